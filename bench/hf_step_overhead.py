"""The hf engine's host work per decode step against the model's layer count, on this CPU (issue 23).

A random Qwen3 small enough that a decode step's arithmetic is negligible (hidden 64, 128-token vocabulary,
one KV head) with L = 1, 2, 4, 8, 16, 32 layers; `HFEngine.generate` (the runtime's engine) of B prompts of 8
tokens, every response exactly R tokens; seconds per decode step = (t(R) - t(1)) / (R - 1), the median of
REPEATS. What is left per step is transformers' per-module Python dispatch, the sampler and the cache
bookkeeping: the least-squares line a + b·L over L gives the fixed and the per-layer host work, in wall seconds
and in the process's CPU seconds (one torch thread: what a dedicated core would take, less the box's contention).

Each point is measured twice, repeats interleaved on the same engine: with the engine's own decode loop
(hfdecode.py, loop "decode": what the cost model's HF_DECODE_STEP_* constants are fitted to) and with the same
batch through transformers' `generate`, as the engine decoded before 813d11a (loop "generate": the before of
that change, side by side on the same box at the same time).

    .venv/bin/python bench/hf_step_overhead.py [--out bench/results/hf_step_overhead.json] [--quick]

The box is shared (2 cores, other engineers' jobs beside it): medians of repeats, not a quiet machine's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "hf_step_overhead.json"
VOCAB = 128


def build(folder: Path, layers: int) -> Path:
    """A saved random Qwen3 of `layers` layers whose arithmetic per token is ~50 kFLOP a layer."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(layers)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=64, tie_word_embeddings=True,
                         max_position_embeddings=512)  # fmt: skip
    path = folder / f"L{layers}"
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


LOOPS = ("decode", "generate")


def _batch_via_generate(self: Any, prompts: list[list[int]], sampling: Any, seeds: tuple[int, ...]) -> list[list[int]]:
    """HFEngine._generate_batch as it was before 813d11a: transformers' `generate` with the seeded sampler."""
    import torch
    from transformers import LogitsProcessorList

    from hetrl_cli.runtime.engines.hf import _SeededGumbel, cut_at_eos

    sampler = _SeededGumbel(seeds, sampling.temperature, sampling.suppress_ids, sampling.max_new_tokens)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), sampling.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    with torch.inference_mode():
        generated = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=sampling.max_new_tokens,
            do_sample=False,
            logits_processor=LogitsProcessorList([sampler]),
            eos_token_id=sampling.eos_token_id,
            pad_token_id=sampling.pad_token_id,
        )
    return [cut_at_eos(row, sampling.eos_token_id, sampling.pad_token_id) for row in generated[:, width:].tolist()]


def seconds_per_step(model_dir: Path, batch: int, response: int, repeats: int) -> dict[str, dict[str, float]]:
    """Per loop (LOOPS): seconds a decode step, wall and process CPU, medians of `repeats` interleaved runs."""
    import torch

    from hetrl_cli.runtime.engines import Sampling
    from hetrl_cli.runtime.engines.hf import HFEngine

    engine = HFEngine(model_dir, batch_size=batch)
    decode_batch = engine._generate_batch
    prompts = torch.randint(4, VOCAB, (batch, 8), generator=torch.Generator().manual_seed(0)).tolist()

    def run(loop: str, new_tokens: int) -> tuple[float, float]:
        engine._generate_batch = decode_batch if loop == "decode" else types.MethodType(_batch_via_generate, engine)  # type: ignore[method-assign]
        sampling = Sampling(new_tokens, 1.0, tuple(range(batch)), eos_token_id=VOCAB + 1, pad_token_id=1,
                            suppress_ids=(0, 1, 2, 3))  # fmt: skip
        start, cpu = time.perf_counter(), time.process_time()
        engine.generate(prompts, sampling)
        return time.perf_counter() - start, time.process_time() - cpu

    for loop in LOOPS:
        run(loop, 4)
    times: dict[tuple[str, int], list[tuple[float, float]]] = {(lp, n): [] for lp in LOOPS for n in (1, response)}
    for _ in range(repeats):
        for loop in LOOPS:
            for n in (1, response):
                times[loop, n].append(run(loop, n))
    out = {}
    for loop in LOOPS:
        wall = [statistics.median(t[0] for t in times[loop, n]) for n in (1, response)]
        cpu = [statistics.median(t[1] for t in times[loop, n]) for n in (1, response)]
        out[loop] = {"step_s": (wall[1] - wall[0]) / (response - 1), "step_cpu_s": (cpu[1] - cpu[0]) / (response - 1),
                     "one_token_s": wall[0], "whole_s": wall[1]}  # fmt: skip
    return out


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b·x: (a, b)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b


def measure(layers: list[int], batches: list[int], repeats: int, passes: int) -> list[dict[str, Any]]:
    """One row per pass, layer count, batch and loop; each pass builds its models again and walks every point."""
    rows: list[dict[str, Any]] = []
    for index in range(passes):
        with tempfile.TemporaryDirectory() as tmp:
            for n in layers:
                path = build(Path(tmp), n)
                for batch in batches:
                    for loop, figures in seconds_per_step(path, batch, 33, repeats).items():
                        row = {"pass": index, "layers": n, "batch": batch, "loop": loop, **figures,
                               "load_1min": os.getloadavg()[0]}  # fmt: skip
                        print(json.dumps(row), flush=True)
                        rows.append(row)
    return rows


def fit_rows(rows: list[dict[str, Any]], passes: int) -> dict[str, dict[str, float]]:
    """The line over layers per loop, batch and clock: of each pass, and of each point's median over the passes."""
    fits = {}
    for loop in LOOPS:
        for batch in sorted({r["batch"] for r in rows}):
            mine = [r for r in rows if r["batch"] == batch and r["loop"] == loop]
            layers = sorted({r["layers"] for r in mine})
            for clock in ("step_s", "step_cpu_s"):
                for index in range(passes):
                    one = [r for r in mine if r["pass"] == index]
                    a, b = fit_line([r["layers"] for r in one], [r[clock] for r in one])
                    fits[f"{loop}, batch {batch}, {clock}, pass {index}"] = {"fixed_s": a, "per_layer_s": b}
                medians = [statistics.median(r[clock] for r in mine if r["layers"] == n) for n in layers]
                a, b = fit_line([float(n) for n in layers], medians)
                fits[f"{loop}, batch {batch}, {clock}, median of passes"] = {"fixed_s": a, "per_layer_s": b}
    return fits


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--quick", action="store_true", help="L = 1, 4, 16; batch 1; 3 repeats; one pass")
    parser.add_argument("--repeats", type=int, default=7, help="runs of each length per point (medians)")
    parser.add_argument("--passes", type=int, default=3, help="walks over all points (fits of each and of medians)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    layers = [1, 4, 16] if args.quick else [1, 2, 4, 8, 16, 32]
    batches = [1] if args.quick else [1, 8]
    repeats, passes = (3, 1) if args.quick else (args.repeats, args.passes)
    started, load = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), os.getloadavg()[0]
    rows = measure(layers, batches, repeats, passes)
    loads = [load] + [r["load_1min"] for r in rows]
    fits = fit_rows(rows, passes)
    command = "bench/hf_step_overhead.py" + (" --quick" if args.quick else f" --repeats {repeats} --passes {passes}")
    ended = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    result = {"command": command, "started": started, "ended": ended, "torch_threads": 1,
              "load_1min": {"min": min(loads), "max": max(loads)}, "fit": fits, "rows": rows}  # fmt: skip
    print(json.dumps(fits))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
