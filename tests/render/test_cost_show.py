"""`show` with prices (issue 24, item 5): $/iteration and $/1M tokens in the summary, time and cost for both
plans in `--compare`, and the figures in `--format json`; plans without prices look as before."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from hetrl_cli.artifacts.plan import Plan, PlanPrice
from hetrl_cli.render.plan import show_plan


def with_price(plan: Plan, hourly: float, objective: str = "cost") -> Plan:
    tokens = 2_097_152.0
    per_iteration = hourly * plan.cost.iteration_s / 3600
    price = PlanPrice(
        usd_per_hour=hourly,
        usd_per_iteration=per_iteration,
        usd_per_million_tokens=per_iteration / tokens * 1e6,
        tokens_per_iteration=tokens,
        devices=len({d for g in plan.groups for d in g.devices}),
    )
    return plan.model_copy(update={"price": price, "objective": objective})


def table_text(plan: Plan, compare: Plan | None = None) -> str:
    buf = io.StringIO()
    show_plan(plan, compare=compare, console=Console(file=buf, width=200))
    return buf.getvalue()


def test_summary_prints_dollars_per_iteration_and_per_million_tokens(ppo_plan: Plan) -> None:
    plan = with_price(ppo_plan, 40.0)  # 15.8 s at $40/h: $0.1756/iteration
    text = table_text(plan)
    assert "$0.1756/iteration" in text and "$0.08371/1M tokens" in text
    assert "$40/hour for 19 devices" in text and "objective cost" in text
    assert "/iteration" not in table_text(ppo_plan)  # no prices, no cost line


def test_markdown_and_json_carry_the_prices(ppo_plan: Plan, capsys: pytest.CaptureFixture) -> None:
    plan = with_price(ppo_plan, 40.0)
    show_plan(plan, fmt="markdown")
    assert "| **cost** | $0.1756/iteration" in capsys.readouterr().out
    show_plan(plan, fmt="json")
    data = json.loads(capsys.readouterr().out)
    assert data["objective"] == "cost"
    assert data["price"]["usd_per_iteration"] == pytest.approx(40.0 * 15.8 / 3600)
    show_plan(ppo_plan, fmt="json")
    assert json.loads(capsys.readouterr().out)["price"] is None


def test_compare_shows_time_and_cost_for_each_plan(
    ppo_plan: Plan, baseline_plan: Plan, capsys: pytest.CaptureFixture
) -> None:
    a, b = with_price(ppo_plan, 40.0), with_price(baseline_plan, 10.0, "time")  # b: slower but cheaper
    text = table_text(a, b)
    assert "a (lab-ilp) is 2.31× faster than b (lab-verl)" in text
    assert "b costs 0.58× a per iteration ($0.1014 vs $0.1756)" in text
    for row in ("$/hour", "$/iteration", "$/1M tokens"):
        assert row in text
    show_plan(a, compare=b, fmt="json")
    ratios = json.loads(capsys.readouterr().out)["ratios"]
    assert ratios["$/iteration"]["b_over_a"] == pytest.approx((10.0 * 36.5) / (40.0 * 15.8))
    assert ratios["$/hour"] == {"a": 40.0, "b": 10.0, "b_over_a": pytest.approx(0.25)}
    show_plan(a, compare=baseline_plan, fmt="json")  # one side without prices: its cost is unknown
    assert json.loads(capsys.readouterr().out)["ratios"]["$/iteration"]["b"] is None
    assert "$/iteration" not in table_text(ppo_plan, baseline_plan)  # neither priced: as before
