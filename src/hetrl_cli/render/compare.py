"""Two plans side by side: the same metrics for each and their ratio (b / a), plus who is faster and by how much.

The ratio is always b / a, so one column reads the same way for every row: above 1 means b has more of it
(more seconds: b slower; more samples/s: b faster).
"""

from __future__ import annotations

from dataclasses import dataclass

from hetrl_cli.artifacts.plan import TaskPlan
from hetrl_cli.render.digest import PlanDigest, seconds, si, task_order

SAME_SPEED = 0.005
"""Iteration times within 0.5% of each other are called equally fast (cost-model noise is larger)."""


@dataclass(frozen=True)
class CompareRow:
    metric: str
    a: float | None
    b: float | None
    unit: str
    """`s`, `samples/s`, `tokens/s` or `devices`: how to print the values."""
    lower_is_better: bool = True
    a_note: str = ""
    """Layout of a task (`tp2 pp1 dp4 on A`), for per-task rows."""
    b_note: str = ""

    @property
    def ratio(self) -> float | None:
        """b / a; None when either side is missing or a is zero."""
        if self.a is None or self.b is None or self.a == 0:
            return None
        return self.b / self.a

    def value_text(self, value: float | None) -> str:
        if value is None:
            return "—"
        if self.unit == "s":
            return seconds(value)
        if self.unit == "devices":
            return str(int(value))
        if self.unit == "$":
            return f"${value:.4g}"
        return f"{si(value)} {self.unit}"


@dataclass(frozen=True)
class Comparison:
    a: PlanDigest
    b: PlanDigest
    rows: list[CompareRow]
    """Whole-plan metrics."""
    tasks: list[CompareRow]
    """Predicted seconds per task."""
    faster: str | None
    """`a`, `b`, or None when equally fast."""
    speedup: float
    """Slower iteration time / faster iteration time (1.0 when equal)."""

    def headline(self) -> str:
        """`a (ilp) is 2.31× faster than b (verl): 15.8 s vs 36.5 s per iteration`."""
        a, b = self.a.plan, self.b.plan
        times = f"{seconds(a.cost.iteration_s)} vs {seconds(b.cost.iteration_s)} per iteration"
        if self.faster is None:
            return f"a ({a.name}) and b ({b.name}) are equally fast: {times}{self.cost_verdict()}"
        winner, loser = ("a", "b") if self.faster == "a" else ("b", "a")
        names = {"a": a.name, "b": b.name}
        verdict = f"{winner} ({names[winner]}) is {self.speedup:.2f}× faster than {loser} ({names[loser]}): {times}"
        return verdict + self.cost_verdict()

    def cost_verdict(self) -> str:
        """`; b costs 0.62× a per iteration ($0.104 vs $0.167)` where both plans have prices, else ''."""
        pa, pb = self.a.plan.price, self.b.plan.price
        if pa is None or pb is None or pa.usd_per_iteration <= 0:
            return ""
        ratio = pb.usd_per_iteration / pa.usd_per_iteration
        return f"; b costs {ratio:.2f}× a per iteration (${pb.usd_per_iteration:.4g} vs ${pa.usd_per_iteration:.4g})"


def compare_plans(a: PlanDigest, b: PlanDigest) -> Comparison:
    """Metrics of both plans with ratios, and the verdict on iteration time."""
    ta, tb = a.plan.cost.iteration_s, b.plan.cost.iteration_s
    speedup = max(ta, tb) / min(ta, tb)
    faster = None if speedup - 1 < SAME_SPEED else ("a" if ta < tb else "b")
    return Comparison(a, b, plan_rows(a, b), task_rows(a, b), faster, speedup if faster else 1.0)


def plan_rows(a: PlanDigest, b: PlanDigest) -> list[CompareRow]:
    ca, cb = a.plan.cost, b.plan.cost
    return [
        CompareRow("iteration time", ca.iteration_s, cb.iteration_s, "s"),
        CompareRow("samples/s", ca.samples_per_s, cb.samples_per_s, "samples/s", lower_is_better=False),
        CompareRow("tokens/s", ca.tokens_per_s, cb.tokens_per_s, "tokens/s", lower_is_better=False),
        CompareRow("weight sync", ca.weight_sync_s, cb.weight_sync_s, "s"),
        CompareRow("transfers", ca.transfer_s, cb.transfer_s, "s"),
        CompareRow("devices used", len(a.used), len(b.used), "devices"),
        *price_rows(a, b),
    ]


def price_rows(a: PlanDigest, b: PlanDigest) -> list[CompareRow]:
    """$/hour, $/iteration and $/1M tokens of each plan (— where a plan has no prices); none if neither has."""
    pa, pb = a.plan.price, b.plan.price
    if pa is None and pb is None:
        return []
    fields = (
        ("$/hour", "usd_per_hour"),
        ("$/iteration", "usd_per_iteration"),
        ("$/1M tokens", "usd_per_million_tokens"),
    )
    return [
        CompareRow(metric, getattr(pa, key) if pa else None, getattr(pb, key) if pb else None, "$")
        for metric, key in fields
    ]


def task_rows(a: PlanDigest, b: PlanDigest) -> list[CompareRow]:
    """One row per task planned in either plan, in dataflow order; a task missing on one side shows `—`."""
    ta = {t.task: t for t in a.plan.tasks}
    tb = {t.task: t for t in b.plan.tasks}
    rows = []
    for name in task_order(list({**ta, **tb})):
        pa, pb = ta.get(name), tb.get(name)
        rows.append(
            CompareRow(
                name,
                pa.predicted.total_s if pa else None,
                pb.predicted.total_s if pb else None,
                "s",
                a_note=layout(pa, a.letters) if pa else "",
                b_note=layout(pb, b.letters) if pb else "",
            )
        )
    return rows


def layout(task: TaskPlan, letters: dict[str, str]) -> str:
    """`tp2 pp1 dp4 on A`: how a task is parallelised and where, in a few characters."""
    return f"tp{task.tp} pp{task.pp} dp{task.dp} on {letters[task.group]}"
