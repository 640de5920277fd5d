"""runtime/tracking.py: per-phase peak memory of a worker process, and the TensorBoard scalars of a metrics line.
The TensorBoard events of a real run are read back in test_run_watch.py."""

from __future__ import annotations

from hetrl_cli.runtime.tracking import MEASURE_RSS, PeakMemory, open_tracker, scalars
from hetrl_cli.runtime.worker import Timer

MIB = 2**20


def test_peak_rss_is_reset_between_phases() -> None:
    """A phase that touches 200 MiB peaks at least that much above the next phase, which allocates nothing."""
    meter = PeakMemory("cpu")
    assert meter.measure == MEASURE_RSS
    timer = Timer(meter)
    with timer.phase("big"):
        block = bytearray(200 * MIB)  # zero-filled: every page is touched
        del block
    with timer.phase("small"):
        pass
    assert timer.peak["big"] - timer.peak["small"] > 150 * MIB
    assert set(timer.seconds) == {"big", "small"}


def test_a_timer_without_a_meter_records_no_memory() -> None:
    timer = Timer()
    with timer.phase("generation"):
        pass
    assert timer.peak == {} and "generation" in timer.seconds


def test_scalars_of_a_full_metrics_line() -> None:
    line = {
        "step": 2,
        "reward_mean": 0.25,
        "reward_std": 0.1,
        "kl_ref_k3": 0.002,
        "vf_loss": 0.7,
        "weight_sync_s": 0.01,
        "seconds": {"generation": 1.0, "critic_train": 0.5},
        "peak_memory_bytes": {"h/0": {"generation": 3, "actor_train": 5}, "h/1": {"reward": 2}},
        "memory_measure": {"h/0": "rss", "h/1": "rss"},
        "engine_checksums": ["abc"],
        "mode": "sync",
        "grad_norm": float("nan"),  # a diverged step: left out, TensorBoard cannot plot it
    }
    assert scalars(line) == {
        "reward/mean": 0.25,
        "reward/std": 0.1,
        "kl/reference_k3": 0.002,
        "loss/value": 0.7,
        "time/weight_sync_s": 0.01,
        "time/generation_s": 1.0,
        "time/critic_train_s": 0.5,
        "memory/h/0/peak_bytes": 5.0,
        "memory/h/1/peak_bytes": 2.0,
    }


def test_switched_off_tracking_makes_no_tracker(tmp_path) -> None:
    assert open_tracker(tmp_path, enabled=False) is None
    assert not (tmp_path / "tensorboard").exists()


def test_a_resumed_run_replaces_the_steps_it_repeats(tmp_path) -> None:
    """Steps 1-4 logged, the run resumes from the checkpoint after step 2: TensorBoard shows steps 1-4 once,
    steps 3-4 with the resumed run's values."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = open_tracker(tmp_path, enabled=True)
    for step in range(1, 5):
        first.log({"step": step, "reward_mean": float(step)})
    first.close()
    resumed = open_tracker(tmp_path, enabled=True, first_step=3)
    for step in range(3, 5):
        resumed.log({"step": step, "reward_mean": 10.0 * step})
    resumed.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    seen = [(e.step, e.value) for e in acc.Scalars("reward/mean")]
    assert seen == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
