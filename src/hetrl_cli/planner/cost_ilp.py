"""`--objective cost` with the exact solver: min (iteration time × hourly price) by a sweep of ILPs over caps.

Time × price is not linear, so no single MILP minimises it. The sweep solves the time ILP (planner/ilp.py) under
a cap on the used devices' $/hour (constraint family (i)), starting from `--max-cost-per-hour` (or none), and
each next step caps strictly below the hourly price of the plan the step before returned. Step i returns T_i,
the least time of any plan priced ≤ cap_i, with price P_i ≤ cap_i. Any plan X (time T_X, price P_X) lies in
one step's range cap_{i+1} < P_X ≤ cap_i, where P_i ≤ P_X and T_i ≤ T_X, so T_i·P_i ≤ T_X·P_X: the cheapest
of the steps' plans is the optimum. The sweep ends where no plan is left under the cap, and each step only
looks for plans faster than best $ × 3600 / (the cheapest price any plan can have), so it also ends as soon as
no cheaper plan can beat the best (usually after a few steps: it walks the time/price Pareto front from the
fast end). Every step is proven optimal or the result is `feasible` with a valid bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from hetrl_cli.artifacts.plan import SolverStats
from hetrl_cli.costmodel.types import GroupPlacement, TaskPlacement
from hetrl_cli.planner.cost import SECONDS_PER_HOUR
from hetrl_cli.planner.search import Budget

MAX_STEPS = 64
"""Caps tried at most (each strictly cheaper than the last); past it the result is `feasible`."""
CAP_STEP = 1e-6
"""Relative step below the last plan's price: above the MILP's feasibility tolerance (1e-7), far below the gaps
between sums of list prices; plans priced within 1 ppm of each other count as priced alike."""
MIN_STEP_S = 0.2
"""A step is started only with more than this many seconds of the budget left."""


@dataclass
class CostOutcome:
    """The sweep's plan (the same fields as the planner's `Outcome`)."""

    groups: list[GroupPlacement]
    placements: list[TaskPlacement]
    stats: SolverStats


@dataclass
class _Sweep:
    """What the steps found: the best plan (its $/iteration, grouping and options), what is proven."""

    best_cost: float
    best: tuple | None = None
    steps: int = 0
    proven: bool = True
    bound: float = math.inf
    """The least $/iteration a plan in a range no step proved can have."""
    last_time_bound: float = 0.0
    """The last step's bound on seconds (every cheaper plan is at least this slow)."""
    note: str = ""


def run_cost_ilp(tables, budget: Budget, first, report: Callable[[str], None], leaf_solver=None) -> CostOutcome | None:
    """The exact $/iteration optimum over the ILP's space (module docstring), started from `first` (the
    hybrid's plan under the cost objective, or None); None where the ILP space is too large (the caller keeps
    the hybrid's plan)."""
    from hetrl_cli.planner.ilp import realise

    objective = tables.objective
    sweep = _Sweep(best_cost=first.stats.objective if first is not None else math.inf)
    user_cap = objective.max_cost_per_hour
    try:
        if not _steps(tables, budget, sweep, report, leaf_solver):
            return None
    finally:
        objective.max_cost_per_hour = user_cap
    lower = min(sweep.bound, sweep.best_cost)
    status = "optimal" if sweep.proven else "feasible"
    note = f"{sweep.note}; cost sweep: {sweep.steps} time ILPs under falling $/hour caps"
    if sweep.best is None:  # nothing in the space beats the starting plan
        if first is None:
            return None
        stats = _stats(sweep.best_cost, lower, status, note + "; started from the hybrid's plan: none cheaper")
        return CostOutcome(first.groups, first.placements, stats)
    grouping, pools, options = sweep.best
    real = realise(tables, grouping, pools, options)
    stats = _stats(sweep.best_cost, lower, status, note)
    return CostOutcome(tables.groups(grouping, real), tables.placements(real), stats)


def _steps(tables, budget: Budget, sweep: _Sweep, report, leaf_solver) -> bool:
    """Run the sweep into `sweep`; False where the ILP has no space (too large)."""
    from hetrl_cli.planner.ilp import realise, solve_ilp

    objective = tables.objective
    cap = objective.max_cost_per_hour
    cheapest = min(objective.prices.values())  # every plan rents at least one device
    while True:
        if sweep.steps >= MAX_STEPS or budget.remaining_s() <= MIN_STEP_S:
            sweep.proven = False
            sweep.bound = min(sweep.bound, sweep.last_time_bound * cheapest / SECONDS_PER_HOUR)
            return True
        objective.max_cost_per_hour = cap
        cut = sweep.best_cost * SECONDS_PER_HOUR / cheapest if math.isfinite(sweep.best_cost) else None
        report(f"ILP cost sweep: step {sweep.steps + 1}, cap {'none' if cap is None else f'{cap:.4g} $/h'}")
        result, space, note = solve_ilp(tables, budget, progress=report, leaf_solver=leaf_solver, incumbent=cut)
        sweep.steps += 1
        sweep.note = note
        if space is None:
            return False
        if space.options:  # a tighter floor on any plan's price: the cheapest pool some group can take
            cheapest = max(
                cheapest, min(objective.pool_hourly(tables.classes, space.pools[p]) for _, p in space.options)
            )
        sweep.last_time_bound = result.bound if result.bound is not None else 0.0
        if result.status != "optimal":
            sweep.proven = False
            sweep.bound = min(sweep.bound, sweep.last_time_bound * cheapest / SECONDS_PER_HOUR)
        if result.options is None:  # nothing under this cap beats the best: the sweep is over
            return True
        real = realise(tables, result.grouping, result.pools, result.options)
        hourly = objective.hourly(d for o in real for d in o.devices)
        cost = result.objective * hourly / SECONDS_PER_HOUR
        if cost < sweep.best_cost * (1 - 1e-12):
            sweep.best_cost = cost
            sweep.best = (result.grouping, result.pools, result.options)
        cap = hourly * (1 - CAP_STEP)


def _stats(objective: float, bound: float, status: str, note: str) -> SolverStats:
    gap = max(0.0, (objective - bound) / objective) if objective > 0 and math.isfinite(bound) else None
    return SolverStats(
        solver="ilp",
        status=status,
        objective=objective,
        bound=bound if math.isfinite(bound) else None,
        gap=0.0 if status == "optimal" else gap,
        note=note,
    )
