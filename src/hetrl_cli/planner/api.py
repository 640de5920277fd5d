"""`make_plan`: the one entry point the CLI calls. Picks the solver, runs it under the budget, re-scores the
result with the cost model (every emitted plan fits), and never returns a plan worse than the better baseline.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hetrl_cli.artifacts.plan import Plan, SolverStats
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.artifacts.rl import TASK_ROLE
from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel.types import GroupPlacement, PlanEstimate, TaskPlacement
from hetrl_cli.errors import BadInput, Infeasible
from hetrl_cli.planner.cost import Objective, make_objective, priced
from hetrl_cli.planner.search import MIN_STAGE_S, Budget

if TYPE_CHECKING:
    from hetrl_cli.planner.ilp_pyomo import LeafOptions

SOLVERS = ("auto", "ilp", "hybrid", "verl", "streamrl")
AUTO_ILP_SHARE = 0.5
"""`auto` picks the ILP when its estimated table-building time is under this share of the budget."""
FINISH_SHARE = 0.01
"""Share of the budget kept for re-scoring the answer and building the Plan after the solver stops."""
ILP_HYBRID_SHARE = 0.2
"""Share of the budget the ILP's solver gives the hybrid search for its starting plan (its first cutoff)..."""
ILP_HYBRID_EVALS = 256
"""...and at most this many evaluations of it (without --max-evals), so an ILP that proves optimality in
seconds is not made to wait for the share."""
FALLBACK_MIN_S = 1.0
"""The hybrid fallback of an ILP that gave no plan gets at least this long, even past the budget."""
OUTSIDE_BOUND_S = 2.0
"""Seconds of the budget's rest the device-count relaxation may take to bound an incumbent outside the ILP's
pools (`_relaxed_bound`; its cheap bounds come first, so a spent budget still gives one)."""


@dataclass
class Outcome:
    """A solver's answer before it becomes a Plan."""

    groups: list[GroupPlacement]
    placements: list[TaskPlacement]
    stats: SolverStats


def make_plan(
    profile: ClusterProfile,
    workload: Workload,
    *,
    solver: str,
    budget_s: float,
    max_evals: int | None = None,
    seed: int = 0,
    name: str | None = None,
    calibration: dict | None = None,
    mip_solver: str | None = None,
    write_model: Path | None = None,
    objective: str = "time",
    max_cost_per_hour: float | None = None,
) -> Plan:
    """Plan `workload` on `profile` with `solver` ('auto', 'ilp', 'hybrid', 'verl', 'streamrl').

    The budget is the whole call's: building the cost model and tables, the baselines, the solver and the
    final re-scoring (the solver gets what is left). It is made here, once, from `budget_s` and `max_evals`
    (`--budget`, `--max-evals`); every stage asks it or a part of it (planner/search.py). `calibration` is
    `Calibration.factors()` (hetrl calibrate): the cost model every solver scores with. `mip_solver` (a pyomo
    solver name) and `write_model` (a folder for the leaves as MPS/LP) apply to the ILP (planner/ilp_pyomo.py).
    `objective` ('time' or 'cost': $/iteration) and `max_cost_per_hour` (a cap on the used devices' $/hour) are
    planner/cost.py's; they need the profile's prices."""
    start = time.monotonic()
    from hetrl_cli.costmodel.architectures import check_executable
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.planner.build import to_plan
    from hetrl_cli.planner.ilp_pyomo import LeafOptions
    from hetrl_cli.planner.tables import Tables

    if solver not in SOLVERS:
        raise BadInput(f"unknown solver {solver!r}; choose one of: {', '.join(SOLVERS)}")
    if budget_s <= 0:
        raise BadInput(f"budget must be positive, got {budget_s} s")
    leaves = LeafOptions(mip_solver, write_model)
    leaves.check(solver)
    check_executable(workload)  # a model the runtime cannot run is one line (exit 2), not a plan
    budget = Budget(budget_s, max_evals, start=start)
    cost_model = CostModel(profile, workload, calibration)
    tables = Tables(cost_model, profile, workload)
    tables.objective = make_objective(profile, objective, max_cost_per_hour)
    check_feasible(tables)
    plan_name = name or f"{profile.name}-{solver}"
    with progress_reporter() as report:
        outcome = _solve_priced(tables, solver, budget.first(1 - FINISH_SHARE), seed, report, leaves)
        outcome.stats.seconds = time.monotonic() - start
    estimate = cost_model.evaluate(outcome.groups, outcome.placements)
    if not estimate.feasible:  # never emit a plan that does not fit
        raise Infeasible(f"the {solver} plan does not fit after re-scoring: {estimate.violations[0]}")
    tables.objective.check_cap([d for g in outcome.groups for d in g.devices], solver)
    _check_objective(outcome.stats, estimate, tables.objective, [d for g in outcome.groups for d in g.devices])
    return priced(to_plan(cost_model, estimate, outcome.groups, outcome.stats, plan_name), tables.objective)


def _solve(tables, solver: str, budget: Budget, seed: int, report, leaves: LeafOptions | None = None) -> Outcome:
    """Run `solver` within `budget`, seeded with and never worse than the baselines."""
    from hetrl_cli.planner import baselines

    start = time.monotonic()
    if solver in baselines.BASELINES:
        base = baselines.BASELINES[solver](tables)
        if base is None:
            raise Infeasible(f"the {solver} baseline finds no layout that fits: {baselines.failure(tables, solver)}")
        if math.isinf(_key(tables, base)):
            raise Infeasible(f"the {solver} baseline's plan is over the cap: {tables.objective.over_cap_message()}")
        stats = SolverStats(
            solver=solver,
            status="heuristic",
            objective=_key(tables, base),
            seconds=time.monotonic() - start,
            evaluations=tables.counters.task_calls,
            note=base.note,
        )
        return Outcome(base.groups, base.placements, stats)
    report("baselines")
    bases = [b for b in (baselines.verl(tables), baselines.streamrl(tables)) if b is not None]
    # Over the cap a baseline's plan still seeds the searches (their path is the uncapped one's); it is never the
    # answer (_allowed: run_hybrid, _not_worse_than).
    note, start = "", None
    if solver == "auto":  # the ILP's start first (its tables stay cached): the estimate counts only what is left
        from hetrl_cli.planner.ilp import choose_granularity

        if choose_granularity(tables, 150) is not None:  # else the hybrid, no start (choose_solver)
            start = (_incumbent(tables, budget.first(ILP_HYBRID_SHARE), seed, bases, report),)
        solver, note = choose_solver(tables, budget, start[0] if start else None)
    if solver == "ilp" and tables.objective.kind == "cost":
        from hetrl_cli.planner.cost_ilp import run_cost_ilp

        first = start[0] if start else _incumbent(tables, budget.first(ILP_HYBRID_SHARE), seed, bases, report)
        leaf = leaves.leaf_solver() if leaves is not None else None
        outcome = run_cost_ilp(tables, budget, first, report, leaf) or first  # type: ignore[assignment]
        if outcome is None:  # no ILP space and no hybrid plan: the hybrid's own answer (or its exit 3)
            outcome = run_hybrid(tables, budget.at_least(FALLBACK_MIN_S), seed, bases, report)
    elif solver == "ilp":
        outcome = run_ilp(tables, budget, seed, bases, report, leaves, start)
    else:
        outcome = run_hybrid(tables, budget, seed, bases, report)
        if start and start[0] is not None and start[0].stats.objective < outcome.stats.objective:
            outcome = start[0]  # auto's start found the better plan
    if note:
        outcome.stats.note = f"auto: {note}; {outcome.stats.note}"
    return _not_worse_than(outcome, bases, tables)


def choose_solver(tables, budget: Budget, start: Outcome | None = None) -> tuple[str, str]:
    """ILP when its space exists and its tables are estimated to take under AUTO_ILP_SHARE of the seconds
    left; `start` (the ILP's starting plan) is the estimate's cutoff for the leaf it solves."""
    from hetrl_cli.planner.estimate import LEAVES_PER_LARGEST
    from hetrl_cli.planner.ilp import choose_granularity, estimate_s
    from hetrl_cli.planner.space import count_pools

    gran = choose_granularity(tables, 150)
    if gran is None:
        n = count_pools(tables.classes, "host")
        return "hybrid", f"hybrid, the ILP space is too large ({n} whole-host pools)"
    budget_s = max(MIN_STAGE_S, budget.remaining_s())
    if start is not None and tables.objective.kind == "time" and math.isfinite(start.stats.objective):
        # the largest leaves solved, cut off at the start's plan (ilp.estimate_s)
        limit_s = AUTO_ILP_SHARE * budget_s / LEAVES_PER_LARGEST  # a leaf past it: the leaves overrun the share
        estimate = estimate_s(tables, gran, start.stats.objective, limit_s)
    else:  # tables timed on a sample, leaf MILPs by their columns
        estimate = estimate_s(tables, gran)
    if tables.objective.kind == "cost":  # the cost sweep solves a time ILP per $/hour cap (cost_ilp.py)
        from hetrl_cli.planner.cost_ilp import expected_steps

        estimate *= expected_steps(tables, gran)
    if estimate <= AUTO_ILP_SHARE * budget_s:
        return "ilp", f"ILP, ~{estimate:.0f} s of tables and MILPs fit the {budget_s:.0f} s budget"
    return "hybrid", f"hybrid, the ILP would take ~{estimate:.0f} s of the {budget_s:.0f} s budget"


def run_ilp(tables, budget: Budget, seed: int, bases, report, leaves: LeafOptions | None = None, start=None) -> Outcome:
    """The ILP within `budget`, started from the hybrid's plan (ILP_HYBRID_SHARE of the budget, never worse
    than the baselines) as its incumbent, so it returns a plan at least as good under any budget. When the
    ILP gives no plan of its own (space too large, no incumbent in time), the hybrid search for what is left
    (at least FALLBACK_MIN_S), the better of both returned. `leaves`: another MILP solver, leaf model files;
    `start`: (that starting plan,) where auto already ran it."""
    from hetrl_cli.planner.ilp import realise
    from hetrl_cli.planner.ilp_pyomo import LeafOptions
    from hetrl_cli.planner.lazy import solve_exact
    from hetrl_cli.planner.space import in_pools

    leaves = leaves or LeafOptions()
    first = start[0] if start else _incumbent(tables, budget.first(ILP_HYBRID_SHARE), seed, bases, report)
    known = first.stats.objective if first is not None else None
    seeds = [(tuple(g.tasks for g in o.groups), [g.devices for g in o.groups]) for o in [first, *bases] if o]
    result, space, note = solve_exact(  # past 150 pools: the lazy ILP from these plans (lazy.py)
        tables, budget, seeds, progress=report, leaf_solver=leaves.leaf_solver(), incumbent=known, seed=seed
    )
    note += leaves.finish(tables, space)
    proven = first is not None and result.status in ("optimal", "feasible")
    if proven and (result.options is None or result.objective > known * (1 + 1e-9)):  # a MIP gap above it
        granularity = space.granularity if space is not None else "host"  # the lazy ILP's: whole hosts
        inside = in_pools(tables.classes, granularity, [g.devices for g in first.groups])
        return _incumbent_outcome(first, result, note, None if inside else _relaxed_bound(tables, budget, known))
    if result.options is None and result.status == "infeasible" and space is not None and space.complete:
        from hetrl_cli.planner.proven import explain_proven

        raise Infeasible(explain_proven(tables, space))  # proven, not the budget: no fallback, the real cause
    if result.options is None:
        why = {"toolarge": note, "nosolution": "no incumbent within the time limit"}.get(result.status, result.status)
        fallback = run_hybrid(tables, budget.at_least(FALLBACK_MIN_S), seed, bases, report)
        if first is not None and first.stats.objective < fallback.stats.objective:
            fallback = first
        fallback.stats.note = f"ILP gave no plan ({why}): fell back to the hybrid result; {fallback.stats.note}"
        return fallback
    options = realise(tables, result.grouping, result.pools, result.options)
    gap = None
    if result.objective and result.bound is not None:
        gap = max(0.0, (result.objective - result.bound) / result.objective)
    stats = SolverStats(
        solver="ilp",
        status=result.status,
        objective=result.objective,
        bound=result.bound,
        gap=0.0 if result.status == "optimal" else gap,
        seconds=result.seconds,
        evaluations=tables.counters.task_calls,
        note=note,
    )
    return Outcome(tables.groups(result.grouping, options), tables.placements(options), stats)


def _incumbent(tables, budget: Budget, seed: int, bases, report) -> Outcome | None:
    """The ILP's starting plan: the hybrid's within `budget` (at most ILP_HYBRID_EVALS evaluations unless
    --max-evals says how many), or the better baseline's; None if neither."""
    if budget.max_evals is None:
        budget.cap = ILP_HYBRID_EVALS
    try:
        outcome = run_hybrid(tables, budget, seed, bases, report, until_found=False)
    except Infeasible:
        return None
    return _not_worse_than(outcome, bases, tables)


def _relaxed_bound(tables, budget: Budget, incumbent: float) -> float:
    """A lower bound over every device set, not only the ILP's pools: the device-count relaxation of
    bound.space_bound (any split of a class between groups), within OUTSIDE_BOUND_S of what the budget leaves
    (valid whenever it stops: cheap bounds first)."""
    from hetrl_cli.planner.bound import space_bound

    deadline = time.monotonic() + max(0.0, min(OUTSIDE_BOUND_S, budget.remaining_s()))
    return space_bound(tables, deadline, incumbent).bound


def _incumbent_outcome(first: Outcome, result, note: str, outside_bound: float | None = None) -> Outcome:
    """The incumbent returned by the ILP: nothing in its space beats it (status optimal where that is proven,
    with the ILP's bound and gap). An incumbent whose device sets are not pools of the ILP's space (part of an
    uneven host, as a baseline may take; a host the hybrid split while the ILP takes whole hosts) is not bounded
    by the space's optimum: its bound is `outside_bound` (`_relaxed_bound`), optimal only where that reaches it."""
    objective = first.stats.objective
    bound = None if result.bound is None else min(result.bound, objective)
    status = result.status
    why = "started from the hybrid's plan (or a baseline's): the ILP found none better"
    if outside_bound is not None:
        bound = min(outside_bound, objective)
        status = "optimal" if bound >= objective * (1 - 1e-4) else "feasible"  # lazy.OPTIMAL_GAP
        why += (
            " in its space, which does not hold this plan's devices (part of a host: not a pool); bound: the"
            " device-count relaxation's"
        )
    gap = None if bound is None or not objective else max(0.0, (objective - bound) / objective)
    stats = SolverStats(
        solver="ilp",
        status=status,
        objective=objective,
        bound=bound,
        gap=0.0 if status == "optimal" else gap,
        seconds=result.seconds,
        evaluations=first.stats.evaluations,
        note=f"{note}; {why}",
    )
    return Outcome(first.groups, first.placements, stats)


def run_hybrid(tables, budget: Budget, seed: int, bases, report, until_found: bool = True) -> Outcome:
    """The hybrid search within `budget` (its evaluations, else its seconds), seeded with the baselines' plans;
    where neither baseline has a plan and `until_found`, past the budget until it finds one (Hybrid.run)."""
    from hetrl_cli.planner.hybrid import Hybrid, genome_of

    search = Hybrid(tables, seed)  # the full tables: the quick ones (depths=1) misrank plans (docs/planner.md)
    seeds = [(tuple(g.tasks for g in b.groups), genome_of(search, [g.devices for g in b.groups])) for b in bases]
    steered = tables.objective.kind == "cost" or tables.objective.max_cost_per_hour is not None
    whole = budget.for_search()  # after building the search: that is spent time too
    budget = whole
    if steered and whole.max_evals is None:  # half the seconds each (_steered)
        budget = whole.first(0.5)
        budget.cap = whole.cap
    bases = _allowed(tables, bases)  # the answers; every baseline seeds the search, the cap filters
    result = search.run(budget, seeds, progress=lambda text, _f: report(text), until_found=until_found and not bases)
    if steered:  # under a cap or --objective cost: also the other objective's search, judged by ours (_steered)
        result = _steered(tables, seed, budget.for_search() if budget is whole else whole, seeds, result, report)

    def stats(objective: float, note: str) -> SolverStats:
        return SolverStats(solver="hybrid", status="heuristic", objective=objective, seconds=result.seconds,
                           evaluations=result.evaluations, seed=seed, note=note)  # fmt: skip

    if result.options is None and bases:  # the baselines' plans are candidates too, also where no genome holds them
        best = min(bases, key=lambda b: _key(tables, b))
        note = f"the search found no plan in {result.evaluations} evaluations; the {best.name} baseline's plan"
        return Outcome(best.groups, best.placements, stats(_key(tables, best), note))
    if result.options is None:
        why = explain_infeasible(tables, result.evaluations)
        from hetrl_cli.planner.ilp import choose_granularity

        if choose_granularity(tables, 150) is not None:  # the full ILP can prove it either way, in seconds here
            why += "; --solver ilp proves whether any plan exists"
        raise Infeasible(f"the hybrid search found no plan that fits: {why}")
    limit = f", max_evals={budget.max_evals}" if budget.max_evals else ""
    note = f"{result.rounds} successive-halving rounds{limit}"
    options = result.options
    return Outcome(tables.groups(result.grouping, options), tables.placements(options), stats(result.score, note))


def _steered(tables, seed: int, budget: Budget, seeds, first, report):
    """Under a cap the time objective's search follows the fastest plans, mostly over the cap; the cost
    objective's follows $/iteration toward the cheap ones. Both run (each its --max-evals, else half the
    seconds), every plan either scores under the cap a candidate, so the answer is at least as fast as either
    search's (before: u05 59.3 s/it where the capped cost search had 29.7). The better of the two results.
    Under the cost objective the second search follows the time objective's path, judged by $/iteration
    (held-out seed 4's u27: the cost search alone 3.1654 $/it, the time search's plan 3.0152)."""
    import dataclasses

    from hetrl_cli.planner.cost import Objective
    from hetrl_cli.planner.hybrid import Hybrid

    objective = tables.objective
    steer = Objective("time" if objective.kind == "cost" else "cost", objective.max_cost_per_hour, objective.prices)
    result = Hybrid(tables, seed, steer=steer).run(budget, seeds, progress=lambda text, _f: report(text))
    objective.cheapest_over_cap = min(objective.cheapest_over_cap, steer.cheapest_over_cap)
    best = result if result.options is not None and (first.options is None or result.score < first.score) else first
    evaluations, rounds = first.evaluations + result.evaluations, first.rounds + result.rounds
    seconds = first.seconds + result.seconds
    return dataclasses.replace(best, evaluations=evaluations, rounds=rounds, seconds=seconds)


def _not_worse_than(outcome: Outcome, bases, tables) -> Outcome:
    """Swap in the better baseline's plan if the search result is worse (it seeds the search, so this only
    happens when the search space cannot express it, e.g. uniform shares beating balanced ones)."""
    bases = _allowed(tables, bases)
    if not bases:
        return outcome
    best = min(bases, key=lambda b: _key(tables, b))
    mine = outcome.stats.objective if outcome.stats.objective is not None else math.inf
    if _key(tables, best) < mine * (1 - 1e-9):
        stats = outcome.stats.model_copy(
            update={
                "objective": _key(tables, best),
                "note": f"{outcome.stats.note}; the {best.name} baseline's plan was better and is returned",
                "status": "heuristic" if outcome.stats.solver == "hybrid" else "feasible",
            }
        )
        return Outcome(best.groups, best.placements, stats)
    return outcome


def _allowed(tables, bases: list) -> list:
    """The baselines' plans under the cap (all of them without one)."""
    return [b for b in bases if math.isfinite(_key(tables, b))]


def _key(tables, base) -> float:
    """A baseline plan's value under the planner's objective (inf over the cap)."""
    return tables.objective.key(base.iteration_s, [d for g in base.groups for d in g.devices])


def _solve_priced(tables, solver: str, budget: Budget, seed: int, report, leaves) -> Outcome:
    """`_solve`; under a cap, a search that finds nothing says so with the cheapest fitting plan's $/hour."""
    try:
        return _solve(tables, solver, budget, seed, report, leaves)
    except Infeasible as exc:
        objective = tables.objective
        if objective.max_cost_per_hour is None or "over the cap" in str(exc):
            raise
        raise Infeasible(objective.over_cap_message()) from None


def _check_objective(
    stats: SolverStats, estimate: PlanEstimate, objective: Objective | None = None, devices: Sequence[str] = ()
) -> None:
    """The solver's objective must equal evaluate() of its plan (seconds, or $/iteration under the cost
    objective); say so in the note if it does not."""
    value = estimate.iteration_s
    if objective is not None and objective.kind == "cost":
        value = objective.score(estimate.iteration_s, devices)
    unit = "s" if objective is None or objective.kind == "time" else "$"
    if stats.objective is None:
        stats.objective = value
        return
    if abs(stats.objective - value) > 1e-6 * max(1.0, value):
        stats.note += f"; objective {stats.objective:.6g} {unit} ≠ re-scored {value:.6g} {unit} (re-scored kept)"
        stats.objective = value


def check_feasible(tables) -> None:
    """Raise Infeasible naming the binding constraint when some task fits nowhere on the cluster: not on all
    its devices, nor on all devices of one class, nor on one host's (a task the small devices cannot hold
    may still fit on the big ones alone, and the planner may leave the others to other tasks)."""
    if not tables.classes:
        raise Infeasible(f"profile {tables.profile.name!r} has no usable devices; re-profile or add hosts")
    from hetrl_cli.planner.baselines import ordered_devices

    devices = ordered_devices(tables)
    for task in tables.tasks:
        if not any(tables.alone(task, pool) for pool in check_pools(tables)):
            raise Infeasible(explain_task(tables, task, devices))


def check_pools(tables) -> list[tuple[str, ...]]:
    """The device sets a task must fit one of: all devices, all devices of one class, one host's, or the
    power-of-two share of one host the baselines may take (4 of a 5-GPU host: baselines.uniform_subsets)."""
    from hetrl_cli.planner.baselines import ordered_devices, power_of_two_share

    pools = [ordered_devices(tables)]
    pools += [ordered_devices(tables, [d for host in c.devices for d in host]) for c in tables.classes]
    hosts = [tuple(host) for c in tables.classes for host in c.devices]
    return pools + hosts + [h[: power_of_two_share(len(h))] for h in hosts if power_of_two_share(len(h)) < len(h)]


def explain_task(tables, task, devices) -> str:
    """'actor_train of qwen3-32b needs ≥ 22 A100-80GB-equivalents of memory; the cluster has 4 GPUs'.

    The count is a true lower bound: the task's model states alone (weights; + grads and optimizer states
    for training), over the usable memory of the cluster's largest device."""
    from hetrl_cli.artifacts.rl import TRAIN_TASKS
    from hetrl_cli.costmodel import constants
    from hetrl_cli.costmodel.architectures import resolve
    from hetrl_cli.costmodel.memory import (
        grad_bytes_per_param,
        optimizer_bytes_per_param,
        weight_bytes_per_param,
    )
    from hetrl_cli.costmodel.types import TaskPlacement

    w = tables.workload
    spec = w.model_for(TASK_ROLE[task])
    per_param = weight_bytes_per_param(w)
    if task in TRAIN_TASKS:
        per_param += grad_bytes_per_param(w) + optimizer_bytes_per_param(w)
    head = "value" if task in ("reward", "critic_inference", "critic_train") else "lm"
    states = resolve(spec).param_count(head) * per_param
    big = max((d for d in tables.profile.devices if d.id in set(devices)), key=lambda d: d.memory_bytes)
    usable = big.memory_bytes * constants.USABLE_MEMORY_FRACTION
    equivalents = math.ceil(states / usable)
    label = big.name.removeprefix("NVIDIA ")
    where = f"the cluster has {len(devices)} GPUs"
    if equivalents > len(devices):
        return f"{task} of {spec.arch} needs ≥ {equivalents} {label}-equivalents of memory; {where}"
    est = tables.cm.task(TaskPlacement(task, (((big.id,),),)))
    where = f"no TP/PP layout of {task} ({spec.arch}) fits on the {len(devices)} devices"
    if est.violation is None:
        return f"{where} together (one {label} alone holds it: plan it on fewer, alike devices)"
    return f"{where} (one {label}: {est.violation})"


def explain_infeasible(tables, evaluations: int | None = None) -> str:
    """Why a search found nothing: the first task that fits nowhere (check_feasible's cause), else that no
    grouping fitted within the evaluations the search had."""
    from hetrl_cli.planner.baselines import ordered_devices

    devices = ordered_devices(tables)
    pools = check_pools(tables)
    for task in tables.tasks:
        if not any(tables.alone(task, pool) for pool in pools):
            return explain_task(tables, task, devices)
    scarce = {t: sum(bool(tables.alone(t, pool)) for pool in pools) for t in tables.tasks}
    tight = sorted((n, t) for t, n in scarce.items())[:2]
    where = " and ".join(f"{t} fits on {n} of {len(pools)} device sets tried" for n, t in tight)
    tried = f" in {evaluations} evaluations" if evaluations else ""
    return (
        f"every task fits on some of the devices, but no grouping of them fitted together{tried} ({where}); "
        "raise --budget or --max-evals, add devices, use ZeRO sharding or shorten sequences"
    )


@contextmanager
def progress_reporter() -> Iterator[Callable[[str], None]]:
    """A rich spinner on stderr when stderr is a TTY; otherwise a no-op (pipes stay clean)."""
    if not sys.stderr.isatty():
        yield lambda _text: None
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=Console(stderr=True)
    ) as bar:
        handle = bar.add_task("planning", total=None)
        yield lambda text: bar.update(handle, description=text)
