"""bench/nemo_rl_host_work.py: the host work NeMo-RL's 'generation' timer holds, measured in vLLM 0.9.0's and
NeMo-RL's own code (docs/benchmarks.md, "What NeMo-RL's generation timer holds besides decode"): the recorded
run is of the lengths the cost model prices today, its sum is what docs/benchmarks.md reports, and the part
that runs without vLLM (NeMo-RL's log-prob copy) measures what it says."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from benchload import bench_module


@pytest.fixture(scope="module")
def bench():
    with bench_module("nemo_rl_host_work") as host, bench_module("nemo_rl_generation") as gen:
        yield host, gen


def test_measured_rollouts_are_the_priced_lengths(bench):
    """Each split's recorded run replayed the cost model's own response lengths (same tokens, same steps), so the
    seconds sit beside the generation the cost model prices for those lengths."""
    host, _ = bench
    assert set(host.MEASURED) == set(host.SPLITS)
    for key, row in host.MEASURED.items():
        lens = host.split_lengths(key)
        assert row["tokens"] == sum(lens) and row["steps"] == max(lens), key
        n, mean, _ = host.SPLITS[key]
        assert len(lens) == n and sum(lens) / n == pytest.approx(mean, rel=0.01), key


def test_host_parts_sum_and_the_8b_share(bench):
    """The parts add up; the per-sequence scheduler and model-runner parts exclude the per-step part the cost model
    prices; on the 8B split (the check miss's rollout) the measured host work is a real share of the gap, not all
    of it."""
    host, gen = bench
    for key in host.MEASURED:
        parts = host.host_parts(key)
        assert parts["total"] == pytest.approx(sum(v for k, v in parts.items() if k != "total")), key
        assert all(v > 0 for v in parts.values()), key
        row = host.MEASURED[key]
        assert parts["scheduler_per_sequence"] == pytest.approx(row["scheduler_s"] - row["scheduler_one_sequence_s"])
        assert parts["runner_per_sequence"] == pytest.approx(row["runner_s"] - row["runner_one_sequence_s"])
    rows = {r["key"]: r for r in gen.host_rows(Path(tempfile.mkdtemp()))}
    eight = rows["nemo-rl-v0.3/llama3.1-8b/8xh100"]
    assert eight["predicted_s"] < eight["with_host_s"] < eight["published_s"]
    assert 0.2 < eight["gap_share"] < 0.6
    lo, hi = eight["at_dbm_host_s"]
    assert lo < eight["published_s"] - eight["predicted_s"] < hi  # DBM's GPU idle time a sequence-step would
    for r in rows.values():  # a slower last engine adds seconds, less than any split's gap
        assert 0.0 < r["slowest_engine_s"] < r["published_s"] - r["predicted_s"], r["key"]


def test_logprob_copy_is_linear_in_tokens(bench):
    """NeMo-RL's per-token copy of the log-probs (0-d tensor index) costs microseconds a token, the same at 2×
    the tokens: a per-token cost, as host_parts counts it."""
    host, _ = bench
    one = min(host.logprob_copy_s([200] * 8) for _ in range(3))
    two = min(host.logprob_copy_s([400] * 8) for _ in range(3))
    assert 0.2e-6 < one / 1600 < 50e-6
    assert two / one == pytest.approx(2.0, rel=0.5)
