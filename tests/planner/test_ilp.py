"""The ILP is exact over its space: it equals brute-force enumeration, and its objective is what the cost
model's evaluate() says of the plan it returns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.planner.api import make_plan
from hetrl_cli.planner.ilp import IlpModel, brute_force, build_space, realise, solve_ilp, subspace
from hetrl_cli.planner.search import Budget
from hetrl_cli.planner.tables import Tables

from .conftest import TINY, cluster, workload

HIGHS_TOLERANCE = 2e-6
"""Twice HiGHS's default primal/MIP feasibility tolerance (1e-6): how far an optimal T may undershoot."""
HIGHS_REL_TOLERANCE = 1e-6
"""The same tolerance applies to HiGHS's scaled rows, so on objectives of hundreds of seconds (host-bound
tiny-cluster plans) the undershoot scales with T: seen 2.3e-7 × T; an under-priced leaf is off by far more."""
CASES = [("grpo", "sync"), ("grpo", "async"), ("ppo", "sync"), ("ppo", "async")]


@pytest.mark.parametrize(("algorithm", "mode"), CASES)
def test_ilp_equals_brute_force(tiny_profile, algorithm, mode):
    w = workload(algorithm, mode)
    cm = CostModel(tiny_profile, w)
    tables = Tables(cm, tiny_profile, w)
    result, _space, _note = solve_ilp(tables, Budget(30), granularity="fine")
    best = brute_force(tables, build_space(tables, "fine"))
    assert result.status == "optimal"
    assert best is not None
    # HiGHS meets rows to its feasibility tolerance (1e-6 absolute): T may sit that far below a phase sum
    assert result.objective == pytest.approx(best[0], rel=HIGHS_REL_TOLERANCE, abs=HIGHS_TOLERANCE)
    assert result.bound == pytest.approx(result.objective, rel=HIGHS_REL_TOLERANCE, abs=HIGHS_TOLERANCE)
    options = realise(tables, result.grouping, result.pools, result.options)
    estimate = cm.evaluate(tables.groups(result.grouping, options), tables.placements(options))
    assert estimate.feasible
    assert estimate.iteration_s == pytest.approx(best[0], rel=1e-9)  # the plan itself is the optimum


@pytest.mark.parametrize(("algorithm", "mode"), [("grpo", "async"), ("ppo", "sync")])
def test_ilp_plan_objective_is_evaluate(tiny_profile, algorithm, mode):
    plan = make_plan(tiny_profile, workload(algorithm, mode), solver="ilp", budget_s=30)
    assert plan.solver.solver == "ilp"
    assert plan.solver.status == "optimal"
    assert plan.solver.gap == 0.0
    assert "≠" not in plan.solver.note
    assert plan.solver.objective == pytest.approx(plan.cost.iteration_s, rel=1e-9)


def test_ilp_plan_on_stdout_is_clean_json(hetrl, tmp_path):
    """HiGHS prints a banner on fd 1 when a process makes its first solver; `-o -` must still be pure JSON."""
    root = Path(__file__).resolve().parents[2]
    profile = tmp_path / "tiny.json"
    save_artifact(cluster("tiny-2x2", TINY["2x2"]), profile)
    args = ("plan", profile, "-w", root / "examples" / "tiny-grpo.yaml")
    result = hetrl(*args, "--solver", "ilp", "--budget", "20s", "-o", "-", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["solver"]["solver"] == "ilp"
    assert "HiGHS" not in result.stdout


@pytest.mark.parametrize(("algorithm", "mode"), [("ppo", "sync"), ("ppo", "async")])
def test_every_grouping_leaf_equals_brute_force(tiny_profile, algorithm, mode):
    """Each grouping's MILP, not only the winning one, is exact: a leaf whose rows under-price some sync
    combination (the actor's colocated reshard plus the critic's sync apart) would solve below brute force."""
    w = workload(algorithm, mode)
    tables = Tables(CostModel(tiny_profile, w), tiny_profile, w)
    space = build_space(tables, "fine")
    mixed = 0
    for grouping in space.groupings:
        leaf = subspace(space, grouping)
        best = brute_force(tables, leaf)
        result = IlpModel(tables, leaf).solve(30)
        if best is None:
            assert result.objective is None
            continue
        assert result.status == "optimal", grouping
        assert result.objective == pytest.approx(best[0], rel=HIGHS_REL_TOLERANCE, abs=HIGHS_TOLERANCE), grouping
        together = any("actor_train" in g and "generation" in g for g in grouping)
        critic_apart = not any("critic_train" in g and "critic_inference" in g for g in grouping)
        mixed += together and critic_apart
    assert mixed > 0  # the case the test is for is in the space
