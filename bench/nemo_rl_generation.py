"""What could make NeMo-RL's rollouts slower than the cost model prices them (issue 24, item 1): each candidate
mechanism measured against the three published per-phase splits (bench/published_figures.py PHASE_BREAKDOWNS).

    .venv/bin/python bench/nemo_rl_generation.py      # ~20 s; markdown on stdout

Prints, per split: the engine's KV room at NeMo-RL's own vLLM settings (gpu_memory_utilization 0.6,
max_model_len 4,096; vLLM V1 sizes the cache as the instance's requested share minus its own weights and
activations, and NeMo-RL builds vLLM before the trainer, which it moves to host before each rollout) against the
live KV of the rollout's one wave; the cost model's sequence cap (P + R̄ tokens a sequence of 0.9 of the device
minus what stays resident); a step-by-step decode of one engine with the cost model's own per-step costs (one
wave, every sequence admitted at once, as vLLM does when the prompts' blocks fit) for the modelled lengths and
with a share truncated at the cap; and how much a per-step floor or a slower KV read would have to be for each
split, with what either does to the fit set's offline vLLM batches. Nothing here changes the cost model.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nemo_rl_host_work as H
import published as P

from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel import generation as G

NEMO_RL_GPU_MEMORY_UTILIZATION = 0.6
"""examples/configs/grpo_math_1B.yaml (the 8B Megatron config's defaults) at v0.3.0: vllm_cfg."""
OFFLINE_FIT = ("lambda/llama3.1-8b/h100/vllm060-ms10", "sglang/vllm060/llama3.1-8b/a100-80gb")


@contextmanager
def captured() -> Iterator[dict[str, Any]]:
    """The generation replica the cost model prices last: its static part, the Generation and the result."""
    seen: dict[str, Any] = {}
    original = G.Generation.replica

    def spy(self, classes, stages, split, n_seq, others, offload, names):  # type: ignore[no-untyped-def]
        out = original(self, classes, stages, split, n_seq, others, offload, names)
        key = (classes, split, others, offload, names)
        seen.update(gen=self, static=self._static.get(key), stages=stages, others=others, n_seq=n_seq, out=out)
        return out

    G.Generation.replica = spy  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        G.Generation.replica = original  # type: ignore[method-assign]


def lengths(n: int, mean: float, tail: float, truncated: float = 0.0) -> list[float]:
    """n response lengths of the cost model's family L = tail·u^k (generation.drain_profile) at quantiles
    (i + 1/2)/n, with a share `truncated` of them at the cap and the rest keeping the mean."""
    capped = round(truncated * n)
    rest_mean = (n * mean - capped * tail) / (n - capped)
    k = max(0.0, tail / rest_mean - 1.0)
    rest = n - capped
    return [tail * ((i + 0.5) / rest) ** k for i in range(rest)] + [tail] * capped


def one_wave_decode_s(static: G.GenStatic, prompt: float, lens: list[float], act_bytes: int = 2) -> float:
    """Decode seconds of one engine, step by step, every sequence live from step 0 until its own length, each
    step priced as the cost model prices one (max(GEMM FLOPs, weights) + KV reads + TP collectives +
    DECODE_STEP_OVERHEAD_S; one pipeline stage: the splits' engines are TP only)."""
    ordered = sorted(lens)
    total, first = 0.0, 0
    for s in range(int(max(ordered))):
        while ordered[first] <= s:
            first += 1
        batch = len(ordered) - first
        step = 0.0
        for st in static.stages:
            c = (batch * st.flops_per_token + st.attention_flops_per_context * batch * (prompt + s)) / st.compute_Fps
            kv = batch * (prompt + s) * st.kv_bytes_per_token / st.mem_Bps
            tp = st.allreduces * G.allreduce_s(batch * static.hidden * act_bytes, st.tp, st.tp_link)
            if st.logits_bytes:
                tp += G.allgather_s(batch * st.logits_bytes, st.tp, st.tp_link)
            step = max(step, max(c, st.weight_bytes / st.mem_Bps) + kv + tp)
        total += step + C.DECODE_STEP_OVERHEAD_S
    return total


def kv_room(seen: dict[str, Any]) -> dict[str, float]:
    """KV tokens one engine holds at NeMo-RL's 0.6 and at the cost model's own budget, and the one wave's peak."""
    gen, static, stage = seen["gen"], seen["static"], seen["stages"][0]
    arch = gen.step.arch["generation"]
    per_token = static.stages[0].kv_bytes_per_token
    weights = static.stages[0].weight_bytes
    h = arch.hidden_size
    work = C.MAX_NUM_BATCHED_TOKENS * (2.0 * (h + arch.q_dim + 2 * arch.kv_dim) + 4.0 * arch.intermediate_size)
    work = work * gen.step.act_bytes / stage.tp + C.MAX_NUM_SEQS * arch.vocab_size * 4 / stage.tp
    prompt, mean, tail, n = gen.step.prompt_tokens, gen.step.resp_mean, gen.step.resp_tail, seen["n_seq"]
    k = max(1e-9, tail / mean - 1.0)
    peak = max(n * (1.0 - (s / tail) ** (1.0 / k)) * (prompt + s) for s in range(int(tail) + 1))
    return {
        "nemo_rl_tokens": (stage.memory_bytes * NEMO_RL_GPU_MEMORY_UTILIZATION - weights - work) / per_token,
        "hetrl_tokens": (stage.memory_bytes * C.GEN_MEMORY_UTILIZATION - seen["others"][0] - weights - work)
        / per_token,
        "one_wave_peak_tokens": peak,
        "all_at_cap_tokens": n * (prompt + tail),
        "hetrl_cap_seqs": static.cap,
        "seqs": n,
    }


def split_row(bd: P.PhaseBreakdown, config_dir: Path) -> dict[str, Any]:
    """One split: the published and predicted generation, the KV room, the one-wave decodes."""
    with captured() as seen:
        phases = P.predict_phases(bd, config_dir)
    gen, static = seen["gen"], seen["static"]
    prompt, mean, tail = gen.step.prompt_tokens, gen.step.resp_mean, gen.step.resp_tail
    n = round(seen["n_seq"])
    act = gen.step.act_bytes
    waves = {
        f"truncated_{q:.2f}": one_wave_decode_s(static, prompt, lengths(n, mean, tail, q), act) for q in (0.0, 0.1)
    }
    return {
        "key": bd.key,
        "published_s": dict(bd.phases)["generation"],
        "predicted_s": phases["predicted"]["generation"],
        "replica_terms": dict(seen["out"].terms),
        "kv": kv_room(seen),
        "one_wave_decode_s": waves,
    }


@contextmanager
def scaled(kv: float, step_s: float) -> Iterator[None]:
    """KV reads `kv`× slower and `step_s` more host time a decode step, for the duration of the block."""
    original, base = G.Generation.static, C.DECODE_STEP_OVERHEAD_S

    def static(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        g = original(self, *args, **kwargs)
        return g._replace(stages=[s._replace(kv_bytes_per_token=s.kv_bytes_per_token * kv) for s in g.stages])

    G.Generation.static = static  # type: ignore[method-assign]
    C.DECODE_STEP_OVERHEAD_S = base + step_s
    try:
        yield
    finally:
        G.Generation.static = original  # type: ignore[method-assign]
        C.DECODE_STEP_OVERHEAD_S = base


def scan(config_dir: Path) -> list[str]:
    """Generation of each split and the fit set's offline vLLM batches under a slower KV read or a step floor."""
    figures = {f.key: f for f in P.FIGURES}
    lines = ["| variant | " + " | ".join(bd.key for bd in P.PHASE_BREAKDOWNS) + " | " + " | ".join(OFFLINE_FIT) + " |"]
    lines.append("|---|" + "---:|" * (len(P.PHASE_BREAKDOWNS) + len(OFFLINE_FIT)))
    for kv, step in ((1.0, 0.0), (2.0, 0.0), (3.0, 0.0), (1.0, 0.003), (1.0, 0.006), (1.0, 0.010)):
        with scaled(kv, step):
            cells = [f"{P.predict_phases(bd, config_dir)['predicted']['generation']:.1f} / "
                     f"{dict(bd.phases)['generation']:.0f} s" for bd in P.PHASE_BREAKDOWNS]  # fmt: skip
            for key in OFFLINE_FIT:
                pred = P.predict(figures[key], config_dir)
                cells.append(f"{pred.predicted / pred.published:.3f}×")
        lines.append(f"| KV reads ×{kv:g}, step floor +{step * 1e3:g} ms | " + " | ".join(cells) + " |")
    return lines


DBM_HOST_US_PER_SEQUENCE_STEP = (42.0, 80.0)
"""GPU idle time per sequence-step that Database Mart's RTX 4090 vLLM batches show (their GPU UTL row; docs/
benchmarks.md, "Why the 3B offline batch is over-predicted"): host work of another vLLM deployment, for scale."""


SLOWEST_ENGINE_UPLIFT = 0.2
"""How much longer, on average, the slowest engine's responses might be than the step's (not published): each
engine draws its own 8 prompts × 32 samples, and the phase ends with the slowest engine's rollout."""


def slowest_engine_s(seen: dict[str, Any], uplift: float) -> float:
    """One-wave decode seconds an engine whose mean response is `uplift` longer adds over the modelled mean's."""
    gen, static, n = seen["gen"], seen["static"], round(seen["n_seq"])
    prompt, mean, tail, act = gen.step.prompt_tokens, gen.step.resp_mean, gen.step.resp_tail, gen.step.act_bytes
    longer = min(mean * (1.0 + uplift), 0.99 * tail)
    return one_wave_decode_s(static, prompt, lengths(n, longer, tail), act) - one_wave_decode_s(
        static, prompt, lengths(n, mean, tail), act
    )


def host_rows(config_dir: Path) -> list[dict[str, Any]]:
    """Each split's generation, published and predicted, beside the host work measured in vLLM 0.9.0's and
    NeMo-RL's own code that its 'generation' timer holds on the GPU's critical path (bench/nemo_rl_host_work.py)."""
    rows = []
    for bd in P.PHASE_BREAKDOWNS:
        with captured() as seen:
            predicted = P.predict_phases(bd, config_dir)["predicted"]["generation"]
        published = dict(bd.phases)["generation"]
        parts, tokens = H.host_parts(bd.key), H.MEASURED[bd.key]["tokens"]
        rows.append({
            "slowest_engine_s": slowest_engine_s(seen, SLOWEST_ENGINE_UPLIFT),
            "key": bd.key, "published_s": published, "predicted_s": predicted, "host": parts,
            "with_host_s": predicted + parts["total"], "gap_share": parts["total"] / (published - predicted),
            "engine_us_per_sequence_step": (parts["total"] - parts["grading"] - parts["driver"]) / tokens * 1e6,
            "at_dbm_host_s": tuple(us * 1e-6 * tokens for us in DBM_HOST_US_PER_SEQUENCE_STEP),
        })  # fmt: skip
    return rows


def host_table(config_dir: Path) -> list[str]:
    """host_rows as markdown."""
    lines = [
        "| split | generation pub / pred | output processing | scheduler (per sequence) | model runner's "
        "_update_states (per sequence) | NeMo-RL log-prob copy | grading (one of 8) | driver decode + observations | "
        "measured host work | pred + host | share of the gap | µs per sequence-step | at DBM's 42–80 µs | slowest "
        "engine's mean +20 % (not measured) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in host_rows(config_dir):
        h, (lo, hi) = r["host"], r["at_dbm_host_s"]
        lines.append(
            f"| {r['key']} | {r['published_s']:.0f} / {r['predicted_s']:.1f} s | {h['output_processor']:.2f} s | "
            f"{h['scheduler_per_sequence']:.2f} s | {h['runner_per_sequence']:.2f} s | {h['logprob_copy']:.2f} s | "
            f"{h['grading']:.2f} s | {h['driver']:.2f} s | "
            f"{h['total']:.2f} s | {r['with_host_s']:.1f} s | {r['gap_share']:.0%} | "
            f"{r['engine_us_per_sequence_step']:.1f} | {lo:.1f}–{hi:.1f} s | +{r['slowest_engine_s']:.1f} s |"
        )
    return lines


def main() -> None:
    config_dir = Path(tempfile.mkdtemp())
    print(
        "| split | generation pub / pred | seqs/engine | KV room at 0.6 (k tokens) | one wave's peak live KV | all at "
        "the cap | hetrl's room (0.9 − resident) | hetrl's cap (seqs) | one-wave decode, modelled lengths | "
        "10 % at the cap |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for bd in P.PHASE_BREAKDOWNS:
        r = split_row(bd, config_dir)
        kv, w = r["kv"], r["one_wave_decode_s"]
        print(
            f"| {r['key']} | {r['published_s']:.0f} / {r['predicted_s']:.1f} s | {kv['seqs']:.0f} | "
            f"{kv['nemo_rl_tokens'] / 1e3:.0f} | {kv['one_wave_peak_tokens'] / 1e3:.0f} | "
            f"{kv['all_at_cap_tokens'] / 1e3:.0f} | {kv['hetrl_tokens'] / 1e3:.0f} | {kv['hetrl_cap_seqs']:.0f} | "
            f"{w['truncated_0.00']:.1f} s | {w['truncated_0.10']:.1f} s |"
        )
    print()
    print("\n".join(scan(config_dir)))
    print()
    print("\n".join(host_table(config_dir)))


if __name__ == "__main__":
    main()
