"""The exact solver past the enumerable (issue 24): where whole hosts alone give more than 150 pools, the ILP
runs as a *restricted master* over a working set of (group, pool) columns, with a certified lower bound from
bound.py instead of the space's own.

- **Bound first** (`BOUND_SHARE` of the budget): `bound.space_bound`, the least over groupings of a
  relaxation in device counts per class (no cost-model call; proven ≤ every plan's iteration in its
  docstring: rooflines, generation's decode + prefill + late steps, memory with optimizer states or their
  offload, weight syncs, a trainer's gradient all-reduce across regions). It caps the gap the plan reports,
  and `optimal` is claimed only where it reaches the plan (within OPTIMAL_GAP).
- **A search next** (`HYBRID_SHARE` of what is left): the hybrid, seeded with the plans found before; on
  clusters this large it finds good plans far faster than columns do.
- **Columns**: the pools (whole hosts per class) of the plans found so far — the hybrid's, the baselines'
  (`seeds`) — each with its group's tasks; the relaxation's device split of its best groupings rounded to
  whole hosts; and, round after round, the ±1-host neighbours of the best plan's pools. A column is the
  group option `Tables.group_option` on the pool's canonical devices: the full ILP's own table entry.
- **Master**: the full ILP's MILP (`ilp.IlpModel`, every constraint family) over the columns, through
  `ilp.search_space` with the incumbent as cutoff, so a plan it returns is exact under the cost model and
  better than every plan found before; rounds go on while the budget lasts and new columns appear.

- **Branching with exact leaves** (branch.py; `SMALL_BRANCH_SHARE` of what the bound leaves up to SMALL_POOLS
  pools, `BRANCH_SHARE` beyond, none past `branch.MAX_POOLS`): groupings whose
  relaxed bound is below the plan, lowest first, get the full ILP's MILP over every whole-host pool a better
  plan could use; each solved leaf's value replaces its relaxed bound, and a leaf's plan below the incumbent
  is returned. Where every grouping reaches the plan, it is optimal over whole-host plans (the space the full
  ILP proves optimality over).

The master's own bound covers only its columns, so it is never reported; the plan's bound is the
relaxation's, raised by the branching's where it ran, min'ed with the plan (a plan cannot beat the optimum).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from hetrl_cli.planner.bound import cheap_bound, space_bound, task_floors
from hetrl_cli.planner.ilp import (
    IlpModel,
    IlpResult,
    IlpSpace,
    _fill_pairs,
    search_space,
    solve_ilp,
)
from hetrl_cli.planner.search import Budget, Subset
from hetrl_cli.planner.space import Pool, allocate, count_pools, groupings
from hetrl_cli.planner.tables import Tables

BOUND_SHARE = 0.25
"""Share of the budget the relaxation bound may take (it stops earlier once every grouping is refined)."""
MIN_BOUND_S = 2.0
"""Seconds the bound gets even where the stages before the ILP spent its budget (it is the plan's certificate;
on the uneven suite it completes in 0.2-8.5 s, while the cheap bound alone was 4.6 against 9.2 on u27)."""
ROUNDS = 100
"""Master rounds at most (each adds the neighbours of the best plan's pools)."""
HYBRID_SHARE = 0.8
"""Share of what the bound leaves that the hybrid search takes for the master's first columns (the master
improves plans locally; the search finds them far better per second on clusters this large: at 60 s on u13
of the uneven suite 28.5 s/it with 0.8 against 33.1 with 0.6, on u02 43.1 against 44.2-49.3)."""
BOUND_SEEDS = 3
"""Refined groupings, lowest bound first, whose relaxed device split seeds columns."""
BRANCH_SHARE = 0.15
"""Share of what the bound leaves that the exact leaves get past SMALL_POOLS, after the search and the master
(on the uneven suite's settings of 2 591-11 663 pools no leaf finished in 40 % of a 60 s budget under load,
and the search that lost the time found a worse plan on u13: 49.2 s/it against 35.8)."""
SMALL_POOLS, SMALL_BRANCH_SHARE = 1000, 0.7
"""Up to this many whole-host pools the leaves get the larger share (each leaf's tables are few: on u02 of the
uneven suite, 161 pools, the leaves alone proved its plan optimal in 29-57 s; on u15, 215 pools, in 9 s)."""
BRANCH_UNBOUNDED_S = 60.0
"""Seconds the exact leaves get where the budget has no deadline (--max-evals only)."""
OPTIMAL_GAP = 1e-4
"""The relaxation bound within this share of the plan proves it optimal (HiGHS's own MIP gap)."""

Column = tuple[Subset, Pool]
Seed = tuple[tuple[Subset, ...], Sequence[Sequence[str]]]
"""A plan found before the ILP: its grouping and each group's device ids (the lazy ILP's first columns)."""


def pool_of(tables: Tables, devices: Sequence[str]) -> Pool:
    """The whole-host pool nearest a device set: per class, its sub-hosts the set holds more than half of."""
    held = set(devices)
    pool = []
    for c in tables.classes:
        whole = sum(1 for host in c.devices if 2 * sum(d in held for d in host) > len(host))
        pool.append((whole, 0))
    return tuple(pool)


def rounded_pool(tables: Tables, counts: Sequence[float]) -> Pool:
    """Device counts per class (the relaxation's) rounded to whole sub-hosts within the class."""
    return tuple((min(c.n_hosts, round(n / c.per_host)), 0) for c, n in zip(tables.classes, counts, strict=True))


def neighbours(tables: Tables, pool: Pool) -> list[Pool]:
    """Pools one whole sub-host away (one more or one fewer of one class)."""
    out = []
    for k, c in enumerate(tables.classes):
        whole = pool[k][0]
        for step in (-1, 1):
            if 0 <= whole + step <= c.n_hosts:
                moved = (*pool[:k], (whole + step, 0), *pool[k + 1 :])
                if any(w for w, _ in moved):
                    out.append(moved)
    return out


class Master:
    """The working set of columns and the restricted space over them."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.groupings = groupings(tables.tasks)
        self.subsets = sorted({g for gs in self.groupings for g in gs}, key=lambda s: (len(s), s))
        self.index = {s: i for i, s in enumerate(self.subsets)}
        self.pools: list[Pool] = []
        self.pool_index: dict[Pool, int] = {}
        self.options: dict[tuple[int, int], object] = {}
        self.same_sync: dict[tuple[int, int], float] = {}
        self.tried: set[Column] = set()

    def add(self, columns: Sequence[Column], budget: Budget) -> int:
        """Score the new columns (group options on the pools' canonical devices) until the budget ends;
        how many were new."""
        new = 0
        for subset, pool in columns:
            if (subset, pool) in self.tried or not any(w or p for w, p in pool):
                continue
            if budget.remaining_s() <= 0:
                break
            self.tried.add((subset, pool))
            new += 1
            if pool not in self.pool_index:
                self.pool_index[pool] = len(self.pools)
                self.pools.append(pool)
            p = self.pool_index[pool]
            devices = allocate(self.tables.classes, [pool])[0]
            option = self.tables.group_option(subset, devices)
            if option is None:
                continue
            s = self.index[subset]
            self.options[(s, p)] = option
            if "actor_train" in subset and "generation" in subset:
                self.same_sync[(s, p)] = self.tables.same_group_weight_sync(devices, option.placements)
        return new

    def space(self) -> IlpSpace:
        """The restricted space: every grouping, the columns scored so far (incomplete by construction)."""
        space = IlpSpace("host", list(self.pools), self.groupings, self.subsets, dict(self.options), complete=False)
        space.same_sync = dict(self.same_sync)
        _fill_pairs(self.tables, space)
        return space


def _seed_columns(tables: Tables, seeds: Sequence[Seed]) -> list[Column]:
    """Each seed plan's groups as columns."""
    columns: list[Column] = []
    for grouping, device_sets in seeds:
        for subset, devices in zip(grouping, device_sets, strict=True):
            columns.append((tuple(subset), pool_of(tables, devices)))
    return columns


def _hybrid(tables: Tables, budget: Budget, seeds: Sequence[Seed], seed: int, progress) -> tuple[Seed, float] | None:
    """The hybrid search within `budget` (its seconds, and its evaluations where counted), seeded with the plans
    found before: its plan (a seed of the master: whole sub-hosts on clusters this large) and seconds, or None."""
    from hetrl_cli.planner.hybrid import Hybrid, genome_of

    if progress:
        progress("ILP: hybrid search for the master's first columns")
    search = Hybrid(tables, seed)
    genomes = [(tuple(tuple(s) for s in g), genome_of(search, sets)) for g, sets in seeds]
    found = search.run(budget, genomes)  # seconds and --max-evals, whichever ends first: the ILP's budget holds
    if found.options is None or found.grouping is None:
        return None
    return (found.grouping, [o.devices for o in found.options]), found.score


def _swaps(tables: Tables, pool: Pool) -> list[Pool]:
    """Pools with one whole sub-host of one class traded for one of another."""
    return [q for p in neighbours(tables, pool) for q in neighbours(tables, p) if q != pool]


def _by_bound(relaxed) -> list:
    """The refined groupings, lowest relaxation bound first."""
    return sorted(relaxed.counts, key=relaxed.per_grouping.__getitem__)


def _around(tables: Tables, grouping: Sequence[Subset], pools: Sequence[Pool]) -> list[Column]:
    return [(s, q) for s, p in zip(grouping, pools, strict=True) for q in neighbours(tables, p)]


def _branch(tables: Tables, relaxed, value: float, budget: Budget, leaf_solver, progress):
    """branch.branch on every grouping (the relaxation's bound where refined, else its cheap bound) below the
    plan of `value`, until the budget's deadline (BRANCH_UNBOUNDED_S without one)."""
    from hetrl_cli.planner.branch import branch

    floors = task_floors(tables)
    values = {g: max(cheap_bound(tables, floors, g), relaxed.per_grouping.get(g, 0.0)) for g in groupings(tables.tasks)}
    deadline = budget.deadline if budget.deadline is not None else time.monotonic() + BRANCH_UNBOUNDED_S
    return branch(tables, values, value, deadline, leaf_solver=leaf_solver, progress=progress)


def _note(n_pools: int, columns: int, rounds: int, bound: float, value: float, refined: int, branched) -> str:
    gap = "" if not math.isfinite(value) else f", gap {max(0.0, 1 - bound / value):.1%}"
    leaves = (
        "" if branched is None else f"; {branched.exact} groupings' exact leaves solved, {branched.open_below} left"
    )
    return (
        f"lazy ILP: {n_pools} whole-host pools are too many to enumerate; a restricted master over "
        f"{columns} (group, pool) columns in {rounds} rounds; bound {bound:.4g} s from the "
        f"device-count relaxation ({refined} groupings refined{leaves}{gap})"
    )


def solve_exact(
    tables: Tables,
    budget: Budget,
    seeds: Sequence[Seed],
    *,
    progress: Callable[[str], None] | None = None,
    leaf_solver: Callable[[IlpModel, float], IlpResult] | None = None,
    incumbent: float | None = None,
    seed: int = 0,
) -> tuple[IlpResult, IlpSpace | None, str]:
    """`ilp.solve_ilp`, and where its space is too large to enumerate the lazy ILP (`solve_lazy`) from the
    plans found before (`seeds`: (grouping, device sets)) and a hybrid search of `seed` (no space returned)."""
    budget = budget.from_now()
    result, space, note = solve_ilp(tables, budget, progress=progress, leaf_solver=leaf_solver, incumbent=incumbent)
    if result.status != "toolarge":
        return result, space, note
    n = count_pools(tables.classes, "host")
    kwargs = {"progress": progress, "leaf_solver": leaf_solver, "incumbent": incumbent, "seed": seed}
    return solve_lazy(tables, budget, seeds, n, **kwargs)


def solve_lazy(
    tables: Tables,
    budget: Budget,
    seeds: Sequence[Seed],
    n_pools: int,
    *,
    progress: Callable[[str], None] | None = None,
    leaf_solver: Callable[[IlpModel, float], IlpResult] | None = None,
    incumbent: float | None = None,
    seed: int = 0,
    cut_at_search: bool = True,
) -> tuple[IlpResult, None, str]:
    """The lazy ILP (module docstring) within `budget`: a plan better than `incumbent` with the relaxation's
    bound, or no plan (options None) with what the bound proves about the incumbent. `cut_at_search`: the
    master looks only for plans better than its own search's (whose plan it may then fail to return); off,
    for any plan better than `incumbent` (the cost sweep needs a plan under each cap)."""
    start = time.monotonic()
    if progress:
        progress("ILP: relaxation bound over device counts")
    relaxed = space_bound(tables, start + max(MIN_BOUND_S, BOUND_SHARE * budget.remaining_s()), incumbent)
    cut, seeds = incumbent, list(seeds)
    share = SMALL_BRANCH_SHARE if n_pools <= SMALL_POOLS else BRANCH_SHARE
    branch_at = budget.from_now().first(1 - share).deadline  # the exact leaves' share starts here
    search = Budget(None if branch_at is None else branch_at - time.monotonic(), budget.max_evals)
    search.cap = budget.cap
    found = None  # no search once the budget is spent (a search's first evaluations can take minutes here)
    if budget.remaining_s() > 0:
        found = _hybrid(tables, search.from_now().first(HYBRID_SHARE), seeds, seed, progress)
    if found is not None:
        seeds.append(found[0])
        if cut_at_search:
            cut = found[1] if cut is None else min(cut, found[1])
    master = Master(tables)
    columns = _seed_columns(tables, seeds)
    for grouping in _by_bound(relaxed)[:BOUND_SEEDS]:
        columns += [(s, rounded_pool(tables, c)) for s, c in zip(grouping, relaxed.counts[grouping], strict=True)]
    for grouping, sets in seeds:
        columns += _around(tables, grouping, [pool_of(tables, d) for d in sets])
    best: IlpResult | None = None
    rounds, extra = 0, _by_bound(relaxed)[BOUND_SEEDS:]
    while rounds < ROUNDS and search.remaining_s() > 0:
        rounds += 1
        if progress:
            progress(f"ILP: restricted master, round {rounds} ({len(master.tried)} columns)")
        if master.add(columns, search) == 0 and rounds > 1:
            if not extra:
                break
            grouping = extra.pop(0)  # nothing new around the best: the next grouping the relaxation ranks
            columns = [(s, rounded_pool(tables, c)) for s, c in zip(grouping, relaxed.counts[grouping], strict=True)]
            continue
        limit = best.objective if best is not None else cut
        result, _ = search_space(tables, master.space(), search, leaf_solver=leaf_solver, incumbent=limit)
        columns = []
        if result.options is not None and (best is None or result.objective < best.objective * (1 - 1e-12)):
            best = result
            columns = _around(tables, result.grouping, result.pools)
        elif best is not None:  # no gain: one sub-host moved from one class to another in a group
            columns = [(s, q) for s, p in zip(best.grouping, best.pools, strict=True) for q in _swaps(tables, p)]
    value = best.objective if best is not None else incumbent  # what the caller returns
    value = math.inf if value is None else value
    bound, branched = relaxed.bound, None
    if math.isfinite(value):
        branched = _branch(tables, relaxed, value, budget, leaf_solver, progress)
        bound = max(bound, branched.bound)
        if branched.plan is not None:
            best, value = branched.plan, branched.plan.objective
    seconds = time.monotonic() - start
    bound = min(bound, value)
    status = "optimal" if math.isfinite(value) and bound >= value * (1 - OPTIMAL_GAP) else "feasible"
    note = _note(n_pools, len(master.tried), rounds, bound, value, relaxed.refined, branched)
    if best is None:
        return IlpResult(status if incumbent is not None else "nosolution", None, bound, seconds), None, note
    best.bound, best.status, best.seconds = bound, status, seconds
    return best, None, note
