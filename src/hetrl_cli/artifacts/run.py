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
    peak_memory_bytes: int | None = None


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
    error: str | None = None
