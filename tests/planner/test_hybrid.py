"""The hybrid search: reproducible for a seed under max_evals, never worse than the better baseline, and
within reach of the ILP optimum on tiny instances."""

from __future__ import annotations

import pytest

from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.planner import baselines
from hetrl_cli.planner.api import make_plan
from hetrl_cli.planner.tables import Tables

from .conftest import cluster, workload


def _fingerprint(plan):
    return (
        [(g.name, tuple(g.devices)) for g in plan.groups],
        [(t.task, t.tp, t.pp, t.dp, [r.stages for r in t.replicas]) for t in plan.tasks],
        plan.cost.iteration_s,
        plan.solver.evaluations,
    )


def test_hybrid_is_reproducible_with_max_evals(tiny_profile):
    w = workload("ppo", "sync")
    a = make_plan(tiny_profile, w, solver="hybrid", budget_s=60, max_evals=150, seed=7)
    b = make_plan(tiny_profile, w, solver="hybrid", budget_s=60, max_evals=150, seed=7)
    assert _fingerprint(a) == _fingerprint(b)
    assert a.solver.seed == 7
    assert a.solver.evaluations == 150


@pytest.mark.parametrize(("algorithm", "mode"), [("grpo", "sync"), ("ppo", "async")])
def test_hybrid_never_worse_than_better_baseline(tiny_profile, algorithm, mode):
    w = workload(algorithm, mode)
    tables = Tables(CostModel(tiny_profile, w), tiny_profile, w)
    bases = [b for b in (baselines.verl(tables), baselines.streamrl(tables)) if b is not None]
    assert bases
    plan = make_plan(tiny_profile, w, solver="hybrid", budget_s=60, max_evals=60, seed=0)
    assert plan.cost.iteration_s <= min(b.iteration_s for b in bases) * (1 + 1e-9)


def test_hybrid_reaches_ilp_on_tiny(tiny_profile):
    w = workload("grpo", "sync")
    ilp = make_plan(tiny_profile, w, solver="ilp", budget_s=30)
    hybrid = make_plan(tiny_profile, w, solver="hybrid", budget_s=60, max_evals=400, seed=0)
    assert hybrid.cost.iteration_s <= ilp.cost.iteration_s / 0.99


def test_baselines_pass_uniform_shares():
    profile = cluster(
        "mixed",
        [
            {"gpu": "A100 80GB", "gpus_per_node": 2, "nodes": 1, "region": "r1"},
            {"gpu": "L4", "gpus_per_node": 2, "nodes": 1, "region": "r1"},
        ],
    )
    for solver in ("verl", "streamrl"):
        plan = make_plan(profile, workload("grpo", "sync"), solver=solver, budget_s=10)
        assert plan.solver.solver == solver
        for task in plan.tasks:
            assert {round(r.batch_share, 9) for r in task.replicas} == {round(1 / task.dp, 9)}
    verl = make_plan(profile, workload("grpo", "sync"), solver="verl", budget_s=10)
    assert len(verl.groups) == 1 and len(verl.groups[0].devices) == 4


def test_constructive_split_and_rebalance(tiny_profile):
    """The constructive split uses every device with at least one block per group; rebalancing keeps every
    group non-empty."""
    import random

    from hetrl_cli.planner.hybrid import Hybrid
    from hetrl_cli.planner.search import Budget
    from hetrl_cli.planner.space import groupings

    w = workload("grpo", "sync")
    tables = Tables(CostModel(tiny_profile, w), tiny_profile, w)
    search = Hybrid(tables, 0)
    unit = min(b.size for b in search.blocks)
    budget = Budget(None, 100)
    for grouping in groupings(tables.tasks):
        split = search.constructive(grouping, unit)
        if split is None:
            continue
        assert sum(split) == search.n_devices and min(split) >= unit
        cand = search.evaluate(grouping, search.initial(split, random.Random(0), 0), budget)
        child = search.rebalance(grouping, cand, random.Random(1))
        if child is not None:
            assert set(range(len(grouping))) <= set(child) and child != list(cand.genome)


def test_budget_stops_one_step_before_the_deadline():
    """A started evaluation is finished, so the seconds stop when the longest recent step would cross the
    deadline; the reserve is capped at STEP_RESERVE_SHARE of the budget."""
    import time

    from hetrl_cli.planner.search import STEP_RESERVE_SHARE, Budget

    budget = Budget(10.0, None)
    budget.count()
    time.sleep(0.3)
    budget.count()  # one step of at least 0.3 s
    budget.deadline = time.monotonic() + 0.25  # less than a step left
    assert budget.spent()
    budget.deadline = time.monotonic() + 5.0  # plenty left
    assert not budget.spent()
    slow = Budget(1.0, None)
    time.sleep(0.2)
    slow.count()  # an outlier step of 0.2 s: the reserve stays at 5 % of 1 s
    slow.deadline = time.monotonic() + 2 * STEP_RESERVE_SHARE * slow.budget_s
    assert not slow.spent()
