"""Branching with exact leaves (issue 24, item 2: proves optimality where the gap closes).

The relaxation (bound.py) bounds each grouping from below by floors over device *counts*; its best grouping is
often one no whole-host layout realises, so its bound sits far below every plan. Here each grouping is a branch:
lowest relaxed bound first, a grouping below the incumbent gets its **exact leaf** — the full ILP's MILP
(`ilp.IlpModel`) restricted to that grouping, over every whole-host pool a plan better than the incumbent can
use — and its relaxed bound is replaced by the leaf's proven value. The bound this returns is the least over
groupings of (the exact value where the leaf was solved, the relaxed bound where not), so it is valid at any
point; where every grouping's value reaches the incumbent, the incumbent is optimal.

Which pools a leaf needs (`_Leaf.survivors`): a plan of the grouping puts group j on some whole-host pool P; its
iteration is ≥ the composition (`compose`) of group j's phase floors at P's device counts (bound.task_floors:
each ≤ the cost model's time on any device set with those counts, summed per phase as the cost model sums a
group's tasks) and, for every other group, the per-phase least over the pools still possible for it (its exact
option's phase seconds where scored, its floors where not), with the weight syncs at their floor
(`bound.sync_floor`). The composition only grows with a phase's seconds (spans are maxima, lanes sums or
maxima), so where that is ≥ the incumbent no plan better than the incumbent uses (j, P): such pools are left
out, and the leaf's MILP over the rest is exact for every plan below the incumbent. Pruning repeats while a
group's least rises (scored options replace floors). The space is the full ILP's at host granularity
(`ilp.build_space` with whole-host pools): a leaf's value is the optimum over whole-host plans, the space the
full ILP proves optimality over on clusters of up to 150 whole-host pools.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hetrl_cli.artifacts.rl import PHASES, TaskName
from hetrl_cli.costmodel.compose import iteration_s, overlaps, span
from hetrl_cli.planner.ilp import IlpModel, IlpResult, IlpSpace, _fill_pairs
from hetrl_cli.planner.search import Subset
from hetrl_cli.planner.space import Pool, allocate, count_pools, enumerate_pools
from hetrl_cli.planner.tables import PHASE_OF, Tables

Phases = tuple[float, ...]
MATE_TIMED = frozenset({"generation", "critic_inference"})
"""Tasks whose time depends on their group mates (generation's KV capacity and weight staging; critic inference
on critic_train's weights, `costmodel.tasks.class_inputs`): a mate may make them faster than alone (measured:
generation 20.753 s beside reference and reward, 20.760 alone, same layout), so their bound is the floor."""
MAX_LEAF_PAIRS = 5_000_000
"""A leaf whose surviving pools make more (group, group) pool products than this is left open (the MILP's pair
tables, one cost-model call a compatible pair of the roles that exchange data, would overrun the budget). The
tables hold far fewer: on u21 of the uneven suite's seed 1 a leaf of 458, 550, 571 and 4 pools (1.3 million
products) made 11 887 pair entries in 0.87 s; on u15 (seed 0) 53 000 products made 200 entries in 0.03 s."""
MAX_POOLS = 50_000
"""Past this many whole-host pools no leaf is tried (the pools' floors alone take seconds per 10^4; the uneven
suite has up to 39 365, a 32-host cluster of 16 kinds 43 million)."""
MIN_LEAF_S = 0.5
"""A leaf is started only with more than this many seconds left."""


def compose(tables: Tables, grouping: tuple[Subset, ...], per_group: list[Phases], weight_sync: float) -> float:
    """The iteration from per-group phase seconds (each at least the planner's phase floor), no transfers (≥ 0):
    `ilp.lower_bound`'s composition."""
    spans = [
        span((p[i] for p, g in zip(per_group, grouping, strict=True) if any(PHASE_OF[t] == i for t in g)), floor)
        for i, floor in enumerate(tables.floor)
    ]
    return iteration_s(spans, (0.0, 0.0), weight_sync, overlaps(tables.workload.mode, grouping))


class FloorTable:
    """Every whole-host pool with a lower bound on each task's seconds there: its floor at the pool's device
    counts (bound.task_floors), raised to its fastest layout alone on the pool's devices once that is known
    (`bound_alone`)."""

    def __init__(self, tables: Tables) -> None:
        from hetrl_cli.planner.bound import task_floors
        from hetrl_cli.planner.tables import DEPTHS

        self.tables = tables
        self.floors = task_floors(tables)
        self.pools: list[Pool] = enumerate_pools(tables.classes, "host")
        self.counts = [[w * c.per_host for c, (w, _) in zip(tables.classes, p, strict=True)] for p in self.pools]
        self.depths = max(tables.depths, DEPTHS)
        self._task: dict[TaskName, dict[int, float]] = {}
        self._devices: dict[int, tuple[str, ...]] = {}
        self._alone: dict[TaskName, dict[int, float]] = {}

    def devices(self, p: int) -> tuple[str, ...]:
        """Pool p's canonical devices (the ILP's tables score a pool there)."""
        if p not in self._devices:
            self._devices[p] = allocate(self.tables.classes, [self.pools[p]])[0]
        return self._devices[p]

    def floor(self, name: TaskName, p: int) -> float:
        """The task's floor on pool p (computed when first asked: past 10^4 pools all at once take seconds)."""
        known = self._task.setdefault(name, {})
        if p not in known:
            known[p] = self.floors[name].value(self.counts[p])
        return known[p]

    def bounded(self, subset: Subset, p: int) -> bool:
        return all(p in self._alone.get(t, ()) for t in subset)

    def bound_next(self, subset: Subset, p: int) -> None:
        """`bound_alone` for the one task of `subset` with the largest floor on pool p not bounded yet (a pool
        often drops out after one: the rest are then not scored)."""
        todo = [t for t in subset if p not in self._alone.get(t, ())]
        if todo:
            self.bound_alone((max(todo, key=lambda t: self.floor(t, p)),), p)

    def bound_alone(self, subset: Subset, p: int) -> None:
        """Each task's fastest layout alone on pool p: in any group a task runs one of these layouts
        (`Tables.task_options` draws only from `Tables.alone` at at most these depths, offloaded variants only
        of fitting ones, which only adds time), so where none fits alone the task fits in no group there (inf).
        Its time in a group equals its time alone on the same layout except for the tasks in MATE_TIMED (mates
        count by name only through residency, `costmodel.tasks.class_inputs`): theirs keep the floor, and their
        layouts are not scored here (the group option says whether they fit)."""
        for t in subset:
            known = self._alone.setdefault(t, {})
            if p in known:
                continue
            if t in MATE_TIMED:  # the floor (its layouts alone would only say whether it fits: not worth them)
                known[p] = self.floor(t, p)
                continue
            fitting = self.tables.alone(t, self.devices(p), self.depths)
            known[p] = max(self.floor(t, p), fitting[0][0]) if fitting else math.inf

    def phases(self, subset: Subset, p: int) -> Phases:
        """The group's lower bound per phase on pool p (its tasks' bounds summed per phase)."""
        out = [0.0] * len(PHASES)
        for t in subset:
            alone = self._alone.get(t, {}).get(p)
            out[PHASE_OF[t]] += self.floor(t, p) if alone is None else alone
        return tuple(out)


@dataclass
class _Leaf:
    """One grouping's exact leaf: the pools each group may still take and their scored options."""

    table: FloorTable
    grouping: tuple[Subset, ...]
    cut: float
    ws: float
    alive: list[list[int]] = field(default_factory=list)
    scored: dict[tuple[int, int], Phases | None] = field(default_factory=dict)
    """(group, pool) → the exact option's phase seconds (None: no layout fits)."""

    def value(self, j: int, p: int) -> Phases:
        got = self.scored.get((j, p))
        return got if got is not None else self.table.phases(self.grouping[j], p)

    def least(self, j: int) -> Phases:
        vals = [self.value(j, p) for p in self.alive[j]]
        return tuple(min(v[i] for v in vals) for i in range(len(PHASES))) if vals else (math.inf,) * len(PHASES)

    def survivors(self, deadline: float = math.inf) -> None:
        """Drop the pools no plan below `cut` can use, until no group's least rises (module docstring) or the
        `deadline` (stopping early keeps more pools: still every plan below `cut`)."""
        tables, grouping = self.table.tables, self.grouping
        if not self.alive:
            self.alive = [[p for p in range(len(self.table.pools)) if (j, p) not in self.scored]
                          for j in range(len(grouping))]  # fmt: skip
        changed = True
        while changed:
            changed = False
            for j in range(len(grouping)):
                if time.monotonic() >= deadline:
                    return
                others = [self.least(i) for i in range(len(grouping))]
                keep = []
                for k, p in enumerate(self.alive[j]):
                    if k % 1024 == 1023 and time.monotonic() >= deadline:  # keep the rest: still valid
                        keep += self.alive[j][k:]
                        break
                    if (j, p) in self.scored and self.scored[(j, p)] is None:
                        continue
                    per_group = [*others[:j], self.value(j, p), *others[j + 1 :]]
                    if compose(tables, grouping, per_group, self.ws) < self.cut:
                        keep.append(p)
                if len(keep) < len(self.alive[j]):
                    self.alive[j], changed = keep, True

    def score(self, deadline: float) -> bool:
        """Score every surviving (group, pool) option, fewest floor seconds first, pruning as they come in;
        False where the deadline came first."""
        tables = self.table.tables
        while True:
            todo = [(j, p) for j in range(len(self.grouping)) for p in self.alive[j] if (j, p) not in self.scored]
            if not todo:
                return True
            todo.sort(key=lambda jp: sum(self.table.phases(self.grouping[jp[0]], jp[1])))
            for j, p in todo[: max(8, len(todo) // 4)]:
                if time.monotonic() >= deadline:
                    return False
                subset = self.grouping[j]
                if not self.table.bounded(subset, p):  # its tasks alone first: the pool may drop out
                    self.table.bound_next(subset, p)
                    continue
                option = tables.group_option(subset, self.table.devices(p))
                self.scored[(j, p)] = None if option is None else tuple(option.phase_s)
            self.survivors(deadline)

    def space(self) -> IlpSpace:
        """The leaf's space: its grouping, the surviving pools with their options (complete for plans < cut)."""
        tables = self.table.tables
        used = sorted({p for ps in self.alive for p in ps})
        pools = [self.table.pools[p] for p in used]
        at = {p: i for i, p in enumerate(used)}
        subsets = sorted(set(self.grouping), key=lambda s: (len(s), s))
        space = IlpSpace("host", pools, [self.grouping], subsets, {})
        for j, subset in enumerate(self.grouping):
            s = subsets.index(subset)
            for p in self.alive[j]:
                devices = self.table.devices(p)
                option = tables.group_option(subset, devices)  # cached by `score`
                if option is None:
                    continue
                space.options[(s, at[p])] = option
                if "actor_train" in subset and "generation" in subset:
                    space.same_sync[(s, at[p])] = tables.same_group_weight_sync(devices, option.placements)
        _fill_pairs(tables, space)
        return space


@dataclass
class Branched:
    """What the branching proved: the bound over whole-host plans, the leaves solved, a plan found at one."""

    bound: float
    exact: int
    """Groupings whose leaf was solved (their exact value replaced the relaxed bound)."""
    open_below: int
    """Groupings left with a relaxed bound below the incumbent (0: the incumbent is optimal)."""
    plan: IlpResult | None = None
    """The best plan a leaf found below the incumbent (exact under the cost model)."""
    stopped: str = "done"
    """Why the branching stopped: done (no grouping left below the plan), time, pairs (a leaf's pair tables
    past MAX_LEAF_PAIRS), milp (a leaf's MILP ran out of time)."""


def branch(
    tables: Tables,
    relaxed: dict[tuple[Subset, ...], float],
    incumbent: float,
    deadline: float,
    *,
    leaf_solver: Callable[[IlpModel, float], IlpResult] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Branched:
    """Solve the exact leaves of the groupings `relaxed` (every grouping's relaxed bound) ranks below the
    incumbent, lowest first, until the `deadline` (time.monotonic()); module docstring."""
    from hetrl_cli.planner.bound import sync_floor

    values = dict(relaxed)
    if count_pools(tables.classes, "host") > MAX_POOLS:
        deadline = -math.inf
    table: FloorTable | None = None
    best: IlpResult | None = None
    cut, exact, stopped = incumbent, 0, "time"
    while time.monotonic() < deadline - MIN_LEAF_S:
        below = [g for g in values if values[g] < cut * (1 - 1e-9)]
        grouping = min(below, key=values.__getitem__, default=None)
        if grouping is None:
            stopped = "done"
            break
        if progress:
            progress(f"ILP: exact leaf {' | '.join('+'.join(g) for g in grouping)}")
        table = table or FloorTable(tables)
        leaf = _Leaf(table, grouping, cut, sync_floor(tables, grouping))
        leaf.survivors(deadline)
        if not leaf.score(deadline):
            break
        if not any(leaf.alive[j] for j in range(len(grouping))) or not all(leaf.alive):
            values[grouping], exact = max(values[grouping], cut), exact + 1
            continue
        sizes = [len(a) for a in leaf.alive]
        left = deadline - time.monotonic()
        if left <= MIN_LEAF_S:
            break
        if sum(sizes) ** 2 - sum(a * a for a in sizes) > MAX_LEAF_PAIRS:
            stopped = "pairs"
            break
        model = IlpModel(tables, leaf.space(), cutoff=cut)
        result = model.solve(left) if leaf_solver is None else leaf_solver(model, left)
        if result.status == "infeasible":  # nothing of this grouping below the cutoff
            values[grouping], exact = max(values[grouping], cut), exact + 1
        elif result.status == "optimal" and result.objective is not None:
            values[grouping], exact = max(values[grouping], result.objective), exact + 1
            if result.objective < cut:
                best, cut = result, result.objective
        else:  # the MILP's time ran out: its proven bound only
            values[grouping] = max(values[grouping], min(result.bound or 0.0, cut))
            stopped = "milp"
            break
    bound = min(cut, min(values.values(), default=math.inf))
    open_below = sum(v < cut * (1 - 1e-9) for v in values.values())
    return Branched(bound, exact, open_below, best, stopped)
