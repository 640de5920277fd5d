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

Past 150 whole-host pools each step is the lazy ILP (planner/lazy.py: a restricted master over columns grown
from the plans found before, under the same cap, with the device-count relaxation's bound on seconds, which
ignores the cap and so stays below every plan under it) on LAZY_STEP_SHARE of the seconds left; its steps
are `feasible` unless the relaxation reaches the plan, and the sweep's bound is the least step bound × the
cheapest price, as for a time-limited step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

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
LAZY_CAP_FALLOFF = 0.7
"""Where a lazy step finds no plan under its cap (and proves none), the next cap is this share of it: plans
cheaper per hour may still be cheaper per iteration."""
LAZY_STEP_SHARE = 0.5
"""Share of the seconds left a lazy step takes (it would otherwise spend them all on its master's rounds):
the first step gets half the budget, the next a quarter, ..., so the sweep walks down the Pareto front."""


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
    seeds: list = field(default_factory=list)
    """Plans found so far as (grouping, device sets): the lazy steps' first columns."""


def run_cost_ilp(tables, budget: Budget, first, report: Callable[[str], None], leaf_solver=None) -> CostOutcome | None:
    """The exact $/iteration optimum over the ILP's space (module docstring), started from `first` (the
    hybrid's plan under the cost objective, or None); past 150 whole-host pools by lazy steps (module
    docstring)."""
    from hetrl_cli.planner.ilp import realise

    objective = tables.objective
    sweep = _Sweep(best_cost=first.stats.objective if first is not None else math.inf)
    if first is not None:
        sweep.seeds.append((tuple(g.tasks for g in first.groups), [g.devices for g in first.groups]))
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
    """Run the sweep into `sweep`; False where no step can run (the ILP's space too large and no lazy step)."""
    from hetrl_cli.planner.ilp import realise

    objective = tables.objective
    cap = objective.max_cost_per_hour
    cheapest = least_hourly(tables)
    while True:
        if sweep.steps >= MAX_STEPS or budget.remaining_s() <= MIN_STEP_S:
            sweep.proven = False
            sweep.bound = min(sweep.bound, sweep.last_time_bound * cheapest / SECONDS_PER_HOUR)
            return True
        objective.max_cost_per_hour = cap
        cut = sweep.best_cost * SECONDS_PER_HOUR / cheapest if math.isfinite(sweep.best_cost) else None
        report(f"ILP cost sweep: step {sweep.steps + 1}, cap {'none' if cap is None else f'{cap:.4g} $/h'}")
        result, space, note = _time_step(tables, budget, sweep, cut, report, leaf_solver)
        sweep.steps += 1
        sweep.note = note
        if result.status == "toolarge":
            return False
        if space is not None and space.options:  # a tighter floor on a plan's price: the cheapest pool a group takes
            cheapest = max(
                cheapest, min(objective.pool_hourly(tables.classes, space.pools[p]) for _, p in space.options)
            )
        sweep.last_time_bound = result.bound if result.bound is not None else 0.0
        if result.status != "optimal":
            sweep.proven = False
            sweep.bound = min(sweep.bound, sweep.last_time_bound * cheapest / SECONDS_PER_HOUR)
        if result.options is None and (space is not None or result.status == "optimal"):
            return True  # nothing under this cap beats the best (or the full ILP's time ran out): the sweep is over
        if result.options is None:  # an unproven lazy step found none: cheaper plans may still beat the best
            cap = (cap if cap is not None else objective.hourly(objective.prices)) * LAZY_CAP_FALLOFF
            if cap < cheapest:  # no plan is that cheap: every range is covered
                return True
            continue
        real = realise(tables, result.grouping, result.pools, result.options)
        hourly = objective.hourly(d for o in real for d in o.devices)
        cost = result.objective * hourly / SECONDS_PER_HOUR
        if cost < sweep.best_cost * (1 - 1e-12):
            sweep.best_cost = cost
            sweep.best = (result.grouping, result.pools, result.options)
        sweep.seeds.append((tuple(result.grouping), [o.devices for o in real]))
        cap = hourly * (1 - CAP_STEP)


def expected_steps(tables, granularity) -> int:
    """auto's count of the sweep's time ILPs: each step caps strictly below the last plan's $/hour, so it walks
    the distinct hourly prices a plan can have; counted as the distinct prices of the ILP's pools (a plan's
    devices are its groups' pools; one group takes them all on the small clusters the full ILP plans), at most
    MAX_STEPS. The cut by the best $ ends it earlier where cheaper plans cannot win (an overestimate there)."""
    from hetrl_cli.planner.space import enumerate_pools

    objective = tables.objective
    prices = {round(objective.pool_hourly(tables.classes, p), 6) for p in enumerate_pools(tables.classes, granularity)}
    return max(1, min(MAX_STEPS, len(prices)))


def least_hourly(tables) -> float:
    """A floor on any plan's $/hour: the group holding the largest task holds its weights (+ gradients when
    training: bound.py's memory floor) in its devices' usable memory, so it rents at least the cheapest
    fractional fill of that many bytes, classes taken by $ per usable byte (a fractional knapsack's optimum is
    ≤ the integer one's); at least one device's price."""
    from hetrl_cli.costmodel import constants as C
    from hetrl_cli.planner.bound import task_floors

    prices = tables.objective.prices
    need = max((f.memory for f in task_floors(tables).values()), default=0.0)
    share = max(C.GEN_MEMORY_UTILIZATION, C.USABLE_MEMORY_FRACTION)
    per_class = [(prices[c.devices[0][0]], c.memory_bytes * share, c.size) for c in tables.classes]
    total = 0.0
    for price, usable, count in sorted(per_class, key=lambda x: x[0] / x[1]):
        if need <= 0:
            break
        take = min(float(count), need / usable)
        total += take * price
        need -= take * usable
    return max(total, min(prices.values()))


def _time_step(tables, budget: Budget, sweep: _Sweep, cut: float | None, report, leaf_solver):
    """One step: the least seconds under the objective's cap (and under `cut`), by the full ILP or, past its
    size, the lazy ILP on LAZY_STEP_SHARE of the seconds left (module docstring; no space returned)."""
    from hetrl_cli.planner.ilp import solve_ilp
    from hetrl_cli.planner.lazy import solve_lazy
    from hetrl_cli.planner.space import count_pools

    result, space, note = solve_ilp(tables, budget, progress=report, leaf_solver=leaf_solver, incumbent=cut)
    if result.status != "toolarge":
        return result, space, note
    objective = tables.objective
    n = count_pools(tables.classes, "host")
    objective.kind = "time"  # the lazy step's own search minimises seconds under the cap, as the master does
    try:
        # its own evaluations (--max-evals caps each step's search, as each stage counts its own): the master
        # finds no plan from the relaxation's columns alone where the search had none left
        step = Budget(max(MIN_STEP_S, budget.remaining_s() * LAZY_STEP_SHARE), budget.max_evals)
        return solve_lazy(
            tables, step, sweep.seeds, n, progress=report, leaf_solver=leaf_solver, incumbent=cut, seed=sweep.steps,
            cut_at_search=False,
        )  # fmt: skip
    finally:
        objective.kind = "cost"


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
