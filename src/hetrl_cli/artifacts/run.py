"""RunSummary: what a run measured against what its plan predicted."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from hetrl_cli.artifacts.base import Artifact, Strict


class TaskMeasurement(Strict):
    task: str
    predicted_s: float | None = None
    measured_s: float
    """Median over the measured steps."""
    error: float | None = None
    """(predicted - measured) / measured."""
    predicted_memory_bytes: int | None = None
    """Largest per-device memory the plan predicts while this task runs."""
    peak_memory_bytes: int | None = None
    """Largest peak measured on the task's devices while it ran (over every step)."""


class DeviceMemory(Strict):
    """One device: the plan's predicted peak against the peak its rank measured, over the whole run."""

    device: str
    measure: str
    """What was measured: `rss` (the process's resident set high-water mark per task, CPU) or
    `cuda_max_allocated` (torch.cuda.max_memory_allocated, reset before each task)."""
    predicted_bytes: int | None = None
    """Largest TaskPlan.memory_bytes of this device over the plan's tasks."""
    peak_bytes: int
    """Largest measured peak over the tasks and steps."""
    tasks: dict[str, int] = Field(default_factory=dict)
    """Measured peak per task (phase) on this device."""


class RunSummary(Artifact):
    KIND: ClassVar[str] = "run-summary"
    SCHEMA_VERSION: ClassVar[int] = 1

    kind: Literal["run-summary"] = "run-summary"
    run_id: str
    plan_name: str
    profile_fingerprint: str
    steps: int
    status: Literal["completed", "failed", "interrupted"]
    started_at: str
    finished_at: str | None = None
    iteration: TaskMeasurement | None = None
    tasks: list[TaskMeasurement] = Field(default_factory=list)
    memory: list[DeviceMemory] = Field(default_factory=list)
    """Per device, predicted vs measured peak memory (empty when the workers recorded none)."""
    error: str | None = None
