"""The multi-level (hybrid) search of PAPER.md §5: nested successive halving over L1 (task groupings, the
arms) and L2 (device-count splits, the sub-arms), and a genetic search over L3 (which devices each group gets).

- A *genome* gives every block of devices an owner group (or none). Blocks are whole sub-hosts on clusters
  of WHOLE_HOSTS_FROM sub-hosts or more, else half sub-hosts, so the genome space contains every ILP pool
  at `host` granularity (and more: blocks of one class spread over many groups). Each whole stage's answer
  then tries half-host moves (`halves`): one half of a large whole-host block to another owner.
- A *screen* first (planner/screen.py, within SCREEN_SHARE of the budget, on clusters of 2…SCREEN_CLASSES
  device classes and at most MAX_ROWS rows): per grouping a branch and bound over rows (blocks per class per
  group, classes split or idle) under proxy phase times from each task alone on class unions and class
  prefixes, corrected by what exact entries showed, plus the exact pair costs; best first over the
  groupings, the best plan's entries made exact, exact plans scored. It ranks the groupings (the arms) and
  seeds their first split.
- Each grouping's first split is otherwise *constructive*: whole device classes per group (the two best
  class plans by a work-to-capacity proxy, `class_plans`), else devices in proportion to the groups' work,
  so the first evaluation of a grouping is already a sensible plan.
- Mutations: rebalance by measured time (move a block from the group with the most slack, or from the idle
  blocks, to the group whose speed-up shortens the iteration most; trade a fast block of the donor for a
  slow one of the bottleneck; or shed the bottleneck's slowest block to the donor), swap the owners of two
  blocks (L3, count-preserving), move one block to another owner (L2 drift), move every block one owner
  has in a class to another owner (class move).
- L4/L5: the tables passed in choose each task's TP/PP (`make_plan` passes the ILP's own tables: shallower
  quick ones, depths=1, misranked plans badly on PPO).
- Successive halving: each round every surviving grouping spends its budget on its surviving splits; the
  worse half of the groupings is dropped; survivors' budgets double; each survivor keeps the better half
  of its explored splits. The first cycle grows only each grouping's constructive split (the mutations
  move device counts from there); later cycles all splits. Screened, the first cycle runs only the best
  SCREEN_ARMS groupings by the screen's rank, and each later cycle doubles the groupings and the splits.
- Anytime: the whole search runs in stages of doubling nominal size, each seeded with the incumbent of the
  stages before, the last cut where the budget ends (`run`, FIRST_STAGE_EVALS): a larger --max-evals runs a
  longer prefix of the same evaluations, so its plan is never worse.
- Deterministic: all randomness comes from `random.Random(seed)`; with `max_evals` the result depends only
  on (profile, workload, seed, max_evals). With only a wall-clock budget, the number of evaluations a
  machine manages decides where the search stops, so results can differ between machines.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hetrl_cli.artifacts.rl import TaskName
from hetrl_cli.planner.screen import Screen, Screened
from hetrl_cli.planner.search import IDLE, STEP_RESERVE_SHARE, Block, Budget, Candidate, Subset
from hetrl_cli.planner.space import DeviceClass, groupings
from hetrl_cli.planner.tables import GroupOption, Tables

if TYPE_CHECKING:
    from hetrl_cli.planner.cost import Objective

MAX_SPLITS = 8
"""Sub-arms (device-count splits) per grouping at the start."""
POPULATION = 4
"""Genomes kept per split."""
FIRST_ROUND = 2
"""Evaluations per split in the first round (later rounds double)."""
WHOLE_HOSTS_FROM = 6
"""From this many sub-hosts on, genomes move whole sub-hosts (smaller clusters: half sub-hosts)."""
REBALANCE = 0.5
"""Share of mutations that rebalance by measured group time (the rest are random L2/L3 moves)."""
SCREEN_ARMS = 8
"""Screened: the first cycle runs the best this-many groupings (by the screen's rank); each later
cycle doubles the number and the splits per grouping, so every arm is reached again (anytime)."""
FIRST_STAGE_EVALS = 256
"""Anytime: the search runs in stages of doubling size (this many evaluations first, under --max-evals),
each a whole search seeded with every earlier incumbent; a stage sizes its shares by its own nominal size and
the last one is cut where the budget ends, so a larger budget runs a longer prefix of the same steps and its
plan is never worse."""
EXTRA_STAGES = 2
"""A search that must find a plan (no baseline has one) runs on past its --max-evals for at most this many stages:
the cut stage whole, then the next (256 + 512 evaluations after a cut in the first stage). Never past a wall-clock
budget: --budget is honoured (a 10 s budget ran 57.7 s on a cluster where nothing plans)."""
HALF_MOVES = 2
"""Half-host moves applied to the answer at most (Hybrid.halves)."""
HALF_EVALS = 64
"""Evaluations the half-host moves may spend, past the budget (a few ms each on the uneven suite)."""
FIRST_STAGE_S = 2.0
"""The first stage's nominal seconds under a wall-clock budget (then 4, 8, 16 s, ...). Smaller first stages cost
quality at 2 s on the paper's PPO settings (0.5 s: 0.83 of the ILP optimum on multi-continent 8B PPO async)."""


@dataclass
class Arm:
    """A split of one grouping, with its population."""

    split: tuple[int, ...]
    population: list[Candidate] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random)
    seeds: list[list[int]] = field(default_factory=list)
    """Constructive genomes dealt before the class-by-class ones."""
    dealt: int = 0
    """Initial genomes made so far."""

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
    genome: tuple[int, ...] = ()
    """The plan's genome."""
    lead: tuple[tuple[Subset, ...], tuple[int, ...], float] | None = None
    """The best scored genome over the cap or not (grouping, genome, score): seeds the next stage, so a cap
    filters the answers and leaves the search's path as it is without one."""


@dataclass
class _Run:
    """One run's state: the groupings, their arms, what the screen found, the best plan so far and the
    counters of the successive halving."""

    groupings: list[tuple[Subset, ...]]
    budget: Budget
    root: random.Random
    """Seeds every arm's generator, in the order the arms are made."""
    arms: dict[int, list[Arm]] = field(default_factory=dict)
    screened: dict[int, Screened] = field(default_factory=dict)
    best: tuple[float, int, Candidate] | None = None
    """The best plan allowed (under the cap): the answer."""
    lead: tuple[float, int, Candidate] | None = None
    """The best plan, allowed or not: what the search follows (the same as `best` without a cap)."""
    rounds: int = 0
    cycle: int = 0

    def child_rng(self) -> random.Random:
        return random.Random(self.root.random())

    def consider(self, gi: int, cand: Candidate) -> None:
        """Every scored plan is a candidate: the answer if it is allowed and the best so far."""
        if cand.options is None:
            return
        if self.lead is None or cand.score < self.lead[0] - 1e-12:
            self.lead = (cand.score, gi, cand)
        value = cand.score if cand.answer is None else cand.answer
        if cand.allowed and (self.best is None or value < self.best[0] - 1e-12):
            self.best = (value, gi, cand)

    def rank(self, gi: int) -> tuple[float, int]:
        """Arm order of a cycle: the best score so far, else the screened bound, else last."""
        best = min((a.best for a in self.arms[gi] if a.population), default=math.inf)  # inf: none fits yet
        return (best if math.isfinite(best) else self.screened[gi].key if gi in self.screened else math.inf, gi)


class Hybrid:
    def __init__(self, tables: Tables, seed: int, steer: Objective | None = None) -> None:
        self.tables = tables
        self.seed = seed
        self.steer = steer
        """Scores the search's path where it is not the answer's objective (the answer: `tables.objective`)."""
        self.classes: list[DeviceClass] = tables.classes
        self.blocks = _blocks(self.classes)
        self.n_devices = sum(b.size for b in self.blocks)
        self._work: dict[TaskName, float] | None = None
        self._scored: dict[tuple[tuple[Subset, ...], tuple[int, ...]], Candidate] = {}
        """Every genome scored so far: a later stage meets it again without scoring it again."""
        self._arms: dict[tuple[Subset, ...], tuple[list[tuple[int, ...]], list[list[int]]]] = {}
        """Each grouping's splits and whole-class genomes (pure functions of the cluster and the grouping): every
        stage starts from them; making them took 0.06-0.11 CPU s per stage on the uneven suite's 203-grouping
        settings (u10, u23), before the stage's first evaluation."""

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
        budget.count()  # a genome met again is counted too (the budget ends every search), only not re-scored
        key = (grouping, tuple(genome))
        if key not in self._scored:
            self._scored[key] = self._score(grouping, genome)
        return self._scored[key]

    def _score(self, grouping: tuple[Subset, ...], genome: Sequence[int]) -> Candidate:
        from hetrl_cli.planner.ilp import relabel

        options = []
        for g, subset in enumerate(grouping):
            actual, canonical = self.devices_of(genome, g)
            if not actual:
                return Candidate(tuple(genome), math.inf, None)
            option = self.tables.group_option(subset, canonical)
            if option is None:
                return Candidate(tuple(genome), math.inf, None)
            options.append(relabel(option, dict(zip(canonical, actual, strict=True))))
        seconds = self.tables.score(grouping, options)
        if self.steer is None:
            return self.tables.objective.candidate(tuple(genome), seconds, options)
        cand = self.steer.candidate(tuple(genome), seconds, options)
        cand.answer = self.tables.objective.score(seconds, [d for o in options for d in o.devices])
        return cand

    # --- measured time: who is the bottleneck, who has slack -----------------------------------

    def pressure(self, grouping: tuple[Subset, ...], options: Sequence[GroupOption]) -> tuple[int, list[float]]:
        """(the group whose 10 % speed-up shortens the iteration most, each group's slack: how much slower
        it could run, as a share, before the iteration grows; capped at 1). Pure arithmetic over the
        composition (`Tables.compose`)."""
        weight_sync, boundary = self.tables.terms(grouping, options)

        def cost(scale: dict[int, float]) -> float:
            phases = [[p * scale.get(g, 1.0) for p in o.phase_s] for g, o in enumerate(options)]
            return self.tables.compose(grouping, phases, weight_sync, boundary)

        base = cost({})
        gains = [base - cost({g: 0.9}) for g in range(len(grouping))]
        bottleneck = max(range(len(grouping)), key=lambda g: (gains[g], -g))
        slack = []
        for g in range(len(grouping)):
            lo, hi = 1.0, 2.0
            if cost({g: hi}) <= base * (1 + 1e-9):
                slack.append(1.0)
                continue
            for _ in range(8):
                mid = (lo + hi) / 2
                if cost({g: mid}) <= base * (1 + 1e-9):
                    lo = mid
                else:
                    hi = mid
            slack.append(lo - 1.0)
        return bottleneck, slack

    def rebalance(self, grouping: tuple[Subset, ...], parent: Candidate, rng: random.Random) -> list[int] | None:
        """Move a block from the idle blocks or the group with the most slack (the donor) to the bottleneck
        group, trade the donor's fastest block for the bottleneck's slowest, or shed the bottleneck's slowest
        block to the donor (a straggler can slow a group down); None without options."""
        if parent.options is None or (len(grouping) == 1 and IDLE not in parent.genome):
            return None
        child = list(parent.genome)
        bottleneck, slack = self.pressure(grouping, parent.options)
        donors = [g for g in range(len(grouping)) if g != bottleneck and child.count(g) > 1]
        idle = [i for i, o in enumerate(child) if o == IDLE]
        mine = [i for i, o in enumerate(child) if o == bottleneck]
        if idle and (not donors or rng.random() < 0.5):
            child[rng.choice(idle)] = bottleneck
            return child
        if not donors:
            return None
        best = max(slack[g] for g in donors)
        donor = rng.choice([g for g in donors if slack[g] >= best - 1e-9])
        theirs = [i for i, o in enumerate(child) if o == donor]
        roll = rng.random()
        if roll < 1 / 3 and mine:  # trade speed, keep counts: blocks are in class order (fastest first)
            fast, slow = min(theirs, key=lambda i: self.blocks[i].cls), max(mine, key=lambda i: self.blocks[i].cls)
            if self.blocks[fast].cls < self.blocks[slow].cls:
                child[fast], child[slow] = bottleneck, donor
                return child
        if roll < 2 / 3 and len(mine) > 1:  # shed a straggler: the bottleneck's slowest block to the donor
            slow = max(mine, key=lambda i: (self.blocks[i].cls, i))
            child[slow] = donor
            return child
        child[rng.choice(theirs)] = bottleneck
        return child

    def refit(self, grouping: tuple[Subset, ...], genome: Sequence[int]) -> list[int] | None:
        """A genome with groups their blocks cannot hold (no options), moved toward a fit: the first such group
        trades its slowest block for the fastest faster block another group holds (counts kept), else takes the
        fastest idle block; again while a group misfits, at most once per block, never taking a block from a group
        that was moved toward its fit (two misfits would trade one block back and forth). Without it a grouping whose
        screened plans all failed to fit (memory next to group mates, which the screen's proxy leaves out) had
        no move toward a fit but random ones and was dropped at its first halving (held-out u19: the trainers'
        group needs H200 and A100 together; docs/benchmarks.md). None where every group fits or nothing moves."""
        child, taken = list(genome), set()
        for _ in self.blocks:
            failing = next((g for g, subset in enumerate(grouping) if self._misfit(subset, child, g)), None)
            if failing is None:
                break
            mine = [i for i, o in enumerate(child) if o == failing]
            slow = max(mine, key=lambda i: (self.blocks[i].cls, i)) if mine else None
            limit = self.blocks[slow].cls if slow is not None else len(self.classes)
            faster = [
                i
                for i, o in enumerate(child)
                if o not in (failing, IDLE) and i not in taken and self.blocks[i].cls < limit
            ]
            idle = [i for i, o in enumerate(child) if o == IDLE]
            if faster and slow is not None:
                fast = min(faster, key=lambda i: (self.blocks[i].cls, i))
                child[fast], child[slow] = failing, child[fast]
            elif idle:
                fast = min(idle, key=lambda i: (self.blocks[i].cls, i))
                child[fast] = failing
            else:
                break
            taken.update(i for i, o in enumerate(child) if o == failing)
        return child if taken else None

    def _misfit(self, subset: Subset, genome: Sequence[int], group: int) -> bool:
        _, canonical = self.devices_of(genome, group)
        return not canonical or self.tables.group_option(subset, canonical) is None

    # --- splits and initial genomes ------------------------------------------------------------

    def work(self) -> dict[TaskName, float]:
        """Each device task's fastest time alone on the whole cluster (inf where it fits nowhere)."""
        if self._work is None:
            from hetrl_cli.planner.baselines import ordered_devices

            devices = ordered_devices(self.tables)
            self._work = {}
            for task in self.tables.tasks:
                fits = self.tables.alone(task, devices)
                self._work[task] = min((f[0] for f in fits), default=math.inf)
        return self._work

    def constructive(self, grouping: tuple[Subset, ...], unit: int) -> tuple[int, ...] | None:
        """Devices per group in proportion to the group's work (Σ of its tasks' times alone on the cluster),
        in multiples of `unit`, every group at least one unit (largest remainders); None if it cannot be."""
        work = self.work()
        units = self.n_devices // unit
        weights = [sum(work[t] for t in g) for g in grouping]
        if units < len(grouping) or not all(math.isfinite(w) and w > 0 for w in weights):
            return None
        spare = units - len(grouping)
        share = [spare * w / sum(weights) for w in weights]
        counts = [1 + int(x) for x in share]
        order = sorted(range(len(grouping)), key=lambda g: (-(share[g] - int(share[g])), g))
        for g in order[: units - sum(counts)]:
            counts[g] += 1
        return tuple(c * unit for c in counts)

    def counts(self, genome: Sequence[int], n_groups: int) -> tuple[int, ...]:
        return tuple(sum(b.size for b, o in zip(self.blocks, genome, strict=True) if o == g) for g in range(n_groups))

    def class_plans(self, grouping: tuple[Subset, ...], keep: int = 2) -> list[list[int]]:
        """Genomes that give every device class wholly to one group (every group at least one class), best
        first by a work-to-capacity proxy: max over groups of (Σ of its tasks' times alone on the cluster) /
        (Σ of its classes' devices × TFLOP/s); at most `keep`. Empty when there are more groups than classes."""
        work = self.work()
        weights = [sum(work[t] for t in g) for g in grouping]
        n, k = len(grouping), len(self.classes)
        if n > k or k > 8 or not all(math.isfinite(w) and w > 0 for w in weights):
            return []
        capacity = [c.size * (c.speed_tflops or 1.0) for c in self.classes]
        ranked = []
        for assign in itertools.product(range(n), repeat=k):
            if len(set(assign)) < n:
                continue
            cap = [0.0] * n
            for cls, g in enumerate(assign):
                cap[g] += capacity[cls]
            ranked.append((max(w / c for w, c in zip(weights, cap, strict=True)), assign))
        ranked.sort()
        return [[assign[b.cls] for b in self.blocks] for _, assign in ranked[:keep]]

    def screen(self, all_groupings: Sequence[tuple[Subset, ...]], budget: Budget) -> dict[int, Screened]:
        """Good plans of the groupings in row space and their rank, within SCREEN_SHARE of the budget
        (planner/screen.py). Deterministic under max_evals (only evaluations count); empty outside 2…SCREEN_CLASSES
        classes or over MAX_ROWS rows."""
        return Screen(self, all_groupings, budget).run()

    def splits(self, n_groups: int, grouping: tuple[Subset, ...] | None = None) -> list[tuple[int, ...]]:
        """Device counts per group (and idle last) in units of whole sub-hosts, at most MAX_SPLITS, spread; the
        constructive split of `grouping` first."""
        unit = max(1, min(b.size for b in self.blocks))
        units = self.n_devices // unit
        while units > 16 and unit * 2 <= self.n_devices // max(1, n_groups):
            unit *= 2
            units = self.n_devices // unit
        out = [tuple(x * unit for x in c) for c in _spread(units, n_groups)]
        first = self.constructive(grouping, unit) if grouping is not None and out else None
        if first is not None:
            out = [first, *(c for c in out if c != first)][: max(MAX_SPLITS, 1)]
        return out

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
        if not child:
            return child
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
        until_found: bool = False,
    ) -> HybridResult:
        """The anytime search: stages of doubling nominal size (FIRST_STAGE_EVALS, FIRST_STAGE_S), each a whole
        search (`_stage`) seeded with `seeds` (the baselines' plans) and the incumbent so far, the last one cut
        where `budget` ends; the best plan of all stages. `until_found`: where --max-evals ends without a plan,
        the cut stage runs on whole (then one more, EXTRA_STAGES in all) until the first plan; the same
        sequence of steps, so a larger budget still never gives a worse plan."""
        start = time.monotonic()
        best: HybridResult | None = None
        lead: tuple[tuple[Subset, ...], tuple[int, ...], float] | None = None
        evals = rounds = 0
        half_s = STEP_RESERVE_SHARE * budget.budget_s if budget.max_evals is None and budget.budget_s else None
        for k in itertools.count():
            stage = _stage_budget(budget, k, evals)
            carried = list(seeds)
            first = best is None  # no plan before this stage: its whole run below if it is cut short
            if lead is not None:
                carried.append((lead[0], list(lead[1])))
            found = self._stage(stage, carried, progress, self.seed + 7919 * k)
            if found.options is not None and (budget.max_evals is None or stage.evals >= (stage.max_evals or 0)):
                found = halves(self, found, half_s)  # a stage cut by --max-evals: not (anytime, `halves`)
            evals += stage.evals
            rounds += found.rounds
            if found.options is not None and (best is None or found.score < best.score - 1e-12):
                best = found
            if found.lead is not None and (lead is None or found.lead[2] < lead[2] - 1e-12):
                lead = found.lead
            if stage is budget or stage.evals == 0 or _outer_spent(budget, evals):
                break
        # A cut stage that found the first plan ran fewer steps than its whole run, which a smaller budget's extra
        # stage runs to the end of the step its first plan came in: run it too, so a larger budget never does worse.
        past = until_found and first and stage is not budget and budget.max_evals is not None  # never past seconds
        for extra in range(EXTRA_STAGES if past else 0):
            stage = _stage_budget(budget, k + extra, 0, whole=True)
            found = self._stage(stage, list(seeds), progress, self.seed + 7919 * (k + extra), stop_on_plan=True)
            evals, rounds = evals + stage.evals, rounds + found.rounds
            if found.options is not None:
                if best is None or found.score < best.score - 1e-12:
                    best = found
                break
        seconds = time.monotonic() - start
        if best is None:
            return HybridResult(None, None, math.inf, evals, seconds, rounds)
        return HybridResult(best.grouping, best.options, best.score, evals, seconds, rounds, genome=best.genome)

    def _stage(
        self,
        budget: Budget,
        seeds: Sequence[tuple[tuple[Subset, ...], list[int]]],
        progress: Callable[[str, float], None] | None,
        seed: int,
        stop_on_plan: bool = False,
    ) -> HybridResult:
        """One whole search (module docstring): the seeds scored first (they are candidates whatever the
        budget), each grouping's arms, the screen's plans in its first arm, then successive-halving cycles
        until the budget is spent."""
        start = time.monotonic()
        run = _Run(groupings(self.tables.tasks), budget, random.Random(seed))
        if stop_on_plan:
            budget.found = lambda: run.best is not None
        scored = [(grouping, self.evaluate(grouping, genome, budget)) for grouping, genome in seeds]
        run.screened = self.screen(run.groupings, budget)
        self._first_arms(run)  # after the screen (its first plan comes sooner), before its arms: the same draws
        self._screened_arms(run)
        for grouping, cand in scored:
            gi = run.groupings.index(grouping)
            if gi not in run.arms:
                run.arms[gi] = [Arm(self.counts(cand.genome, len(grouping)), rng=run.child_rng())]
            run.arms[gi][0].population.append(cand)
            run.consider(gi, cand)
        while not budget.spent():  # one successive-halving cycle after another (budgets doubling per cycle)
            self._cycle(run, progress)
        seconds = time.monotonic() - start
        lead = None if run.lead is None else (run.groupings[run.lead[1]], run.lead[2].genome, run.lead[0])
        if run.best is None:
            return HybridResult(None, None, math.inf, budget.evals, seconds, run.rounds, lead=lead)
        score, gi, cand = run.best
        return HybridResult(
            run.groupings[gi], cand.options, score, budget.evals, seconds, run.rounds, genome=cand.genome, lead=lead
        )

    def _first_arms(self, run: _Run) -> None:
        """Each grouping's splits as arms; first, where there are any, its whole-class constructive genomes."""
        for gi, grouping in enumerate(run.groupings):
            if grouping not in self._arms:
                splits = self.splits(len(grouping), grouping)
                self._arms[grouping] = (splits, self.class_plans(grouping) if splits else [])
            splits, plans = self._arms[grouping][0], [list(g) for g in self._arms[grouping][1]]
            if splits:  # a grouping with more groups than blocks has none
                run.arms[gi] = [Arm(split, rng=run.child_rng()) for split in splits]
                if plans:  # first: whole device classes per group, the constructive genomes
                    counts = self.counts(plans[0], len(grouping))
                    rest = [a for a in run.arms[gi] if a.split != counts]
                    run.arms[gi] = [Arm(counts, rng=run.child_rng(), seeds=plans), *rest[: MAX_SPLITS - 1]]

    def _screened_arms(self, run: _Run) -> None:
        """A screened grouping's first arm: the screen's plans, the scored ones in its population."""
        for gi, found in run.screened.items():
            genomes = [list(c.genome) for c in found.scored] + found.bounded
            if not genomes:
                continue
            counts = self.counts(genomes[0], len(run.groupings[gi]))
            rest = [a for a in run.arms.get(gi, []) if a.split != counts]
            first = Arm(counts, rng=run.child_rng(), seeds=found.bounded[:POPULATION])
            first.population = [c for c in found.scored if c.options is not None][:POPULATION]  # room for seeds
            run.arms[gi] = [first, *rest[: MAX_SPLITS - 1]]
            for cand in found.scored:
                run.consider(gi, cand)

    def _cycle(self, run: _Run, progress: Callable[[str, float], None] | None) -> None:
        """One successive-halving cycle: rounds over the live groupings, each spending its budget per arm on
        its active splits, then dropping the worse half of the groupings and of each one's explored splits."""
        budget = run.budget
        alive = list(run.arms)
        per_arm = FIRST_ROUND * 2**run.cycle
        run.cycle += 1
        width = 1 if run.cycle == 1 else MAX_SPLITS + 1  # the first cycle: only each grouping's constructive split
        if any(not s.quick for s in run.screened.values()):  # the best-ranked groupings first, more each cycle
            alive = sorted(alive, key=run.rank)[: SCREEN_ARMS * 2 ** (run.cycle - 1)]
            width = min(MAX_SPLITS + 1, 2 ** (run.cycle - 1))
        live_arms = {gi: list(run.arms[gi]) for gi in alive}
        while alive and not budget.spent():
            run.rounds += 1
            for gi in alive:
                for arm in live_arms[gi][:width]:
                    self._grow(run.groupings[gi], arm, per_arm, budget, lambda c, gi=gi: run.consider(gi, c))
                    if budget.spent():
                        break
                if budget.spent():
                    break
            if progress and run.best is not None:
                text = f"hybrid: cycle {run.cycle} round {run.rounds}, {len(alive)} groupings, best {run.best[0]:.3g} s"
                progress(text, 0.0)
            if len(alive) == 1 and len(live_arms[alive[0]][:width]) == 1:
                break
            ranked = sorted(alive, key=lambda gi: (min(a.best for a in live_arms[gi][:width]), gi))
            alive = ranked[: max(1, (len(ranked) + 1) // 2)]
            for gi in alive:  # the better half of the explored splits; unexplored ones wait their turn
                explored = sorted((a for a in live_arms[gi] if a.population), key=lambda a: a.best)
                waiting = [a for a in live_arms[gi] if not a.population]
                live_arms[gi] = explored[: max(1, (len(explored) + 1) // 2)] + waiting
            per_arm *= 2

    def _grow(self, grouping, arm: Arm, evals: int, budget: Budget, consider) -> None:
        """Spend `evals` evaluations on one split: fill the population, then mutate rank-biased parents
        (rebalancing by measured time or random moves)."""
        n = len(grouping)

        def admit(cand: Candidate) -> Candidate:
            consider(cand)
            return cand

        while len(arm.population) < POPULATION and evals > 0 and not budget.spent():
            kind = arm.dealt - len(arm.seeds)
            genome = list(arm.seeds[arm.dealt]) if kind < 0 else self.initial(arm.split, arm.rng, kind)
            genome = self.refit(grouping, genome) or genome
            arm.dealt += 1
            arm.population.append(admit(self.evaluate(grouping, genome, budget)))
            evals -= 1
        seen = {c.genome for c in arm.population}
        while evals > 0 and not budget.spent():
            arm.population.sort(key=lambda c: c.score)
            parent = arm.population[min(int(arm.rng.random() ** 2 * len(arm.population)), len(arm.population) - 1)]
            child = self.refit(grouping, parent.genome) if parent.options is None else None
            if child is None and arm.rng.random() < REBALANCE:
                child = self.rebalance(grouping, parent, arm.rng)
                if child is not None:
                    self._repair(child, n)
            if child is None:
                child = self.mutate(parent.genome, n, arm.rng)
            child = tuple(child)
            evals -= 1
            if child in seen:
                continue
            seen.add(child)
            cand = admit(self.evaluate(grouping, child, budget))
            if cand.score < arm.population[-1].score:
                arm.population[-1] = cand


def halves(search: Hybrid, best: HybridResult, seconds: float | None = None) -> HybridResult:
    """The answer's large whole-host blocks split in halves, each half moved to every other owner, the best
    move kept, at most HALF_MOVES times (HALF_EVALS evaluations past the budget; under a wall-clock budget also
    at most `seconds`, the step reserve's share of it: 0.5 s at 10 s). Whole-host genomes
    (WHOLE_HOSTS_FROM) cannot give one 8-GPU host to two groups, which the ILP at half granularity can
    (held-out u24: generation 4 of an L40S host, training the other 12; docs/benchmarks.md). Only blocks of
    >= 4 devices, a power of two (the ILP's halving parts). A stage's answer only, never its lead (later stages
    search whole hosts from it), so never a worse plan; under --max-evals only a stage that ran whole (`run`): a
    cut stage's answer changes with the cut, and its split could beat a longer run's (not anytime)."""
    assert best.grouping is not None
    split = [b for b in search.blocks if b.size >= 4 and b.size & (b.size - 1) == 0]
    if not split or len(best.genome) != len(search.blocks):
        return best
    fine = Hybrid(search.tables, search.seed, search.steer)
    fine.blocks, genome, second_halves = [], [], []  # each split block's second half (the two are alike)
    for b, owner in zip(search.blocks, best.genome, strict=True):
        half = b.size // 2
        parts = [Block(b.cls, b.host, b.start + h * half, half) for h in (0, 1)] if b in split else [b]
        fine.blocks.extend(parts)
        genome.extend([owner] * len(parts))
        if len(parts) == 2:
            second_halves.append(len(fine.blocks) - 1)
    owners = [*range(len(best.grouping)), IDLE]
    budget, value, found = Budget(seconds, HALF_EVALS), best.score, None
    for _ in range(HALF_MOVES):
        moved = None
        for i in second_halves:
            for owner in owners:
                if owner == genome[i] or budget.spent():
                    continue
                child = [*genome[:i], owner, *genome[i + 1 :]]
                cand = fine.evaluate(best.grouping, child, budget)
                score = cand.score if cand.answer is None else cand.answer
                if cand.options is not None and cand.allowed and score < value * (1 - 1e-9):
                    value, moved = score, cand
        if moved is None:
            break
        genome, found = list(moved.genome), moved
    return best if found is None else dataclasses.replace(best, options=found.options, score=value, genome=found.genome)


def _stage_budget(outer: Budget, k: int, used: int, whole: bool = False) -> Budget:
    """Stage k's budget: FIRST_STAGE_EVALS·2^k evaluations capped at what `outer` has left (`used` spent), or
    FIRST_STAGE_S·2^k seconds ending no later than `outer`; `outer` itself when it is unbounded. `whole`: the
    stage's own size, past `outer` (a search that must find a plan)."""
    if whole:
        return Budget(None, FIRST_STAGE_EVALS * 2**k) if outer.max_evals is not None else Budget(FIRST_STAGE_S * 2**k)
    caps = [c - used for c in (outer.max_evals, outer.cap) if c is not None]
    if outer.max_evals is not None:
        stage = Budget(None, FIRST_STAGE_EVALS * 2**k)
    elif outer.deadline is None:
        return outer
    else:
        stage = Budget(FIRST_STAGE_S * 2**k, None)
        assert stage.deadline is not None
        stage.deadline = min(stage.deadline, outer.deadline)
    stage.cap = max(0, min(caps)) if caps else None
    return stage


def _outer_spent(outer: Budget, used: int) -> bool:
    if any(c is not None and used >= c for c in (outer.max_evals, outer.cap)):
        return True
    return outer.max_evals is None and outer.deadline is not None and time.monotonic() >= outer.deadline


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


@functools.lru_cache(maxsize=256)
def _spread(units: int, parts: int) -> tuple[tuple[int, ...], ...]:
    """At most MAX_SPLITS compositions of ≤ `units` into `parts`, evenly spaced in sorted order. Cached: every
    grouping with as many groups asks for the same ones (on PPO with 203 groupings, enumerating them per grouping
    and stage took 0.1 CPU s of a 2 s budget before the first evaluation)."""
    comps = sorted(_compositions(units, parts))
    if len(comps) > MAX_SPLITS:
        step = len(comps) / MAX_SPLITS
        comps = [comps[int(i * step)] for i in range(MAX_SPLITS)]
    return tuple(comps)


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
