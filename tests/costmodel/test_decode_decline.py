"""Decode priced over the live batch's decline (generation.decode_segments), not at its average batch.

A step costs max(GEMM FLOPs, weight reads) + KV reads: convex in the batch. A long-tailed rollout starts at the
full batch (compute bound) and drains to a few sequences (memory bound); priced at its average batch the
compute-bound start is undercounted. At a fixed response length nothing drains and both agree."""

from __future__ import annotations

import pytest

from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel.architectures import BUILTIN
from hetrl_cli.costmodel.generation import decode_segments, drain_contexts, drain_profile
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.costmodel.types import TaskPlacement

from .conftest import make_profile

A100_FLOPS, A100_BPS = 312e12, 2039e9
N, PROMPT, MAX_RESP = 256, 256, 512


def _workload(mean: float, p99: float) -> Workload:
    return Workload(actor={"arch": "qwen3-0.6b"}, prompts_per_step=64, responses_per_prompt=4,
                    max_prompt_tokens=PROMPT, max_response_tokens=MAX_RESP, micro_batch=4,
                    response_length={"mean_fraction": mean, "p99_fraction": p99})  # fmt: skip


def _generation_s(w: Workload) -> float:
    prof = make_profile([("a0", "A100", 1, "r")])
    est = CostModel(prof, w).task(TaskPlacement("generation", ((("a0/0",),),)))
    assert est.violation is None
    return est.cost.total_s


def _average_batch_s(r_mean: float, r_tail: float) -> float:
    """The pricing before the decline: every step at the average live batch n·R̄ / steps, context P + R̄ / 2."""
    a = BUILTIN["qwen3-0.6b"]
    steps = max(r_tail, N * r_mean / N + r_tail - r_mean)
    batch, ctx = N * r_mean / steps, PROMPT + r_mean / 2
    compute = batch * a.forward_flops_per_token(ctx) / (A100_FLOPS * C.DECODE_MFU)
    weights = a.param_count() * 2 / (A100_BPS * C.HBM_EFFICIENCY)
    kv = batch * ctx * a.kv_bytes_per_token() / (A100_BPS * C.HBM_EFFICIENCY)
    prefill = N * PROMPT * a.forward_flops_per_token(PROMPT / 2) / (A100_FLOPS * C.PREFILL_MFU)
    overhead = steps * C.DECODE_STEP_OVERHEAD_S + N * r_mean * C.DECODE_SEQ_OVERHEAD_S
    return prefill + steps * (max(compute, weights) + kv) + overhead


def test_full_batch_is_compute_bound_here() -> None:
    """The premise: at 256 sequences this decode step is compute bound, at the average batch of the tail not."""
    a = BUILTIN["qwen3-0.6b"]
    weights = a.param_count() * 2 / (A100_BPS * C.HBM_EFFICIENCY)
    assert N * a.forward_flops_per_token(PROMPT) / (A100_FLOPS * C.DECODE_MFU) > weights
    assert N / 4 * a.forward_flops_per_token(PROMPT) / (A100_FLOPS * C.DECODE_MFU) < weights


def test_long_tail_costs_more_than_its_average_batch() -> None:
    r_mean, r_tail = 0.25 * MAX_RESP, MAX_RESP
    declined, average = _generation_s(_workload(0.25, 1.0)), _average_batch_s(r_mean, r_tail)
    assert declined > 1.02 * average  # 1.036x here (1.000x before the decline was priced)


def test_fixed_length_equals_its_average_batch() -> None:
    assert _generation_s(_workload(1.0, 1.0)) == pytest.approx(_average_batch_s(MAX_RESP, MAX_RESP), rel=1e-9)


@pytest.mark.parametrize(("mean", "tail"), [(100.0, 100.0), (50.0, 100.0), (20.0, 100.0), (90.0, 100.0)])
@pytest.mark.parametrize(("n_seq", "batch"), [(1000.0, 256.0), (100.0, 256.0), (0.5, 1.0)])
def test_segments_keep_steps_and_tokens(mean: float, tail: float, n_seq: float, batch: float) -> None:
    """The decline moves no step and no token: max(Rt, n·R̄/batch + Rt − R̄) steps carry n·R̄ tokens."""
    segments = decode_segments(n_seq, batch, mean, tail, drain_profile(mean, tail))
    assert len(segments) <= 1 + 4
    assert sum(s for s, _ in segments) == pytest.approx(max(tail, n_seq * mean / batch + tail - mean), rel=1e-12)
    assert sum(s * b for s, b in segments) == pytest.approx(n_seq * mean, rel=1e-12)
    assert all(0 < b <= batch for _, b in segments)


@pytest.mark.parametrize(("mean", "tail"), [(100.0, 100.0), (50.0, 100.0), (20.0, 100.0), (90.0, 100.0)])
@pytest.mark.parametrize(("n_seq", "batch"), [(1000.0, 256.0), (100.0, 256.0), (0.5, 1.0)])
def test_segments_read_each_sequences_own_context(mean: float, tail: float, n_seq: float, batch: float) -> None:
    """A sequence of length L reads L KV caches of 0 .. L − 1 generated tokens: n·E[L²]/2 in all, E[L²] =
    tail²/(2k + 1) for L = tail·u^k, k = tail/mean − 1 (R̄²/2 a sequence only at a fixed length)."""
    segments = decode_segments(n_seq, batch, mean, tail, drain_profile(mean, tail))
    contexts = drain_contexts(mean, tail)[-len(segments) :]
    k = tail / mean - 1
    read = sum(s * b * c for (s, b), c in zip(segments, contexts, strict=True))
    assert read == pytest.approx(n_seq * tail**2 / (2 * k + 1) / 2, rel=1e-12)
    assert read >= n_seq * mean**2 / 2 * (1 - 1e-12)


SHORT_N = 32  # few enough sequences that every decode step reads the weights (memory bound at the full batch)


def _kv_bound_s(r_mean: float, r_tail: float, kv_tokens: float) -> float:
    """Generation of SHORT_N sequences on one A100, by hand, every step at its weight reads + the KV reads."""
    a = BUILTIN["qwen3-0.6b"]
    weights = a.param_count() * 2 / (A100_BPS * C.HBM_EFFICIENCY)
    assert SHORT_N * a.forward_flops_per_token(PROMPT + r_mean) / (A100_FLOPS * C.DECODE_MFU) < weights
    kv = kv_tokens * a.kv_bytes_per_token() / (A100_BPS * C.HBM_EFFICIENCY)
    prefill = SHORT_N * PROMPT * a.forward_flops_per_token(PROMPT / 2) / (A100_FLOPS * C.PREFILL_MFU)
    overhead = r_tail * C.DECODE_STEP_OVERHEAD_S + SHORT_N * r_mean * C.DECODE_SEQ_OVERHEAD_S
    return prefill + r_tail * weights + kv + overhead


@pytest.mark.parametrize(("mean", "p99"), [(0.25, 1.0), (0.5, 1.0), (1.0, 1.0)])
def test_long_tail_reads_longer_kv_caches(mean: float, p99: float) -> None:
    """The KV bytes read follow each sequence's own context: SHORT_N·(P·R̄ + E[L²]/2) tokens, above the average
    context's SHORT_N·R̄·(P + R̄/2) wherever lengths vary (2.3× the generated part at R̄ = R99/4), equal at a
    fixed length. Before, the model read the average context's."""
    r_mean, r_tail = mean * MAX_RESP, p99 * MAX_RESP
    w = Workload(actor={"arch": "qwen3-0.6b"}, prompts_per_step=SHORT_N // 4, responses_per_prompt=4,
                 max_prompt_tokens=PROMPT, max_response_tokens=MAX_RESP, micro_batch=4,
                 response_length={"mean_fraction": mean, "p99_fraction": p99})  # fmt: skip
    k = r_tail / r_mean - 1
    own = _kv_bound_s(r_mean, r_tail, SHORT_N * (PROMPT * r_mean + r_tail**2 / (2 * k + 1) / 2))
    average = _kv_bound_s(r_mean, r_tail, SHORT_N * r_mean * (PROMPT + r_mean / 2))
    assert _generation_s(w) == pytest.approx(own, rel=1e-9)
    if mean < p99:
        assert own > 1.01 * average
    else:
        assert own == pytest.approx(average, rel=1e-12)


@pytest.mark.parametrize(("mean", "p99"), [(0.25, 1.0), (0.5, 1.0), (1.0, 1.0)])
def test_attention_flops_cover_the_contexts_the_kv_reads_cover(mean: float, p99: float) -> None:
    """A decode token's attention FLOPs (4·q_dim·context a layer) are linear in its context, as its KV reads are:
    both sum over the same SHORT_N·(P·R̄ + E[L²]/2) context tokens, not SHORT_N·R̄·(P + R̄/2) (the average
    context's, which the FLOPs took before while the KV reads took each sequence's own)."""
    a = BUILTIN["qwen3-0.6b"]
    r_mean, r_tail = mean * MAX_RESP, p99 * MAX_RESP
    w = Workload(actor={"arch": "qwen3-0.6b"}, prompts_per_step=SHORT_N // 4, responses_per_prompt=4,
                 max_prompt_tokens=PROMPT, max_response_tokens=MAX_RESP, micro_batch=4,
                 response_length={"mean_fraction": mean, "p99_fraction": p99})  # fmt: skip
    est = CostModel(make_profile([("a0", "A100", 1, "r")]), w).task(TaskPlacement("generation", ((("a0/0",),),)))
    k = r_tail / r_mean - 1
    context_tokens = SHORT_N * (PROMPT * r_mean + r_tail**2 / (2 * k + 1) / 2)
    flops = SHORT_N * r_mean * a.forward_flops_per_token(0) + a.num_layers * a.layer_attention_flops(context_tokens)
    prefill = SHORT_N * PROMPT * a.forward_flops_per_token(PROMPT / 2) / (A100_FLOPS * C.PREFILL_MFU)
    assert est.terms["compute"] == pytest.approx(prefill + flops / (A100_FLOPS * C.DECODE_MFU), rel=1e-9)
    average = SHORT_N * r_mean * a.forward_flops_per_token(PROMPT + r_mean / 2)
    if mean < p99:
        assert flops > 1.001 * average
    else:
        assert flops == pytest.approx(average, rel=1e-12)
