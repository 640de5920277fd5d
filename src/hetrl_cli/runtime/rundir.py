"""The run directory `runs/ID/`: what a run was given, what it measured, and where it can resume from.

```
runs/ID/
  plan.json  workload.json    the inputs, as run
  launch.json                 LaunchManifest: rank -> device, steps, engine, timeouts (launcher writes it)
  metrics.jsonl               one line a completed step (rank 0 writes it)
  checkpoints/step-000010/    actor.pt, critic.pt, meta.json; renamed into place only when complete
  checkpoints/latest          name of the newest complete checkpoint
  logs/rank-N.log|.pid|.error worker output, pid (so the launcher can stop it), traceback on failure
  models/                     the tiny model build (when the workload uses it)
  tensorboard/                TensorBoard events of every step (rank 0, when tensorboard is installed)
  summary.json                RunSummary: measured vs predicted per task
```
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import Field

from hetrl_cli.artifacts.base import Strict
from hetrl_cli.artifacts.io import write_text_atomic
from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.run import DeviceMemory, RunSummary, TaskMeasurement

KEEP_CHECKPOINTS = 2


class LaunchManifest(Strict):
    """What the launcher tells every worker, beyond the plan."""

    run_id: str
    devices: list[str]
    """devices[rank]: the plan device that rank stands for (layout.plan_devices order)."""
    steps: int = Field(gt=0)
    """Total steps of the run; a resumed run continues up to this."""
    checkpoint_every: int = Field(ge=0)
    """Checkpoint every N steps (and after the last); 0 = only after the last."""
    engine: str
    """Rollout engine: hf or vllm."""
    collective_timeout_s: float = Field(gt=0)
    resume: bool = False
    backend: str = "gloo"
    """torch.distributed backend of the world group: gloo on CPU, `cpu:gloo,cuda:nccl` on GPUs."""
    verify_weights: bool = False
    """Record trainer and engine weight checksums in every metrics line (hashes all weights: tests, debugging)."""
    tensorboard: bool = True
    """Rank 0 also logs every step to tensorboard/ (when the tensorboard package is importable)."""


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RunDir:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    plan = property(lambda self: self.root / "plan.json")
    workload = property(lambda self: self.root / "workload.json")
    manifest = property(lambda self: self.root / "launch.json")
    metrics = property(lambda self: self.root / "metrics.jsonl")
    summary = property(lambda self: self.root / "summary.json")
    checkpoints = property(lambda self: self.root / "checkpoints")
    logs = property(lambda self: self.root / "logs")
    models = property(lambda self: self.root / "models")

    def log(self, rank: int, kind: str) -> Path:
        """logs/rank-N.<kind> (kind: log, pid, error, done)."""
        return self.logs / f"rank-{rank}.{kind}"

    # metrics ----------------------------------------------------------------------------------------------
    def append_metrics(self, record: dict[str, Any]) -> None:
        with open(self.metrics, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics.exists():
            return []
        out = []
        for line in self.metrics.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a torn last line from a killed run: everything before it is intact
        return out

    def truncate_metrics(self, last_step: int) -> None:
        """Keep the lines of steps <= last_step (the ones the resumed checkpoint contains)."""
        kept = [m for m in self.read_metrics() if m.get("step", 0) <= last_step]
        write_text_atomic(self.metrics, "".join(json.dumps(m, sort_keys=True) + "\n" for m in kept))

    # checkpoints ------------------------------------------------------------------------------------------
    def staging(self, step: int) -> Path:
        path = self.checkpoints / f".step-{step:06d}.tmp"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def finalize_checkpoint(self, step: int, meta: dict[str, Any]) -> Path:
        """Write meta.json into the staging dir, rename it into place, point `latest` at it, prune old ones."""
        staging = self.staging(step)
        write_text_atomic(staging / "meta.json", json.dumps(meta, indent=2, sort_keys=True) + "\n")
        final = self.checkpoints / f"step-{step:06d}"
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
        write_text_atomic(self.checkpoints / "latest", final.name + "\n")
        complete = sorted(p for p in self.checkpoints.glob("step-*") if p.is_dir())
        for old in complete[:-KEEP_CHECKPOINTS]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        """(step, directory) of the newest complete checkpoint, or None."""
        pointer = self.checkpoints / "latest"
        if not pointer.exists():
            return None
        path = self.checkpoints / pointer.read_text(encoding="utf-8").strip()
        if not (path / "meta.json").exists():
            return None
        return int(json.loads((path / "meta.json").read_text(encoding="utf-8"))["step"]), path


def save_torch_atomic(obj: Any, path: Path) -> None:
    """torch.save via a temp file and rename (a checkpoint file is never half written)."""
    import torch

    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _measurement(task: str, predicted: float | None, measured: list[float]) -> TaskMeasurement | None:
    value = _median(measured)
    if value is None:
        return None
    error = (predicted - value) / value if predicted is not None and value > 0 else None
    return TaskMeasurement(task=task, predicted_s=predicted, measured_s=value, error=error)


def measured_peaks(metrics: list[dict[str, Any]]) -> tuple[dict[str, dict[str, int]], dict[str, str]]:
    """Per device, the largest peak of each phase over every step (warm-up included: a peak is a peak),
    and what was measured there."""
    peaks: dict[str, dict[str, int]] = {}
    measures: dict[str, str] = {}
    for m in metrics:
        for device, phases in m.get("peak_memory_bytes", {}).items():
            mine = peaks.setdefault(device, {})
            for phase, value in phases.items():
                mine[phase] = max(mine.get(phase, 0), int(value))
        measures.update(m.get("memory_measure", {}))
    return peaks, measures


def device_memory(plan: Plan, metrics: list[dict[str, Any]]) -> list[DeviceMemory]:
    """Predicted (the plan's largest TaskPlan.memory_bytes per device) vs measured peak, per device."""
    peaks, measures = measured_peaks(metrics)
    predicted = plan.peak_memory()
    return [
        DeviceMemory(
            device=device,
            measure=measures.get(device, "unknown"),
            predicted_bytes=predicted.get(device),
            peak_bytes=max(phases.values()),
            tasks=dict(sorted(phases.items())),
        )
        for device, phases in peaks.items()
        if phases
    ]


def task_memory(plan: Plan, memory: list[DeviceMemory], task: str) -> tuple[int | None, int | None]:
    """(predicted, measured) peak of `task`: the largest over the devices it runs on."""
    spec = next((t for t in plan.tasks if t.task == task), None)
    predicted = max(spec.memory_bytes.values()) if spec is not None and spec.memory_bytes else None
    found = [d.tasks[task] for d in memory if task in d.tasks]
    return predicted, max(found) if found else None


def summarize(
    plan: Plan, run_id: str, metrics: list[dict[str, Any]], status: str, started_at: str, error: str | None = None
) -> RunSummary:
    """Measured (median over steps, the first step excluded as warm-up when there are more) vs predicted;
    peak memory per device and task over the whole run."""
    steady = metrics[1:] if len(metrics) > 2 else metrics
    memory = device_memory(plan, metrics)
    tasks = []
    for task in plan.tasks:
        found = [m["seconds"][task.task] for m in steady if task.task in m.get("seconds", {})]
        item = _measurement(task.task, task.predicted.total_s or None, found)
        if item:
            item.predicted_memory_bytes, item.peak_memory_bytes = task_memory(plan, memory, task.task)
            tasks.append(item)
    sync = _measurement(
        "weight_sync", plan.cost.weight_sync_s or None, [m["weight_sync_s"] for m in steady if "weight_sync_s" in m]
    )
    if sync:
        tasks.append(sync)
    iteration = _measurement("iteration", plan.cost.iteration_s, [m["step_s"] for m in steady if "step_s" in m])
    return RunSummary(
        run_id=run_id,
        plan_name=plan.name,
        profile_fingerprint=plan.profile_fingerprint,
        steps=max((m["step"] for m in metrics), default=0),
        status=status,  # type: ignore[arg-type]
        started_at=started_at,
        finished_at=now_iso(),
        iteration=iteration,
        tasks=tasks,
        memory=memory,
        error=error,
    )
