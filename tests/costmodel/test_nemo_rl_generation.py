"""bench/nemo_rl_generation.py: the negative findings docs/benchmarks.md records for NeMo-RL's rollouts hold on
today's cost model ("What makes NeMo-RL's rollouts slower than priced"), and its step-by-step decode prices a
step as the cost model does."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest

from benchload import bench_module


@pytest.fixture(scope="module")
def diag():
    with bench_module("nemo_rl_generation") as module:
        yield module


@pytest.fixture(scope="module")
def rows(diag):
    config_dir = Path(tempfile.mkdtemp())
    return {bd.key: diag.split_row(bd, config_dir) for bd in diag.P.PHASE_BREAKDOWNS}


def test_kv_room_at_nemo_rl_settings_is_never_full(rows):
    """At gpu_memory_utilization 0.6 every split's one wave fits: no preemption, so the KV room is not the gap."""
    assert len(rows) == 3
    for key, r in rows.items():
        kv = r["kv"]
        assert kv["one_wave_peak_tokens"] < kv["nemo_rl_tokens"], key
        assert kv["one_wave_peak_tokens"] < kv["all_at_cap_tokens"], key


def test_length_shape_moves_little(rows):
    """10 % of the responses truncated at the cap (same mean) adds a few seconds, not the 15-45 s gap."""
    for key, r in rows.items():
        waves = r["one_wave_decode_s"]
        assert 0.0 <= waves["truncated_0.10"] - waves["truncated_0.00"] < 5.0, key
        assert r["published_s"] - r["predicted_s"] > 10.0, key  # the gap the findings are about


def test_one_wave_decode_at_a_fixed_length_is_the_cost_models(diag):
    """A fixed length, few enough sequences that every step reads the weights: the cost model prices decode as
    one segment at the full batch and the average context, which the step-by-step decode reproduces (its
    contexts P + 0 .. R - 1 average half a token less than the model's P + R/2)."""
    bd = next(b for b in diag.P.PHASE_BREAKDOWNS if "70b" in b.key)  # vLLM TP4: collectives and logits gather too
    setting = dataclasses.replace(bd.setting, prompts=16, mean_fraction=1.0, p99_fraction=1.0, response_tokens=256)
    with diag.captured() as seen:
        diag.P.predict_phases(dataclasses.replace(bd, setting=setting), Path(tempfile.mkdtemp()))
    gen, static, out = seen["gen"], seen["static"], seen["out"]
    n, prompt, steps = round(seen["n_seq"]), gen.step.prompt_tokens, gen.step.resp_tail
    assert n == 32 and static.cap >= n and gen.step.resp_mean == steps
    slow = static.prefill
    tokens = n * prompt
    chunk = min(float(diag.C.MAX_NUM_BATCHED_TOKENS), tokens)
    prefill = tokens * slow.slow_s_per_token + slow.bubble_s_per_token * chunk
    prefill += (
        tokens
        / chunk
        * slow.slow_allreduces
        * diag.G.allreduce_s(chunk * static.hidden * gen.step.act_bytes, slow.slow_tp, slow.slow_link)
    )
    decode = diag.one_wave_decode_s(static, prompt, [steps] * n, gen.step.act_bytes)
    assert decode == pytest.approx(out.total_s - prefill, rel=1e-4)
