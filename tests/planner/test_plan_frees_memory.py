"""A finished `make_plan` frees its cost model and tables by reference counting, not by the cyclic collector.

Before: each Memo held its owner's bound method (owner → memo → method → owner) and the screen's recursive
`visit` closure held itself and the Screen (→ Tables → CostModel), so a dropped plan's whole cost model (886,954
objects after u10's ILP) waited for a garbage collection, which then ran inside the next `make_plan`'s timed
budget (bench/hybrid_uneven.py: a 2 s hybrid got 9 evaluations instead of 37)."""

from __future__ import annotations

import collections
import gc
import weakref

import pytest

from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel.memo import Memo
from hetrl_cli.planner.api import make_plan
from hetrl_cli.profiling.catalog import profile_from_cluster

# bench/uneven_suite.py's u12 (seed 0): 6 device classes, so the hybrid runs the screen too
from .test_hybrid_uneven import U12, U12_WORKLOAD


def planner_garbage_after(run) -> collections.Counter:
    """The cost-model and planner-table objects that `gc.collect()` finds unreachable once `run()` returned
    and its result was dropped, counted by type (automatic collection off meanwhile, so none ran earlier)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        run()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        return collections.Counter(
            f"{type(o).__module__}.{type(o).__qualname__}"
            for o in gc.garbage
            if type(o).__module__.startswith(("hetrl_cli.costmodel", "hetrl_cli.planner"))
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()


@pytest.mark.parametrize("solver", ["hybrid", "ilp"])
def test_a_dropped_plan_leaves_no_cost_model_to_the_collector(solver):
    """Zero cost-model or planner objects are left to the cyclic collector after make_plan (before: the whole
    CostModel, its memos and their tables, and the screen's Tables)."""
    profile, workload = profile_from_cluster(U12), Workload.model_validate(U12_WORKLOAD)
    budget = {"max_evals": 32, "budget_s": 600} if solver == "hybrid" else {"budget_s": 120}

    def run() -> None:
        make_plan(profile, workload, solver=solver, seed=0, **budget)

    assert planner_garbage_after(run) == {}


class _Owner:
    def __init__(self) -> None:
        self.calls = 0
        self.squares: Memo[int] = Memo(self._square)

    def _square(self, x: int) -> int:
        self.calls += 1
        return x * x


def test_a_memo_of_a_bound_method_does_not_keep_its_owner():
    """The owner of a memo made from its bound method is freed when dropped (no cycle); results unchanged."""
    gc.disable()
    try:
        owner = _Owner()
        assert owner.squares(3) == 9 and owner.squares(3) == 9 and owner.calls == 1
        assert owner.squares.keyed("k", 4) == 16 and owner.squares.keyed("k", 5) == 16
        memo, alive = owner.squares, weakref.ref(owner)
        del owner
        assert alive() is None  # freed by reference counting, with the collector off
        with pytest.raises(ReferenceError):
            memo(7)
    finally:
        gc.enable()
