"""`hetrl show runs/ID` and the live view of `hetrl run`: a run directory made readable.

`show` of a run draws, from metrics.jsonl and summary.json: a summary (plan, status, steps, step time,
tokens/s), one terminal sparkline per metric over the steps (reward, KL, response length, per-task and weight
sync seconds, ...), the measured-vs-predicted table per task and the predicted-vs-peak memory per device, in
the same three formats as plans (`table` on a terminal, `markdown`, `json`), plus `--svg` line charts
(hand-written SVG like the plan timeline, no plotting dependency). A run that is still going, or whose
launcher was killed, has no summary.json yet: its summary is derived from metrics.jsonl the same way
`hetrl run` would write it (runtime.rundir.summarize). Lines of metrics.jsonl that are not metrics lines the
runtime writes (a torn last line of a killed run, garbage, JSON without a step, non-finite or huge numbers)
are skipped, with one warning on stderr naming the file and the first such line.

The live view is a rich Live panel the launcher shows on a terminal while the workers run: the latest step,
reward, per-task seconds and tokens/s, re-read from metrics.jsonl as lines arrive (or parsed from rank 0's
`step ...` output line when the run directory is on another host). Every other worker line still prints,
above the panel.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape

from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.run import RunSummary
from hetrl_cli.errors import BadInput
from hetrl_cli.render import markdown
from hetrl_cli.render.console import make_console
from hetrl_cli.render.digest import seconds, si, task_order
from hetrl_cli.render.sections import Section
from hetrl_cli.render.svg import FONT, PALETTE, WIDTH, save_svg
from hetrl_cli.render.timeline import nice_ticks

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 40
"""Sparkline cells; longer runs are averaged into this many buckets."""
UNFINISHED = "unfinished"


# 1) The run, loaded ----------------------------------------------------------------------------------------


@dataclass
class RunView:
    """Everything `show` draws of one run directory."""

    root: Path
    plan: Plan
    metrics: list[dict[str, Any]]
    summary: RunSummary
    finished: bool
    """summary.json exists (the launcher saw the run end); otherwise the summary is derived from the metrics."""
    total_steps: int | None = None
    """The --steps the run was launched with (launch.json)."""
    engine: str | None = None
    workers: int | None = None
    warnings: list[str] = field(default_factory=list)
    """Printed on stderr before the run (skipped metrics lines)."""

    @property
    def status(self) -> str:
        return self.summary.status if self.finished else UNFINISHED

    @property
    def run_id(self) -> str:
        return self.root.resolve().name


def is_run_dir(path: str | Path) -> bool:
    """A directory is shown as a run; a file (or `-`) as a plan."""
    return str(path) != "-" and Path(path).is_dir()


def load_run_view(path: str | Path) -> RunView:
    """Read a run directory (BadInput, one line, when it is not one)."""
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.runtime.rundir import LaunchManifest, RunDir, now_iso, summarize

    run = RunDir(path)
    if not run.plan.is_file():
        raise BadInput(f"{path}: not a run directory (no plan.json); show takes a plan file or a runs/ID directory")
    plan = load_artifact(run.plan, Plan)
    read = run.read_metrics_checked()
    metrics = read.records
    finished = run.summary.is_file()
    if finished:
        summary = load_artifact(run.summary, RunSummary)
    else:
        started = str(metrics[0].get("time") or now_iso()) if metrics else now_iso()
        summary = summarize(plan, run.root.resolve().name, metrics, "interrupted", started)
    warning = read.warning(run.metrics)
    view = RunView(run.root, plan, metrics, summary, finished, warnings=[warning] if warning else [])
    if run.manifest.is_file():
        try:
            manifest = LaunchManifest.model_validate_json(run.manifest.read_text(encoding="utf-8"))
        except ValueError:
            manifest = None
        if manifest is not None:
            view.total_steps, view.engine, view.workers = manifest.steps, manifest.engine, len(manifest.devices)
    return view


# 2) Series over steps --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    key: str
    """Machine name (the JSON key): a metrics field, or `seconds.<task>`."""
    label: str
    unit: str
    """`s` (formatted as seconds), `tokens`, `/s` or `` (a plain number)."""
    values: list[float | None]
    predicted: float | None = None
    """The plan's figure for it (per-task and weight sync seconds, step time)."""


SCALAR_SERIES = (
    ("reward_mean", "reward (mean)", ""),
    ("kl_ref_k3", "KL to reference (k3)", ""),
    ("response_length_mean", "response length", "tokens"),
    ("step_s", "step time", "s"),
    ("tokens_per_s", "tokens/s", "/s"),
)


def run_series(view: RunView) -> list[Series]:
    """Reward, KL, length, step time, tokens/s, then seconds of every measured task and the weight sync."""
    lines, plan = view.metrics, view.plan
    out = []
    for key, label, unit in SCALAR_SERIES:
        predicted = plan.cost.iteration_s if key == "step_s" else None
        out.append(Series(key, label, unit, [_number(m.get(key)) for m in lines], predicted))
    predicted_task = {t.task: t.predicted.total_s or None for t in plan.tasks}
    measured = task_order(sorted({t for m in lines for t in m.get("seconds", {}) if not t.endswith("_transfer")}))
    for task in measured:
        values = [_number(m.get("seconds", {}).get(task)) for m in lines]
        out.append(Series(f"seconds.{task}", f"{task} seconds", "s", values, predicted_task.get(task)))
    sync = [_number(m.get("weight_sync_s")) for m in lines]
    out.append(Series("weight_sync_s", "weight sync seconds", "s", sync, plan.cost.weight_sync_s or None))
    return [s for s in out if any(v is not None for v in s.values)]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def sparkline(values: list[float | None], width: int = SPARK_WIDTH) -> str:
    """One block character per step (bucket means past `width`), scaled from the series' min to its max.

    >>> sparkline([0, 1, 2, 3, 4, 5, 6, 7])
    '▁▂▃▄▅▆▇█'
    >>> sparkline([2.0, 2.0, None, 2.0])
    '▁▁ ▁'
    >>> len(sparkline(list(range(100)), width=10))
    10
    """
    if len(values) > width:
        buckets = [values[i * len(values) // width : (i + 1) * len(values) // width] for i in range(width)]
        values = [statistics.fmean(xs) if (xs := [v for v in b if v is not None]) else None for b in buckets]
    known = [v for v in values if v is not None]
    if not known:
        return ""
    lo, hi = min(known), max(known)
    span = hi - lo
    cells = []
    for v in values:
        if v is None:
            cells.append(" ")
        else:
            cells.append(BLOCKS[0 if span == 0 else min(len(BLOCKS) - 1, int((v - lo) / span * len(BLOCKS)))])
    return "".join(cells)


def value_text(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "s":
        return seconds(value)
    if unit == "/s":
        return si(value)
    return f"{value:.4g}"


def size_text(value: int | float | None) -> str:
    """Bytes in binary units readable at any size: `412 MiB`, `1.3 GiB`, `850 KiB`.

    >>> size_text(3 * 2**30), size_text(412 * 2**20), size_text(None)
    ('3.0 GiB', '412 MiB', '—')
    """
    if value is None:
        return "—"
    for factor, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(value) >= factor:
            return f"{value / factor:.1f} {unit}" if value / factor < 10 else f"{value / factor:.0f} {unit}"
    return f"{value:.0f} B"


def mean_step_s(view: RunView) -> float | None:
    steps = [s for m in view.metrics if (s := _number(m.get("step_s"))) is not None]
    return statistics.fmean(steps) if steps else None


def tokens_per_s(view: RunView) -> float | None:
    """Generated tokens over the seconds of the steps that produced them."""
    tokens = sum(_number(m.get("response_tokens")) or 0.0 for m in view.metrics)
    total = sum(_number(m.get("step_s")) or 0.0 for m in view.metrics)
    return tokens / total if total > 0 else None


# 3) Sections (format-neutral tables) -----------------------------------------------------------------------


def summary_rows(view: RunView) -> list[tuple[str, str]]:
    s, plan = view.summary, view.plan
    rows = [("run", f"{view.run_id} · {view.root.resolve()}"), ("plan", f"{plan.name} (profile {plan.profile_name})")]
    if view.finished:
        status = s.status + (f": {s.error}" if s.error else "")
        status += f" · {s.started_at} → {s.finished_at}" if s.finished_at else ""
    else:
        status = f"{UNFINISHED}: no summary.json yet (still running, or its launcher was killed)"
    rows.append(("status", status))
    steps = f"{len(view.metrics)} logged" + (f" of {view.total_steps}" if view.total_steps else "")
    if view.metrics and view.metrics[-1].get("step") != len(view.metrics):
        steps += f" (last step {view.metrics[-1].get('step')})"
    rows.append(("steps", steps))
    mean, tps = mean_step_s(view), tokens_per_s(view)
    if mean is not None:
        it = s.iteration
        median = f"median {seconds(it.measured_s)}, " if it else ""
        rows.append(("step time", f"mean {seconds(mean)} ({median}predicted {seconds(plan.cost.iteration_s)})"))
    if tps is not None:
        rows.append(("throughput", f"{si(tps)} tokens/s (predicted {si(plan.cost.tokens_per_s)})"))
    if view.engine:
        rows.append(
            ("workers", f"{view.workers} · engine {view.engine} · {plan.workload.algorithm} {plan.workload.mode}")
        )
    board = view.root / "tensorboard"
    if board.is_dir():
        rows.append(("tensorboard", f"tensorboard --logdir {board}"))
    return rows


def series_section(view: RunView, series: list[Series]) -> Section:
    rows = []
    for s in series:
        known = [v for v in s.values if v is not None]
        rows.append(
            [
                s.label,
                value_text(known[0], s.unit),
                value_text(known[-1], s.unit),
                value_text(min(known), s.unit),
                value_text(max(known), s.unit),
                sparkline(s.values),
            ]
        )
    first = view.metrics[0].get("step", 1) if view.metrics else 1
    last = view.metrics[-1].get("step", len(view.metrics)) if view.metrics else 0
    note = "" if series else "no completed step yet"
    return Section(f"Over steps {first}–{last}", ["metric", "first", "last", "min", "max", "trend"], rows,
                   right={1, 2, 3, 4}, note=note)  # fmt: skip


def tasks_section(view: RunView) -> Section:
    """Measured (median after warm-up) vs predicted per task, from summary.json (or derived)."""
    s = view.summary

    def pct(error: float | None) -> str:
        return "—" if error is None else f"{error * 100:+.0f} %"

    rows = [
        [t.task, value_text(t.predicted_s, "s"), seconds(t.measured_s), pct(t.error),
         size_text(t.predicted_memory_bytes), size_text(t.peak_memory_bytes)]
        for t in s.tasks
    ]  # fmt: skip
    if s.iteration is not None:
        it = s.iteration
        rows.append(["iteration", value_text(it.predicted_s, "s"), seconds(it.measured_s), pct(it.error), "", ""])
    warm = "the first step left out as warm-up" if len(view.metrics) > 2 else "every step (too few to drop warm-up)"
    note = f"measured = median over steps, {warm}; error = (predicted − measured) / measured"
    columns = ["task", "predicted", "measured", "error", "pred. memory", "peak memory"]
    return Section("Measured vs predicted", columns, rows, right={1, 2, 3, 4, 5}, note=note if rows else "")


def memory_section(view: RunView) -> Section:
    rows = []
    for d in view.summary.memory:
        ratio = f"{d.peak_bytes / d.predicted_bytes:.2f}×" if d.predicted_bytes else "—"
        top = max(d.tasks, key=lambda t: d.tasks[t]) if d.tasks else "—"
        rows.append([d.device, d.measure, size_text(d.predicted_bytes), size_text(d.peak_bytes), ratio, top])
    note = (
        "rss = the worker process's resident set (interpreter, libraries and every role it holds), so on CPU it "
        "sits above the plan's model-state figure; cuda_max_allocated = torch's allocations"
        if rows
        else "no memory recorded (a run made before hetrl measured peak memory)"
    )
    columns = ["device", "measure", "predicted", "peak", "peak/pred.", "peak during"]
    return Section("Peak memory per device", columns, rows, right={2, 3, 4}, note=note)


def sections_of(view: RunView) -> list[Section]:
    return [series_section(view, run_series(view)), tasks_section(view), memory_section(view)]


# 4) The three formats --------------------------------------------------------------------------------------


def show_run(view: RunView, *, fmt: str = "table", svg: Path | None = None, console: Console | None = None) -> None:
    """Print the run in `fmt` on stdout (its warnings on stderr); also write the SVG charts when asked."""
    for warning in view.warnings:
        sys.stderr.write(f"warning: {warning}\n")
    if svg is not None:
        save_svg(svg, run_svg(view))
    if fmt == "json":
        sys.stdout.write(json.dumps(run_summary_json(view), indent=2) + "\n")
    elif fmt == "markdown":
        sys.stdout.write(run_markdown(view))
    else:
        print_run(console or make_console(), view)
    if svg is not None:
        sys.stderr.write(f"wrote {svg}\n")


def print_run(out: Console, view: RunView) -> None:
    from rich.table import Table

    from hetrl_cli.render.plan import table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for key, value in summary_rows(view):
        grid.add_row(key, value)
    out.print(grid)
    out.print()
    for section in sections_of(view):
        out.print(table(section))
        if section.note:
            out.print()


def run_markdown(view: RunView) -> str:
    rows = [f"| **{k}** | {markdown.escape(v)} |" for k, v in summary_rows(view)]
    parts = [f"## Run `{view.run_id}`", "\n".join(["| | |", "|---|---|", *rows])]
    parts += [markdown.table(section) for section in sections_of(view)]
    return "\n\n".join(parts) + "\n"


def run_summary_json(view: RunView) -> dict[str, Any]:
    """Plain numbers for scripts: per-step series keyed like metrics.jsonl, and the summary as stored."""
    series = run_series(view)
    return {
        "run_id": view.run_id,
        "root": str(view.root),
        "plan": view.plan.name,
        "status": view.status,
        "finished": view.finished,
        "steps": [m.get("step") for m in view.metrics],
        "total_steps": view.total_steps,
        "mean_step_s": mean_step_s(view),
        "tokens_per_s": tokens_per_s(view),
        "predicted": {"iteration_s": view.plan.cost.iteration_s, "tokens_per_s": view.plan.cost.tokens_per_s},
        "series": {s.key: s.values for s in series},
        "summary": view.summary.model_dump(mode="json"),
    }


# 5) SVG: one line chart per series -------------------------------------------------------------------------

CHART_H = 120
CHART_LEFT = 80
CHART_RIGHT = 150
TITLE_H = 26
AXIS_H = 30
GAP = 14


def run_svg(view: RunView) -> str:
    """Small multiples: each series over the steps, with the plan's prediction as a dashed line."""
    series = run_series(view)
    steps = [int(m.get("step", i + 1)) for i, m in enumerate(view.metrics)]
    heading = f"run {view.run_id} — plan {view.plan.name}, {view.status}, {len(steps)} steps"
    body = [f'<text x="10" y="20" font-size="15" font-weight="bold">{escape(heading)}</text>']
    y = 34
    for i, s in enumerate(series):
        body += _chart(s, steps, y, PALETTE[i % len(PALETTE)])
        y += TITLE_H + CHART_H + AXIS_H + GAP
    if not series:
        body.append(f'<text x="10" y="{y + 16}" fill="#7f7f7f">no completed step yet</text>')
        y += 30
    head = f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y}" viewBox="0 0 {WIDTH} {y}" {FONT}>'
    return "\n".join([head, f'<rect width="{WIDTH}" height="{y}" fill="white"/>', *body, "</svg>"]) + "\n"


def _chart(s: Series, steps: list[int], y: int, colour: str) -> list[str]:
    """Title, y grid from 0 to the top value, the polyline with a dot per step, the predicted line."""
    top = y + TITLE_H
    plot_w = WIDTH - CHART_LEFT - CHART_RIGHT
    known = [v for v in s.values if v is not None]
    lo = min(0.0, *known)
    hi = max([*known, s.predicted or 0.0, lo + 1e-12])
    span = (hi - lo) * 1.15  # headroom: a prediction at the top keeps its label clear of the title
    first, last = steps[0], steps[-1]

    def px(step: int) -> float:
        return CHART_LEFT + (plot_w * (step - first) / (last - first) if last > first else plot_w / 2)

    def py(v: float) -> float:
        return top + CHART_H - CHART_H * (v - lo) / span

    out = [f'<text x="10" y="{y + 16}" font-weight="bold">{escape(s.label)}</text>']
    for tick in nice_ticks(span, 40):
        value = lo + tick
        out.append(f'<line x1="{CHART_LEFT}" y1="{py(value):.1f}" x2="{CHART_LEFT + plot_w}" y2="{py(value):.1f}" '
                   'stroke="#dddddd"/>')  # fmt: skip
        out.append(f'<text x="{CHART_LEFT - 6}" y="{py(value) + 4:.1f}" text-anchor="end" fill="#555555">'
                   f"{escape(value_text(value, s.unit))}</text>")  # fmt: skip
    for tick in _step_ticks(first, last):
        out.append(
            f'<text x="{px(tick):.1f}" y="{top + CHART_H + 16}" text-anchor="middle" fill="#555555">{tick}</text>'
        )
    out.append(f'<text x="{CHART_LEFT - 6}" y="{top + CHART_H + 16}" text-anchor="end" fill="#555555">step</text>')
    points = [(px(st), py(v)) for st, v in zip(steps, s.values, strict=True) if v is not None]
    path = " ".join(f"{x:.1f},{yy:.1f}" for x, yy in points)
    out.append(f'<polyline class="series" data-key="{escape(s.key)}" points="{path}" fill="none" '
               f'stroke="{colour}" stroke-width="2"/>')  # fmt: skip
    out += [f'<circle cx="{x:.1f}" cy="{yy:.1f}" r="2.5" fill="{colour}"/>' for x, yy in points]
    right = CHART_LEFT + plot_w + 8
    out.append(
        f'<text x="{right}" y="{points[-1][1] + 4:.1f}" fill="{colour}">{escape(value_text(known[-1], s.unit))}</text>'
    )
    if s.predicted is not None:
        yp = py(s.predicted)
        out.append(f'<line class="predicted" x1="{CHART_LEFT}" y1="{yp:.1f}" x2="{CHART_LEFT + plot_w}" '
                   f'y2="{yp:.1f}" stroke="#333333" stroke-dasharray="6 4"/>')  # fmt: skip
        out.append(f'<text x="{CHART_LEFT + 6}" y="{yp - 4:.1f}" fill="#333333">'
                   f"predicted {escape(value_text(s.predicted, s.unit))}</text>")  # fmt: skip
    return out


def _step_ticks(first: int, last: int) -> list[int]:
    """Whole steps, about ten labels."""
    if last <= first:
        return [first]
    every = max(1, math.ceil((last - first) / 10))
    return list(range(first, last + 1, every))


# 6) The live view of `hetrl run` ---------------------------------------------------------------------------

_STEP_LINE = re.compile(r"\[rank 0\] step (\d+)/(\d+) reward (-?[\d.]+)")
_STEP_FIELDS = {
    "kl_ref_k3": re.compile(r" kl (-?[\d.e+-]+)"),
    "response_length_mean": re.compile(r" len ([\d.]+)"),
    "step_s": re.compile(r"\| ([\d.]+)s:"),
    "weight_sync_s": re.compile(r" sync ([\d.]+)"),
}
_STEP_SECONDS = {"generation": re.compile(r" gen ([\d.]+)"), "actor_train": re.compile(r" train ([\d.]+)")}


def parse_step_line(line: str) -> dict[str, Any] | None:
    """The metrics in rank 0's `step` output line (for a live view whose metrics.jsonl is on another host).

    >>> row = parse_step_line("[h] [rank 0] step 3/10 reward 0.250±0.100 kl 0.0012 len 9.5 | 1.20s: gen 0.60 "
    ...                       "train 0.50 sync 0.010")
    >>> row["step"], row["reward_mean"], row["step_s"], row["seconds"]
    (3, 0.25, 1.2, {'generation': 0.6, 'actor_train': 0.5})
    >>> parse_step_line("[rank 1] loading") is None
    True
    """
    match = _STEP_LINE.search(line)
    if match is None:
        return None
    row: dict[str, Any] = {
        "step": int(match.group(1)),
        "total": int(match.group(2)),
        "reward_mean": float(match.group(3)),
    }
    for key, pattern in _STEP_FIELDS.items():
        if found := pattern.search(line):
            row[key] = float(found.group(1))
    row["seconds"] = {t: float(f.group(1)) for t, pattern in _STEP_SECONDS.items() if (f := pattern.search(line))}
    return row


@dataclass
class LiveState:
    """What the live panel shows: the run's metrics lines so far."""

    run_id: str
    total_steps: int
    lines: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0


def live_panel(state: LiveState) -> RenderableType:
    """The panel: progress, reward (with its trend), KL and length, step time and tokens/s, per-task seconds."""
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    last = state.lines[-1] if state.lines else None
    done = int(last["step"]) if last else 0
    width = 24
    filled = round(width * done / state.total_steps) if state.total_steps else 0
    bar = "█" * filled + "░" * (width - filled)
    eta = ""
    if last and done and state.elapsed_s > 0 and done < state.total_steps:
        steps_s = [m["step_s"] for m in state.lines if isinstance(m.get("step_s"), int | float)]
        per_step = statistics.fmean(steps_s[-5:]) if steps_s else state.elapsed_s / done
        eta = f" · about {_clock(per_step * (state.total_steps - done))} left"
    grid.add_row("step", f"{done}/{state.total_steps} {bar} · {_clock(state.elapsed_s)} elapsed{eta}")
    if last is None:
        grid.add_row("", Text("starting the workers (imports, model build, process groups) ...", style="dim"))
    else:
        rewards = [_number(m.get("reward_mean")) for m in state.lines]
        std = f" ± {last['reward_std']:.3f}" if isinstance(last.get("reward_std"), int | float) else ""
        grid.add_row("reward", f"{last['reward_mean']:.3f}{std}   {sparkline(rewards, 30)}")
        extra = []
        if isinstance(last.get("kl_ref_k3"), int | float):
            extra.append(f"KL {last['kl_ref_k3']:.4f}")
        if isinstance(last.get("response_length_mean"), int | float):
            extra.append(f"length {last['response_length_mean']:.1f} tokens")
        if extra:
            grid.add_row("policy", " · ".join(extra))
        speed = [f"{seconds(last['step_s'])}/step"] if isinstance(last.get("step_s"), int | float) else []
        if isinstance(last.get("tokens_per_s"), int | float):
            speed.append(f"{si(last['tokens_per_s'])} tokens/s")
        if speed:
            grid.add_row("speed", " · ".join(speed))
        grid.add_row("per task", _task_line(last))
    return Panel(grid, title=f"hetrl run {state.run_id}", title_align="left", expand=False)


def _task_line(line: dict[str, Any]) -> str:
    secs = line.get("seconds", {})
    parts = [f"{t} {seconds(secs[t])}" for t in task_order(list(secs)) if not t.endswith("_transfer")]
    if isinstance(line.get("weight_sync_s"), int | float):
        parts.append(f"weight sync {seconds(line['weight_sync_s'])}")
    return " · ".join(parts) or "—"


def _clock(seconds_: float) -> str:
    """`42s`, `3m05s`, `1h02m`."""
    s = int(seconds_)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class LiveView:
    """The launcher's terminal while workers run: a Live panel at the bottom, worker lines printed above it.

    Rank 0's `step` lines are folded into the panel (metrics.jsonl and `hetrl show` keep the history); every
    other line (warnings, errors, the failure tail) prints as it comes.
    """

    def __init__(self, run_root: Path, total_steps: int, console: Console | None = None) -> None:
        from rich.console import Console
        from rich.live import Live

        from hetrl_cli.runtime.rundir import RunDir

        self.run = RunDir(run_root)
        self.state = LiveState(Path(run_root).resolve().name, total_steps)
        self.console = console or Console(stderr=True, highlight=False)
        self.parsed: dict[int, dict[str, Any]] = {}
        self._stamp: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self.live = Live(console=self.console, get_renderable=self._render, refresh_per_second=4,
                         redirect_stdout=False, redirect_stderr=False)  # fmt: skip

    def __enter__(self) -> LiveView:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.refresh()
        self.live.stop()

    def echo(self, line: str) -> None:
        row = parse_step_line(line)
        if row is not None:
            with self._lock:
                self.parsed[row["step"]] = row
            return
        from rich.text import Text

        self.console.print(Text(line), soft_wrap=True)

    def _render(self) -> RenderableType:
        with self._lock:
            self.state.elapsed_s = time.monotonic() - self._started
            self._refresh_lines()
            return live_panel(self.state)

    def _refresh_lines(self) -> None:
        """metrics.jsonl when it changed (it is rewritten on resume); rank 0's parsed lines when there is none."""
        try:
            st = self.run.metrics.stat()
        except OSError:
            self.state.lines = [self.parsed[k] for k in sorted(self.parsed)]
            return
        stamp = (st.st_ino, st.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            self.state.lines = self.run.read_metrics()
