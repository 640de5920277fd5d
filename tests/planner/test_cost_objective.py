"""`hetrl plan --objective cost` and `--max-cost-per-hour` (issue 24, item 5): a cheap slow GPU type against an
expensive fast one; each objective's plan is checked against brute force over the ILP's space."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import load_artifact, save_artifact
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.errors import BadInput, Infeasible
from hetrl_cli.planner.api import make_plan
from hetrl_cli.planner.cost import SECONDS_PER_HOUR, make_objective
from hetrl_cli.planner.ilp import _fits, build_space, choose_granularity, realise
from hetrl_cli.planner.tables import Tables

from .conftest import cluster, workload

HETRL = str(Path(sys.executable).parent / "hetrl")
FAST, CHEAP = 6.88, 3.43
"""$/GPU-hour of the H100s and the A100s (given in cluster.yaml, so a new catalog price cannot move the test)."""


@pytest.fixture(scope="module")
def priced() -> ClusterProfile:
    return cluster(
        "priced",
        [
            {"gpu": "H100", "gpus_per_node": 2, "region": "r1", "price_per_gpu_hour": FAST},
            {"gpu": "A100 80GB", "gpus_per_node": 2, "region": "r2", "price_per_gpu_hour": CHEAP},
        ],
    )


@pytest.fixture(scope="module")
def plans(priced: ClusterProfile) -> dict[str, object]:
    w = workload("grpo", "sync")
    return {
        "time": make_plan(priced, w, solver="ilp", budget_s=60),
        "cost": make_plan(priced, w, solver="ilp", budget_s=60, objective="cost"),
        "hybrid": make_plan(priced, w, solver="hybrid", budget_s=60, max_evals=256, objective="cost"),
    }


def brute_force(profile: ClusterProfile, cap: float | None = None) -> tuple[float, float]:
    """(least seconds, least $/iteration) over the ILP's whole space by enumeration, among plans priced ≤ cap."""
    w = workload("grpo", "sync")
    tables = Tables(CostModel(profile, w), profile, w)
    objective = make_objective(profile, "cost", None)
    space = build_space(tables, choose_granularity(tables, 150))
    index = {s: i for i, s in enumerate(space.subsets)}
    best_time = best_cost = math.inf
    for grouping in space.groupings:
        for combo in itertools.product(*(space.feasible_pools(index[s]) for s in grouping)):
            pools = [space.pools[p] for p in combo]
            if not _fits(tables, pools):
                continue
            options = [space.options[(index[s], p)] for s, p in zip(grouping, combo, strict=True)]
            real = realise(tables, grouping, pools, options)
            hourly = objective.hourly(d for o in real for d in o.devices)
            if cap is not None and hourly > cap:
                continue
            seconds = tables.score(grouping, real)
            best_time = min(best_time, seconds)
            best_cost = min(best_cost, seconds * hourly / SECONDS_PER_HOUR)
    return best_time, best_cost


def test_cost_objective_picks_a_cheaper_slower_plan(plans) -> None:
    fast, cheap = plans["time"], plans["cost"]
    assert (fast.objective, cheap.objective) == ("time", "cost")
    assert cheap.price.usd_per_iteration < fast.price.usd_per_iteration * 0.95
    assert cheap.cost.iteration_s > fast.cost.iteration_s
    assert {d for g in cheap.groups for d in g.devices} != {d for g in fast.groups for d in g.devices}
    assert cheap.solver.objective == pytest.approx(cheap.price.usd_per_iteration, rel=1e-9)  # the solver's unit: $
    assert fast.solver.objective == pytest.approx(fast.cost.iteration_s, rel=1e-9)


def test_each_objective_is_optimal_against_brute_force(priced: ClusterProfile, plans) -> None:
    best_time, best_cost = brute_force(priced)
    assert plans["time"].solver.status == "optimal" and plans["cost"].solver.status == "optimal"
    assert plans["time"].cost.iteration_s == pytest.approx(best_time, rel=1e-6)
    assert plans["cost"].price.usd_per_iteration == pytest.approx(best_cost, rel=1e-6)
    assert plans["hybrid"].price.usd_per_iteration == pytest.approx(best_cost, rel=1e-6)  # scored by $ too


def test_the_price_is_the_used_devices_only(plans) -> None:
    """Idle devices are not rented: $/hour is the sum over the groups' devices, $/iteration that × time."""
    for plan in plans.values():
        used = {d for g in plan.groups for d in g.devices}
        hourly = sum(FAST if d.startswith("h100") else CHEAP for d in used)
        assert plan.price.usd_per_hour == pytest.approx(hourly)
        assert plan.price.devices == len(used)
        assert plan.price.usd_per_iteration == pytest.approx(hourly * plan.cost.iteration_s / 3600)
        w = plan.workload
        response = w.response_length.mean_fraction * w.max_response_tokens
        tokens = w.samples_per_step * (response + (w.max_prompt_tokens + response) * w.ppo_epochs)
        assert plan.price.tokens_per_iteration == pytest.approx(tokens)
        assert plan.price.usd_per_million_tokens == pytest.approx(plan.price.usd_per_iteration / tokens * 1e6)


@pytest.mark.parametrize("solver", ["ilp", "hybrid"])
def test_the_cap_is_respected_and_optimal_under_it(priced: ClusterProfile, plans, solver: str) -> None:
    cap = 2 * CHEAP + FAST - 0.01  # the time optimum (all four devices) is over it
    assert plans["time"].price.usd_per_hour > cap
    plan = make_plan(priced, workload("grpo", "sync"), solver=solver, budget_s=60, max_evals=256, max_cost_per_hour=cap)
    assert plan.price.usd_per_hour <= cap and plan.price.max_usd_per_hour == cap
    best_time, _ = brute_force(priced, cap)
    assert plan.cost.iteration_s == pytest.approx(best_time, rel=1e-6)


def test_cost_and_cap_together(priced: ClusterProfile) -> None:
    cap = CHEAP + 0.5
    plan = make_plan(
        priced, workload("grpo", "sync"), solver="ilp", budget_s=60, objective="cost", max_cost_per_hour=cap
    )
    _, best_cost = brute_force(priced, cap)
    assert plan.price.usd_per_hour <= cap
    assert plan.price.usd_per_iteration == pytest.approx(best_cost, rel=1e-6)


@pytest.mark.parametrize("solver", ["ilp", "hybrid", "verl"])
def test_no_plan_under_the_cap_names_the_cheapest(priced: ClusterProfile, solver: str) -> None:
    with pytest.raises(
        Infeasible, match=r"no plan under --max-cost-per-hour 1 \$/h.*cheapest plan found that fits costs"
    ):
        make_plan(priced, workload("grpo", "sync"), solver=solver, budget_s=30, max_evals=64, max_cost_per_hour=1.0)


def test_missing_prices_are_one_line_naming_the_devices() -> None:
    unpriced = cluster("unpriced", [{"gpu": "H100", "gpus_per_node": 1}, {"gpu": "L4", "gpus_per_node": 2}])
    assert unpriced.devices[0].price_per_gpu_hour == pytest.approx(55.04 / 8)  # the catalog's list price
    for kwargs in ({"objective": "cost"}, {"max_cost_per_hour": 10.0}):
        with pytest.raises(BadInput, match=r"l4-0/0, l4-0/1 have none: set 'price_per_gpu_hour'") as err:
            make_plan(unpriced, workload("grpo", "sync"), solver="hybrid", budget_s=5, **kwargs)
        assert "h100" not in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(BadInput, match="unknown objective 'money'"):
        make_plan(unpriced, workload("grpo", "sync"), solver="hybrid", budget_s=5, objective="money")
    plan = make_plan(unpriced, workload("grpo", "sync"), solver="verl", budget_s=30)  # time needs no prices
    assert plan.objective == "time"


def test_cli_exit_codes(tmp_path: Path, priced: ClusterProfile) -> None:
    profile, job = tmp_path / "priced.json", tmp_path / "workload.json"
    save_artifact(priced, profile)
    job.write_text(workload("grpo", "sync").model_dump_json())
    base = [HETRL, "plan", str(profile), "-w", str(job), "--solver", "hybrid", "--max-evals", "64"]
    base += ["-o", str(tmp_path / "p.json")]
    over = subprocess.run([*base, "--max-cost-per-hour", "1"], capture_output=True, text=True, timeout=300)
    assert over.returncode == 3, over.stderr
    assert "cheapest plan found that fits costs" in over.stderr and "Traceback" not in over.stderr
    bad = subprocess.run([*base, "--max-cost-per-hour", "-2"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    good = subprocess.run([*base, "--objective", "cost"], capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stderr
    assert "/iteration (hybrid" in good.stderr
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["objective"] == "cost" and data["price"]["usd_per_iteration"] > 0


def test_old_profiles_without_prices_load_and_plan(tmp_path: Path, priced: ClusterProfile) -> None:
    """A profile written before prices (no price fields) loads, keeps its fingerprint and plans by time."""
    data = json.loads(priced.model_dump_json())
    for device in data["devices"]:
        del device["price_per_gpu_hour"], device["price_source"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    old = load_artifact(str(path), ClusterProfile)
    assert old.fingerprint == priced.fingerprint  # prices are not hardware facts
    plan = make_plan(old, workload("grpo", "sync"), solver="ilp", budget_s=60)
    assert plan.price is None and plan.objective == "time"
    with pytest.raises(BadInput, match="needs a price for every device"):
        make_plan(old, workload("grpo", "sync"), solver="ilp", budget_s=60, objective="cost")


def test_simulate_keeps_the_objective_and_reprices(priced: ClusterProfile, plans) -> None:
    """`hetrl simulate` re-scores a cost plan with the profile's prices: same objective, the new $/hour."""
    from hetrl_cli.planner.build import rescore

    again = rescore(plans["cost"], priced)
    assert again.objective == "cost"
    assert again.price.usd_per_iteration == pytest.approx(plans["cost"].price.usd_per_iteration, rel=1e-9)
    cheaper = cluster(
        "priced",
        [
            {"gpu": "H100", "gpus_per_node": 2, "region": "r1", "price_per_gpu_hour": FAST},
            {"gpu": "A100 80GB", "gpus_per_node": 2, "region": "r2", "price_per_gpu_hour": CHEAP / 2},
        ],
    )
    assert rescore(plans["cost"], cheaper).price.usd_per_hour == pytest.approx(plans["cost"].price.usd_per_hour / 2)
