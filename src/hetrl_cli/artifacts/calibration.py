"""Validation (a run's predicted vs measured seconds) and Calibration (cost-model factors fitted from runs).

`hetrl validate` writes a Validation into the run directory (validation.json); `hetrl calibrate` writes a
Calibration next to the profile (profiles/NAME.calibration.json). docs/calibration.md describes both.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from hetrl_cli.artifacts.base import Artifact, Strict
from hetrl_cli.artifacts.run import DeviceMemory

MIN_FACTOR, MAX_FACTOR = 1e-6, 1e6
"""Bounds of a factor and of an overhead in seconds: the fit clips its factors to 1e-3..1e3 (calibration/fit.py);
beyond these a hand-edited 1e308 overflows the cost model into inf and NaN."""


class Comparison(Strict):
    """One task (or `weight_sync`, or `iteration`): the cost model's seconds against the run's."""

    task: str
    predicted_s: float | None = None
    measured_s: float | None = None
    """Median over the steps after warm-up."""
    error: float | None = None
    """(predicted - measured) / measured."""
    steps: int = 0
    """How many steps the median is over."""
    predicted_memory_bytes: int | None = None
    """Largest per-device peak the plan predicts for this task."""
    peak_memory_bytes: int | None = None
    """Largest peak measured on the task's devices while it ran; None for runs that recorded no memory."""


class Validation(Artifact):
    """What `hetrl validate` reports for one run directory."""

    KIND: ClassVar[str] = "validation"
    SCHEMA_VERSION: ClassVar[int] = 1

    kind: Literal["validation"] = "validation"
    run_id: str
    plan_name: str
    profile_fingerprint: str
    mode: str
    """sync or async (the workload's)."""
    predictions: str
    """Where the predicted seconds come from: `plan` (as planned) or `calibration:<file>` (re-scored)."""
    warmup: int
    steps: int
    """Steps in metrics.jsonl."""
    iteration: Comparison
    tasks: list[Comparison] = Field(default_factory=list)
    median_abs_error: float | None = None
    """Over `tasks` with both figures (weight sync included)."""
    p90_abs_error: float | None = None
    memory: list[DeviceMemory] = Field(default_factory=list)
    """Per device, the plan's predicted peak against the peak measured over the whole run."""
    notes: list[str] = Field(default_factory=list)


class DeviceFactors(Strict):
    compute: float = Field(1.0, ge=MIN_FACTOR, le=MAX_FACTOR)
    """Multiplies the profile's FLOP/s (on top of the efficiency priors in costmodel/constants.py)."""
    memory: float = Field(1.0, ge=MIN_FACTOR, le=MAX_FACTOR)
    """Multiplies the profile's memory bandwidth."""
    optimizer: float = Field(1.0, ge=MIN_FACTOR, le=MAX_FACTOR)
    """Multiplies the rate (on top of `memory`) the optimizer step moves its bytes at: an elementwise update
    that a fused GPU kernel streams at HBM speed and a CPU runs element by element."""


class LinkFactors(Strict):
    bandwidth: float = Field(1.0, ge=MIN_FACTOR, le=MAX_FACTOR)
    latency: float = Field(1.0, ge=MIN_FACTOR, le=MAX_FACTOR)


class Residual(Strict):
    """One fitted observation: a task of a run, before and after calibration (exact re-scores)."""

    run_id: str
    task: str
    measured_s: float
    before_s: float
    after_s: float
    error_before: float
    error_after: float


class Calibration(Artifact):
    """Efficiency factors and fixed overheads for one profile, fitted from measured runs."""

    KIND: ClassVar[str] = "calibration"
    SCHEMA_VERSION: ClassVar[int] = 1

    kind: Literal["calibration"] = "calibration"
    profile_name: str
    profile_fingerprint: str
    """The profile these factors are for; using them with another profile is refused."""
    created_at: str
    method: str
    """How the factors were fitted (one sentence; docs/calibration.md has the details)."""
    runs: list[str]
    """Run ids the fit used."""
    device_class: dict[str, DeviceFactors] = Field(default_factory=dict)
    """Keyed by Device.name."""
    link_class: dict[str, LinkFactors] = Field(default_factory=dict)
    """Keyed by link kind (loopback, nvlink, pcie, lan, wan, ...)."""
    task_overhead_s: dict[str, Annotated[float, Field(ge=0, le=MAX_FACTOR)]] = Field(default_factory=dict)
    """Fixed seconds added to a task per step (and `weight_sync` per sync): launch and Python overhead."""
    overhead_factor: dict[str, Annotated[float, Field(ge=0, le=MAX_FACTOR)]] = Field(default_factory=dict)
    """Multipliers on the cost model's built-in per-step host costs (`generation`: per decode step,
    `weight_sync`: per tensor); absent = 1."""
    residuals: list[Residual] = Field(default_factory=list)
    median_abs_error_before: float | None = None
    median_abs_error_after: float | None = None
    p90_abs_error_before: float | None = None
    p90_abs_error_after: float | None = None

    def factors(self) -> dict:
        """The dict `CostModel(..., calibration=)` reads."""
        return {
            "device_class": {k: v.model_dump() for k, v in self.device_class.items()},
            "link_class": {k: v.model_dump() for k, v in self.link_class.items()},
            "task_overhead_s": dict(self.task_overhead_s),
            "overhead_factor": dict(self.overhead_factor),
        }
