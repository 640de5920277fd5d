"""`show --compare`: ratios b / a computed exactly, the verdict sentence, and all three formats."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.render.compare import compare_plans
from hetrl_cli.render.digest import digest_plan, group_letters
from hetrl_cli.render.plan import show_plan


def comparison(a: Plan, b: Plan):
    return compare_plans(digest_plan(a), digest_plan(b))


def test_ratios_are_b_over_a(ppo_plan: Plan, baseline_plan: Plan) -> None:
    c = comparison(ppo_plan, baseline_plan)
    ratios = {r.metric: r.ratio for r in c.rows}
    assert ratios["iteration time"] == pytest.approx(36.5 / 15.8)
    assert ratios["samples/s"] == pytest.approx(15.8 / 36.5)
    assert ratios["tokens/s"] == pytest.approx(15.8 / 36.5)
    assert ratios["weight sync"] == pytest.approx(0.3 / 0.8)
    assert ratios["transfers"] == pytest.approx(0.0)
    assert ratios["devices used"] == pytest.approx(16 / 19)
    tasks = {r.metric: r.ratio for r in c.tasks}
    assert tasks == pytest.approx(
        {
            "generation": 3.0,
            "reference": 2.5 / 1.2,
            "critic_inference": 2.5 / 1.2,
            "actor_train": 2.15,
            "critic_train": 4.6 / 2.1,
        }
    )
    assert [r.metric for r in c.tasks] == ["generation", "reference", "critic_inference", "actor_train", "critic_train"]


def test_verdict_names_the_faster_plan(ppo_plan: Plan, baseline_plan: Plan) -> None:
    c = comparison(ppo_plan, baseline_plan)
    assert (c.faster, round(c.speedup, 2)) == ("a", 2.31)
    assert c.headline() == "a (lab-ilp) is 2.31× faster than b (lab-verl): 15.8 s vs 36.5 s per iteration"
    assert comparison(baseline_plan, ppo_plan).headline().startswith("b (lab-ilp) is 2.31× faster than a (lab-verl)")


def test_same_plan_is_equally_fast(ppo_plan: Plan) -> None:
    c = comparison(ppo_plan, ppo_plan)
    assert c.faster is None and c.speedup == 1.0
    assert c.headline().startswith("a (lab-ilp) and b (lab-ilp) are equally fast")


def test_task_missing_on_one_side_has_no_ratio(ppo_plan: Plan, grpo_plan: Plan) -> None:
    rows = {r.metric: r for r in comparison(grpo_plan, ppo_plan).tasks}
    assert rows["critic_train"].a is None and rows["critic_train"].ratio is None
    assert rows["critic_train"].value_text(None) == "—"
    assert rows["generation"].a_note == "tp2 pp1 dp4 on A"


def test_table_format(ppo_plan: Plan, baseline_plan: Plan) -> None:
    buf = io.StringIO()
    show_plan(ppo_plan, compare=baseline_plan, console=Console(file=buf, width=120))
    text = buf.getvalue()
    assert "a (lab-ilp) is 2.31× faster than b (lab-verl)" in text
    for expected in ("2.31×", "0.43×", "0.37×", "0.84×", "3.00×", "tp2 pp1 dp8 on A", "a: lab-ilp", "b: lab-verl"):
        assert expected in text, expected
    # Both timelines share one axis: the axis rows are identical.
    axes = [line for line in text.splitlines() if "└" in line]
    assert len(axes) == 2 and axes[0] == axes[1]


def test_markdown_format(ppo_plan: Plan, baseline_plan: Plan, capsys: pytest.CaptureFixture) -> None:
    show_plan(ppo_plan, compare=baseline_plan, fmt="markdown")
    out = capsys.readouterr().out
    assert "**a (lab-ilp) is 2.31× faster than b (lab-verl): 15.8 s vs 36.5 s per iteration**" in out
    assert "| iteration time | 15.8 s | 36.5 s | 2.31× |" in out
    assert "| generation | 6 s | tp2 pp1 dp4 on A | 18 s | tp2 pp1 dp8 on A | 3.00× |" in out


def test_json_format(ppo_plan: Plan, baseline_plan: Plan, capsys: pytest.CaptureFixture) -> None:
    show_plan(ppo_plan, compare=baseline_plan, fmt="json")
    data = json.loads(capsys.readouterr().out)
    assert data["faster"] == "a"
    assert data["speedup"] == pytest.approx(36.5 / 15.8)
    assert data["ratios"]["iteration time"] == {"a": 15.8, "b": 36.5, "b_over_a": pytest.approx(36.5 / 15.8)}
    assert data["tasks"]["generation"]["b_over_a"] == pytest.approx(3.0)
    assert data["a"]["plan"] == "lab-ilp" and data["b"]["plan"] == "lab-verl"


def test_compared_groups_share_letters_by_the_tasks_they_run(ppo_plan: Plan) -> None:
    """b lists the same groups in the other order: each group keeps a's letter for the same tasks."""
    b = ppo_plan.model_copy(update={"groups": list(reversed(ppo_plan.groups)), "name": "reordered"})
    a_letters = digest_plan(ppo_plan).letters
    b_letters = digest_plan(b, match=digest_plan(ppo_plan)).letters
    by_tasks = {frozenset(g.tasks): a_letters[g.name] for g in ppo_plan.groups}
    assert len(set(by_tasks.values())) == len(ppo_plan.groups) > 1
    for g in b.groups:
        assert b_letters[g.name] == by_tasks[frozenset(g.tasks)]
    assert list(b_letters.values()) != list(digest_plan(b).letters.values())  # plan order alone would differ


def test_groups_without_a_twin_take_the_letters_left_free(ppo_plan: Plan) -> None:
    """b keeps a's generation group and merges the rest: generation keeps its letter, the merged group takes
    the first letter the match leaves free, and no letter is used twice on one side."""
    gen = next(g for g in ppo_plan.groups if g.tasks == ["generation"])
    rest = [d for g in ppo_plan.groups if g is not gen for d in g.devices]
    merged = ppo_plan.groups[0].model_copy(
        update={
            "name": "merged",
            "tasks": [t for g in ppo_plan.groups if g is not gen for t in g.tasks],
            "devices": rest,
        }
    )
    b = ppo_plan.model_copy(update={"groups": [merged, gen], "tasks": [], "name": "merged"})
    a_letters = digest_plan(ppo_plan).letters
    letters = group_letters(b, ppo_plan)
    assert letters[gen.name] == a_letters[gen.name]
    assert letters["merged"] == next(x for x in "ABCDEFG" if x != a_letters[gen.name])
    assert len(set(letters.values())) == 2
