"""The iteration as a text Gantt chart: one row per timeline entry, bars scaled to the available width.

Layout only (strings and column spans); `render/plan.py` colours it with rich and `render/markdown.py` puts it
in a code block, so both show the same chart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.render.digest import seconds

GLYPHS = {"task": "█", "transfer": "▒", "sync": "▒"}
ASCII_GLYPHS = {"task": "#", "transfer": "=", "sync": "="}
MAX_LABEL = 22
"""Names longer than this, or a fifth of a wider terminal, are cut with an ellipsis to keep bars wide."""
MIN_BAR_WIDTH = 10


@dataclass(frozen=True)
class Bar:
    """One timeline entry, classified for drawing."""

    label: str
    group: str
    letter: str
    """Group letter, or empty when the entry's group is not one of the plan's groups (e.g. a sync between two)."""
    kind: str
    """`task`, `transfer` or `sync`."""
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class GanttLine:
    """A chart row as text pieces: `label letter │ pre bar post │ duration at start`."""

    bar: Bar
    label: str
    offset: int
    """Blank cells before the bar."""
    length: int
    """Cells the bar covers (at least one, so short transfers stay visible)."""
    fill: int
    """Blank cells after the bar."""
    times: str


def entry_kind(name: str) -> str:
    if name.startswith("weight_sync"):
        return "sync"
    return "transfer" if name.startswith("transfer") else "task"


def timeline_bars(plan: Plan, letters: dict[str, str]) -> list[Bar]:
    """The plan's timeline in start order (ties: shorter first), each with its group letter."""
    bars = [
        Bar(e.name, e.group, letters.get(e.group, ""), entry_kind(e.name), e.start_s, e.end_s)
        for e in plan.cost.timeline
    ]
    return sorted(bars, key=lambda b: (b.start_s, b.end_s, b.label))


def horizon_s(*plans: Plan) -> float:
    """The time axis length: the longest iteration or the last entry's end, whichever is later."""
    ends = [e.end_s for p in plans for e in p.cost.timeline]
    return max([p.cost.iteration_s for p in plans] + ends)


def cell_span(start_s: float, end_s: float, horizon: float, width: int) -> tuple[int, int]:
    """(first cell, cell count) of a bar on a `width`-cell axis; never empty, never past the end."""
    first = min(width - 1, max(0, round(start_s / horizon * width)))
    last = min(width, max(first + 1, round(end_s / horizon * width)))
    return first, last - first


def time_format(horizon: float) -> str:
    """Enough decimals to tell entries apart at this scale, no more."""
    return "{:.0f}" if horizon >= 100 else "{:.1f}" if horizon >= 10 else "{:.2f}"


def label_width(total_width: int, *bar_lists: list[Bar]) -> int:
    """Width of the name column: the longest name, capped; shared by charts that must line up (compare)."""
    cap = max(MAX_LABEL, total_width // 5)
    return min(cap, max([len(b.label) for bars in bar_lists for b in bars] + [4]))


def shorten_unique(labels: list[str], width: int, ellipsis: str = "…") -> list[str]:
    """Each label in at most `width` characters, cut in the middle (the start names the task, the end tells
    transfers and replicas apart), and no two different labels cut into the same text: a clash keeps its head
    and gets a `#n` tail instead."""

    def cut(label: str) -> str:
        if len(label) <= width:
            return label
        head = (width - 1) // 2
        return label[:head] + ellipsis + label[len(label) - (width - 1 - head) :]

    out = [cut(label) for label in labels]
    owners: dict[str, set[str]] = {}
    for label, short in zip(labels, out, strict=True):
        owners.setdefault(short, set()).add(label)
    numbered: dict[str, int] = {}
    for i, (label, short) in enumerate(zip(labels, out, strict=True)):
        if len(owners[short]) > 1:
            n = numbered.setdefault(label, len(numbered) + 1)
            tag = f"#{n}"
            out[i] = label[: max(0, width - len(tag) - 1)] + ellipsis + tag
    return out


def gantt_lines(
    bars: list[Bar], horizon: float, total_width: int, label_w: int | None = None, ascii_only: bool = False
) -> tuple[list[GanttLine], int, int]:
    """Rows for `total_width` columns; returns (rows, label width, bar width) for the axis to align to."""
    fmt = time_format(horizon)
    ellipsis = "~" if ascii_only else "…"
    # Duration first (what a reader compares), then the start; a 2 ms transfer in a 170 s iteration still reads.
    times = [f"{seconds(b.duration_s):>7} at {fmt.format(b.start_s)} s" for b in bars]
    label_w = label_w or label_width(total_width, bars)
    # Widest label any horizon could need, so two charts with the same label width get the same bar width.
    times_w = 13 + len(fmt.format(horizon))
    bar_w = max(MIN_BAR_WIDTH, total_width - label_w - times_w - 6)
    lines = []
    labels = shorten_unique([b.label for b in bars], label_w, ellipsis)
    for bar, text, label in zip(bars, times, labels, strict=True):
        first, length = cell_span(bar.start_s, bar.end_s, horizon, bar_w)
        lines.append(GanttLine(bar, label.ljust(label_w), first, length, bar_w - first - length, text))
    return lines, label_w, bar_w


def nice_ticks(horizon: float, bar_w: int) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 × 10^k apart), about one per 8 cells, starting at 0."""
    wanted = max(1, bar_w // 8)
    raw = horizon / wanted
    magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    count = int(horizon / step + 1e-9)
    return [i * step for i in range(count + 1)]


def axis_lines(horizon: float, bar_w: int, ascii_only: bool = False) -> tuple[str, str]:
    """A ruler under the bars (`└───┴───┴──┘`) and its second labels, aligned to the chart's edge column.

    Position 0 is the left corner (t = 0), positions 1..bar_w are the bar cells, bar_w + 1 the right corner.
    """
    corners = ("+", "+") if ascii_only else ("└", "┘")
    rule = [corners[0]] + ["-" if ascii_only else "─"] * bar_w + [corners[1]]
    labels = [" "] * (bar_w + 8)
    cursor = 0
    for tick in nice_ticks(horizon, bar_w):
        pos = min(bar_w, round(tick / horizon * bar_w))
        if pos:
            rule[pos] = "+" if ascii_only else "┴"
        text = f"{tick:g}"
        start = max(0, pos - len(text) // 2)
        if start >= cursor and start + len(text) <= len(labels):
            labels[start : start + len(text)] = text
            cursor = start + len(text) + 1
    return "".join(rule), "".join(labels).rstrip() + " s"


def plain_chart(
    lines: list[GanttLine], label_w: int, bar_w: int, horizon: float, ascii_only: bool = False
) -> list[str]:
    """The chart as uncoloured text (markdown code block, and the layout the rich version colours)."""
    glyphs = ASCII_GLYPHS if ascii_only else GLYPHS
    edge = "|" if ascii_only else "│"
    out = []
    for ln in lines:
        bar = " " * ln.offset + glyphs[ln.bar.kind] * ln.length + " " * ln.fill
        out.append(f"{ln.label} {ln.bar.letter or '-'} {edge}{bar}{edge} {ln.times}")
    rule, labels = axis_lines(horizon, bar_w, ascii_only)
    pad = " " * (label_w + 3)
    return [*out, pad + rule, pad + labels, pad + legend(ascii_only)]


def legend(ascii_only: bool = False) -> str:
    glyphs = ASCII_GLYPHS if ascii_only else GLYPHS
    return f"{glyphs['task']} task  {glyphs['sync']} transfer / weight sync  (letters: groups)"
