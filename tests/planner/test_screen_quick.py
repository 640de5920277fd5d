"""The screen's first plans before its union tables (issue 24, item 2: the hybrid at 2 s on a loaded box). Under
seconds alone, where the union tables would not come in time, whole-class plans under an estimate from the single
classes are scored before the 2^k − 1 union tables; under --max-evals, or with the CPU for the tables, nothing
changes (the same evaluations, so the same plans)."""

from __future__ import annotations

import math
import os

import pytest

import hetrl_cli.planner.screen as screen_module
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.planner.hybrid import Hybrid
from hetrl_cli.planner.screen import Screen
from hetrl_cli.planner.search import Budget
from hetrl_cli.planner.space import groupings
from hetrl_cli.planner.tables import Tables

from .conftest import cluster, workload
from .test_hybrid_uneven import u12  # noqa: F401 (the fixture)


def _three_classes(budget: Budget) -> Screen:
    profile = cluster(
        "three-classes",
        [
            {"gpu": "A100 80GB", "gpus_per_node": 1, "nodes": 2, "region": "r1"},
            {"gpu": "L4", "gpus_per_node": 1, "nodes": 2, "region": "r1"},
            {"gpu": "H100 SXM", "gpus_per_node": 1, "nodes": 2, "region": "r2"},
        ],
    )
    w = workload("ppo", "sync")
    search = Hybrid(Tables(CostModel(profile, w), profile, w), 0)
    return Screen(search, groupings(search.tables.tasks), budget)


def _tabulated_at_first_score(screen: Screen) -> int:
    """Runs the screen; the device sets its tables had tabulated each task alone on when it scored its first
    plan."""
    calls: list[int] = []
    seen: list[int] = []
    evaluate, fastest_alone = screen.search.evaluate, screen._fastest_alone

    def watched(grouping, genome, budget):
        if not seen:
            seen.append(len(calls) // len(screen.tables.tasks))
        return evaluate(grouping, genome, budget)

    def counted(task, devices):
        calls.append(1)
        return fastest_alone(task, devices)

    screen.search.evaluate = watched
    screen._fastest_alone = counted
    screen.run()
    return seen[0]


@pytest.fixture
def starved(monkeypatch):
    """A box where the union tables would not come in time."""
    monkeypatch.setattr(screen_module, "_starved", lambda budget, tables_cpu: True)


def test_starved_weighs_the_tables_against_the_seconds_left_and_the_load(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    assert not screen_module._starved(Budget(2.0), 0.5)
    assert screen_module._starved(Budget(2.0), 2.5)
    monkeypatch.setattr(os, "getloadavg", lambda: (8.0 * cores, 0.0, 0.0))  # 1/8 of a core
    assert screen_module._starved(Budget(2.0), 0.5)
    assert not screen_module._starved(Budget(None, None), 1e9)


def test_with_the_cpu_for_the_tables_the_union_tables_come_first_as_before():
    screen = _three_classes(Budget(None, None))
    assert _tabulated_at_first_score(screen) >= 7


def test_under_seconds_the_first_plan_comes_before_the_union_tables(starved):
    screen = _three_classes(Budget(None, None))
    assert _tabulated_at_first_score(screen) == 3  # each class alone, none of the 4 unions of two or more


def test_under_max_evals_the_union_tables_come_first_as_before(starved):
    screen = _three_classes(Budget(None, 256))
    assert _tabulated_at_first_score(screen) >= 7  # every union of whole classes (then the classes' parts)


def test_the_estimates_are_dropped_and_the_ratios_are_the_real_proxies(starved):
    screen = _three_classes(Budget(None, None))
    screen.run()
    fresh = _three_classes(Budget(None, None))
    assert fresh.build_tables()
    assert screen.fastest == fresh.fastest
    for key, near in screen.ratios.items():
        if not isinstance(key, tuple):
            continue
        subset = key[0]
        for row, ratio in near:
            proxy = screen.proxy(subset, row)
            assert math.isclose(ratio, sum(screen.exact[(subset, row)]) / sum(proxy), rel_tol=1e-12)


def test_u12_keeps_the_optimum_when_the_union_tables_never_come(u12, monkeypatch, starved):  # noqa: F811
    """u12's optimum (19.67 s/it, the ILP's, on 11 of 48 GPUs) is a whole-class plan the screen scored only after
    its 63 union tables (0.46 CPU s; a 2 s run at load 8 gets ~0.5 in all and kept the baseline's 26.7). With the
    tables cut off (as a spent budget does), the quick plans still hold it."""
    profile, w = u12
    search = Hybrid(Tables(CostModel(profile, w), profile, w), 0)
    monkeypatch.setattr(Screen, "build_tables", lambda self: False)
    found = search.screen(groupings(search.tables.tasks), Budget(None, None))
    best = min(c.score for s in found.values() for c in s.scored)
    assert best <= 19.6703


def test_the_unpriced_search_is_a_lower_bound_of_the_priced_one():
    """`_quick_plans` ranks the groupings by their best plan without pair costs (weight syncs, transfers only add)."""
    screen = _three_classes(Budget(None, 256))
    assert screen.build_tables()
    for gi in range(len(screen.groupings)):
        priced, unpriced = screen.best_plans(gi, set(), True), screen.best_plans(gi, set(), True, False)
        assert bool(priced) == bool(unpriced)
        if priced:
            assert unpriced[0][0] <= priced[0][0] * (1 + 1e-12)


def test_quick_plans_alone_are_marked_so_the_search_does_not_rank_by_them(u12, monkeypatch, starved):  # noqa: F811
    """Where the tables never came, nothing ranked the groupings: the hybrid's first cycle then grows every
    grouping's constructive split, as it does with no screen (ranked as screened, it would grow only the few
    quick-scored groupings and the next ones by index)."""
    profile, w = u12
    search = Hybrid(Tables(CostModel(profile, w), profile, w), 0)
    monkeypatch.setattr(Screen, "build_tables", lambda self: False)
    found = search.screen(groupings(search.tables.tasks), Budget(None, None))
    assert found and all(s.quick for s in found.values())
