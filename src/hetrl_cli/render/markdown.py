"""`show --format markdown`: the same sections as GitHub-flavoured markdown, for PR descriptions and docs.

Tables are GFM pipe tables (cells escaped); the Gantt chart is a fixed-width ```text block at CHART_WIDTH.
"""

from __future__ import annotations

from hetrl_cli.render import sections
from hetrl_cli.render.compare import Comparison
from hetrl_cli.render.digest import PlanDigest
from hetrl_cli.render.timeline import gantt_lines, horizon_s, label_width, plain_chart, timeline_bars

CHART_WIDTH = 100


def plan(d: PlanDigest) -> str:
    """One plan, every section."""
    parts = [f"## Plan `{d.plan.name}`", *stale(d), summary(d)]
    parts += [
        table(s)
        for s in (
            sections.groups_section(d),
            sections.task_layout_section(d),
            sections.task_time_section(d),
            sections.device_map_section(d),
        )
    ]
    parts += [timeline(d, horizon_s(d.plan)), table(sections.memory_section(d)), f"**Bottleneck:** {d.bottleneck}"]
    return "\n\n".join(parts) + "\n"


def comparison(c: Comparison) -> str:
    """Verdict, ratios, per-task times, then each plan's groups and timeline on a shared scale."""
    parts = [f"## Plans `{c.a.plan.name}` (a) vs `{c.b.plan.name}` (b)", *stale(c.a), *stale(c.b)]
    parts += [f"**{escape(c.headline())}**", table(sections.compare_section(c), with_note=False)]
    parts.append(table(sections.compare_tasks_section(c)))
    horizon = horizon_s(c.a.plan, c.b.plan)
    label_w = label_width(CHART_WIDTH, timeline_bars(c.a.plan, c.a.letters), timeline_bars(c.b.plan, c.b.letters))
    for label, d in (("a", c.a), ("b", c.b)):
        parts += [f"### {label}: `{d.plan.name}`", table(sections.groups_section(d)), timeline(d, horizon, label_w)]
        parts.append(f"**Bottleneck:** {d.bottleneck}")
    return "\n\n".join(parts) + "\n"


def stale(d: PlanDigest) -> list[str]:
    if d.stale is None:
        return []
    return [f"> **⚠ STALE PLAN** `{d.plan.name}`: {escape(d.stale.sentence())}"]


def summary(d: PlanDigest) -> str:
    rows = [f"| **{key}** | {escape(value)} |" for key, value in sections.summary_rows(d)]
    return "\n".join(["| | |", "|---|---|", *rows])


def escape(text: str) -> str:
    """Keep a cell one cell: pipes escaped, newlines as <br>."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")


def table(section: sections.Section, with_note: bool = True) -> str:
    """`### Title`, a pipe table with aligned numeric columns, and the note in italics."""
    header = "| " + " | ".join(escape(c) or " " for c in section.columns) + " |"
    rule = "|" + "|".join("---:" if i in section.right else "---" for i in range(len(section.columns))) + "|"
    rows = ["| " + " | ".join(escape(c) for c in row) + " |" for row in section.rows]
    text = "\n".join([f"### {section.title}", "", header, rule, *rows])
    if with_note and section.note:
        text += f"\n\n_{escape(section.note)}_"
    return text


def timeline(d: PlanDigest, horizon: float, label_w: int | None = None) -> str:
    bars = timeline_bars(d.plan, d.letters)
    if not bars:
        return "### Iteration timeline\n\n_no timeline in this plan_"
    lines, label_w, bar_w = gantt_lines(bars, horizon, CHART_WIDTH, label_w)
    chart = plain_chart(lines, label_w, bar_w, horizon)
    return "\n".join(["### Iteration timeline", "", "```text", *chart, "```"])
