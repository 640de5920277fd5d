"""The multi-level (hybrid) search of PAPER.md §5: nested successive halving over L1 (task groupings, the
arms) and L2 (device-count splits, the sub-arms), and a genetic search over L3 (which devices each group gets).

- A *genome* gives every block of devices an owner group (or none). Blocks are half sub-hosts (whole
  sub-hosts of 1 device), so the genome space contains every ILP pool at `half` granularity and more
  (several partial sub-hosts per class, blocks of one class spread over many groups).
- Mutations: swap the owners of two blocks of different groups (L3, count-preserving), move one block to
  another group (L2 drift), and swap two blocks inside one group's stage order is not needed: the tables
  choose each task's TP/PP degrees and stage order (L4, L5) exactly for the group's devices, so no
  TP/PP/DP mutation is left to guess.
- Successive halving: each round every surviving grouping spends its budget on its surviving splits; the
  worse half of the groupings is dropped; survivors' budgets double; each survivor keeps the better half of
  its splits.
- Deterministic: all randomness comes from `random.Random(seed)`; with `max_evals` the result depends only
  on (profile, workload, seed, max_evals). With only a wall-clock budget, the number of evaluations a
  machine manages decides where the search stops, so results can differ between machines.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hetrl_cli.artifacts.workload import TaskName
from hetrl_cli.planner.space import DeviceClass, groupings
from hetrl_cli.planner.tables import GroupOption, Tables

Subset = tuple[TaskName, ...]
IDLE = -1
MAX_SPLITS = 8
"""Sub-arms (device-count splits) per grouping at the start."""
POPULATION = 4
"""Genomes kept per split."""
FIRST_ROUND = 2
"""Evaluations per split in the first round (later rounds double)."""
WHOLE_HOSTS_FROM = 6
"""From this many sub-hosts on, genomes move whole sub-hosts (smaller clusters: half sub-hosts)."""


@dataclass(frozen=True)
class Block:
    cls: int
    host: int
    """Sub-host index within its class."""
    start: int
    size: int


@dataclass
class Candidate:
    genome: tuple[int, ...]
    score: float
    options: list[GroupOption] | None


@dataclass
class Arm:
    """A split of one grouping, with its population."""

    split: tuple[int, ...]
    population: list[Candidate] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random)

    @property
    def best(self) -> float:
        return min((c.score for c in self.population), default=math.inf)


@dataclass
class HybridResult:
    grouping: tuple[Subset, ...] | None
    options: list[GroupOption] | None
    score: float
    evaluations: int
    seconds: float
    rounds: int
    note: str = ""


class Budget:
    """Evaluations and/or wall-clock seconds; `spent()` says when to stop."""

    def __init__(self, budget_s: float | None, max_evals: int | None) -> None:
        self.deadline = None if budget_s is None else time.monotonic() + budget_s
        self.max_evals = max_evals
        self.evals = 0

    def spent(self) -> bool:
        if self.max_evals is not None and self.evals >= self.max_evals:
            return True
        return self.deadline is not None and time.monotonic() >= self.deadline


class Hybrid:
    def __init__(self, tables: Tables, seed: int) -> None:
        self.tables = tables
        self.seed = seed
        self.classes: list[DeviceClass] = tables.classes
        self.blocks = _blocks(self.classes)
        self.n_devices = sum(b.size for b in self.blocks)

    # --- genomes -> plans ----------------------------------------------------------------------

    def devices_of(self, genome: Sequence[int], group: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(actual devices in structural order, canonical devices with the same structure)."""
        per_host: dict[tuple[int, int], list[str]] = {}
        for block, owner in zip(self.blocks, genome, strict=True):
            if owner == group:
                devs = self.classes[block.cls].devices[block.host][block.start : block.start + block.size]
                per_host.setdefault((block.cls, block.host), []).extend(devs)
        actual: list[str] = []
        canonical: list[str] = []
        for k, c in enumerate(self.classes):
            hosts = sorted(((h, d) for (kk, h), d in per_host.items() if kk == k), key=lambda hd: (-len(hd[1]), hd[0]))
            for i, (_, devs) in enumerate(hosts):
                actual.extend(devs)
                canonical.extend(c.devices[i][: len(devs)])
        return tuple(actual), tuple(canonical)

    def evaluate(self, grouping: tuple[Subset, ...], genome: Sequence[int], budget: Budget) -> Candidate:
        budget.evals += 1
        options = []
        for g, subset in enumerate(grouping):
            actual, canonical = self.devices_of(genome, g)
            if not actual:
                return Candidate(tuple(genome), math.inf, None)
            option = self.tables.group_option(subset, canonical)
            if option is None:
                return Candidate(tuple(genome), math.inf, None)
            from hetrl_cli.planner.ilp import relabel

            options.append(relabel(option, dict(zip(canonical, actual, strict=True))))
        return Candidate(tuple(genome), self.tables.score(grouping, options), options)

    # --- splits and initial genomes ------------------------------------------------------------

    def splits(self, n_groups: int) -> list[tuple[int, ...]]:
        """Device counts per group (and idle last) in units of whole sub-hosts, at most MAX_SPLITS, spread."""
        unit = max(1, min(b.size for b in self.blocks))
        units = self.n_devices // unit
        while units > 16 and unit * 2 <= self.n_devices // max(1, n_groups):
            unit *= 2
            units = self.n_devices // unit
        comps = list(_compositions(units, n_groups))
        comps.sort()
        if len(comps) > MAX_SPLITS:
            step = len(comps) / MAX_SPLITS
            comps = [comps[int(i * step)] for i in range(MAX_SPLITS)]
        return [tuple(x * unit for x in c) for c in comps]

    def initial(self, split: tuple[int, ...], rng: random.Random, kind: int) -> list[int]:
        """A genome with (about) `split` devices per group: blocks dealt class by class (fastest first,
        slowest first, then classes in random order), so groups start with whole device classes."""
        by_class: dict[int, list[int]] = {}
        for i, b in enumerate(self.blocks):
            by_class.setdefault(b.cls, []).append(i)
        classes = list(by_class)
        if kind == 1:
            classes.reverse()
        elif kind >= 2:
            rng.shuffle(classes)
        order = [i for k in classes for i in by_class[k]]
        groups = list(range(len(split)))
        if kind >= 2:
            rng.shuffle(groups)
        genome = [IDLE] * len(self.blocks)
        need = {g: split[g] for g in groups}
        gi = 0
        for b in order:
            while gi < len(groups) and need[groups[gi]] <= 0:
                gi += 1
            if gi >= len(groups):
                break
            genome[b] = groups[gi]
            need[groups[gi]] -= self.blocks[b].size
        self._repair(genome, len(split))
        return genome

    def _repair(self, genome: list[int], n_groups: int) -> None:
        """Every group needs at least one block: take one from the largest owner."""
        for g in range(n_groups):
            if g not in genome:
                donor = max(sorted(set(genome)), key=genome.count)
                genome[genome.index(donor)] = g

    def mutate(self, genome: Sequence[int], n_groups: int, rng: random.Random) -> list[int]:
        """L3 swap of two blocks' owners (count-preserving), L2 drift of one block to another owner (or
        idle), or a class move: every block one owner holds in a device class goes to another owner."""
        child = list(genome)
        owners = [*range(n_groups), IDLE]
        for _ in range(1 + (rng.random() < 0.3)):
            i = rng.randrange(len(child))
            roll = rng.random()
            if roll < 0.5:
                j = rng.randrange(len(child))
                child[i], child[j] = child[j], child[i]
            elif roll < 0.75:
                child[i] = rng.choice([o for o in owners if o != child[i]])
            else:
                src, dst = child[i], rng.choice([o for o in owners if o != child[i]])
                cls = self.blocks[i].cls
                for j, b in enumerate(self.blocks):
                    if b.cls == cls and child[j] == src:
                        child[j] = dst
        self._repair(child, n_groups)
        return child

    # --- successive halving --------------------------------------------------------------------

    def run(
        self,
        budget: Budget,
        seeds: Sequence[tuple[tuple[Subset, ...], list[int]]] = (),
        progress: Callable[[str, float], None] | None = None,
    ) -> HybridResult:
        start = time.monotonic()
        all_groupings = groupings(self.tables.tasks)
        root = random.Random(self.seed)
        arms: dict[int, list[Arm]] = {}
        for gi, grouping in enumerate(all_groupings):
            splits = self.splits(len(grouping))
            if splits:  # a grouping with more groups than blocks has none
                arms[gi] = [Arm(split, rng=random.Random(root.random())) for split in splits]
        best: tuple[float, int, Candidate] | None = None

        def consider(gi: int, cand: Candidate) -> None:
            nonlocal best
            if cand.options is not None and (best is None or cand.score < best[0] - 1e-12):
                best = (cand.score, gi, cand)

        for grouping, genome in seeds:
            gi = all_groupings.index(grouping)
            cand = self.evaluate(grouping, genome, budget)
            if gi not in arms:
                counts = tuple(
                    sum(b.size for b, o in zip(self.blocks, genome, strict=True) if o == g)
                    for g in range(len(grouping))
                )
                arms[gi] = [Arm(counts, rng=random.Random(root.random()))]
            arms[gi][0].population.append(cand)
            consider(gi, cand)
        rounds = cycle = 0
        while not budget.spent():  # one successive-halving cycle after another (budgets doubling per cycle)
            alive = list(arms)
            live_arms = {gi: list(arms[gi]) for gi in alive}
            per_arm = FIRST_ROUND * 2**cycle
            cycle += 1
            while alive and not budget.spent():
                rounds += 1
                for gi in alive:
                    for arm in live_arms[gi]:
                        self._grow(all_groupings[gi], arm, per_arm, budget, lambda c, gi=gi: consider(gi, c))
                        if budget.spent():
                            break
                    if budget.spent():
                        break
                if progress and best is not None:
                    progress(f"hybrid: cycle {cycle} round {rounds}, {len(alive)} groupings, best {best[0]:.3g} s", 0.0)
                if len(alive) == 1 and len(live_arms[alive[0]]) == 1:
                    break
                ranked = sorted(alive, key=lambda gi: (min(a.best for a in live_arms[gi]), gi))
                alive = ranked[: max(1, (len(ranked) + 1) // 2)]
                for gi in alive:
                    kept = sorted(live_arms[gi], key=lambda a: a.best)
                    live_arms[gi] = kept[: max(1, (len(kept) + 1) // 2)]
                per_arm *= 2
        seconds = time.monotonic() - start
        if best is None:
            return HybridResult(None, None, math.inf, budget.evals, seconds, rounds)
        score, gi, cand = best
        return HybridResult(all_groupings[gi], cand.options, score, budget.evals, seconds, rounds)

    def _grow(self, grouping, arm: Arm, evals: int, budget: Budget, consider) -> None:
        """Spend `evals` evaluations on one split: fill the population, then mutate the best genomes."""
        n = len(grouping)
        kind = len(arm.population)
        while len(arm.population) < POPULATION and evals > 0 and not budget.spent():
            genome = self.initial(arm.split, arm.rng, kind)
            kind += 1
            cand = self.evaluate(grouping, genome, budget)
            arm.population.append(cand)
            consider(cand)
            evals -= 1
        seen = {c.genome for c in arm.population}
        while evals > 0 and not budget.spent():
            arm.population.sort(key=lambda c: c.score)
            parent = arm.population[min(int(arm.rng.random() ** 2 * len(arm.population)), len(arm.population) - 1)]
            child = tuple(self.mutate(parent.genome, n, arm.rng))
            evals -= 1
            if child in seen:
                continue
            seen.add(child)
            cand = self.evaluate(grouping, child, budget)
            consider(cand)
            if cand.score < arm.population[-1].score:
                arm.population[-1] = cand


def _blocks(classes: Sequence[DeviceClass]) -> list[Block]:
    """The units the genome assigns: whole sub-hosts on clusters of WHOLE_HOSTS_FROM sub-hosts or more,
    else half sub-hosts (single devices when a sub-host has one or two), in class order."""
    n_subhosts = sum(c.n_hosts for c in classes)
    out = []
    for k, c in enumerate(classes):
        if n_subhosts >= WHOLE_HOSTS_FROM or c.per_host % 2:
            size = c.per_host
        else:
            size = max(1, c.per_host // 2) if c.per_host > 2 else 1
        for h in range(c.n_hosts):
            for start in range(0, c.per_host, size):
                out.append(Block(k, h, start, size))
    return out


def _compositions(total: int, parts: int):
    """Positive compositions of ≤ total into `parts` parts (the rest idle), as tuples."""
    for used in range(parts, total + 1):
        for cuts in itertools.combinations(range(1, used), parts - 1):
            bounds = (0, *cuts, used)
            yield tuple(bounds[i + 1] - bounds[i] for i in range(parts))


def genome_of(hybrid: Hybrid, devices_per_group: Sequence[Sequence[str]]) -> list[int]:
    """The genome closest to given device sets (seeding with baseline plans): a block goes to the group
    holding most of its devices."""
    owner = {d: g for g, devs in enumerate(devices_per_group) for d in devs}
    genome = []
    for b in hybrid.blocks:
        devs = hybrid.classes[b.cls].devices[b.host][b.start : b.start + b.size]
        votes = [owner.get(d, IDLE) for d in devs]
        genome.append(max(sorted(set(votes)), key=votes.count))
    return genome
