"""The iteration timeline as a standalone SVG Gantt chart (hand-written: no plotting dependency).

One `<rect class="bar">` per timeline entry, one colour per group (transfers and syncs lighter), second
ticks with grid lines, and a legend naming each group's tasks. With `--compare`, one panel per plan on a
shared time axis so bar lengths compare directly.
"""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from hetrl_cli.artifacts.io import write_text_atomic
from hetrl_cli.errors import BadInput, HetrlError
from hetrl_cli.render.digest import PlanDigest, seconds
from hetrl_cli.render.timeline import Bar, horizon_s, nice_ticks, shorten_unique, timeline_bars

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
OTHER = "#7f7f7f"
"""Entries whose group is not a plan group."""
WIDTH = 1000
LABEL_W = 210
RIGHT_W = 80
ROW_H = 26
BAR_H = 18
MAX_LABEL_CHARS = 30
"""Names longer than this are cut (the full name stays in the bar's hover title)."""
FONT = 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12"'


def group_colour(letter: str) -> str:
    if not letter:
        return OTHER
    return PALETTE[(ord(letter[0]) - ord("A") + 26 * int(letter[1:] or 0)) % len(PALETTE)]


def write_svg(path: Path, digests: list[tuple[str, PlanDigest]]) -> None:
    """Write the chart atomically; `-` is refused because stdout carries the chosen format."""
    save_svg(path, timeline_svg(digests))


def save_svg(path: Path, document: str) -> None:
    """Write an SVG document atomically (plans' timelines and runs' charts); `-` is refused."""
    if str(path) == "-":
        raise BadInput("--svg -: give a file path (stdout carries the table/json/markdown output)")
    try:
        write_text_atomic(path, document)
    except OSError as exc:
        raise HetrlError(f"cannot write {path}: {exc.strerror or exc}") from None


def timeline_svg(digests: list[tuple[str, PlanDigest]]) -> str:
    """The whole document: a panel per (title, digest), stacked, sharing one time axis."""
    horizon = horizon_s(*(d.plan for _, d in digests))
    body: list[str] = []
    y = 10
    for title, digest in digests:
        panel, y = _panel(title, digest, horizon, y)
        body += panel
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y + 10}" '
        f'viewBox="0 0 {WIDTH} {y + 10}" {FONT}>'
    )
    return "\n".join([head, f'<rect width="{WIDTH}" height="{y + 10}" fill="white"/>', *body, "</svg>"]) + "\n"


def _panel(title: str, digest: PlanDigest, horizon: float, y: int) -> tuple[list[str], int]:
    """Title, legend, grid and bars of one plan starting at height `y`; returns the elements and the next y."""
    bars = timeline_bars(digest.plan, digest.letters)
    heading = f"{title} — {seconds(digest.plan.cost.iteration_s)} per iteration"
    out = [f'<text x="10" y="{y + 16}" font-size="15" font-weight="bold">{escape(heading)}</text>']
    legend, y = _legend(digest, y + 28)
    out += legend
    top = y + 8
    out += _grid(horizon, top, len(bars))
    names = shorten_unique([b.label for b in bars], MAX_LABEL_CHARS)
    for i, (bar, name) in enumerate(zip(bars, names, strict=True)):
        out += _bar(bar, name, horizon, top + i * ROW_H)
    if not bars:
        out.append(f'<text x="{LABEL_W}" y="{top + 16}" fill="{OTHER}">no timeline in this plan</text>')
    return out, top + max(1, len(bars)) * ROW_H + 34


def _legend(digest: PlanDigest, y: int) -> tuple[list[str], int]:
    """`■ A rollout: generation` per group, wrapped across the width."""
    out, x = [], 10
    for group in digest.plan.groups:
        letter = digest.letters[group.name]
        text = f"{letter} {group.name}: {', '.join(group.tasks)}"
        width = 24 + 7 * len(text)
        if x + width > WIDTH - 10 and x > 10:
            x, y = 10, y + 18
        out.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{group_colour(letter)}"/>')
        out.append(f'<text x="{x + 16}" y="{y + 10}">{escape(text)}</text>')
        x += width
    return out, y + 14


def _x(t: float, horizon: float) -> float:
    return LABEL_W + (WIDTH - LABEL_W - RIGHT_W) * t / horizon


def _grid(horizon: float, top: int, rows: int) -> list[str]:
    """Vertical grid lines at round seconds, labelled under the last row."""
    bottom = top + max(1, rows) * ROW_H
    out = []
    for tick in nice_ticks(horizon, (WIDTH - LABEL_W - RIGHT_W) // 7):
        x = _x(tick, horizon)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#dddddd"/>')
        out.append(f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle" fill="#555555">{tick:g}</text>')
    out.append(f'<text x="{WIDTH - RIGHT_W + 8}" y="{bottom + 14}" fill="#555555">seconds</text>')
    return out


def _bar(bar: Bar, name: str, horizon: float, y: int) -> list[str]:
    """Label (`name`: the bar's label shortened) on the left, the bar (with a hover title), its duration."""
    x0, x1 = _x(bar.start_s, horizon), _x(bar.end_s, horizon)
    width = max(1.5, x1 - x0)
    colour = group_colour(bar.letter)
    opacity = "1" if bar.kind == "task" else "0.55"
    label = f"{bar.letter or bar.group} · {name}"
    tip = f"{bar.label} (group {bar.group}): {bar.start_s:.3f}–{bar.end_s:.3f} s"
    return [
        f'<text x="{LABEL_W - 8}" y="{y + 14}" text-anchor="end">{escape(label)}</text>',
        f'<rect class="bar" x="{x0:.1f}" y="{y + (ROW_H - BAR_H) // 2}" width="{width:.1f}" height="{BAR_H}" '
        f'fill="{colour}" fill-opacity="{opacity}" rx="2" data-group={quoteattr(bar.group)}>'
        f"<title>{escape(tip)}</title></rect>",
        f'<text x="{x0 + width + 4:.1f}" y="{y + 14}" fill="#333333">{escape(seconds(bar.duration_s))}</text>',
    ]
