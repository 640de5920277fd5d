"""auto's estimate of the exact solver's CPU seconds (`ilp.estimate_s`; issue 24, item 2): what the full ILP
still has to do on the tables as they are when auto asks, after the hybrid's start has filled some of them.

- **Tables**: every (subset, pool) group option the ILP reads that the tables do not hold yet. The pools are cut
  into strata by whether the start already scored some of their entries and by their size (a pool of many
  devices has more layouts, and one whose `alone` tables are built costs a fraction: both moved the old
  single-sample estimate 2-3x); PER_STRATUM pools per stratum are scored, timed in process CPU seconds, and
  the rate per missing entry scales to the stratum (an outlier entry counts once: OUTLIER). The sampled
  entries stay cached for the run.
- **Leaf MILPs**: one per grouping; its LP columns are the pools its groups can take (cached entries known,
  the rest from the sample's feasibility) and the weight syncs' pool pairs. How hard HiGHS finds a leaf is
  not in its size (CPU per column varied 6x between settings of like size), so it is measured: with the
  start's plan as cutoff, the two largest leaves (every task apart; the most estimated columns) are solved as
  the exact solver would solve them (`ilp.probe_leaf`; their results kept for it: `ilp.solved_leaf`), and all
  leaves are LEAVES_PER_LARGEST times the slower, at least LEAF_FLOOR_S_PER_COLUMN a column; without a start,
  LEAF_S_PER_COLUMN a column (constants fitted on the uneven suite, bench/hybrid_uneven.py; docs/benchmarks.md
  says on which settings). The pair tables themselves (`ilp._fill_pairs`) took 1-8 % of the tables' CPU
  seconds there and are left to the tables' rate.

CPU seconds, not wall: other processes' load does not move the estimate; on an idle machine they are the
ILP's wall seconds (one thread).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hetrl_cli.planner.search import Subset
from hetrl_cli.planner.space import Granularity, allocate, enumerate_pools, groupings
from hetrl_cli.planner.tables import Tables

SIZE_STRATA = 3
"""Pool-size strata (equal numbers of pools) within each of the two cache states (untouched, partly cached)..."""
PER_STRATUM = 2
"""...and pools scored per stratum."""
OUTLIER = 10
"""A sampled entry over this many times the stratum's median is counted once, at its excess: on the suite one
entry in a few hundred took 0.1-0.6 CPU s against 1-5 ms for the rest (a cost-model cache warmed once: u18's
whole tables then took 1.35 s), and scaled to every entry it put the estimate at 3-10x."""
LEAVES_PER_LARGEST = 6.0
"""All leaf MILPs' CPU seconds over the largest leaf's (the slower of every task apart and the most estimated
columns; model building and HiGHS), solved in the estimate with the start's plan as cutoff: 3.8-9.9 on the
fit set u04, u07, u10, u12 (geometric mean 5.9; docs/benchmarks.md), where their CPU per column varied 6x..."""
LEAF_FLOOR_S_PER_COLUMN = 4e-6
"""but at least this per LP column summed over the groupings: many leaves alike in size and none hard (u23:
198 leaves, the largest 3 % of their CPU) cost their building and presolve; the cheapest column of the fit
set's leaves (u04 and u12: 4-8e-6)."""
LEAF_S_PER_COLUMN = 1.7e-5
"""Without a start to cut off at (no probe): CPU seconds of leaf MILPs (model building and HiGHS) per LP column
summed over the groupings: a column per (group, pool) it can take and per pair of pools of a weight sync between
two groups (`IlpModel`'s transportation variables)."""


@dataclass
class Estimate:
    """The parts of the estimate, in process CPU seconds."""

    tables_s: float
    leaves_s: float
    missing: int
    """Group options the tables do not hold yet."""
    largest: tuple[Subset, ...] = ()
    """The grouping whose leaf has the most estimated columns..."""
    columns: float = 0.0
    """...and the columns summed over every grouping's leaf."""
    largest_s: float | None = None
    """The largest leaf's CPU seconds where it was solved (`leaves_from_largest`)."""

    @property
    def total_s(self) -> float:
        return self.tables_s + self.leaves_s


def estimate(tables: Tables, granularity: Granularity, seed: int = 0) -> Estimate:
    """The estimate (module docstring) on `tables` as they are, its leaves from their columns (with a start,
    `ilp.estimate_parts` solves the largest and prices them by `leaves_from_largest`)."""
    rng = random.Random(seed)
    pools = enumerate_pools(tables.classes, granularity)
    all_groupings = groupings(tables.tasks)
    subsets = sorted({g for gs in all_groupings for g in gs}, key=lambda s: (len(s), s))
    devices = [allocate(tables.classes, [p])[0] for p in pools]
    known = tables._group  # (subset, devices) → option or None: what the start already scored
    todo = [[s for s in subsets if (s, d) not in known] for d in devices]
    fits: dict[Subset, list[float]] = {s: [] for s in subsets}
    """Per subset, per pool it may take: 1 / 0 where known, else its stratum's sampled share."""
    for s in subsets:  # before sampling: the sample's entries are counted with their stratum
        fits[s].extend(float(known[(s, d)] is not None) for d in devices if (s, d) in known)
    tables_s = 0.0
    for stratum in _strata(todo, devices, len(subsets)):
        picks = rng.sample(stratum, min(PER_STRATUM, len(stratum)))
        sampled, took = {}, []
        for pool, subset in [(p, s) for p in picks for s in todo[p]]:
            start = time.process_time()
            sampled[(pool, subset)] = tables.group_option(subset, devices[pool]) is not None
            took.append(time.process_time() - start)
        typical = sorted(took)[len(took) // 2] * OUTLIER
        once = sum(t - typical for t in took if t > typical)  # a cache warmed once (module docstring)
        tables_s += once + (sum(took) - once) / len(took) * sum(len(todo[p]) for p in stratum)
        share = {s: [ok for (_, ss), ok in sampled.items() if ss == s] for s in subsets}
        for p in stratum:
            for s in todo[p]:
                fits[s].append(sum(share[s]) / len(share[s]) if share[s] else 0.5)
    feasible = {s: sum(f) for s, f in fits.items()}
    columns = [_columns(tables, grouping, feasible) for grouping in all_groupings]
    largest = all_groupings[columns.index(max(columns))]
    return Estimate(tables_s, LEAF_S_PER_COLUMN * sum(columns), sum(map(len, todo)), largest, sum(columns))


def leaves_from_largest(estimate: Estimate, largest_s: float) -> Estimate:
    """`estimate` with its leaves priced from the largest leaf's measured CPU seconds (module docstring)."""
    leaves_s = max(LEAVES_PER_LARGEST * largest_s, LEAF_FLOOR_S_PER_COLUMN * estimate.columns)
    return replace(estimate, leaves_s=leaves_s, largest_s=largest_s)


def _strata(todo: Sequence[list[Subset]], devices: Sequence[tuple[str, ...]], n_subsets: int) -> list[list[int]]:
    """Pools with missing entries, by cache state (none of their entries known / some), then cut by size into
    SIZE_STRATA runs of about equal count."""
    out = []
    for partly in (False, True):
        pools = [p for p, missing in enumerate(todo) if missing and (len(missing) < n_subsets) == partly]
        pools.sort(key=lambda p: (len(devices[p]), p))
        n = min(SIZE_STRATA, len(pools))
        out += [pools[len(pools) * i // n : len(pools) * (i + 1) // n] for i in range(n)]
    return [s for s in out if s]


def _columns(tables: Tables, grouping: tuple[Subset, ...], feasible: dict[Subset, float]) -> float:
    """A leaf's LP columns: its groups' pools (x), and the weight syncs' pool pairs (W) where a trainer and its
    inference task are in different groups (about half the pairs are capacity-compatible)."""
    from hetrl_cli.artifacts.rl import SYNCED

    group_of = {t: g for g in grouping for t in g}
    columns = 1 + sum(feasible[g] for g in grouping)
    for train, infer in SYNCED.values():
        if train in group_of and infer in group_of and group_of[train] != group_of[infer]:
            columns += feasible[group_of[train]] * feasible[group_of[infer]] / 2
    return columns
