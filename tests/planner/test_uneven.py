"""Issue 24: a planner that does not break off the paper's settings. A 51-GPU cluster over three regions
(H100, A10G, V100, T4; one host with 3 GPUs, the others uneven) and a PPO-async workload with 8B actor,
critic and reference and a separate smaller reward model (qwen3-1.7b, the nearest built-in to 1.5B).

Before: the hybrid exited 3 under small --max-evals with "(one device: None)", a larger --max-evals could
return nothing where a smaller one planned, both baselines exited 3 with the same wrong cause, and the ILP
under a short budget returned a plan worse than the hybrid's."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from hetrl_cli.artifacts.workload import ModelSpec, Workload
from hetrl_cli.errors import Infeasible
from hetrl_cli.planner.api import make_plan

from .conftest import cluster

UNEVEN = [  # 16 H100 + 19 A10G (one 3-GPU host) + 8 V100 + 8 T4 = 51; 179 whole-host pools (hybrid only)
    {"gpu": "H100 SXM", "gpus_per_node": 8, "nodes": 2, "region": "us"},
    {"gpu": "A10G", "gpus_per_node": 4, "nodes": 4, "region": "eu"},
    {"gpu": "A10G", "gpus_per_node": 3, "nodes": 1, "region": "eu", "name_prefix": "a10g3"},
    {"gpu": "V100", "gpus_per_node": 8, "nodes": 1, "region": "ap"},
    {"gpu": "T4", "gpus_per_node": 4, "nodes": 2, "region": "ap"},
]
UNEVEN_ILP = [  # 24 H100 + 11 A10G (one 3-GPU host) + 8 V100 + 8 T4 = 51; 143 whole-host pools (the ILP's)
    {"gpu": "H100 SXM", "gpus_per_node": 8, "nodes": 3, "region": "us"},
    {"gpu": "A10G", "gpus_per_node": 4, "nodes": 2, "region": "eu"},
    {"gpu": "A10G", "gpus_per_node": 3, "nodes": 1, "region": "eu", "name_prefix": "a10g3"},
    {"gpu": "V100", "gpus_per_node": 8, "nodes": 1, "region": "ap"},
    {"gpu": "T4", "gpus_per_node": 4, "nodes": 2, "region": "ap"},
]


def ppo_async() -> Workload:
    eight = ModelSpec(arch="qwen3-8b")
    return Workload(
        algorithm="ppo", mode="async", actor=eight, critic=eight, reference=eight, reward=ModelSpec(arch="qwen3-1.7b")
    )


@pytest.fixture(scope="module")
def uneven():
    return cluster("uneven51", UNEVEN)


@pytest.fixture(scope="module")
def uneven_ilp():
    return cluster("uneven51-ilp", UNEVEN_ILP)


@pytest.mark.parametrize("evals", [10, 20])
def test_the_hybrid_plans_with_few_evaluations(uneven, evals):
    """Before: exit 3, 'no TP/PP layout of generation (qwen3-8b) fits on the 51 devices (one device: None)'.
    The baselines' plans are candidates of the hybrid even where its genomes cannot express them."""
    plan = make_plan(uneven, ppo_async(), solver="hybrid", budget_s=600, max_evals=evals, seed=0)
    assert plan.solver.objective is not None and plan.solver.objective < float("inf")


def test_the_hybrid_is_anytime_over_a_ladder_of_evaluations(uneven):
    """For one seed a larger --max-evals never returns a worse plan (before: 40 → 96.7 s, 80 → exit 3)."""
    ladder = [10, 20, 40, 80, 160, 320]
    seconds = [
        make_plan(uneven, ppo_async(), solver="hybrid", budget_s=600, max_evals=n, seed=0).solver.objective
        for n in ladder
    ]
    pairs = zip(ladder[1:], itertools.pairwise(seconds), strict=True)
    worse = [(n, a, b) for n, (a, b) in pairs if b > a * (1 + 1e-12)]
    assert not worse, dict(zip(ladder, seconds, strict=True))


@pytest.mark.parametrize("solver", ["verl", "streamrl"])
def test_baselines_plan_uneven_hosts(uneven, solver):
    """Before: both exited 3 ('... (one device: None)'). Now both plan the 51 uneven GPUs."""
    plan = make_plan(uneven, ppo_async(), solver=solver, budget_s=60)
    assert plan.solver.solver == solver and plan.cost.iteration_s > 0


def test_verl_runs_on_the_largest_uniform_subset(uneven):
    """Colocating everything needs TP the 3-GPU host cannot take: verl runs on the largest uniform subset
    that fits (the same GPU count on every host it uses), the odd devices idle and said so."""
    plan = make_plan(uneven, ppo_async(), solver="verl", budget_s=60)
    (group,) = plan.groups
    per_host = Counter(d.split("/")[0] for d in group.devices)
    assert len(set(per_host.values())) == 1, per_host
    assert len(group.devices) < 51 and f"{51 - len(group.devices)} devices left idle" in plan.solver.note


def test_a_baseline_that_cannot_fit_says_why_without_none():
    """Every task colocated on four A100s cannot hold 8B PPO (each task alone fits): the cause is the
    memory figure of the task that does not fit, never 'None'."""
    four = cluster("four-a100", [{"gpu": "A100 80GB", "gpus_per_node": 4, "nodes": 1, "region": "r1"}])
    with pytest.raises(Infeasible) as caught:
        make_plan(four, ppo_async(), solver="verl", budget_s=60)
    message = str(caught.value)
    assert "None" not in message and "every task on one group" in message and "GB" in message, message


def test_the_ilp_is_never_worse_than_the_hybrid_it_starts_from(uneven_ilp):
    """The ILP's first cutoff is the hybrid's plan (same seed and evaluations): at least as good."""
    hybrid = make_plan(uneven_ilp, ppo_async(), solver="hybrid", budget_s=600, max_evals=40, seed=0)
    ilp = make_plan(uneven_ilp, ppo_async(), solver="ilp", budget_s=3, max_evals=40, seed=0)
    assert ilp.solver.objective <= hybrid.solver.objective * (1 + 1e-9)
    assert ilp.solver.solver in ("ilp", "hybrid")


@pytest.mark.slow
def test_the_ilp_under_15_s_is_at_least_the_hybrids_plan(uneven_ilp):
    """The issue's case: `--solver ilp --budget 15s` returned 'feasible' with a plan worse than the hybrid's
    at 3 s (here before: 53.7 s/it against 39.4, in the cost model's units of that day; its refits since moved every
    prediction, so the check is against the hybrid, unit-free). The hybrid it starts from is fixed by --max-evals,
    so the comparison does not depend on the machine's speed; the plan carries a certified bound below it."""
    hybrid = make_plan(uneven_ilp, ppo_async(), solver="hybrid", budget_s=600, max_evals=256, seed=0)
    ilp = make_plan(uneven_ilp, ppo_async(), solver="ilp", budget_s=15, max_evals=256, seed=0)
    assert ilp.solver.objective <= hybrid.solver.objective * (1 + 1e-9)
    assert ilp.solver.bound is not None and 0 < ilp.solver.bound <= ilp.solver.objective


def test_without_baselines_the_hybrid_searches_on_until_it_has_a_plan(uneven):
    """Where no baseline has a plan, a budget that ends before the first plan does not mean 'infeasible': the
    cut stage runs on whole until its first plan (the same steps, so the ladder stays monotone)."""
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.planner.hybrid import Hybrid
    from hetrl_cli.planner.search import Budget
    from hetrl_cli.planner.tables import Tables

    w = ppo_async()
    tables = Tables(CostModel(uneven, w), uneven, w)
    assert Hybrid(tables, 0).run(Budget(None, 10)).options is None  # 10 evaluations find nothing here
    ladder = [10, 20, 40, 80]
    found = [Hybrid(tables, 0).run(Budget(None, n), until_found=True) for n in ladder]
    assert all(r.options is not None for r in found)
    seconds = [r.score for r in found]
    assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(seconds)), seconds


def test_streamrl_on_many_device_types_scores_a_bounded_number_of_splits(monkeypatch):
    """Before: every type-wise split (2^10 - 2 = 1022 on ten types), 45 s of a 30 s budget. Now past six types
    generation takes one or two types or all but one or two (110 splits); up to six, still every split."""
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.planner import baselines
    from hetrl_cli.planner.tables import Tables

    gpus = ["H100 SXM", "A100 80GB", "A100 40GB", "L40S", "L4", "A10G", "RTX 4090", "V100", "T4", "H200"]
    ten = cluster("ten-types", [{"gpu": g, "gpus_per_node": 4, "nodes": 1, "region": "r1", "name_prefix": f"g{i}"}
                                for i, g in enumerate(gpus)])  # fmt: skip
    scored: list[str] = []
    real = baselines._score
    monkeypatch.setattr(baselines, "_score", lambda *a: scored.append(a[1]) or real(*a))
    w = ppo_async()
    plan = baselines.streamrl(Tables(CostModel(ten, w), ten, w))
    assert len(scored) == 110 and plan is not None and plan.groups[0].tasks == ("generation",)
    assert baselines._generation_type_counts(6) == [1, 2, 3, 4, 5]
