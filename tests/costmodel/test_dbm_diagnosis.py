"""bench/dbm_diagnosis.py: the measured cause docs/benchmarks.md records for the Qwen2.5-3B offline batch on an
RTX 4090 ("Why the 3B offline batch is over-predicted") holds on today's cost model: the page's own GPU UTL row
splits each run into kernel time, which the cost model prices, and host time, about the same seconds for every
model, which it does not; the other candidates are small or model-independent."""

from __future__ import annotations

import math

import pytest

from benchload import bench_module

THREE_B = "databasemart/qwen2.5-3b/rtx4090/offline"
PRICED = ("databasemart/r1-distill-llama-8b/rtx4090/offline", "databasemart/r1-distill-qwen-7b/rtx4090/offline",
          THREE_B)  # fmt: skip


@pytest.fixture(scope="module")
def diag():
    with bench_module("dbm_diagnosis") as module:
        yield module


@pytest.fixture(scope="module")
def result(diag):
    return diag.run()


def _row(result, key):
    return next(r for r in result["rows"] if r["key"] == key)


def test_the_gpu_idle_share_accounts_for_the_3b_miss(result):
    """The 3B is priced 1.47x too fast; its GPU ran kernels 64 % of the time (ln 1/0.64 = 0.45 >= ln 1.47 =
    0.39), and the cost model's time is within 10 % of the kernel time the page implies."""
    r = _row(result, THREE_B)
    assert r["pred_over_pub_rate"] > 1.4  # the miss the diagnosis is about
    assert -math.log(r["gpu_util"][0]) >= 0.9 * math.log(r["pred_over_pub_rate"])
    assert 0.9 < r["pred_over_busy"][0] < 1.1


def test_priced_time_tracks_kernel_time_and_host_seconds_are_model_independent(result):
    """All three priced figures: predicted / kernel time within 0.95-1.25 while their pred/pub runs 1.02-1.47;
    the host seconds per sequence-step (duration x (1 - GPU UTL) / 180,000) lie within 40-80 µs for every model
    of the table, the 1.5B diagnostic included."""
    for key in PRICED:
        lo, hi = _row(result, key)["pred_over_busy"]
        assert lo > 0.95 and hi < 1.25, key
    for r in result["rows"]:
        lo, hi = r["idle_us_per_sequence_step"]
        assert lo > 40.0 and hi < 81.0, r["key"]


def test_max_num_seqs_waves_at_a_fixed_length(result):
    """At a fixed 600 tokens vLLM runs the 3B as a wave of 256 and one of 44 (1,200 steps), where the cost model
    refills the batch (703 steps): worth 1.47 -> 1.29 at most, and nothing for the 7B and the 8B."""
    r = _row(result, THREE_B)
    assert round(r["priced_steps"]) == 703 and round(r["wave_steps"]) == 1200
    assert 1.2 < r["waves_pred_over_pub_rate"] < 1.35
    for key in PRICED[:2]:
        assert abs(_row(result, key)["waves_pred_over_pub_rate"] / _row(result, key)["pred_over_pub_rate"] - 1) < 0.03


def test_a_per_sequence_host_cost_would_break_the_fit_set(result):
    """50 µs a sequence-step closes the 3B (1.01) but takes the fit set's vLLM 0.6.0 batch of 256 on an H100 to
    0.73 and the fit set's max |ln| from 0.165 to 0.32: not a constant of the engine the fit set measures."""
    base, _, fifty = result["host_cost_sweep"]
    assert fifty["per_sequence_s"] == pytest.approx(5e-5)
    assert abs(math.log(fifty["ratios"][THREE_B])) < 0.05
    assert fifty["fit"]["max_abs_ln"] > base["fit"]["max_abs_ln"] + 0.1


def test_sampler_and_gemm_tiles_do_not_single_out_the_3b(result):
    """The logits traffic is ~1.5 % of the 3B's priced step; the tile-quantisation share is the same for the
    3B at 256 sequences as for the 8B fit figure at 62 (both ~0.44)."""
    assert result["sampler"]["share_of_step"] < 0.03
    tiles = result["gemm_tiles"]
    assert abs(tiles["qwen2.5-3b at 256"] - tiles["llama-3.1-8b at 62"]) < 0.05


def test_instruct_models_stop_early_on_the_vendors_runs(result):
    """The same vendor's A40 runs (same 100 in / 600 out) generated 58-92 % of the requested tokens: early stops
    shorten the published run, the opposite direction of the miss."""
    shares = result["early_stop"].values()
    assert all(0.5 < s < 0.95 for s in shares)
