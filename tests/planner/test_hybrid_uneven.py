"""Issue 24, item 2: the hybrid against the ILP optimum on the uneven suite, and auto's estimate.

The cluster is the suite's u12 (bench/uneven_suite.py, seed 0): 48 GPUs in 6 device classes over four regions
(0.5 Gbps WAN), GRPO sync with a 1.7B actor and an 8B reward model. The ILP's optimum runs on 11 of the 48
GPUs; the hybrid's constructive genomes give every class to a group, and with the screen limited to 5 classes
it stayed at 0.91 of the optimum up to 1024 evaluations, 1536 reach it (bench/hybrid_uneven.py)."""

from __future__ import annotations

import time

import pytest

from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.planner.api import make_plan
from hetrl_cli.planner.tables import Tables
from hetrl_cli.profiling.catalog import profile_from_cluster

U12 = {
    "name": "u12",
    "node_groups": [
        {"gpu": "H200", "gpus_per_node": 8, "nodes": 1, "region": "r4", "name_prefix": "g0-h200"},
        {"gpu": "H200", "gpus_per_node": 3, "nodes": 1, "region": "r2", "name_prefix": "g1-h200"},
        {"gpu": "L4", "gpus_per_node": 8, "nodes": 2, "region": "r4", "name_prefix": "g2-l4"},
        {"gpu": "V100", "gpus_per_node": 6, "nodes": 2, "region": "r0", "name_prefix": "g3-v100"},
        {"gpu": "V100", "gpus_per_node": 8, "nodes": 1, "region": "r4", "name_prefix": "g4-v100"},
        {"gpu": "A10G", "gpus_per_node": 1, "nodes": 1, "region": "r1", "name_prefix": "g5-a10g"},
    ],
    "network": {
        "intra_region": {"bandwidth": "100Gbps", "latency": "0.1ms"},
        "inter_region": {"default": {"bandwidth": "0.5Gbps", "latency": "20ms"}},
    },
}
U12_WORKLOAD = {"algorithm": "grpo", "mode": "sync", "actor": {"arch": "qwen3-1.7b"}, "reward": {"arch": "qwen3-8b"}}


@pytest.fixture(scope="module")
def u12():
    return profile_from_cluster(U12), Workload.model_validate(U12_WORKLOAD)


def fresh_tables(profile, workload) -> Tables:
    return Tables(CostModel(profile, workload), profile, workload)


def test_the_screen_runs_on_six_classes(u12):
    """The screen (the search that leaves classes idle) runs on the 6-class cluster, and its best plan leaves
    blocks idle. Before: no screen past 5 classes."""
    from hetrl_cli.planner.hybrid import Hybrid
    from hetrl_cli.planner.search import Budget
    from hetrl_cli.planner.space import groupings

    profile, workload = u12
    search = Hybrid(fresh_tables(profile, workload), seed=0)
    assert len(search.classes) == 6
    found = search.screen(groupings(search.tables.tasks), Budget(None, 256))  # a first stage's
    assert found
    best = min(c.score for s in found.values() for c in s.scored)
    idle = next(c for s in found.values() for c in s.scored if c.score == best)
    assert -1 in idle.genome  # the best screened plan leaves blocks idle


def test_the_estimate_does_not_count_wall_seconds(u12, monkeypatch):
    """auto's estimate is timed in process CPU seconds: a process that other processes' load keeps waiting
    (here: a wall clock that jumps 10 s at every reading) gets the same estimate. Before: it timed sampled
    pools by the wall clock, so the load moved it 2-3x (and this clock by thousands of seconds)."""
    from hetrl_cli.planner.ilp import choose_granularity, estimate_s

    profile, workload = u12
    tables = fresh_tables(profile, workload)
    gran = choose_granularity(tables, 150)
    assert gran == "host"
    calm = estimate_s(tables, gran)
    clock = iter(range(0, 10**9, 10))
    monkeypatch.setattr(time, "monotonic", lambda: float(next(clock)))
    waited = estimate_s(fresh_tables(profile, workload), gran)
    monkeypatch.undo()
    assert 0 < waited < 3 * calm + 1, (calm, waited)


@pytest.mark.slow
def test_the_hybrid_reaches_the_optimum_that_leaves_classes_idle(u12):
    """The hybrid at 128 evaluations (seed 0) is within 1 % of the ILP's proven optimum. Before: 0.86 at 128
    evaluations, 0.91 at 1024 (the screen did not run on 6 classes). (auto's time estimate against the ILP's CPU
    seconds is a benchmark, bench/hybrid_uneven.py in docs/benchmarks.md: inside `--solver ilp` the ILP runs on
    tables the hybrid's warm-up already built, 2.0 CPU s in the full suite against 9.3 estimated on cold tables.)"""
    profile, workload = u12
    ilp = make_plan(profile, workload, solver="ilp", budget_s=300, seed=0)
    assert ilp.solver.status == "optimal"
    hybrid = make_plan(profile, workload, solver="hybrid", budget_s=600, max_evals=128, seed=0)
    assert ilp.cost.iteration_s / hybrid.cost.iteration_s >= 0.99, (ilp.cost.iteration_s, hybrid.cost.iteration_s)
