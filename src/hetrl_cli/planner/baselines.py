"""Baselines scored by the same cost model: what verl and StreamRL would deploy on this cluster.

- `verl`: every task colocated on all devices; the same TP/PP for all replicas of a task, sized as if the
  cluster were homogeneous (the smallest model-parallel size that fits on the smallest-memory device, with
  TP inside a host first); uniform batch shares and even layer splits (no load balancing).
- `streamrl`: generation alone on one group, everything else on the other; each group homogeneous where
  possible (whole device types per side); the split is the best by the cost model among the type-wise
  splits (every non-empty proper subset of types for generation; with one type, 1/4, 1/2, 3/4 of the
  hosts). Same homogeneous sizing and uniform shares inside each group.

On hosts with uneven GPU counts (a 3-GPU host beside 4- and 8-GPU ones) both do what a user of those systems
does: where the whole device set has no uniform layout, each group runs on the largest uniform subset that
fits (the same number of GPUs taken from every host that has that many; the odd devices left idle).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from hetrl_cli.artifacts.rl import TaskName
from hetrl_cli.costmodel.types import GroupPlacement, PlanEstimate, TaskPlacement
from hetrl_cli.planner.space import host_chunks, layouts, max_pp_of, place
from hetrl_cli.planner.tables import Tables, group_name


@dataclass
class BaselinePlan:
    name: str
    groups: list[GroupPlacement]
    placements: list[TaskPlacement]
    estimate: PlanEstimate
    note: str = ""

    @property
    def iteration_s(self) -> float:
        return self.estimate.iteration_s if self.estimate.feasible else math.inf


def ordered_devices(tables: Tables, devices: Sequence[str] | None = None) -> tuple[str, ...]:
    """Devices in the planner's structural order: fastest class first, then host, then index."""
    wanted = None if devices is None else set(devices)
    out = []
    for c in tables.classes:
        for host in c.devices:
            out.extend(d for d in host if wanted is None or d in wanted)
    return tuple(out)


def _uniform(placement: TaskPlacement, layers: int) -> TaskPlacement:
    """Uniform batch shares and even layer splits (first stages take the remainder)."""
    dp, pp = placement.dp, placement.pp
    base, extra = divmod(layers, pp)
    split = tuple(base + (1 if s < extra else 0) for s in range(pp))
    return TaskPlacement(placement.task, placement.replicas, tuple([1.0 / dp] * dp), tuple([split] * dp))


def homogeneous_layouts(tables: Tables, task: TaskName, devices: tuple[str, ...]) -> list[TaskPlacement]:
    """Blocked layouts of `task` on `devices` in the order a homogeneous-cluster user tries them: smallest
    model-parallel size first, TP before PP at equal size (uniform shares, even splits)."""
    chunks = host_chunks(devices, tables.host_of)
    shape = tables.shapes[task]
    sizes = [len(c) for c in chunks]
    options = [lay for lay in layouts(sizes, shape, mixed=False, max_pp=max_pp_of(task)) if not lay.strided]
    options.sort(key=lambda lay: (lay.tp * lay.pp, lay.pp))
    return [_uniform(place(task, chunks, lay), shape.layers) for lay in options]


MAX_JOINT_TRIES = 24
"""Combinations of per-task layouts `size_group` scores after its greedy sizing fails (each: one cost-model call
per task); baselines run as the hybrid's seeds on every plan, so this stays small."""


def size_group(
    tables: Tables, tasks: tuple[TaskName, ...], devices: tuple[str, ...], search: bool = False
) -> list[TaskPlacement] | None:
    """Per task the first homogeneous layout that fits next to its group mates (by name), then bumped per
    task until the group fits with exact placements; with `search`, where that runs out, the combinations of
    layouts that each fit by name, smallest first (`MAX_JOINT_TRIES`); None if nothing fits."""
    candidates = {t: homogeneous_layouts(tables, t, devices) for t in tasks}
    greedy = _size_greedy(tables, tasks, candidates)
    if greedy is not None or len(tasks) == 1 or not search:
        return greedy or None  # sized, or a task fits by name nowhere here
    fitting = [[c for c in candidates[t] if not tables.cm.task(c, _mates(tasks, t)).violation] for t in tasks]
    for combo in itertools.islice(_by_index_sum([len(f) for f in fitting]), MAX_JOINT_TRIES):
        chosen = [f[i] for f, i in zip(fitting, combo, strict=True)]
        if _fits_together(tables, chosen):
            return chosen
    return None


def _mates(tasks: tuple[TaskName, ...], task: TaskName) -> tuple[TaskName, ...]:
    return tuple(u for u in tasks if u != task)


def _fits_together(tables: Tables, chosen: list[TaskPlacement]) -> bool:
    """Every task fits next to its mates' exact placements."""
    return not any(
        tables.cm.task(p, tuple(q for j, q in enumerate(chosen) if j != i)).violation for i, p in enumerate(chosen)
    )


def _by_index_sum(lengths: list[int]):
    """Index tuples within `lengths` in increasing sum (smaller model-parallel sizes first: the layouts are
    sorted so), ties in lexicographic order. On held-out seed 2's u09 verl fits the 12 H100 only with
    reference at TP 2 x PP 6 beside actor_train's one fitting layout: the greedy bumped actor_train past it."""

    def parts(total: int, bounds: list[int]):
        if len(bounds) == 1:
            if total < bounds[0]:
                yield (total,)
            return
        for first in range(min(total, bounds[0] - 1) + 1):
            for rest in parts(total - first, bounds[1:]):
                yield (first, *rest)

    for total in range(sum(n - 1 for n in lengths) + 1):
        yield from parts(total, lengths)


def _size_greedy(tables: Tables, tasks: tuple[TaskName, ...], candidates: dict) -> list[TaskPlacement] | None:
    """`size_group`'s first pass: per task the first layout fitting by name, the first misfit bumped; [] where
    some task has no layout that fits by name (no combination can fit then), None where the bumps ran out."""
    index = dict.fromkeys(tasks, 0)
    for t in tasks:
        others = _mates(tasks, t)
        while index[t] < len(candidates[t]) and tables.cm.task(candidates[t][index[t]], others).violation:
            index[t] += 1
        if index[t] >= len(candidates[t]):
            return []
    for _ in range(sum(len(c) for c in candidates.values())):
        chosen = [candidates[t][index[t]] for t in tasks]
        bad = [
            i
            for i, p in enumerate(chosen)
            if tables.cm.task(p, tuple(q for j, q in enumerate(chosen) if j != i)).violation
        ]
        if not bad:
            return chosen
        t = tasks[bad[0]]
        index[t] += 1
        if index[t] >= len(candidates[t]):
            return None
    return None


def power_of_two_share(count: int) -> int:
    """The most GPUs of a host of `count` a TP group of a power of two can take (4 of 5, 2 of 3, 4 of 6)."""
    return 1 << (count.bit_length() - 1)


def uniform_subsets(tables: Tables, devices: tuple[str, ...], shares: bool = False) -> list[tuple[str, ...]]:
    """`devices`, then its uniform subsets largest first: of all of them and of each GPU type's, for each
    per-host count c the first c devices of every host holding at least c (what a verl or StreamRL user
    configures on uneven hosts: the odd devices idle). With `shares`, only the subsets whose c is a host
    count's `power_of_two_share` and not a host count (held-out seed 3's u20: 8B actor_train fits at TP 4 on 4
    of a 5-GPU host's H100, not on all 5): tried after the others (`size_largest`)."""
    by_type: dict[str, list[str]] = {}
    for d in devices:
        by_type.setdefault(tables.spec_of[d][0], []).append(d)
    subsets: list[tuple[str, ...]] = []
    for pool in [list(devices), *by_type.values()]:
        per_host: dict[str, list[str]] = {}
        for d in pool:
            per_host.setdefault(tables.host_of[d], []).append(d)
        counts = {len(v) for v in per_host.values()}
        for c in {power_of_two_share(c) for c in counts} - counts if shares else counts:
            subsets.append(tuple(d for v in per_host.values() if len(v) >= c for d in v[:c]))
    subsets.sort(key=lambda s: -len(s))
    if shares:
        plain = set(uniform_subsets(tables, devices))
        return [s for s in dict.fromkeys(subsets) if s not in plain]
    return list(dict.fromkeys([devices, *subsets]))


def _overflow(tables: Tables, placement: TaskPlacement, others: tuple[TaskName, ...]) -> tuple[float, str | None]:
    """How far `placement` is from fitting next to `others`: 0 where it fits, else its fullest device's need
    over its memory (at least just above 1: a violation that is not memory still fails), with the violation."""
    est = tables.cm.task(placement, others)
    if est.violation is None:
        return 0.0, None
    fill = max((b / tables.spec_of[d][1] for d, b in est.memory_bytes.items() if d in tables.spec_of), default=0.0)
    return max(fill, 1.0 + 1e-9), est.violation


def closest(tables: Tables, tasks: tuple[TaskName, ...], devices: tuple[str, ...]) -> tuple[float, str]:
    """Why no uniform subset of `devices` holds `tasks` together, from the subset that comes closest: per
    subset, each task's least overflow over its layouts (next to its group mates); the subset whose worst task
    overflows least (the larger on ties), and that task's violation. (score, reason); score 0 where each
    task fits alone but not together. Before, the first subset's first failing task was named, which could be
    one that fits elsewhere: generation on all 30 GPUs of held-out u19 (one layout there, TP 1) while
    training was what fit nowhere."""
    best: tuple[float, str] | None = None
    for subset in uniform_subsets(tables, devices) + uniform_subsets(tables, devices, shares=True):
        worst: tuple[float, str] = (
            0.0,
            f"{', '.join(tasks)} fit one by one but not together on the {len(subset)} devices",
        )
        for t in tasks:
            options = homogeneous_layouts(tables, t, subset)
            if not options:
                worst = max(worst, (math.inf, f"{t} has no uniform TP/PP layout on the {len(subset)} devices"))
                continue
            others = tuple(u for u in tasks if u != t)
            least = min((_overflow(tables, lay, others) for lay in options), key=lambda o: o[0])
            if least[1] is not None:
                worst = max(worst, (least[0], least[1]))
        if best is None or worst[0] < best[0]:
            types = sorted({tables.spec_of[d][0].removeprefix("NVIDIA ") for d in subset})
            best = (worst[0], f"closest on {len(subset)} devices ({', '.join(types)}): {worst[1]}")
    return best if best is not None else (math.inf, f"no devices for {', '.join(tasks)}")


def why_not(tables: Tables, tasks: tuple[TaskName, ...], devices: tuple[str, ...]) -> str:
    """Why no uniform subset of `devices` holds `tasks` together (`closest`)."""
    return closest(tables, tasks, devices)[1]


def size_largest(
    tables: Tables, tasks: tuple[TaskName, ...], devices: tuple[str, ...]
) -> tuple[tuple[str, ...], list[TaskPlacement]] | None:
    """The group on `devices`, else on its largest uniform subset that fits (`uniform_subsets`); where the
    greedy sizing fits none, again with `size_group`'s search (a subset it sizes may be far larger, and
    slower, than the one the greedy sizes: held-out seed 1's u15 verl 97.9 s/it against 637.8, so it only
    turns no plan into one); where neither fits, both on the power-of-two shares of uneven hosts (likewise:
    on seed 2's u09 verl took 8 of the 12 H100 before the 12 that fit with the search)."""
    plain = uniform_subsets(tables, devices)
    shares = uniform_subsets(tables, devices, shares=True)
    for subsets, search in ((plain, False), (plain, True), (shares, False), (shares, True)):
        for subset in subsets:
            sized = size_group(tables, tasks, subset, search)
            if sized is not None:
                return subset, sized
    return None


def _score(tables: Tables, name: str, grouping, device_sets) -> BaselinePlan | None:
    groups, placements, idle = [], [], 0
    for tasks, devices in zip(grouping, device_sets, strict=True):
        if not devices:
            return None
        found = size_largest(tables, tasks, devices)
        if found is None:
            return None
        used, sized = found
        idle += len(devices) - len(used)
        groups.append(GroupPlacement(group_name(tasks), tasks, used))
        placements.extend(sized)
    estimate = tables.cm.evaluate(groups, placements)
    if not estimate.feasible:
        return None
    note = f"largest uniform subsets: {idle} devices left idle" if idle else ""
    return BaselinePlan(name, groups, placements, estimate, note)


def verl(tables: Tables) -> BaselinePlan | None:
    """Everything colocated on all devices, homogeneous sizing, uniform shares."""
    return _score(tables, "verl", [tables.tasks], [ordered_devices(tables)])


EVERY_SPLIT_UP_TO_TYPES = 6
"""Up to this many device types the StreamRL-like baseline tries every type-wise split (62 at 6 types); past it,
generation on one or two types or on all but one or two (110 at 10 types, not 1022): a StreamRL user picks the
generation side by type, and scoring 2^n splits took 45 s of a 30 s budget on a 10-type cluster."""


def _generation_type_counts(types: int) -> list[int]:
    """How many device types the generation side may take in the StreamRL-like baseline's splits."""
    if types <= EVERY_SPLIT_UP_TO_TYPES:
        return list(range(1, types))
    return sorted({1, 2, types - 2, types - 1})


def _splits(tables: Tables) -> list[tuple[tuple[str, ...], tuple[str, ...], str]]:
    """The StreamRL-like baseline's (generation side, other side, label) splits (module docstring)."""
    devices = ordered_devices(tables)
    by_type: dict[str, list[str]] = {}
    for d in devices:
        by_type.setdefault(tables.spec_of[d][0], []).append(d)
    splits: list[tuple[tuple[str, ...], tuple[str, ...], str]] = []
    types = list(by_type)
    for r in _generation_type_counts(len(types)):
        for gen_types in itertools.combinations(types, r):
            gen = tuple(d for t in gen_types for d in by_type[t])
            other = tuple(d for d in devices if d not in set(gen))
            splits.append((gen, other, f"generation on {', '.join(gen_types)}"))
    if len(types) == 1:
        hosts = list(dict.fromkeys(tables.host_of[d] for d in devices))
        for frac in (0.25, 0.5, 0.75):
            if len(hosts) > 1:
                cut = max(1, min(len(hosts) - 1, round(len(hosts) * frac)))
                gen = tuple(d for d in devices if tables.host_of[d] in set(hosts[:cut]))
            else:
                cut = max(1, min(len(devices) - 1, round(len(devices) * frac)))
                gen = devices[:cut]
            other = tuple(d for d in devices if d not in set(gen))
            splits.append((gen, other, f"generation on {len(gen)} of {len(devices)} devices"))
    return list(dict.fromkeys(splits))


def streamrl(tables: Tables) -> BaselinePlan | None:
    """Generation apart from the rest, one device type per side where possible; best type-wise split."""
    rest = tuple(t for t in tables.tasks if t != "generation")
    if not rest:
        return None
    best: BaselinePlan | None = None
    for gen, other, label in _splits(tables):
        plan = _score(tables, "streamrl", [("generation",), rest], [gen, other])
        if plan is not None and (best is None or plan.iteration_s < best.iteration_s):
            plan.note = f"{label}; {plan.note}" if plan.note else label
            best = plan
    return best


def failure(tables: Tables, name: str) -> str:
    """The real reason baseline `name` has no plan (for its exit-3 message)."""
    devices = ordered_devices(tables)
    if name == "verl":
        return f"every task on one group: {why_not(tables, tables.tasks, devices)}"
    rest = tuple(t for t in tables.tasks if t != "generation")
    if not rest:
        return "the workload has no task besides generation to put on a second group"
    if len(devices) < 2:
        return "generation and the other tasks need two groups, and the cluster has one device"
    sides = []  # per split, the side further from fitting
    for gen, other, label in _splits(tables):
        side = max(closest(tables, ("generation",), gen), closest(tables, rest, other))
        sides.append((side[0], f"{label}; {side[1]}"))
    why = min(sides)[1] if sides else why_not(tables, ("generation",), devices)
    head = "no split of the device types (or hosts) holds generation on one side and"
    return f"{head} {', '.join(rest)} on the other; the nearest: {why}"


BASELINES = {"verl": verl, "streamrl": streamrl}
