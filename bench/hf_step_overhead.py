"""The hf engine's host work per decode step against the model's layer count, on this CPU (issue 23).

A random Qwen3 small enough that a decode step's arithmetic is negligible (hidden 64, 128-token vocabulary,
one KV head) with L = 1, 2, 4, 8, 16, 32 layers; `HFEngine.generate` (the runtime's engine) of B prompts of 8
tokens, every response exactly R tokens; seconds per decode step = (t(R) - t(1)) / (R - 1), the median of
REPEATS. What is left per step is transformers' per-module Python dispatch, the sampler and the cache
bookkeeping: the least-squares line a + b·L over L gives the fixed and the per-layer host work, in wall seconds
and in the process's CPU seconds (one torch thread: what a dedicated core would take, less the box's contention).

    .venv/bin/python bench/hf_step_overhead.py [--out bench/results/hf_step_overhead.json] [--quick]

The box is shared (2 cores, other engineers' jobs beside it): medians of repeats, not a quiet machine's figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
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


def seconds_per_step(model_dir: Path, batch: int, response: int, repeats: int) -> dict[str, float]:
    import torch

    from hetrl_cli.runtime.engines import Sampling
    from hetrl_cli.runtime.engines.hf import HFEngine

    engine = HFEngine(model_dir, batch_size=batch)
    prompts = torch.randint(4, VOCAB, (batch, 8), generator=torch.Generator().manual_seed(0)).tolist()

    def run(new_tokens: int) -> tuple[float, float]:
        sampling = Sampling(new_tokens, 1.0, tuple(range(batch)), eos_token_id=VOCAB + 1, pad_token_id=1,
                            suppress_ids=(0, 1, 2, 3))  # fmt: skip
        start, cpu = time.perf_counter(), time.process_time()
        engine.generate(prompts, sampling)
        return time.perf_counter() - start, time.process_time() - cpu

    run(4)
    one = [run(1) for _ in range(repeats)]
    whole = [run(response) for _ in range(repeats)]
    wall = [statistics.median(t[0] for t in ts) for ts in (one, whole)]
    cpu = [statistics.median(t[1] for t in ts) for ts in (one, whole)]
    return {"step_s": (wall[1] - wall[0]) / (response - 1), "step_cpu_s": (cpu[1] - cpu[0]) / (response - 1),
            "one_token_s": wall[0], "whole_s": wall[1]}  # fmt: skip


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b·x: (a, b)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--quick", action="store_true", help="L = 1, 4, 16; batch 1; 3 repeats")
    args = parser.parse_args()
    torch.set_num_threads(1)
    layers = [1, 4, 16] if args.quick else [1, 2, 4, 8, 16, 32]
    batches = [1] if args.quick else [1, 8]
    repeats = 3 if args.quick else 5
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in layers:
            path = build(Path(tmp), n)
            for batch in batches:
                row = {"layers": n, "batch": batch, **seconds_per_step(path, batch, 33, repeats)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    fits = {}
    for batch in batches:
        mine = [r for r in rows if r["batch"] == batch]
        for clock in ("step_s", "step_cpu_s"):
            a, b = fit_line([r["layers"] for r in mine], [r[clock] for r in mine])
            fits[f"batch {batch}, {clock}"] = {"fixed_s": a, "per_layer_s": b}
    result = {"command": "bench/hf_step_overhead.py" + (" --quick" if args.quick else ""), "rows": rows, "fit": fits,
              "torch_threads": 1}  # fmt: skip
    print(json.dumps(fits))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
