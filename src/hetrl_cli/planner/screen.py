"""The hybrid search's screen (docs/planner.md, "The screen"): before successive halving, good plans of the
groupings in *row* space, where the cost model's tables are cheap, and a rank of the groupings by them.

- A *row* is a group's blocks per device class (a count vector). Blocks of a class are interchangeable, so
  a row's costs do not depend on which blocks realise it: a row alone takes the first blocks of each class,
  and of two rows in a pair cost the second takes the blocks after the first.
- Per (subset of tasks, row) the screen holds the exact per-phase seconds (`Tables.group_option` on the
  row's devices, what `evaluate()` charges) or, until they are needed, a proxy from each task alone on the
  unions of whole classes and on the first x blocks of each class (`proxy`), scaled by the exact/proxy
  ratio seen on the nearest exact row over the same classes (`_correction`).
- Per grouping a branch and bound finds the best rows of its groups (each class split between the groups
  or left idle) under those phases plus the exact weight syncs and transfers between the rows.
- First the whole-class plans, scored in increasing value (`_class_plans`); then best first over the
  groupings: the grouping whose best plan is lowest has that plan's proxied entries made exact and is
  searched again; a plan exact throughout is scored with `evaluate()`. Until the share of the budget is
  spent or no grouping's best is within MARGIN of the best score.

On whole classes a proxy is a lower bound (a task next to group mates is never faster: they only take
memory), so when the screen ends on its own its best score beats every whole-class plan. On parts it is an
estimate: the faster of the time on the classes' union scaled by the share of the union's task rate the
part holds, and the part's per-class rates added up (load-balanced data parallelism).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import heapq
import itertools
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetrl_cli.artifacts.rl import PHASES, TaskName
from hetrl_cli.costmodel.compose import iteration_s
from hetrl_cli.planner.search import IDLE, Budget, Candidate, GenomeSearch, Subset
from hetrl_cli.planner.tables import PHASE_OF, PairSpec

Row = tuple[int, ...]
Phases = tuple[float, ...]

SCREEN_SHARE = 0.8
"""At most this share of the budget screens (tables, branch and bound, exact entries and scores)."""
TABLES_SHARE = 0.6
"""Share of the screen's budget within which the single-class part tables (the proxy's rates) are built."""
SCREEN_CLASSES = 6
"""The screen runs on clusters of 2 to this many device classes (the tables hold every union of whole classes:
2^k − 1 device sets)... It is what finds plans that leave whole classes idle: the constructive genomes give every
class to a group. At 5, the uneven suite's u12 (6 classes, 48 GPUs; the optimum runs on 11 of them) stayed at
0.91 of the ILP optimum up to 1024 evaluations (1536 reach it); at 6 it reaches it at 128 (bench/hybrid_uneven.py)."""
MAX_ROWS = 4096
"""...and at most this many rows (Π (blocks per class + 1) − 1); other clusters search without it. Tried on
the synthetic 64-GPU cluster (8 classes, one host each) with the unions cut to each class, each union of whole
regions and the whole cluster: the proxies of rows across regions were off by 2-3x either way and the 2 s plan
was no better than without the screen (89-95 s/it against 87-91; 66 s/it at 10 s either way)."""
CLASS_SHARE = 0.3
"""Share of what the tables leave of the screen's budget that the whole-class plans may take before the
partial-class search starts."""
MARGIN = 0.1
"""Plans are worked on while their value under the screen's tables is within this share above the best exact
score (a proxy errs by about this much either way), not only while they could beat it."""
KEEP = 3
"""Best plans the branch and bound returns per grouping (the first is searched on; the rest seed the arm)."""
SMALL_LEVEL = 64
"""The branch and bound tests up to this many rows of a level for fit in Python, more with numpy (its call costs
about as much as 64 Python tests)."""
NODES = 20_000
"""Branch-and-bound nodes per search of one grouping (pure arithmetic; a 5-group grouping on 5 classes has
millions of plans)."""
QUICK_PLANS = 3
"""Under seconds alone (no --max-evals): whole-class plans scored before the union tables (`_quick_plans`), at
most this many (until one fits). The union tables are 2^k − 1 device sets of cost-model calls (0.13-0.54 CPU s
on the uneven suite) and a 2 s run on a loaded box (load 8: ~0.5 CPU s) stopped before the screen's first plan."""
QUICK_GROUPINGS = 4
"""...of the best plans of this many groupings (a search with pair costs prices pairs of rows: all 203 groupings of
a PPO workload searched so took the short run's whole CPU on u16; ranked first without them)."""
STARVED = 3.0
"""`_quick_plans` runs where the CPU left is short of the union tables' CPU, estimated as this many times the single
classes' per device set (a union has more layouts than a class: CPU per device set of the unions over the single
classes' 2.5x on u12, 3.6x u04, 2.6x u23, 2.4x u16, 3.2x paper multi-continent GRPO; one run each)."""


@dataclass
class Screened:
    """What the screen learnt about one grouping."""

    key: float
    """Its best exact score, or its best plan's value under the screen's tables where none was scored (the
    arm order)."""
    scored: list[Candidate]
    """Plans scored exactly, best first."""
    bounded: list[list[int]]
    """Genomes of its best plans not scored, best first (dealt before the class-by-class ones)."""
    quick: bool = False
    """Only `_quick_plans`' plans: the union tables never came (the budget ended), nothing ranked the groupings."""


@dataclass
class _Table:
    """One subset's rows in `Screen.table`: phases per row (None: does not fit), the exact-entry count per mask
    they were worked out at, and the feasible rows with their phases (None: to be listed again)."""

    phases: list[Phases | None]
    seen: dict[int, int]
    rows: list[tuple[Row, Phases]] | None


@dataclass
class _Search:
    """One grouping's latest branch and bound."""

    plans: list[tuple[float, tuple[Row, ...]]]
    versions: tuple[int, ...]
    """The subsets' table versions it saw (a newer exact entry makes it stale)."""


class Screen:
    """State of one screen over `search`'s blocks and tables (docs above)."""

    def __init__(self, search: GenomeSearch, all_groupings: Sequence[tuple[Subset, ...]], budget: Budget) -> None:
        self.search = search
        self.tables = search.tables
        self.groupings = all_groupings
        self.budget = budget
        self.k = len(search.classes)
        self.of_class = [[i for i, b in enumerate(search.blocks) if b.cls == c] for c in range(self.k)]
        self.n_blocks = [len(blocks) for blocks in self.of_class]
        self.rows: list[Row] = []  # none when there are too many to tabulate: no screen then
        if math.prod(n + 1 for n in self.n_blocks) - 1 <= MAX_ROWS:
            self.rows = [r for r in itertools.product(*(range(n + 1) for n in self.n_blocks)) if any(r)]
        self.fastest: dict[tuple[TaskName, int], float] = {}
        """(task, mask of whole classes) → seconds alone on their union."""
        self.part: dict[tuple[TaskName, int, int], float] = {}
        """(task, class, x) → seconds alone on the first x blocks of the class."""
        self.proxies: dict[tuple[Subset, Row], Phases | None] = {}
        self.exact: dict[tuple[Subset, Row], Phases | None] = {}
        self.version: dict[Subset, int] = {}
        self.ratios: dict = {}
        self._tables: dict[Subset, _Table] = {}
        self._of_mask: dict[int, list[int]] = {}
        """Mask of classes → the indices of the rows over exactly those classes."""
        for i, row in enumerate(self.rows):
            self._of_mask.setdefault(_mask(row), []).append(i)
        self._changes: dict[int, int] = {}
        """Mask → exact entries made on rows over those classes (any subset): what a table's rows depend on."""
        self._n_changes = 0
        self._whole_rows = [row for row in self.rows if self._whole(row)]
        self._wholes: dict[Subset, tuple[int, list[tuple[Row, Phases]]]] = {}
        self._rates: dict[TaskName, list[float]] = {}
        """(subset, classes of the row) and classes of the row → exact / proxy seconds of the entries made exact."""
        self._spans: dict[tuple[int, int, int], tuple[str, ...]] = {}
        self._pairs: dict[tuple, dict[tuple[Row, Row], float]] = {}
        self._local: dict[Row | tuple[Subset, Row], float] = {}
        """Row → the weight sync when actor_train and generation share it (the branch and bound's `local`); on
        an exact entry's (subset, row), that on the option's layouts (a relay between its devices)."""
        self.critic_sync: dict[tuple[Subset, Row], float] = {}
        """(subset, row) of an exact entry → the option's own sync seconds (GroupOption.critic_sync_s: the critic's
        sync inside the group, the trainers' gathers)."""

    # --- devices of rows ------------------------------------------------------------------------

    def devices(self, row: Row, after: Row | None = None) -> tuple[str, ...]:
        """The devices of `row` on the first blocks of each class (after the blocks `after` takes)."""
        out: tuple[str, ...] = ()
        for c, x in enumerate(row):
            start = after[c] if after else 0
            key = (c, start, x)
            if key not in self._spans:
                cls = self.search.classes[c]
                blocks = [self.search.blocks[i] for i in self.of_class[c][start : start + x]]
                self._spans[key] = tuple(d for b in blocks for d in cls.devices[b.host][b.start : b.start + b.size])
            out += self._spans[key]
        return out

    def genome(self, rows: Sequence[Row]) -> list[int]:
        """Group g takes the next rows[g][c] blocks of class c (in order); the rest idle."""
        genome = [IDLE] * len(self.search.blocks)
        for c in range(self.k):
            at = 0
            for g, row in enumerate(rows):
                for i in self.of_class[c][at : at + row[c]]:
                    genome[i] = g
                at += row[c]
        return genome

    # --- tables ---------------------------------------------------------------------------------

    def build_tables(self) -> bool:
        """Each task alone on every union of whole classes (2^k − 1 device sets), finished even past the
        share: without them nothing ranks the groupings (False only when the whole budget is spent); then on
        the first x blocks of each class (within TABLES_SHARE of the screen's share; missing ones leave the
        proxy to the unions). One evaluation per device set."""
        tasks = self.tables.tasks
        for mask in sorted(range(1, 2**self.k), key=lambda m: (-bin(m).count("1"), m)):
            if self.budget.spent():
                return False
            self.budget.count()
            devices = self._union(mask)
            for task in tasks:
                self.fastest[(task, mask)] = self._fastest_alone(task, devices)
        for c in range(self.k):
            for task in tasks:
                self.part[(task, c, self.n_blocks[c])] = self.fastest[(task, 1 << c)]
        for x, c in sorted((size, cls) for cls in range(self.k) for size in range(1, self.n_blocks[cls])):
            if not self.budget.within(SCREEN_SHARE * TABLES_SHARE):
                break
            self.budget.count()
            row = tuple(x if cc == c else 0 for cc in range(self.k))
            for task in tasks:
                self.part[(task, c, x)] = self._fastest_alone(task, self.devices(row))
        return True

    def _union(self, mask: int) -> tuple[str, ...]:
        """The devices of the union of whole classes `mask` (as the tables key them)."""
        return self.search.devices_of([0 if mask >> b.cls & 1 else IDLE for b in self.search.blocks], 0)[1]

    def _fastest_alone(self, task: TaskName, devices: tuple[str, ...]) -> float:
        return min((f[0] for f in self.tables.alone(task, devices)), default=math.inf)

    def proxy(self, subset: Subset, row: Row) -> Phases | None:
        """Per-phase seconds of `subset` on `row` from the tasks alone (module docstring); None if a task
        fits nowhere there."""
        key = (subset, row)
        if key not in self.proxies:
            mask = _mask(row)
            whole = self._whole(row)
            phase = [0.0] * len(PHASES)
            for task in subset:
                rates = [r if x else 0.0 for r, x in zip(self._class_rates(task), row, strict=True)]
                held = sum(r * row[c] / self.n_blocks[c] for c, r in enumerate(rates))
                share = held / sum(rates) if sum(rates) > 0 else 0.0
                seconds = self.fastest[(task, mask)] / share if share > 0 else math.inf
                if not whole:
                    added = sum(1 / self.part.get((task, c, x), math.inf) for c, x in enumerate(row) if x)
                    seconds = min(seconds, 1 / added if added > 0 else math.inf)
                phase[PHASE_OF[task]] += seconds
            self.proxies[key] = tuple(phase) if all(map(math.isfinite, phase)) else None
        return self.proxies[key]

    def _class_rates(self, task: TaskName) -> list[float]:
        """The task's rate (1 / seconds) alone on each whole class; a class it does not fit alone still adds
        pipeline stages next to others, at the fitting classes' rate per TFLOP/s."""
        if task not in self._rates:
            alone = [self.fastest[(task, 1 << c)] for c in range(self.k)]
            flops = [c.size * (c.speed_tflops or 1.0) for c in self.search.classes]
            fit = [c for c in range(self.k) if math.isfinite(alone[c])]
            per_flop = sum(1 / alone[c] for c in fit) / sum(flops[c] for c in fit) if fit else 0.0
            self._rates[task] = [1 / alone[c] if c in fit else per_flop * flops[c] for c in range(self.k)]
        return self._rates[task]

    def table(self, subset: Subset) -> list[tuple[Row, Phases]]:
        """The subset's feasible rows with their phases: the exact entry where known, else the proxy times
        the (lower) median exact/proxy ratio seen so far on rows over the same classes, of this subset, else
        of any subset (the proxy's error is mostly the classes': pipelines across them, a slow link).

        Kept up to date by classes: an exact entry changes only rows over its own classes (their exact entry,
        their correction), so after one only those rows are worked out again, not all of them (the whole
        table was rebuilt after every exact entry before: 0.1-0.4 CPU s of a screen on the uneven suite)."""
        table = self._tables.get(subset)
        if table is None:
            table = self._tables[subset] = _Table([None] * len(self.rows), {}, None)
        stale = [m for m, rows in self._of_mask.items() if table.seen.get(m, -1) != self._changes.get(m, 0)]
        for mask in stale:
            table.seen[mask] = self._changes.get(mask, 0)
            for i in self._of_mask[mask]:
                table.phases[i] = self._phases(subset, self.rows[i])
        if stale or table.rows is None:
            table.rows = [(row, ph) for row, ph in zip(self.rows, table.phases, strict=True) if ph is not None]
        return table.rows

    def whole_table(self, subset: Subset) -> list[tuple[Row, Phases]]:
        """`table`'s rows of whole classes only (one per union), without working out the others: the whole-class
        plans come first and need only these, so the first screened plan no longer waits for every subset's
        proxies on every row (all of them are worked out later, for the partial-class search)."""
        hit = self._wholes.get(subset)
        if hit is None or hit[0] != self._n_changes:
            rows = [(row, ph) for row in self._whole_rows if (ph := self._phases(subset, row)) is not None]
            hit = self._wholes[subset] = (self._n_changes, rows)
        return hit[1]

    def _phases(self, subset: Subset, row: Row) -> Phases | None:
        """One row's phases in `table`: exact, else the corrected proxy; None where it does not fit."""
        if (subset, row) in self.exact:
            return self.exact[(subset, row)]
        proxy = self.proxy(subset, row)
        if proxy is None:
            return None
        correction = self._correction(subset, row)
        return tuple(x * correction for x in proxy)

    def _correction(self, subset: Subset, row: Row) -> float:
        """The exact/proxy ratio of the subset's nearest exact row over the same classes (fewest blocks
        apart; the lower median of ties), else the lower median over any subset's rows over those classes,
        else 1."""
        near = self.ratios.get((subset, _mask(row)))
        if near:
            dist = [(sum(abs(a - b) for a, b in zip(r, row, strict=True)), ratio) for r, ratio in near]
            least = min(d for d, _ in dist)
            ratios = sorted(ratio for d, ratio in dist if d == least)
        else:
            ratios = sorted(ratio for _, ratio in self.ratios.get(_mask(row), []))
        return ratios[(len(ratios) - 1) // 2] if ratios else 1.0

    def _whole(self, row: Row) -> bool:
        return all(x in (0, self.n_blocks[c]) for c, x in enumerate(row))

    def make_exact(self, subset: Subset, row: Row) -> None:
        """The group's layouts on the row's devices (one evaluation): its phases from now on; its ratio to
        the proxy corrects other proxies over the same classes (`_correction`)."""
        self.budget.count()
        option = self.tables.group_option(subset, self.devices(row))
        self.exact[(subset, row)] = option.phase_s if option is not None else None
        self.critic_sync[(subset, row)] = option.critic_sync_s if option is not None else 0.0
        if option is not None and "actor_train" in subset and "generation" in subset:  # the relay on its layouts
            self._local[(subset, row)] = self.tables.same_group_weight_sync(self.devices(row), option.placements)
        proxy = self.proxy(subset, row)
        if option is not None and proxy is not None and sum(proxy) > 0:
            ratio = sum(option.phase_s) / sum(proxy)
            self.ratios.setdefault((subset, _mask(row)), []).append((row, ratio))
            self.ratios.setdefault(_mask(row), []).append((row, ratio))
        self.version[subset] = self.version.get(subset, 0) + 1
        self._changes[_mask(row)] = self._changes.get(_mask(row), 0) + 1
        self._n_changes += 1

    def pair_cost(self, spec: PairSpec, src: Row, dst: Row) -> float:
        """A weight sync or transfer between two groups' rows (dst on the blocks after src's)."""
        memo = self.pair_memo(spec)
        if (src, dst) not in memo:
            memo[(src, dst)] = self.tables.pair_cost(spec, self.devices(src), self.devices(dst, after=src))
        return memo[(src, dst)]

    def pair_memo(self, spec: PairSpec) -> dict[tuple[Row, Row], float]:
        """(src row, dst row) → `pair_cost` of one kind of pair (its role and bytes), shared by every grouping:
        the branch and bound reads it tens of thousands of times per search."""
        return self._pairs.setdefault((spec.role, spec.nbytes), {})

    # --- branch and bound over one grouping ------------------------------------------------------

    def best_plans(
        self, gi: int, skip: set[tuple[Row, ...]], whole: bool = False, priced: bool = True
    ) -> list[tuple[float, tuple[Row, ...]]]:
        """The KEEP best plans (value, rows per group) of grouping `gi` under the current tables and exact
        pair costs, leaving out the plans in `skip` (already scored); `whole`: rows of whole classes only."""
        grouping = self.groupings[gi]
        tabs = [self.whole_table(s) if whole else self.table(s) for s in grouping]
        if not all(tabs) or len(grouping) > sum(self.n_blocks):
            return []
        specs = self.tables.pair_specs(grouping) if priced else []  # unpriced: no pair costs (`_quick_plans`)
        train = next(i for i, g in enumerate(grouping) if "actor_train" in g)
        gen = next(i for i, g in enumerate(grouping) if "generation" in g)
        local = {}  # group → the weight sync on its own row: the actor's local reshard, the critic's in its group
        if train == gen:

            def actor(row: Row, subset: Subset = grouping[gen]) -> float:
                if (exact := self._local.get((subset, row))) is not None:
                    return exact
                if row not in self._local:
                    self._local[row] = self.tables.same_group_weight_sync(self.devices(row))
                return self._local[row]

            local[gen] = actor
        for own in (i for i, g in enumerate(grouping) if {"critic_train", "actor_train", "generation"} & set(g)):
            # the option's own sync seconds (critic in its group, gathers, hand-off): exact rows; 0 on proxies
            subset, alone = grouping[own], local.get(own)
            local[own] = lambda row, s=subset, a=alone: (a(row) if a else 0.0) + self.critic_sync.get((s, row), 0.0)
        overlap = self.tables.workload.mode == "async" and ("generation",) in grouping
        floor = self.tables.floor
        pairs = (self.pair_cost, [self.pair_memo(spec) for spec in specs])
        return _branch_and_bound(tabs, specs, local, pairs, self.n_blocks, overlap, floor, skip)

    def _search(self, gi: int, skip: set[tuple[Row, ...]]) -> _Search:
        versions = tuple(self.version.get(s, 0) for s in self.groupings[gi])
        return _Search(self.best_plans(gi, skip), versions)

    # --- best first over the groupings -----------------------------------------------------------

    def run(self) -> dict[int, Screened]:
        """The screen (module docstring); {} outside 2…SCREEN_CLASSES classes, over MAX_ROWS rows, or when the
        budget ends first.

        First the whole-class plans (`_class_plans`). Then two queues: groupings not searched yet, by a
        capacity-free bound, and searched ones, by their best plan's value. Each round searches the next
        unsearched grouping and works on the best searched one (searches it again if an exact entry it uses
        changed, else makes its best plan's proxied entries exact, else scores that plan)."""
        if not 1 < self.k <= SCREEN_CLASSES or not self.rows:
            return {}
        done: dict[int, _Search] = {}
        scored: dict[int, list[Candidate]] = {}
        skip: dict[int, set[tuple[Row, ...]]] = {}
        quick = self._quick_plans(scored, skip) if self.budget.max_evals is None else []
        if not self.build_tables():
            return {gi: dataclasses.replace(found, quick=True) for gi, found in self._results(done, scored).items()}
        incumbent = self._class_plans(scored, skip)
        self._rerate(quick)
        fresh = [(bound, gi) for gi in range(len(self.groupings)) if math.isfinite(bound := self._cheap_bound(gi))]
        heapq.heapify(fresh)
        searched: list[tuple[float, int]] = []

        def search(gi: int) -> None:
            found = done[gi] = self._search(gi, skip.setdefault(gi, set()))
            if found.plans:
                heapq.heappush(searched, (found.plans[0][0], gi))

        while self.budget.within(SCREEN_SHARE):
            reach = incumbent * (1 + MARGIN)
            explored = bool(fresh) and fresh[0][0] < reach
            if explored:
                search(heapq.heappop(fresh)[1])
            if not searched or searched[0][0] >= reach:
                if explored:
                    continue
                break  # nothing new within reach and nothing searched within reach
            _, gi = heapq.heappop(searched)
            grouping, found = self.groupings[gi], done[gi]
            if found.versions != tuple(self.version.get(s, 0) for s in grouping):
                search(gi)
                continue
            value, rows = found.plans[0]
            proxied = [(s, r) for s, r in zip(grouping, rows, strict=True) if (s, r) not in self.exact]
            for subset, row in proxied:
                if not self.budget.within(SCREEN_SHARE):
                    break
                self.make_exact(subset, row)
            if not proxied:  # exact throughout: score it as the search does
                cand = self.search.evaluate(grouping, self.genome(rows), self.budget)
                scored.setdefault(gi, []).append(cand)
                incumbent = min(incumbent, cand.score)
                skip[gi].add(rows)
                found.versions = ()  # search it again without this plan
            heapq.heappush(searched, (value, gi))
        return self._results(done, scored)

    def _class_plans(self, scored: dict[int, list[Candidate]], skip: dict[int, set[tuple[Row, ...]]]) -> float:
        """Plans that give each class wholly to one group (or leave it idle), each grouping's KEEP best by the
        branch and bound over whole-class rows, scored exactly in increasing value until the next cannot beat
        the best score or CLASS_SHARE of the screen's share is spent; the best score. On whole classes the
        tables are lower bounds, so this finds the best whole-class plan in few scorings; the partial-class
        proxies that follow are estimates, some optimistic, and a budget spent on them first could miss it."""
        plans = sorted(
            (value, gi, rows) for gi in range(len(self.groupings)) for value, rows in self.best_plans(gi, set(), True)
        )
        best = min((c.score for found in scored.values() for c in found), default=math.inf)  # `_quick_plans`'
        used = self.budget.used()
        share = used + CLASS_SHARE * max(0.0, SCREEN_SHARE - used)  # of what the tables left
        for value, gi, rows in plans:
            if value >= best * (1 - 1e-9) or not (self.budget.within(share) or self._first_plan_due(best)):
                break
            if rows in skip.get(gi, ()):  # scored by `_quick_plans`
                continue
            best = min(best, self._score_rows(gi, rows, scored, skip).score)
        return best

    def _score_rows(
        self, gi: int, rows: tuple[Row, ...], scored: dict[int, list[Candidate]], skip: dict[int, set[tuple[Row, ...]]]
    ) -> Candidate:
        """Grouping gi's whole-class plan of these rows, its entries made exact, scored by the search and recorded
        (in `scored`, and in `skip` so that no later pass scores it again)."""
        grouping = self.groupings[gi]
        for subset, row in zip(grouping, rows, strict=True):
            if (subset, row) not in self.exact:
                self.make_exact(subset, row)
        cand = self.search.evaluate(grouping, self.genome(rows), self.budget)
        scored.setdefault(gi, []).append(cand)
        skip.setdefault(gi, set()).add(rows)
        return cand

    def _quick_plans(self, scored: dict[int, list[Candidate]], skip: dict[int, set[tuple[Row, ...]]]) -> list:
        """Under seconds alone, before the union tables: each task alone on each whole class (k device sets of
        the 2^k − 1, entries the tables then find made), each union estimated as fast as its fastest class,
        every grouping's best whole-class plan under that estimate without pair costs (a branch and bound of
        arithmetic), the QUICK_GROUPINGS best of those searched again with the exact pair costs, and their best
        plans made exact and scored in increasing value until one fits or QUICK_PLANS were tried. The estimate
        is no bound and is dropped afterwards (with the ratios measured against it: `_rerate`); the scores are
        the search's own, so a loaded box's short run keeps the best of them. The entries made exact (what
        `_rerate` rates again). Only where the union tables would not come in time (`_starved`): otherwise the
        tables and the whole-class plans follow as without it (where they come, the quick plans only cost CPU:
        a loaded box's u04 and u23 scored worse within 10 s with them)."""
        tasks = self.tables.tasks
        cpu = time.process_time()
        for c in range(self.k):
            if self.budget.spent():
                return []
            devices = self._union(1 << c)
            for task in tasks:
                self.fastest[(task, 1 << c)] = self._fastest_alone(task, devices)
        if not _starved(self.budget, STARVED * (time.process_time() - cpu) / self.k * (2**self.k - 1 - self.k)):
            return []
        real, before = self.fastest, set(self.exact)
        self.fastest = dict(real)
        for mask in (m for m in range(1, 2**self.k) if m & (m - 1)):
            for task in tasks:
                self.fastest[(task, mask)] = min(real[(task, 1 << c)] for c in range(self.k) if mask >> c & 1)
        try:
            unpriced = [
                (p[0][0], gi) for gi in range(len(self.groupings)) if (p := self.best_plans(gi, set(), True, False))
            ]
            found = [
                (plans[0][0], gi, plans[0][1])
                for _, gi in sorted(unpriced)[:QUICK_GROUPINGS]
                if (plans := self.best_plans(gi, set(), True))
            ]
            for _, gi, rows in sorted(found)[:QUICK_PLANS]:
                if self.budget.spent():
                    break
                if self._score_rows(gi, rows, scored, skip).options is not None:
                    break
        finally:
            self.fastest = real
            self.proxies.clear()
            self._wholes.clear()
            self.ratios.clear()
        return [key for key in self.exact if key not in before]

    def _rerate(self, entries: Sequence[tuple[Subset, Row]]) -> None:
        """The exact/proxy ratios of `_quick_plans`' entries against the real tables' proxies (after the
        whole-class plans, which read whole rows uncorrected as in a run without them)."""
        for subset, row in entries:
            exact, proxy = self.exact[(subset, row)], self.proxy(subset, row)
            if exact is not None and proxy is not None and sum(proxy) > 0:
                ratio = sum(exact) / sum(proxy)
                self.ratios.setdefault((subset, _mask(row)), []).append((row, ratio))
                self.ratios.setdefault(_mask(row), []).append((row, ratio))

    def _first_plan_due(self, best: float) -> bool:
        """Under seconds alone (no --max-evals), the whole-class plans are scored past their share until one
        fits, while the budget lasts: their tables are paid by then, and on a loaded machine the shares of a 2 s
        stage are spent waiting (the uneven suite's u23: the tables took the share and the plan stayed the
        baseline's, 0.48 of the optimum). Under --max-evals nothing changes (the same evaluations)."""
        return math.isinf(best) and self.budget.max_evals is None and not self.budget.spent()

    def _cheap_bound(self, gi: int) -> float:
        """Each group at its lowest proxy phases over all rows (capacity and pair costs left out)."""
        grouping = self.groupings[gi]
        if len(grouping) > sum(self.n_blocks):
            return math.inf
        floor = self.tables.floor
        span = list(floor)
        for subset in grouping:
            found = [ph for _, ph in self.table(subset)]
            if not found:
                return math.inf
            for i in range(len(PHASES)):
                span[i] = max(span[i], min(ph[i] for ph in found))
        overlap = self.tables.workload.mode == "async" and ("generation",) in grouping
        return _compose(span, 0.0, 0.0, overlap)

    def _results(self, done: dict[int, _Search], scored_by: dict[int, list[Candidate]]) -> dict[int, Screened]:
        out: dict[int, Screened] = {}
        for gi in sorted(set(done) | set(scored_by)):
            found = done.get(gi, _Search([], ()))
            scored = sorted(scored_by.get(gi, []), key=lambda c: c.score)
            scored_genomes = {c.genome for c in scored}
            bounded = [self.genome(rows) for _, rows in found.plans]
            bounded = [g for g in bounded if tuple(g) not in scored_genomes]
            keys = [c.score for c in scored[:1]] + [v for v, _ in found.plans[:1]]
            if keys:  # a grouping whose scored plans all failed to fit ranks by its best plan's value, not last
                fits = math.isfinite(scored[0].score) if scored else False
                out[gi] = Screened(scored[0].score if fits else min(keys), scored, bounded)
        return out


def _starved(budget: Budget, tables_cpu: float) -> bool:
    """Whether the CPU this process can expect before `budget`'s deadline (its seconds left times the share of
    the cores the load average leaves it) is short of `tables_cpu`, the union tables' CPU seconds estimated from
    the single classes' (per device set alike)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    share = min(1.0, cores / max(1.0, os.getloadavg()[0]))
    return budget.remaining_s() * share < tables_cpu


def _mask(row: Row) -> int:
    """The classes a row takes blocks of, as a bit mask."""
    return sum(1 << c for c, x in enumerate(row) if x)


def _compose(span: Sequence[float], weight_sync: float, transfers: float, overlap: bool) -> float:
    """The composition (costmodel/compose.py) of phase spans, weight sync and the transfers as the branch and
    bound sums them, one pair at a time: all at the first boundary, 0 s at the second (adding 0 s changes no
    digit, so this is the iteration to the last digit)."""
    return iteration_s(span, (transfers, 0.0), weight_sync, overlap)


def _branch_and_bound(tabs, specs, local, pairs, capacity, overlap, floor, skip) -> list:
    """The KEEP best (value, rows per group) of one grouping.

    `tabs[g]`: group g's feasible rows with their phase seconds; `specs`: the pair costs between groups;
    `pairs`: (`pair_cost(spec, src row, dst row)`, per spec the memo it fills, read first); `local`: group →
    the weight syncs on its own row (actor_train beside generation, the critic's tasks together). Depth-first over
    the groups, the most demanding first, each trying its rows within the blocks left in increasing order of
    the value the row alone forces (its phases raised to the remaining groups' lowest ones and the floor): a
    level stops at the first row that cannot beat the KEEP-th best complete plan. A pair cost is added at the
    depth where its second group is placed. Written
    out for three phases."""
    n = len(tabs)
    lowest = [tuple(min(ph[i] for _, ph in tab) for i in range(len(PHASES))) for tab in tabs]
    order = sorted(range(n), key=lambda g: (-max(lowest[g]), g))
    depth = {g: j for j, g in enumerate(order)}
    rest = [tuple(max([f, *(lowest[g][i] for g in order[j:])]) for i, f in enumerate(floor)) for j in range(n + 1)]
    pair_cost, memos = pairs
    at_depth: list[list[tuple]] = [[] for _ in range(n)]  # (spec, src, dst, weight sync?, memo), in spec order
    for spec, memo in zip(specs, memos, strict=True):
        at_depth[max(depth[spec.src], depth[spec.dst])].append((spec, spec.src, spec.dst, spec.weight_sync, memo))
    # Rows as integers with one field per class and a guard bit on top of each field: a row fits in `left`
    # exactly when subtracting it from `left` with every guard set borrows from no guard.
    width = max(capacity).bit_length() + 1
    guard = sum(1 << (c * width + width - 1) for c in range(len(capacity)))
    levels = [_level(tabs[g], rest[j + 1], overlap, width) for j, g in enumerate(order)]
    kept: list[tuple[float, tuple[Row, ...]]] = []  # the KEEP best so far, as a max-heap (values negated)
    nodes = 0
    chosen: list[Row] = [()] * n

    def visit(j: int, left: int, s0: float, s1: float, s2: float, ws: float, tr: float) -> None:
        nonlocal nodes
        r0, r1, r2 = rest[j + 1]
        g = order[j]
        items, codes, ints, forced_of = levels[j]
        pairs_here = at_depth[j]
        local_here = local.get(g)
        deeper = j + 1 < n
        cutoff = -kept[0][0] if len(kept) == KEEP else math.inf
        for i in _fitting(left, guard, codes, ints, bisect.bisect_left(forced_of, cutoff)):
            forced, row, p0, p1, p2 = items[i]
            cutoff = -kept[0][0] if len(kept) == KEEP else math.inf
            if forced >= cutoff or nodes >= NODES:
                return
            # max() written out (the first of equals, as max returns): these lines run ~10^5 times per screen
            n0, n1, n2 = p0 if p0 > s0 else s0, p1 if p1 > s1 else s1, p2 if p2 > s2 else s2
            spans = (r0 if r0 > n0 else n0, r1 if r1 > n1 else n1, r2 if r2 > n2 else n2)
            if pairs_here and cutoff < math.inf and iteration_s(spans, (tr, 0.0), ws, overlap) >= cutoff:
                continue  # cannot be kept whatever this level's pair costs add: they are not worked out
            chosen[g] = row
            w, t = ws, tr
            if local_here is not None:
                w += local_here(row)
            for spec, src, dst, sync, memo in pairs_here:
                cost = memo.get((chosen[src], chosen[dst]))
                if cost is None:
                    cost = pair_cost(spec, chosen[src], chosen[dst])
                if sync:
                    w += cost
                else:
                    t += cost
            value = iteration_s(spans, (t, 0.0), w, overlap)  # as `_compose`
            if value >= cutoff:
                continue
            nodes += 1
            if deeper:
                visit(j + 1, left - ints[i], n0, n1, n2, w, t)
            elif tuple(chosen) not in skip:
                heapq.heappush(kept, (-value, tuple(chosen)))
                if len(kept) > KEEP:
                    heapq.heappop(kept)

    visit(0, _code(tuple(capacity), width), 0.0, 0.0, 0.0, 0.0, 0.0)
    visit = None  # a recursive closure is a cycle (its cell holds it) keeping pair_cost's Screen, Tables, CostModel
    return sorted((-v, rows) for v, rows in kept)


def _level(tab: list[tuple[Row, Phases]], rest: Phases, overlap: bool, width: int) -> tuple:
    """One depth of the branch and bound: its rows as (forced value, row, phases) in increasing forced value
    (the row's phases raised to `rest`, the lowest of the groups below and the floor), their codes as an array
    and a list (the fit test), and the forced values (where the cutoff falls)."""
    r0, r1, r2 = rest
    items = [
        (iteration_s((max(p0, r0), max(p1, r1), max(p2, r2)), (0.0, 0.0), 0.0, overlap), row, p0, p1, p2)
        for row, (p0, p1, p2) in tab
    ]
    items.sort(key=lambda item: item[:2])
    ints = [_code(item[1], width) for item in items]
    return items, np.array(ints, dtype=np.int64), ints, [item[0] for item in items]


@functools.lru_cache(maxsize=1 << 16)
def _code(row: Row, width: int) -> int:
    """A row as one integer, `width` bits per class (the branch and bound's fit test; every search codes the same
    rows again)."""
    return sum(x << (c * width) for c, x in enumerate(row))


def _fitting(left: int, guard: int, codes, ints: list[int], end: int) -> list[int]:
    """Indices below `end` of the rows (`codes` as an array, `ints` as a list, in the level's order) that fit in
    `left`, in order. `end`: the first row whose forced value is at the cutoff (no later row can be kept: the
    level stops there anyway). A few rows are tested in Python, more at once with numpy."""
    spare = left | guard
    if end <= SMALL_LEVEL:
        return [i for i in range(end) if (spare - ints[i]) & guard == guard]
    return np.flatnonzero((spare - codes[:end]) & guard == guard).tolist()
