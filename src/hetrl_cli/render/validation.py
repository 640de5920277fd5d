"""Tables for `hetrl validate` (predicted vs measured per task) and `hetrl calibrate` (fitted factors).

Data only: the caller chooses the console (stdout for the report, per the CLI contract)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from hetrl_cli.artifacts.calibration import Calibration, Comparison, Validation
from hetrl_cli.render.digest import seconds
from hetrl_cli.render.run import size_text

if TYPE_CHECKING:
    from rich.console import Console


def _s(value: float | None) -> str:
    return "—" if value is None else seconds(value)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:+.0f} %"


def _row(table: Table, c: Comparison) -> None:
    peak = size_text(c.peak_memory_bytes) if c.peak_memory_bytes is not None else "not recorded"
    table.add_row(c.task, _s(c.predicted_s), _s(c.measured_s), _pct(c.error), str(c.steps),
                  size_text(c.predicted_memory_bytes), peak)  # fmt: skip


def print_memory(v: Validation, console: Console) -> None:
    """Predicted vs peak measured memory per device (the largest over its tasks and every step)."""
    if not v.memory:
        return
    table = Table(title="memory per device: predicted vs peak measured", title_justify="left")
    for name in ("device", "measure", "predicted", "peak measured", "peak/pred.", "peak during"):
        table.add_column(name, justify="left" if name in ("device", "measure", "peak during") else "right")
    for d in v.memory:
        ratio = f"{d.peak_bytes / d.predicted_bytes:.2f}×" if d.predicted_bytes else "—"
        during = max(d.tasks, key=lambda t: d.tasks[t]) if d.tasks else "—"
        table.add_row(d.device, d.measure, size_text(d.predicted_bytes), size_text(d.peak_bytes), ratio, during)
    console.print(table)


def print_validation(v: Validation, console: Console) -> None:
    """The per-task table, the iteration row, the error summary and the notes."""
    title = f"{v.run_id}: plan {v.plan_name} ({v.mode}), predictions from {v.predictions}"
    table = Table(title=title, title_justify="left")
    for name in ("task", "predicted", "measured (median)", "error", "steps", "pred. memory", "peak memory"):
        table.add_column(name, justify="left" if name == "task" else "right")
    for c in v.tasks:
        _row(table, c)
    table.add_section()
    _row(table, v.iteration)
    console.print(table)
    print_memory(v, console)
    if v.median_abs_error is not None:
        console.print(
            f"|error| over tasks: median {v.median_abs_error * 100:.0f} %, p90 {v.p90_abs_error * 100:.0f} % "
            f"(warm-up {v.warmup} of {v.steps} steps excluded)"
        )
    for note in v.notes:
        console.print(f"note: {note}")


def print_calibration(cal: Calibration, console: Console) -> None:
    """Fitted factors and the fit's error before/after."""
    table = Table(title=f"calibration for {cal.profile_name} ({cal.profile_fingerprint})", title_justify="left")
    for name in ("what", "name", "factor"):
        table.add_column(name)
    for name, f in cal.device_class.items():
        table.add_row("device compute", name, f"{f.compute:.3g}×")
        table.add_row("device memory", name, f"{f.memory:.3g}×")
    for kind, f in cal.link_class.items():
        table.add_row("link bandwidth / latency", kind, f"{f.bandwidth:.3g}× / {f.latency:.3g}×")
    for task, s in cal.task_overhead_s.items():
        table.add_row("fixed overhead", task, f"+{seconds(s)}")
    console.print(table)
    if cal.median_abs_error_before is not None:
        console.print(
            f"fit over {len(cal.residuals)} observations of {len(cal.runs)} run(s): |error| median "
            f"{cal.median_abs_error_before * 100:.0f} % → {cal.median_abs_error_after * 100:.0f} %, p90 "
            f"{cal.p90_abs_error_before * 100:.0f} % → {cal.p90_abs_error_after * 100:.0f} %"
        )
