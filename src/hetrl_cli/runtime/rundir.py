"""The run directory `runs/ID/`: what a run was given, what it measured, and where it can resume from.

```
runs/ID/
  plan.json  workload.json    the inputs, as run
  launch.json                 LaunchManifest: rank -> device, steps, engine, timeouts (launcher writes it)
  metrics.jsonl               one line a completed step (rank 0 writes it)
  checkpoints/step-000010/    rank-N.safetensors, index.json, meta.json (runtime/checkpoint.py); renamed into
                              place only when complete
  checkpoints/latest          name of the newest complete checkpoint
  logs/rank-N.log|.pid|.error worker output, pid (so the launcher can stop it), traceback on failure
  models/                     the tiny model build (when the workload uses it)
  tensorboard/                TensorBoard events of every step (rank 0, when tensorboard is installed)
  summary.json                RunSummary: measured vs predicted per task
```

A run directory is private to the user: the launcher makes it 0700 and everything of the run (launcher,
workers, remote hosts) writes under umask 077, so files are 0600 and folders 0700 whatever the user's umask.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import Field

from hetrl_cli.artifacts.base import Strict
from hetrl_cli.artifacts.io import write_text_atomic
from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.run import DeviceMemory, RunSummary, TaskMeasurement
from hetrl_cli.errors import BadInput, Unwritable

KEEP_CHECKPOINTS = 2
PRIVATE_UMASK = 0o077
"""The umask of everything a run writes: files 0600, folders 0700."""
MAX_STEP = 2**53
"""Largest step number a metrics line may carry (beyond it a float cannot tell steps apart)."""


@contextlib.contextmanager
def private_files() -> Iterator[None]:
    """Within the block this process creates files 0600 and folders 0700 (umask 077); the umask is restored
    after. Process-wide: the launcher holds it while it prepares, launches and summarises a run."""
    previous = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(previous)


def make_private_dir(path: Path) -> None:
    """Create the run directory `path` (and missing parents) 0700. An existing one is made 0700 when it is empty
    or already a run (--resume), never a folder of other things someone passed as --run-dir (e.g. /tmp)."""
    created = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        if created or (path / "plan.json").is_file() or not any(path.iterdir()):
            os.chmod(path, 0o700)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise Unwritable(f"{path}: cannot make the run directory ({why}); choose a --run-dir of your own") from None


@dataclass
class MetricsRead:
    """metrics.jsonl as read: the usable lines, and the ones skipped as (line number, why)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)

    def warning(self, path: Path) -> str | None:
        """One line about the skipped lines, naming the file and the first of them (None when none was)."""
        if not self.skipped:
            return None
        number, why = self.skipped[0]
        count = len(self.skipped)
        what = "1 line that is not a metrics line" if count == 1 else f"{count} lines that are not metrics lines"
        return f"{path}:{number}: {why}; skipped {what}, showing the rest"


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def metrics_problem(record: Any) -> str | None:
    """Why a parsed metrics line is unusable, or None. Checks what the readers index without `.get`: the step,
    the start time, per-task seconds, step and sync seconds, and the per-device memory peaks."""
    if not isinstance(record, dict):
        return "not a JSON object"
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not 1 <= step <= MAX_STEP:
        return "no step number from 1 up"
    if "time" in record and not isinstance(record["time"], str):
        return "'time' is not a string"
    for key in ("step_s", "weight_sync_s"):
        if key in record and not _finite(record[key]):
            return f"'{key}' is not a finite number"
    seconds = record.get("seconds", {})
    if not isinstance(seconds, dict) or not all(_finite(v) for v in seconds.values()):
        return "'seconds' is not an object of finite numbers"
    peaks = record.get("peak_memory_bytes", {})
    if not isinstance(peaks, dict) or not all(
        isinstance(phases, dict) and all(_finite(v) and 0 <= v < 2**63 for v in phases.values())
        for phases in peaks.values()
    ):
        return "'peak_memory_bytes' is not an object of byte counts per device"
    measures = record.get("memory_measure", {})
    if not isinstance(measures, dict) or not all(isinstance(v, str) for v in measures.values()):
        return "'memory_measure' is not an object of strings"
    return None


def _metrics_int(text: str) -> int:
    """An integer of a metrics line: at most 300 digits, so that every reader may take it as a float."""
    if len(text.lstrip("-")) > 300:
        raise ValueError("too many digits")
    return int(text)


def parse_metrics(text: str) -> MetricsRead:
    """The lines of a metrics.jsonl, each parsed and checked; bad ones (a torn last line of a killed run,
    garbage) are skipped with their line number instead of failing every reader."""
    read = MetricsRead()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line, parse_int=_metrics_int)
        except json.JSONDecodeError:
            read.skipped.append((number, "not valid JSON"))
            continue
        except ValueError:  # an integer no float can hold (past 1e308; Python's digit limit)
            read.skipped.append((number, "a number too long to be a measurement"))
            continue
        except RecursionError:
            read.skipped.append((number, "nested too deeply"))
            continue
        problem = metrics_problem(record)
        if problem:
            read.skipped.append((number, problem))
        else:
            read.records.append(record)
    return read


class LaunchManifest(Strict):
    """What the launcher tells every worker, beyond the plan."""

    run_id: str
    devices: list[str]
    """devices[rank]: the plan device that rank stands for (layout.plan_devices order)."""
    steps: int = Field(gt=0)
    """Total steps of the run; a resumed run continues up to this."""
    checkpoint_every: int = Field(ge=0)
    """Checkpoint every N steps; 0 = none between the first and the last step."""
    checkpoint_last: bool = True
    """Also checkpoint after the last step (`--checkpoint-every 0` turns every checkpoint off)."""
    resume_from: str | None = None
    """--resume: the checkpoint folder (checkpoints/step-N) the launcher chose and verified."""
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
        fd = os.open(self.metrics, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with open(fd, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def read_metrics(self) -> list[dict[str, Any]]:
        """The usable metrics lines (see read_metrics_checked for the skipped ones)."""
        return self.read_metrics_checked().records

    def read_metrics_checked(self) -> MetricsRead:
        if not self.metrics.exists():
            return MetricsRead()
        if not self.metrics.is_file():  # a folder, or a link to /dev/zero or a FIFO: reading would never end
            raise BadInput(f"{self.metrics}: not a regular file; remove it or give the run directory as written")
        return parse_metrics(self.metrics.read_text(encoding="utf-8", errors="replace"))

    def truncate_metrics(self, last_step: int) -> None:
        """Keep the lines of steps <= last_step (the ones the resumed checkpoint contains)."""
        kept = [m for m in self.read_metrics() if m.get("step", 0) <= last_step]
        write_text_atomic(self.metrics, "".join(json.dumps(m, sort_keys=True) + "\n" for m in kept))

    # checkpoints ------------------------------------------------------------------------------------------
    def staging(self, step: int) -> Path:
        path = self.checkpoints / f".step-{step:06d}.tmp"
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path

    def finalize_checkpoint(self, step: int, meta: dict[str, Any]) -> Path:
        """Write meta.json into the staging dir, rename it into place, point `latest` at it, prune old ones."""
        staging = self.staging(step)
        write_text_atomic(staging / "meta.json", sealed_json(meta))
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


def sealed_json(body: dict[str, Any]) -> str:
    """`body` as canonical JSON (sorted keys, indent 1) with `sha256` of that text added: any change to the file,
    even one that keeps it valid JSON, is found by read_sealed_json."""
    plain = {k: v for k, v in body.items() if k != "sha256"}
    digest = hashlib.sha256(_canonical(plain).encode()).hexdigest()
    return _canonical({**plain, "sha256": digest})


def read_sealed_json(text: str) -> tuple[str | None, dict[str, Any]]:
    """(problem or None, body without its seal) of a sealed_json text."""
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        return "not valid JSON", {}
    if not isinstance(body, dict) or not isinstance(body.get("sha256"), str):
        return "not a sealed JSON object (no sha256)", {}
    if text != _canonical(body):
        return "altered (not the text hetrl wrote)", {}
    plain = {k: v for k, v in body.items() if k != "sha256"}
    if hashlib.sha256(_canonical(plain).encode()).hexdigest() != body["sha256"]:
        return "checksum mismatch", {}
    return None, plain


def _canonical(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, allow_nan=False) + "\n"


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
