"""Watching a run from inside its workers: peak memory per task, and every step's metrics in TensorBoard.

Peak memory: each rank measures its own process (one process per plan device), per phase of the step. On CPU
that is the resident-set high-water mark (`VmHWM`), which Linux lets a process reset by writing `5` to
/proc/self/clear_refs, so each phase gets its own peak for the price of two small /proc accesses. On a GPU it
is torch's `max_memory_allocated`, reset before each phase. Rank 0 gathers them into the metrics line as
`peak_memory_bytes[device][phase]` and `memory_measure[device]`.

TensorBoard: rank 0 logs each metrics line through accelerate's TensorBoardTracker (the logger RL users
already read) into runs/ID/tensorboard/, only when the `tensorboard` package is importable and the launch did
not switch it off (`hetrl run --no-tensorboard`). Tracking is a side channel: if writing the events fails,
the run warns once and carries on.
"""

from __future__ import annotations

import importlib.util
import math
import re
import resource
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MEASURE_RSS = "rss"
"""The process's resident-set high-water mark, reset before each phase (Linux)."""
MEASURE_RSS_LIFETIME = "rss_lifetime"
"""The process's peak RSS since it started (where the high-water mark cannot be reset)."""
MEASURE_CUDA = "cuda_max_allocated"
TENSORBOARD_DIR = "tensorboard"
_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")
_HWM = re.compile(r"^VmHWM:\s+(\d+)\s+kB", re.M)


class PeakMemory:
    """The peak memory of this process's device between `reset()` and `peak_bytes()`."""

    def __init__(self, device: str) -> None:
        self.device = device
        if device.startswith("cuda"):
            self.measure = MEASURE_CUDA
        else:
            self.measure = MEASURE_RSS if _reset_hwm() else MEASURE_RSS_LIFETIME

    def reset(self) -> None:
        if self.measure == MEASURE_CUDA:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.measure == MEASURE_RSS:
            _reset_hwm()

    def peak_bytes(self) -> int:
        if self.measure == MEASURE_CUDA:
            import torch

            return int(torch.cuda.max_memory_allocated(self.device))
        return rss_high_water_bytes()


def _reset_hwm() -> bool:
    """Reset the RSS high-water mark to the current RSS; False where the kernel does not allow it."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def rss_high_water_bytes() -> int:
    """VmHWM of this process (ru_maxrss where /proc is missing)."""
    try:
        match = _HWM.search(_STATUS.read_text())
    except OSError:
        match = None
    if match:
        return int(match.group(1)) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def memory_fields(devices: Sequence[str], reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The metrics-line fields from every rank's `memory` report entry ([measure, {phase: bytes}]).

    >>> memory_fields(["h/0", "h/1"], [{"rank": 1, "memory": ["rss", {"generation": 5}]}, {"rank": 0}])
    {'peak_memory_bytes': {'h/1': {'generation': 5}}, 'memory_measure': {'h/1': 'rss'}}
    """
    peaks: dict[str, dict[str, int]] = {}
    measures: dict[str, str] = {}
    for rep in reports:
        if "memory" in rep:
            measure, phases = rep["memory"]
            device = devices[rep["rank"]]
            peaks[device] = {name: int(value) for name, value in phases.items()}
            measures[device] = measure
    return {"peak_memory_bytes": peaks, "memory_measure": measures} if peaks else {}


# ---- TensorBoard ------------------------------------------------------------------------------------------

SCALARS = {
    "reward_mean": "reward/mean",
    "reward_std": "reward/std",
    "kl_ref_k3": "kl/reference_k3",
    "kl": "kl/actor_loss_term",
    "response_length_mean": "response/length_mean",
    "response_tokens": "response/tokens",
    "pg_loss": "loss/policy",
    "vf_loss": "loss/value",
    "clip_frac": "train/clip_frac",
    "grad_norm": "train/grad_norm",
    "step_s": "time/step_s",
    "weight_sync_s": "time/weight_sync_s",
    "tokens_per_s": "throughput/tokens_per_s",
    "generation_tokens_per_s": "throughput/generation_tokens_per_s",
}
"""Metrics-line field -> TensorBoard tag (slash groups become TensorBoard's sections)."""


def scalars(line: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of one metrics line: the fields above, per-phase seconds and per-device peaks.

    >>> scalars({"step": 3, "reward_mean": 0.5, "seconds": {"generation": 1.5},
    ...          "peak_memory_bytes": {"h/0": {"generation": 7, "actor_train": 9}}})
    {'reward/mean': 0.5, 'time/generation_s': 1.5, 'memory/h/0/peak_bytes': 9.0}
    """
    out = {tag: float(line[key]) for key, tag in SCALARS.items() if isinstance(line.get(key), int | float)}
    for phase, value in line.get("seconds", {}).items():
        out[f"time/{phase}_s"] = float(value)
    for device, phases in line.get("peak_memory_bytes", {}).items():
        if phases:
            out[f"memory/{device}/peak_bytes"] = float(max(phases.values()))
    return {tag: value for tag, value in out.items() if math.isfinite(value)}


def tensorboard_available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


class MetricsTracker:
    """accelerate's TensorBoardTracker on rank 0, writing runs/ID/tensorboard/."""

    def __init__(self, run_root: Path, first_step: int = 1) -> None:
        from accelerate.tracking import TensorBoardTracker

        _accelerate_state()
        self.logdir = Path(run_root) / TENSORBOARD_DIR
        # A resumed run repeats the steps after its last checkpoint: purge_step hides the earlier events of
        # those steps, so TensorBoard shows one curve instead of a zig-zag.
        purge = {"purge_step": first_step} if first_step > 1 else {}
        self.tracker = TensorBoardTracker(run_name=TENSORBOARD_DIR, logging_dir=str(run_root), **purge)
        self.tracker.main_process_only = False  # only rank 0 makes one; no need to ask accelerate's state
        self.tracker.start()
        self.broken = False

    def log(self, line: dict[str, Any]) -> None:
        """Log one metrics line at its step (accelerate flushes after each call); warn once on failure."""
        if self.broken:
            return
        try:
            self.tracker.log(scalars(line), step=int(line["step"]))
        except Exception as exc:  # a full disk must not end the run
            self.broken = True
            print(f"warning: TensorBoard logging stopped: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if not self.broken:
            self.tracker.finish()


def _accelerate_state() -> None:
    """accelerate's trackers log through its logger, which needs its PartialState. Created after our process
    group exists it adopts it; it may also pick a thread count and a CUDA device, so both are put back."""
    import torch
    from accelerate.state import PartialState

    if PartialState._shared_state:
        return
    threads = torch.get_num_threads()
    cuda = torch.cuda.current_device() if torch.cuda.is_available() else None
    PartialState()
    torch.set_num_threads(threads)
    if cuda is not None:
        torch.cuda.set_device(cuda)


def open_tracker(run_root: Path, enabled: bool, first_step: int = 1) -> MetricsTracker | None:
    """The rank-0 tracker, or None when switched off or tensorboard is not installed."""
    if not enabled or not tensorboard_available():
        return None
    try:
        return MetricsTracker(run_root, first_step)
    except Exception as exc:
        print(f"warning: no TensorBoard logging: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return None
