"""The hybrid's class-plan screen: within its share of the budget, deterministic, its exactly scored plans
are what `evaluate()` says, and it ranks every grouping that has class plans."""

from __future__ import annotations

import itertools
import math

import pytest

from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.planner.hybrid import IDLE, SCREEN_CLASSES, SCREEN_SHARE, Budget, Hybrid
from hetrl_cli.planner.space import groupings
from hetrl_cli.planner.tables import Tables

from .conftest import cluster, workload


def _search(profile, algorithm: str, mode: str) -> Hybrid:
    w = workload(algorithm, mode)
    return Hybrid(Tables(CostModel(profile, w), profile, w), 0)


@pytest.mark.parametrize(("algorithm", "mode"), [("grpo", "sync"), ("ppo", "async")])
def test_screen_scores_within_its_share(tiny_profile, algorithm, mode):
    search = _search(tiny_profile, algorithm, mode)
    all_groupings = groupings(search.tables.tasks)
    budget = Budget(None, 200)
    screened = search.screen(all_groupings, budget)
    assert budget.evals <= SCREEN_SHARE * 200 + 1
    k = len(search.classes)
    # every grouping that can give each group a class has an entry, ranked by a finite key
    expected = {gi for gi, g in enumerate(all_groupings) if len(g) <= k}
    assert set(screened) <= expected
    assert screened and all(math.isfinite(s.key) for s in screened.values())
    check = Budget(None, None)
    for gi, found in screened.items():
        assert [c.score for c in found.scored] == sorted(c.score for c in found.scored)
        for cand in found.scored:  # the screen's exact scores are evaluate()'s
            again = search.evaluate(all_groupings[gi], list(cand.genome), check)
            assert again.score == pytest.approx(cand.score, rel=1e-12)
        for genome in found.bounded:  # every group holds a block; owners are groups or idle
            assert set(range(len(all_groupings[gi]))) <= set(genome) <= {*range(len(all_groupings[gi])), IDLE}
        if found.scored:
            assert found.key <= found.scored[0].score


def test_screen_is_deterministic_under_max_evals(tiny_profile):
    runs = []
    for _ in range(2):
        search = _search(tiny_profile, "ppo", "sync")
        screened = search.screen(groupings(search.tables.tasks), Budget(None, 120))
        runs.append({gi: ([c.genome for c in s.scored], s.bounded, s.key) for gi, s in screened.items()})
    assert runs[0] == runs[1]


def test_screen_finds_the_best_whole_class_plan():
    """Two classes, GRPO: the screen's best scored plan is at least as good as every whole-class plan
    scored directly (the bound-ordered search may stop only when no bound can beat it)."""
    profile = cluster(
        "two-types",
        [
            {"gpu": "A100 80GB", "gpus_per_node": 2, "nodes": 1, "region": "r1"},
            {"gpu": "L4", "gpus_per_node": 2, "nodes": 1, "region": "r2"},
        ],
    )
    search = _search(profile, "grpo", "sync")
    all_groupings = groupings(search.tables.tasks)
    screened = search.screen(all_groupings, Budget(None, 10_000))
    best = min(c.score for s in screened.values() for c in s.scored)
    budget = Budget(None, None)
    k = len(search.classes)
    for grouping in all_groupings:
        n = len(grouping)
        for assign in itertools.product([*range(n), IDLE], repeat=k):
            if len(set(assign) - {IDLE}) < n:
                continue
            cand = search.evaluate(grouping, [assign[b.cls] for b in search.blocks], budget)
            assert best <= cand.score * (1 + 1e-9)


def test_screen_skips_clusters_with_many_classes():
    groups = [{"gpu": "L4", "gpus_per_node": 1, "nodes": 1, "region": f"r{i}"} for i in range(SCREEN_CLASSES + 1)]
    search = _search(cluster("many", groups), "grpo", "sync")
    assert len(search.classes) > SCREEN_CLASSES
    budget = Budget(None, 50)
    assert search.screen(groupings(search.tables.tasks), budget) == {}
    assert budget.evals == 0


def test_budget_within_counts_evaluations():
    budget = Budget(None, 10)
    budget.evals = 3
    assert budget.within(0.4)
    budget.evals = 4
    assert not budget.within(0.4)
