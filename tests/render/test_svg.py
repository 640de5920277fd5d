"""`show --svg`: well-formed XML, one bar per timeline entry, one colour per group, atomic write."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.errors import BadInput
from hetrl_cli.render.digest import digest_plan
from hetrl_cli.render.plan import show_plan
from hetrl_cli.render.svg import timeline_svg

NS = {"svg": "http://www.w3.org/2000/svg"}


def bars(path: Path) -> list[ET.Element]:
    root = ET.parse(path).getroot()
    return [r for r in root.iterfind(".//svg:rect", NS) if r.get("class") == "bar"]


def test_one_bar_per_entry_one_colour_per_group(ppo_plan: Plan, tmp_path: Path, capsys) -> None:
    out = tmp_path / "charts" / "ppo.svg"
    show_plan(ppo_plan, svg=out, fmt="json")
    assert capsys.readouterr().err.strip() == f"wrote {out}"
    rects = bars(out)
    assert len(rects) == len(ppo_plan.cost.timeline) == 8
    colours = {}
    for rect in rects:
        colours.setdefault(rect.get("data-group"), set()).add(rect.get("fill"))
    assert all(len(c) == 1 for c in colours.values())
    assert len({next(iter(c)) for c in colours.values()}) == 3
    assert not list(tmp_path.glob("charts/.*.tmp"))  # the temp file of the atomic write is gone


def test_bars_scale_with_time(ppo_plan: Plan, tmp_path: Path) -> None:
    out = tmp_path / "ppo.svg"
    show_plan(ppo_plan, svg=out, fmt="json")
    widths = {r.find("svg:title", NS).text.split(" (")[0]: float(r.get("width")) for r in bars(out)}
    assert widths["generation"] / widths["actor_train"] == pytest.approx(6.0 / 4.0, rel=0.01)


def test_labels_are_readable_text(ppo_plan: Plan) -> None:
    root = ET.fromstring(timeline_svg([("lab-ilp", digest_plan(ppo_plan))]))
    texts = [t.text for t in root.iterfind(".//svg:text", NS)]
    assert "A · generation" in texts and "C · actor_train" in texts
    assert "lab-ilp — 15.8 s per iteration" in texts
    assert "A rollout: generation" in texts


def test_compare_stacks_two_panels(ppo_plan: Plan, baseline_plan: Plan, tmp_path: Path) -> None:
    out = tmp_path / "cmp.svg"
    show_plan(ppo_plan, compare=baseline_plan, svg=out, fmt="json")
    assert len(bars(out)) == len(ppo_plan.cost.timeline) + len(baseline_plan.cost.timeline)


def test_empty_timeline_is_still_valid(grpo_plan: Plan) -> None:
    bare = grpo_plan.model_copy(update={"cost": grpo_plan.cost.model_copy(update={"timeline": []})})
    root = ET.fromstring(timeline_svg([("bare", digest_plan(bare))]))
    assert not [r for r in root.iterfind(".//svg:rect", NS) if r.get("class") == "bar"]


def test_svg_to_stdout_is_refused(ppo_plan: Plan) -> None:
    with pytest.raises(BadInput, match=r"^--svg -: give a file path"):
        show_plan(ppo_plan, svg=Path("-"))
