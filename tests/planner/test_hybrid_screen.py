"""The hybrid's screen (planner/screen.py): within its share of the budget, deterministic, its exactly scored
plans are what `evaluate()` says, its branch and bound is exact over its tables, and it beats every
whole-class plan when it ends on its own."""

from __future__ import annotations

import itertools
import math

import pytest

from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.planner.hybrid import Hybrid
from hetrl_cli.planner.screen import MAX_ROWS, SCREEN_CLASSES, SCREEN_SHARE, Screen, _compose
from hetrl_cli.planner.search import IDLE, Budget
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
    # a grouping with more groups than blocks has no plan; every screened one has a finite key
    expected = {gi for gi, g in enumerate(all_groupings) if len(g) <= len(search.blocks)}
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


def test_screen_skips_many_classes_and_too_many_rows():
    """Over SCREEN_CLASSES classes, or over MAX_ROWS rows, there is no screen, and nothing is spent on one."""
    groups = [{"gpu": "L4", "gpus_per_node": 1, "nodes": 1, "region": f"r{i}"} for i in range(SCREEN_CLASSES + 1)]
    many = _search(cluster("many", groups), "grpo", "sync")
    assert len(many.classes) > SCREEN_CLASSES
    hosts = [{"gpu": gpu, "gpus_per_node": 1, "nodes": 64, "region": "r1"} for gpu in ("A100 80GB", "L4")]
    rows = _search(cluster("rows", hosts), "grpo", "sync")
    assert len(rows.classes) == 2 and MAX_ROWS < 65 * 65 - 1
    for search in (many, rows):
        budget = Budget(None, 50)
        assert search.screen(groupings(search.tables.tasks), budget) == {}
        assert budget.evals == 0


def test_budget_within_counts_evaluations():
    budget = Budget(None, 10)
    budget.evals = 3
    assert budget.within(0.4)
    budget.evals = 4
    assert not budget.within(0.4)


def _rows_value(screen: Screen, gi: int, rows) -> float:
    """A plan's value under the screen's tables, written out from compose() (the branch and bound's objective)."""
    grouping = screen.groupings[gi]
    phases = [dict(screen.table(s))[r] for s, r in zip(grouping, rows, strict=True)]
    span = [max([f, *(p[i] for p in phases)]) for i, f in enumerate(screen.tables.floor)]
    weight_sync = transfers = 0.0
    gen = next(i for i, g in enumerate(grouping) if "generation" in g)
    if "actor_train" in grouping[gen]:  # on an exact entry, on its option's layouts (the runtime's relay)
        devices, exact = screen.devices(rows[gen]), (grouping[gen], rows[gen]) in screen.exact
        option = screen.tables.group_option(grouping[gen], devices) if exact else None
        weight_sync += screen.tables.same_group_weight_sync(devices, option.placements if option else ())
    weight_sync += sum(screen.critic_sync.get((s, r), 0.0) for s, r in zip(grouping, rows, strict=True))
    for spec in screen.tables.pair_specs(grouping):
        cost = screen.pair_cost(spec, rows[spec.src], rows[spec.dst])
        if spec.weight_sync:
            weight_sync += cost
        else:
            transfers += cost
    overlap = screen.tables.workload.mode == "async" and ("generation",) in grouping
    return _compose(span, weight_sync, transfers, overlap)


@pytest.mark.parametrize(("algorithm", "mode"), [("grpo", "async"), ("ppo", "sync")])
def test_branch_and_bound_is_exact_over_its_tables(tiny_profile, algorithm, mode):
    """Every grouping's best plan equals the minimum over all row assignments that fit, by enumeration."""
    search = _search(tiny_profile, algorithm, mode)
    screen = Screen(search, groupings(search.tables.tasks), Budget(None, None))
    assert screen.build_tables()
    for gi, grouping in enumerate(screen.groupings):
        rows = {s: [r for r, _ in screen.table(s)] for s in grouping}
        best = math.inf
        for combo in itertools.product(*(rows[s] for s in grouping)):
            if all(sum(r[c] for r in combo) <= n for c, n in enumerate(screen.n_blocks)):
                best = min(best, _rows_value(screen, gi, combo))
        found = screen.best_plans(gi, set())
        if not math.isfinite(best):
            assert found == []
            continue
        assert found[0][0] == pytest.approx(best, rel=1e-12)
        assert found[0][0] == pytest.approx(_rows_value(screen, gi, found[0][1]), rel=1e-12)
        assert [v for v, _ in found] == sorted(v for v, _ in found)


def _screen(name: str, per_node: int, nodes: int, l4_region: str, algorithm: str, mode: str) -> tuple[Hybrid, Screen]:
    """A search and its screen with tables built, on `nodes` A100 hosts in r1 and as many L4 hosts."""
    groups = [
        {"gpu": "A100 80GB", "gpus_per_node": per_node, "nodes": nodes, "region": "r1"},
        {"gpu": "L4", "gpus_per_node": per_node, "nodes": nodes, "region": l4_region},
    ]
    search = _search(cluster(name, groups), algorithm, mode)
    screen = Screen(search, groupings(search.tables.tasks), Budget(None, None))
    assert screen.build_tables()
    return search, screen


def test_exact_rows_score_what_evaluate_says():
    """With its entries made exact, a plan's value under the screen's tables is evaluate()'s score (whole
    sub-host blocks: the rows' realisation does not matter)."""
    search, screen = _screen("two-by-two", 1, 2, "r2", "ppo", "async")
    checked = 0
    for gi, grouping in enumerate(screen.groupings):
        for _, rows in screen.best_plans(gi, set()):
            for subset, row in zip(grouping, rows, strict=True):
                screen.make_exact(subset, row)
            if any(dict(screen.table(s)).get(r) is None for s, r in zip(grouping, rows, strict=True)):
                continue  # the group does not fit next to its mates there
            cand = search.evaluate(grouping, screen.genome(rows), Budget(None, None))
            assert _rows_value(screen, gi, rows) == pytest.approx(cand.score, rel=1e-9)
            checked += 1
    assert checked > 10


def test_proxies_are_corrected_by_the_nearest_exact_row():
    _, screen = _screen("six-hosts", 2, 3, "r1", "grpo", "sync")
    subset = ("reference",)
    row, near, far = (1, 1), (2, 1), (1, 0)
    before = dict(screen.table(subset))
    screen.make_exact(subset, row)
    after = dict(screen.table(subset))
    assert after[row] == screen.exact[(subset, row)]
    ratio = sum(after[row]) / sum(screen.proxy(subset, row))
    assert sum(after[near]) == pytest.approx(ratio * sum(before[near]), rel=1e-12)  # same classes: corrected
    assert after[far] == before[far]  # other classes: no exact row to learn from
