"""`validate_run(run_dir) -> Validation`: a run's measured seconds against the cost model's, per task.

Measured = the median over the steps after warm-up of metrics.jsonl (`seconds[task]` is the slowest replica;
`weight_sync_s`; `step_s`). Predicted = the plan's own figures, or the plan re-scored with a calibration.
The `*_transfer` phases are not compared: the runtime's figure includes waiting for the slowest sender.
Memory: per device, the plan's largest TaskPlan.memory_bytes against the largest peak the worker measured over
every step (`peak_memory_bytes` in metrics.jsonl; on CPU the process's resident set, see runtime/tracking.py).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from hetrl_cli.artifacts.calibration import Comparison, Validation
from hetrl_cli.artifacts.io import load_artifact, save_artifact
from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.errors import BadInput

VALIDATION_FILE = "validation.json"
NO_MEMORY_NOTE = "peak memory: not recorded (metrics.jsonl has no memory figures: a run from an older hetrl)"
RSS_NOTE = (
    "peak memory on CPU is the worker process's resident set (interpreter, libraries and every role it holds), "
    "so it sits above the plan's model-state prediction"
)


def load_run(run_dir: str | Path) -> tuple[Plan, list[dict[str, Any]]]:
    """The plan a run executed and its metrics lines (BadInput when the directory is not a run)."""
    from hetrl_cli.runtime.rundir import RunDir

    run = RunDir(run_dir)
    if not run.plan.is_file():
        raise BadInput(f"{run_dir}: no plan.json there; give a run directory made by 'hetrl run' or 'hetrl validate'")
    plan = load_artifact(run.plan, Plan)
    metrics = run.read_metrics()
    if not metrics:
        raise BadInput(f"{run_dir}: metrics.jsonl has no completed step; run the plan for at least one step")
    return plan, metrics


def steady(metrics: list[dict[str, Any]], warmup: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The steps after `warmup` (all of them, with a note, when the run has no more than that)."""
    if warmup < 0:
        raise BadInput(f"--warmup must be 0 or more, got {warmup}")
    if len(metrics) > warmup:
        return metrics[warmup:], []
    return metrics, [f"only {len(metrics)} step(s), not more than --warmup {warmup}: the median includes warm-up"]


def measured_seconds(lines: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per task (plus `weight_sync` and `iteration`) the measured seconds of each step."""
    out: dict[str, list[float]] = {}
    for m in lines:
        for task, seconds in m.get("seconds", {}).items():
            if not task.endswith("_transfer"):
                out.setdefault(task, []).append(float(seconds))
        if "weight_sync_s" in m:
            out.setdefault("weight_sync", []).append(float(m["weight_sync_s"]))
        if "step_s" in m:
            out.setdefault("iteration", []).append(float(m["step_s"]))
    return out


def predicted_seconds(plan: Plan) -> dict[str, float]:
    """Per task (plus `weight_sync` and `iteration`) what the plan predicts."""
    out = {t.task: t.predicted.total_s for t in plan.tasks}
    out["weight_sync"] = plan.cost.weight_sync_s
    out["iteration"] = plan.cost.iteration_s
    return out


def compare(
    task: str, predicted: float | None, measured: list[float], memory: int | None = None, peak: int | None = None
) -> Comparison:
    value = statistics.median(measured) if measured else None
    error = None
    if predicted is not None and value:
        error = (predicted - value) / value
        error = error if math.isfinite(error) else None  # a hand-edited plan's 1e308 s: no error to average
    return Comparison(
        task=task,
        predicted_s=predicted,
        measured_s=value,
        error=error,
        steps=len(measured),
        predicted_memory_bytes=memory,
        peak_memory_bytes=peak,
    )


def abs_error_stats(errors: list[float]) -> tuple[float | None, float | None]:
    """(median, p90) of |error| (p90 by linear interpolation between order statistics)."""
    if not errors:
        return None, None
    import numpy as np

    values = np.abs(np.asarray(errors, dtype=float))
    return float(np.median(values)), float(np.percentile(values, 90))


def validate_run(
    run_dir: str | Path,
    warmup: int = 1,
    scored: Plan | None = None,
    predictions: str = "plan",
    write: bool = True,
) -> Validation:
    """Compare a run directory's measurements with `scored` (default: its plan.json) and, when `write`,
    save the result as validation.json there."""
    from hetrl_cli.runtime.rundir import device_memory, task_memory

    plan, metrics = load_run(run_dir)
    lines, notes = steady(metrics, warmup)
    measured = measured_seconds(lines)
    predicted = predicted_seconds(scored or plan)
    devices = device_memory(scored or plan, metrics)
    tasks = [
        compare(t.task, predicted[t.task], measured.get(t.task, []), *task_memory(scored or plan, devices, t.task))
        for t in plan.tasks
    ]
    tasks.append(compare("weight_sync", predicted["weight_sync"], measured.get("weight_sync", [])))
    missing = [c.task for c in tasks if c.measured_s is None]
    if missing:
        notes.append(f"no measurement for {', '.join(missing)}")
    median, p90 = abs_error_stats([c.error for c in tasks if c.error is not None])
    validation = Validation(
        run_id=Path(run_dir).resolve().name,
        plan_name=plan.name,
        profile_fingerprint=plan.profile_fingerprint,
        mode=plan.workload.mode,
        predictions=predictions,
        warmup=warmup,
        steps=len(metrics),
        iteration=compare("iteration", predicted["iteration"], measured.get("iteration", [])),
        tasks=tasks,
        median_abs_error=median,
        p90_abs_error=p90,
        memory=devices,
        notes=[*notes, *memory_notes(devices)],
    )
    if write:
        save_artifact(validation, Path(run_dir) / VALIDATION_FILE)
    return validation


def memory_notes(devices: list) -> list[str]:
    if not devices:
        return [NO_MEMORY_NOTE]
    return [RSS_NOTE] if any(d.measure.startswith("rss") for d in devices) else []


def validate_run_calibrated(
    run_dir: str | Path, warmup: int, calibration_file: str, profile_file: str | None = None
) -> Validation:
    """Validate a run against its plan re-scored with a calibration (made for the plan's profile), pricing the
    rollout engine the run used (inputs.run_engine: the hf engine's decode host work)."""
    from hetrl_cli.calibration.inputs import find_profile, load_calibration, run_engine
    from hetrl_cli.planner.build import rescore

    plan, _ = load_run(run_dir)
    cluster = find_profile(plan, profile_file)
    factors = load_calibration(calibration_file, cluster.fingerprint or cluster.compute_fingerprint()).factors()
    scored = rescore(plan, cluster, calibration=factors, engine=run_engine(run_dir))
    return validate_run(run_dir, warmup, scored=scored, predictions=f"calibration:{calibration_file}")


def validate_plan(
    plan: Plan,
    steps: int,
    warmup: int,
    run_dir: Path | None = None,
    engine: str = "auto",
    echo=None,
    allow_user_reward: bool = False,
) -> tuple[Path, Validation]:
    """Run `plan` for `steps` steps through the ordinary runtime (run_plan), then validate the run."""
    from hetrl_cli.runtime.api import RunOptions, run_plan

    if steps <= warmup:
        raise BadInput(f"--steps {steps} must exceed --warmup {warmup} so some steps are measured")
    options = RunOptions(steps=steps, run_dir=run_dir, engine=engine, allow_user_reward=allow_user_reward)
    if echo is not None:
        options.echo = echo
    summary = run_plan(plan, options)
    path = run_dir or Path("runs") / summary.run_id
    return path, validate_run(path, warmup)
