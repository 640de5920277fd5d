"""Why the cost model over-predicts Database Mart's Qwen2.5-3B offline batch on one RTX 4090 (issue 24, item 1):
each candidate cause measured against the figures of the same page (bench/published_figures.py DBM_4090).

    PYTHONPATH=. .venv/bin/python bench/dbm_diagnosis.py      # ~10 s; markdown on stdout

DIAGNOSTIC only: nothing here is in bench/published.py's fit or check sets (adding checks after seeing the
results would bias their median), and nothing here changes the cost model. It prints, per figure of the page:
  1. the page's own "GPU UTL" row against the cost model's time: the page's duration x its GPU utilisation is the
     time a kernel ran (nvidia-smi's utilisation counts a sample busy when any kernel runs, however few SMs it
     fills), which the cost model prices; the rest is time the GPU waited on the host;
  2. the decode steps the cost model prices against vLLM's max_num_seqs waves at a fixed 600-token length;
  3. what one per-sequence host cost a step (DECODE_SEQ_OVERHEAD_S) does to the whole published table;
  4. the sampler's logits traffic at 256 sequences x 151,936 tokens, against the priced step;
  5. the GEMMs' tile quantisation at the 3B's hidden 2,048 on the RTX 4090's 128 SMs;
  6. how long the same vendor's benchmark let instruct models run (its A40 page prints the tokens generated).
A seventh figure of the same table, DeepSeek-R1-Distill-Qwen-1.5B (13.85 req/s, GPU UTL 64 %), is priced as a
diagnostic comparison with the same code path.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import published as P
from published_figures import _DBM_NOTE, DBM_4090, FIGURES, Figure, Setting

from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel import generation as G

GPU_UTIL: dict[str, tuple[float, float]] = {
    "databasemart/r1-distill-llama-8b/rtx4090/offline": (0.81, 0.89),
    "databasemart/r1-distill-qwen-7b/rtx4090/offline": (0.85, 0.85),
    "databasemart/qwen2.5-3b/rtx4090/offline": (0.64, 0.64),
    "databasemart/r1-distill-qwen-1.5b/rtx4090/offline": (0.64, 0.64),
}
"""DBM_4090's 'RTX4090 Offline Benchmark Results Display', row GPU UTL, per model column (read 2026-12-05):
DeepSeek-R1-Distill-Llama-8B 81-89 %, DeepSeek-R1-Distill-Qwen-7B 85 %, Qwen2.5-3B-Instruct 64 %,
DeepSeek-R1-Distill-Qwen-1.5B 64 % (Qwen2.5-VL-7B-Instruct and gemma-2-9b-it, not priced here: 94 %)."""

QWEN_1_5B = {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151936, "model_type": "qwen2"}  # fmt: skip
"""DeepSeek-R1-Distill-Qwen-1.5B (Qwen2.5-Math-1.5B's architecture): 2 KV heads, separate embedding and head of
151,936 x 1,536 (public code that loads its embeddings and unembeddings separately prints these shapes)."""

DIAGNOSTIC_1_5B = Figure(
    "databasemart/r1-distill-qwen-1.5b/rtx4090/offline", "Database Mart (GPU benchmark blog)",
    f"{DBM_4090} — same table, column DeepSeek-R1-Distill-Qwen-1.5B: Request (req/s) 13.85 (read 2026-12-05)",
    "requests_per_s", 13.85,
    Setting("qwen2.5-1.5b-r1", "RTX 4090", 1, 1, "serve", prompts=300, prompt_tokens=100, response_tokens=600,
            inter_node="100Gbps", assumptions=_DBM_NOTE),
    "generation", "diagnostic", "DIAGNOSTIC only (not in the fit or check sets): a smaller model of the same table",
)  # fmt: skip

DBM_A40 = "https://www.databasemart.com/blog/vllm-gpu-benchmark-a40"
A40_GENERATED = {
    "meta-llama/Llama-3.1-8B-Instruct": 22170,
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B": 27517,
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B": 17321,
    "Qwen/Qwen2.5-14B-Instruct": 25213,
    "Qwen/Qwen2.5-7B-Instruct": 25703,
    "google/gemma-3-12b-it": 27148,
}
"""DBM_A40, 'A40 Benchmark for Scenario 1: 50 Concurrent Requests', row Total Generated Tokens (read 2026-12-05):
50 requests of 100 input / 600 output tokens, the same vendor's parameters as DBM_4090's."""
A40_REQUESTED = 50 * 600

OFFLINE_VLLM060 = ("lambda/llama3.1-8b/h100/vllm060-ms10", "sglang/vllm060/llama3.1-8b/a100-80gb")
"""The fit set's offline vLLM batches of 256 sequences (vLLM 0.6.0, ShareGPT through the OpenAI server)."""

_DECODE_SEGMENTS = G.decode_segments
"""The cost model's own schedule, kept before any patching here."""

RTX4090_SMS = 128
"""Streaming multiprocessors of the RTX 4090 (AD102 as sold: 128 of 144)."""


def figures() -> tuple[Figure, ...]:
    """The page's three figures of bench/published.py and the 1.5B diagnostic."""
    own = tuple(f for f in FIGURES if f.key in GPU_UTIL)
    return (*own, DIAGNOSTIC_1_5B)


def config_dir() -> Path:
    """A scratch directory for the HF config.json files model_spec writes (the 1.5B's among them)."""
    P.HF_CONFIGS.setdefault("qwen2.5-1.5b-r1", QWEN_1_5B)
    return Path(tempfile.mkdtemp())


@contextmanager
def recorded() -> Iterator[dict[str, Any]]:
    """The decode segments and full-batch step the cost model prices during one prediction."""
    seen: dict[str, Any] = {"segments": [], "steps": []}
    segments, step = G.decode_segments, G.Generation._decode_step

    def segments_spy(*args: Any) -> list[tuple[float, float]]:
        out = segments(*args)
        seen["segments"].append(out)
        return out

    def step_spy(self: G.Generation, g: G.GenStatic, batch: float, ctx: float) -> tuple:
        out = step(self, g, batch, ctx)
        seen["steps"].append((batch, ctx, out[0]))
        seen["static"] = g
        return out

    G.decode_segments, G.Generation._decode_step = segments_spy, step_spy  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        G.decode_segments, G.Generation._decode_step = segments, step  # type: ignore[method-assign]


def fixed_length_waves(
    n_seq: float, batch: float, resp_mean: float, resp_tail: float, drain: Any
) -> list[tuple[float, float]]:
    """vLLM's schedule of `n_seq` requests of one fixed length at up to `batch` at once: every sequence of a wave
    ends at the same step, so the waiting ones start together as the next wave (the last one partial). Other
    lengths: the cost model's own decode_segments."""
    if resp_tail != resp_mean:
        return _DECODE_SEGMENTS(n_seq, batch, resp_mean, resp_tail, drain)
    waves = math.ceil(n_seq / batch - 1e-9)
    last = n_seq - (waves - 1) * batch
    return ([((waves - 1) * resp_mean, batch)] if waves > 1 else []) + [(resp_mean, last)]


def busy_row(fig: Figure, cfg: Path) -> dict[str, Any]:
    """The page's duration split by its GPU UTL into kernel time and host time, beside the cost model's time."""
    with recorded() as seen:
        pred = P.predict(fig, cfg)
    n, length = fig.setting.prompts, fig.setting.response_tokens
    published_s, predicted_s = n / fig.published, n / pred.predicted
    lo, hi = GPU_UTIL[fig.key]
    busy = (published_s * lo, published_s * hi)
    idle = (published_s - busy[1], published_s - busy[0])
    segments = seen["segments"][-1]
    full_batch_step = max(s for _, _, s in seen["steps"])
    batch = max(1.0, min(math.floor(seen["static"].cap), C.MAX_NUM_SEQS, n))  # as Generation.replica takes it
    original = G.decode_segments
    G.decode_segments = fixed_length_waves
    try:
        waved = P.predict(fig, cfg)
    finally:
        G.decode_segments = original
    return {
        "key": fig.key,
        "published_s": published_s,
        "predicted_s": predicted_s,
        "pred_over_pub_rate": pred.predicted / fig.published,
        "gpu_util": (lo, hi),
        "busy_s": busy,
        "pred_over_busy": (predicted_s / busy[1], predicted_s / busy[0]),
        "idle_s": idle,
        "idle_us_per_sequence_step": tuple(1e6 * i / (n * length) for i in idle),
        "kv_cap_sequences": seen["static"].cap,
        "priced_steps": sum(s for s, _ in segments),
        "priced_segments": segments,
        "wave_steps": sum(s for s, _ in fixed_length_waves(n, batch, length, length, ())),
        "waves_pred_over_pub_rate": waved.predicted / fig.published,
        "full_batch_step_s": full_batch_step,
    }  # fmt: skip


def host_cost_sweep(cfg: Path, per_sequence_s: tuple[float, ...]) -> list[dict[str, Any]]:
    """The whole published table with DECODE_SEQ_OVERHEAD_S set to each value: fit/check medians and maxima and
    the offline vLLM batches' ratios (the page's three, and the fit set's vLLM 0.6.0 batches of 256)."""
    watch = set(GPU_UTIL) | set(OFFLINE_VLLM060)
    saved = C.DECODE_SEQ_OVERHEAD_S
    out = []
    try:
        for h in per_sequence_s:
            C.DECODE_SEQ_OVERHEAD_S = h
            preds = [P.predict(f, cfg) for f in FIGURES]
            s = P.summary(FIGURES, preds)
            ratios = {p.key: p.predicted / p.published for p in preds if p.key in watch}
            out.append({"per_sequence_s": h, "fit": s["fit"], "check": s["check"], "ratios": ratios})
    finally:
        C.DECODE_SEQ_OVERHEAD_S = saved
    return out


def sampler_traffic(vocab: int, batch: int, mem_Bps: float, passes: int = 2) -> dict[str, float]:
    """One decode step's fp32 logits (batch x vocab x 4 bytes) written by the head and read back by the sampler
    (`passes` times over: 2 = one write, one argmax/softmax read) at the priced memory bandwidth."""
    logits = batch * vocab * 4.0
    return {"logits_bytes": logits, "seconds": passes * logits / mem_Bps}


def gemm_tile_efficiency(arch: dict[str, Any], batch: int, sms: int = RTX4090_SMS, tile: int = 128) -> float:
    """FLOP-weighted share of SM-waves doing work in one layer's four GEMMs at `batch` tokens, output tiles of
    tile x tile, one tile per SM per wave (no split-K): an upper bound on the tile-quantisation loss."""
    h, inter = arch["hidden_size"], arch["intermediate_size"]
    head_dim = h // arch["num_attention_heads"]
    kv = arch["num_key_value_heads"] * head_dim
    shapes = [(h + 2 * kv, h), (h, h), (2 * inter, h), (h, inter)]  # (N out features, K) of qkv, o, gate_up, down
    work = waste = 0.0
    for n_out, k in shapes:
        tiles = math.ceil(batch / tile) * math.ceil(n_out / tile)
        waves = math.ceil(tiles / sms)
        flops = 2.0 * batch * n_out * k
        work += flops
        waste += flops * (waves * sms) / tiles
    return work / waste


def early_stop_rows() -> dict[str, float]:
    """Share of the 600 requested tokens the A40 page's runs generated, per model."""
    return {m: g / A40_REQUESTED for m, g in A40_GENERATED.items()}


def run() -> dict[str, Any]:
    cfg = config_dir()
    rows = [busy_row(f, cfg) for f in figures()]
    three_b = next(r for r in rows if "qwen2.5-3b" in r["key"])
    mem_Bps = 1008e9 * C.DATASHEET_HBM_FRACTION["ada"] * C.HBM_EFFICIENCY
    sampler = sampler_traffic(P.HF_CONFIGS["qwen2.5-3b"]["vocab_size"], C.MAX_NUM_SEQS, mem_Bps)
    sampler["share_of_step"] = sampler["seconds"] / three_b["full_batch_step_s"]
    tiles = {
        "qwen2.5-3b at 256": gemm_tile_efficiency(P.HF_CONFIGS["qwen2.5-3b"], 256),
        "qwen2.5-7b at 156": gemm_tile_efficiency(P.HF_CONFIGS["qwen2.5-7b"], 156),
        "llama-3.1-8b at 62": gemm_tile_efficiency({"hidden_size": 4096, "intermediate_size": 14336,
                                                     "num_attention_heads": 32, "num_key_value_heads": 8}, 62),
    }  # fmt: skip
    sweep = host_cost_sweep(cfg, (0.0, 2e-5, 5e-5))
    idle_us = [statistics.mean(r["idle_us_per_sequence_step"]) for r in rows]
    return {"rows": rows, "sampler": sampler, "gemm_tiles": tiles, "host_cost_sweep": sweep,
            "early_stop": early_stop_rows(),
            "idle_us_per_sequence_step_median": statistics.median(idle_us)}  # fmt: skip


def _pair(v: tuple[float, float], fmt: str) -> str:
    return format(v[0], fmt) if abs(v[0] - v[1]) < 1e-12 else f"{format(v[0], fmt)}–{format(v[1], fmt)}"


def report(res: dict[str, Any]) -> str:
    lines = ["**The page's GPU UTL against the cost model's time** (300 requests, 100 in / 600 out)", "",
             "| figure | pred/pub rate | published s | GPU UTL | kernel s (pub x UTL) | predicted s | pred / kernel s "
             "| host s | host µs per sequence-step | priced steps | fixed-length waves' steps | pred/pub with waves |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in res["rows"]:
        lines.append(
            f"| {r['key']} | {r['pred_over_pub_rate']:.3f} | {r['published_s']:.1f} | {_pair(r['gpu_util'], '.2f')} "
            f"| {_pair(r['busy_s'], '.1f')} | {r['predicted_s']:.1f} | {_pair(r['pred_over_busy'], '.3f')} "
            f"| {_pair(r['idle_s'], '.1f')} | {_pair(r['idle_us_per_sequence_step'], '.0f')} "
            f"| {r['priced_steps']:.0f} | {r['wave_steps']:.0f} | {r['waves_pred_over_pub_rate']:.3f} |"
        )
    lines += ["", "**One per-sequence host cost a decode step (DECODE_SEQ_OVERHEAD_S) over the whole table** "
              "(constants.py's values otherwise)", "",
              "| seconds per sequence-step | fit median / max | check median / max | ratios pred/pub |",
              "|---:|---:|---:|---|"]  # fmt: skip
    for s in res["host_cost_sweep"]:
        ratios = ", ".join(f"{k} {v:.3f}" for k, v in s["ratios"].items())
        lines.append(
            f"| {s['per_sequence_s'] * 1e6:.0f} µs | {s['fit']['median_abs_ln']:.3f} / {s['fit']['max_abs_ln']:.3f} "
            f"| {s['check']['median_abs_ln']:.3f} / {s['check']['max_abs_ln']:.3f} | {ratios} |"
        )
    sm = res["sampler"]
    lines += ["", f"Sampler: logits {sm['logits_bytes'] / 1e6:.1f} MB a step (256 x 151,936 fp32); written and read "
              f"once, {sm['seconds'] * 1e3:.2f} ms at the priced bandwidth = {sm['share_of_step']:.1%} of the 3B's "
              "priced full-batch step.", "",
              "GEMM tile quantisation (128 x 128 tiles, 128 SMs, no split-K; FLOP-weighted useful share): "
              + ", ".join(f"{k} {v:.2f}" for k, v in res["gemm_tiles"].items()), "",
              "Same vendor's A40 page, generated / requested tokens: "
              + ", ".join(f"{k.split('/')[1]} {v:.2f}" for k, v in res["early_stop"].items())]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    res = run()
    print(report(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=_jsonable), encoding="utf-8")
    return 0


def _jsonable(o: Any) -> Any:
    return dataclasses.asdict(o) if dataclasses.is_dataclass(o) else str(o)


if __name__ == "__main__":
    raise SystemExit(main())
