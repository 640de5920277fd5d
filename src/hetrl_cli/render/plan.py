"""`hetrl show`: a plan (or two, compared) as rich tables, GitHub markdown or a JSON summary, on stdout.

`show` is a display command, so its rendering is its output and goes to stdout (plain text, no colour, when
stdout is not a terminal); only the `wrote out.svg` message goes to stderr. Data comes from `digest.py`,
tables from `sections.py`; this module only draws them with rich.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.render import markdown, sections
from hetrl_cli.render.compare import Comparison, compare_plans
from hetrl_cli.render.console import make_console
from hetrl_cli.render.digest import IDLE, MISSING, PlanDigest, digest_plan
from hetrl_cli.render.machine import comparison_summary, plan_summary
from hetrl_cli.render.svg import write_svg
from hetrl_cli.render.timeline import (
    ASCII_GLYPHS,
    GLYPHS,
    axis_lines,
    gantt_lines,
    horizon_s,
    label_width,
    legend,
    timeline_bars,
)

FORMATS = ("table", "json", "markdown")
STYLES = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta", "bright_green")
"""Group letter colours, in the same order as the SVG palette."""


def show_plan(
    plan: Plan,
    *,
    fmt: str = "table",
    compare: Plan | None = None,
    profile: ClusterProfile | None = None,
    svg: Path | None = None,
    console: Console | None = None,
) -> None:
    """Print `plan` (against `compare`, when given) in `fmt` on stdout; also write the SVG timeline if asked."""
    a = digest_plan(plan, profile)
    b = digest_plan(compare, profile, match=a) if compare is not None else None
    if svg is not None:
        write_svg(svg, [("a: " + a.plan.name, a), ("b: " + b.plan.name, b)] if b else [(a.plan.name, a)])
    if fmt == "json":
        data = comparison_summary(compare_plans(a, b)) if b else plan_summary(a)
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif fmt == "markdown":
        sys.stdout.write(markdown.comparison(compare_plans(a, b)) if b else markdown.plan(a))
    elif b is not None:
        print_comparison(console or make_console(), compare_plans(a, b))
    else:
        print_plan(console or make_console(), a)
    warn_stale_on_stderr(fmt, [a] if b is None else [a, b])
    if svg is not None:
        sys.stderr.write(f"wrote {svg}\n")  # one line, never wrapped: scripts grep it


def warn_stale_on_stderr(fmt: str, digests: list[PlanDigest]) -> None:
    """JSON and markdown carry the stale flag in-band, where a script can miss it; say it once on stderr too."""
    if fmt == "table":
        return
    for d in digests:
        if d.stale is not None:
            sys.stderr.write(f"hetrl: warning: plan {d.plan.name} is STALE: {d.stale.sentence()}\n")


def print_plan(out: Console, d: PlanDigest) -> None:
    """Every section of one plan, top to bottom in the order a reader asks: what, where, when, fits, why."""
    print_stale(out, d)
    print_summary(out, d)
    for section in (sections.groups_section(d), sections.task_layout_section(d), sections.task_time_section(d)):
        out.print(table(section))
    print_device_map(out, d)
    print_timeline(out, d, horizon_s(d.plan))
    memory = sections.memory_section(d)
    out.print(table(memory))
    if memory.note:  # a caption ends the table without the usual blank line
        out.print()
    out.print(Text.assemble(("Bottleneck: ", "bold"), d.bottleneck))


def print_comparison(out: Console, c: Comparison) -> None:
    """Verdict first, then the metrics with ratios, per-task times, and both timelines on one scale."""
    for d in (c.a, c.b):
        print_stale(out, d)
    out.print(Panel(Text(c.headline(), style="bold"), box=box.ROUNDED, expand=False))
    out.print(table(sections.compare_section(c), with_note=False))
    out.print(table(sections.compare_tasks_section(c)))
    horizon = horizon_s(c.a.plan, c.b.plan)
    label_w = label_width(out.width - 1, timeline_bars(c.a.plan, c.a.letters), timeline_bars(c.b.plan, c.b.letters))
    for label, d in (("a", c.a), ("b", c.b)):
        out.print(Text(f"{label}: {d.plan.name}", style="bold underline"))
        out.print(table(sections.groups_section(d)))
        print_timeline(out, d, horizon, label_w)
        out.print(Text.assemble(("Bottleneck: ", "bold"), d.bottleneck))
        out.print()


def print_stale(out: Console, d: PlanDigest) -> None:
    """A red panel nobody can miss: the numbers below describe hardware that is no longer there."""
    if d.stale is not None:
        text = Text.assemble(("STALE PLAN ", "bold red"), (d.plan.name + ": ", "bold"), d.stale.sentence())
        out.print(Panel(text, border_style="red", box=box.HEAVY, expand=False))


def print_summary(out: Console, d: PlanDigest) -> None:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for key, value in sections.summary_rows(d):
        grid.add_row(key, value)
    out.print(grid)
    out.print()


def table(section: sections.Section, with_note: bool = True) -> Table:
    """A section as a rich table: bold title, right-aligned numbers, group letters in their colour."""
    caption = section.note if with_note and section.note else None
    t = Table(title=section.title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, caption=caption)
    t.caption_justify = "left"
    for i, name in enumerate(section.columns):
        t.add_column(name, justify="right" if i in section.right else "left", overflow="fold")
    for row in section.rows:
        cells = [Text(c) for c in row]
        if section.letter_column is not None:
            cells[section.letter_column].stylize(letter_style(cells[section.letter_column].plain) + " bold")
        t.add_row(*cells)
    return t


def letter_style(letter: str) -> str:
    if not letter or not letter[0].isalpha():
        return "dim"
    return STYLES[(ord(letter[0]) - ord("A") + 26 * int(letter[1:] or 0)) % len(STYLES)]


def print_device_map(out: Console, d: PlanDigest) -> None:
    """Host rows with one coloured mark per device; the table's note is the legend."""
    section = sections.device_map_section(d)
    t = Table(title=section.title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD)
    for name in section.columns:
        t.add_column(name, overflow="fold")
    for row in d.hosts:
        marks = Text()
        for i, mark in enumerate(row.marks):
            style = "dim" if mark == IDLE else "bold red" if mark == MISSING else letter_style(mark) + " bold"
            marks.append(("" if i == 0 else " ") + mark, style=style)
        t.add_row(row.label, row.region or "—", row.types or "—", marks)
    out.print(t)
    out.print(Text("  " + section.note, style="dim"))
    out.print()


def print_timeline(out: Console, d: PlanDigest, horizon: float, label_w: int | None = None) -> None:
    """The Gantt chart, scaled to the console width, coloured by group (`label_w` aligns compared charts)."""
    out.print(Text("Iteration timeline", style="bold"))
    bars = timeline_bars(d.plan, d.letters)
    if not bars:
        out.print(Text("  no timeline in this plan", style="dim"))
        out.print()
        return
    ascii_only = not out.encoding.lower().startswith("utf")
    glyphs = ASCII_GLYPHS if ascii_only else GLYPHS
    lines, label_w, bar_w = gantt_lines(bars, horizon, out.width - 1, label_w, ascii_only)
    edge = "|" if ascii_only else "│"
    for ln in lines:
        style = letter_style(ln.bar.letter)
        out.print(
            Text.assemble(
                ln.label + " ",
                (ln.bar.letter or "-", style + " bold"),
                " " + edge + " " * ln.offset,
                (glyphs[ln.bar.kind] * ln.length, style),
                " " * ln.fill + edge + " ",
                (ln.times, "dim"),
            ),
            no_wrap=True,
            crop=True,
        )
    rule, labels = axis_lines(horizon, bar_w, ascii_only)
    pad = " " * (label_w + 3)
    out.print(
        Text("\n".join([pad + rule, pad + labels, pad + legend(ascii_only)]), style="dim"), no_wrap=True, crop=True
    )
    out.print()
