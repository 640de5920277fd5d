"""One task's estimate: its placement's device classes, the class-level estimate (per-replica times from
generation.py or forward.py, balanced batch shares, layer splits, the training sync), and per-device memory
with what the group's other tasks keep resident (docs/costmodel.md).

Estimates are computed on device classes and cached by what they depend on (`class_inputs`), so the many
placements a search tries that share a shape in classes cost one computation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from hetrl_cli.artifacts.plan import TaskCost
from hetrl_cli.artifacts.rl import HEAD, TRAIN_TASKS, TaskName
from hetrl_cli.costmodel.devices import ClassLayout, Cluster
from hetrl_cli.costmodel.forward import Forward
from hetrl_cli.costmodel.generation import Generation
from hetrl_cli.costmodel.memo import Memo
from hetrl_cli.costmodel.memory import resident_bytes_per_param
from hetrl_cli.costmodel.step import Step
from hetrl_cli.costmodel.training import add_train_sync, add_zero3_inference_gathers, critic_sync_receivers
from hetrl_cli.costmodel.types import ReplicaTimes, TaskEstimate, TaskPlacement

GB = 1e9
BALANCE_ROUNDS = 4
"""Rate-proportional re-balancing rounds (forward tasks are ~linear in their share: one round suffices)."""
BALANCE_TOLERANCE = 5e-3
"""Stop balancing when the replicas' times agree within this fraction (0.5 % of the iteration)."""

Mates = tuple  # the group's other tasks: names, or placements (TaskName | TaskPlacement)
StageBytes = tuple[tuple[float, ...], ...]
"""Bytes per replica and stage (what the group's other tasks keep resident there)."""


@dataclass
class ClassEstimate:
    """A task's estimate on device classes: what every placement of the same class shape shares."""

    shares: tuple[float, ...]
    splits: tuple[tuple[int, ...], ...]
    cost: TaskCost
    terms: dict[str, float]
    links: dict[str, str]
    stage_bytes: list[list[float]]
    stage_parts: list[list[str]]
    violation: str | None
    mem_violation: tuple[int, int, float, str] | None
    """(replica, stage, bytes needed, what) when one sequence/micro-batch cannot fit at all."""
    hard: bool = False
    """The shape cannot run at all (violation set, times inf, no memory)."""


class Tasks:
    """Scores one task's placement (TaskEstimate), given the group's other tasks."""

    def __init__(
        self,
        step: Step,
        cluster: Cluster,
        forward: Forward,
        generation: Generation,
        task_overhead_s: dict[str, float],
    ) -> None:
        self.step = step
        self.cluster = cluster
        self.forward = forward
        self.generation = generation
        self.task_overhead_s = task_overhead_s
        self._others: Memo[tuple[float, dict[str, float] | None]] = Memo(self._others_resident)
        self._resident: Memo[dict[str, float]] = Memo(self._resident_map)
        self._classes: Memo[ClassEstimate] = Memo(self._class_estimate)
        self._replicas: Memo[ReplicaTimes] = Memo(self._replica)

    def estimate(self, placement: TaskPlacement, group_tasks: Mates) -> TaskEstimate:
        """Time terms and per-device peak memory of one task (CostModel.task, uncached)."""
        task = placement.task
        # 1) device ids → classes (what the class-level estimate is keyed by), once per device layout
        rep_key, bad = self.cluster.checked_layout(placement.replicas)
        if bad is not None:
            return TaskEstimate(placement, TaskCost(total_s=math.inf), {}, task + bad)
        # 2) what the group's other tasks keep resident on these devices: one figure for every device (mates
        # by name) or a figure per device (mates' placements)
        names = frozenset(t if isinstance(t, str) else t.task for t in group_tasks) - {task}
        uniform, others_dev = 0.0, None
        apart = self._critic_apart(placement, group_tasks)
        if group_tasks:
            okey = (task, placement.replicas, group_tasks, apart)
            uniform, others_dev = self._others.keyed(okey, placement, group_tasks, names, apart)
        if others_dev:
            others_key = tuple(
                tuple(max(others_dev.get(d, 0.0) for d in st) for st in rep) for rep in placement.replicas
            )
        elif uniform:
            others_key = tuple((uniform,) * len(rep) for rep in placement.replicas)
        else:
            others_key = None
        # 3) the class-level estimate (cached on what it depends on: see class_inputs)
        shares, splits, offload = placement.batch_shares, placement.layer_splits, placement.offload
        cnames, cothers = class_inputs(task, names, others_key)
        if apart and task == "critic_inference":  # a copy of its own: its weights, no zero3 gathers
            cnames = frozenset()
        ckey = (task, rep_key, shares, splits, offload, cnames, cothers)
        ce = self._classes.keyed(ckey, task, rep_key, shares, splits, offload, cnames, cothers)
        if ce.hard:
            return TaskEstimate(placement, ce.cost, {}, ce.violation)
        filled = TaskPlacement(task, placement.replicas, ce.shares, ce.splits, offload)
        memory, violation = self._device_memory(placement, ce, names, uniform, others_dev)
        return TaskEstimate(filled, ce.cost, memory, violation, terms=ce.terms, links=ce.links)

    def _device_memory(
        self,
        placement: TaskPlacement,
        ce: ClassEstimate,
        names: frozenset[str],
        uniform: float,
        others_dev: dict[str, float] | None,
    ) -> tuple[dict[str, int], str | None]:
        """Per-device peak bytes and the worst overflow's sentence (per stage when the resident bytes are
        uniform: a stage's devices then hold the same bytes and the one with the least usable memory
        overflows most)."""
        task = placement.task
        gen = task == "generation"
        usable = self.cluster.usable_gen if gen else self.cluster.usable
        memory: dict[str, int] = {}
        worst: tuple[float, str, float, str] | None = None
        for r, rep in enumerate(placement.replicas):
            own_r = ce.stage_bytes[r]
            for p, st in enumerate(rep):
                own = own_r[p]
                if others_dev is None:
                    total = own + uniform
                    b = int(total)
                    for d in st:
                        memory[d] = b
                    d, room = self.cluster.least_usable(st, gen)
                    over = total - room
                    if over > 0 and (worst is None or over > worst[0]):
                        worst = (over, d, total, ce.stage_parts[r][p])
                    continue
                for d in st:
                    total = own + others_dev.get(d, 0.0)
                    memory[d] = int(total)
                    over = total - usable[d]
                    if over > 0 and (worst is None or over > worst[0]):
                        worst = (over, d, total, ce.stage_parts[r][p])
        violation = ce.violation
        devices = self.cluster.devices
        if violation is None and ce.mem_violation is not None:
            r, p, need, what = ce.mem_violation
            d = placement.replicas[r][p][0]
            violation = (
                f"{d} needs {need / GB:.1f} GB for {task} {what}, has "
                f"{devices[d].memory_bytes / GB:.1f} GB; use more devices (tp/pp) or shorter sequences"
            )
        if violation is None and worst is not None:
            _, d, total, what = worst
            resident = others_dev.get(d) if others_dev else uniform
            extra = " + resident state of " + ", ".join(sorted(names)) if resident else ""
            violation = (
                f"{d} needs {total / GB:.1f} GB for {task} {what}{extra}, has "
                f"{usable[d] / GB:.1f} GB usable of {devices[d].memory_bytes / GB:.1f} GB; "
                "use more devices, ZeRO sharding, recompute or offload"
            )
        return memory, violation

    # ---- memory of colocated tasks ----------------------------------------------------------------------
    def _others_resident(
        self, placement: TaskPlacement, group_tasks: Mates, names: frozenset[str], apart: bool = False
    ) -> tuple[float, dict[str, float] | None]:
        """Bytes the other tasks of the group keep resident while this task runs: (bytes on every device, None)
        when the mates are given by name (spread like this placement), else (0, bytes per device). `apart`: critic
        inference runs on a copy of its own (`_critic_apart`), which stays resident as any inference model's."""
        group_all = names | {placement.task}
        arch_of, w = self.step.arch, self.step.workload
        if all(isinstance(t, str) for t in group_tasks):
            total = 0.0
            for other in group_tasks:
                if other == placement.task or other not in arch_of:
                    continue
                per_param = resident_bytes_per_param(other, group_all - {other}, False, w, placement.dp)
                per_dev = arch_of[other].param_count(HEAD[other]) * per_param / (placement.tp * placement.pp)
                total += per_dev
            return total, None
        out: dict[str, float] = {}
        for other in group_tasks:
            if isinstance(other, str):
                if other == placement.task or other not in arch_of:
                    continue
                per_param = resident_bytes_per_param(other, group_all - {other}, False, w, placement.dp)
                per_dev = arch_of[other].param_count(HEAD[other]) * per_param / (placement.tp * placement.pp)
                if per_dev:
                    for d in placement.devices:
                        out[d] = out.get(d, 0.0) + per_dev
            else:
                if other.task == placement.task:
                    continue
                group = group_all - {other.task}
                if apart and other.task == "critic_inference":
                    group -= {"critic_train"}
                for d, b in self._resident(other, group).items():
                    out[d] = out.get(d, 0.0) + b
        return 0.0, out

    def _resident_map(self, placement: TaskPlacement, group: frozenset[str]) -> dict[str, float]:
        """Bytes per device a task keeps resident between its runs (memory.py module docstring)."""
        out: dict[str, float] = {}
        rep_key = self.cluster.class_layout(placement.replicas)
        if rep_key is not None and not self.shape_problem(placement.task, rep_key, None, placement.layer_splits):
            arch = self.step.arch[placement.task]
            per_param = resident_bytes_per_param(
                placement.task, group, placement.offload, self.step.workload, placement.dp
            )
            splits = placement.layer_splits or self._splits(placement.task, rep_key)
            for r, rep in enumerate(placement.replicas):
                for p, st in enumerate(rep):
                    b = self.step.stage_params(arch, HEAD[placement.task], splits[r], p) * per_param / placement.tp
                    for d in st:
                        out[d] = b
        return out

    def _critic_apart(self, placement: TaskPlacement, group_tasks: Mates) -> bool:
        """critic_inference and critic_train placed in one group with layouts the runtime does not share weights
        between (training.critic_sync_receivers): inference then runs on a copy of its own. Mates given by name
        are taken to share (their layout unknown, as for their resident bytes)."""
        placed = {p.task: p for p in (placement, *group_tasks) if isinstance(p, TaskPlacement)}
        infer, train = placed.get("critic_inference"), placed.get("critic_train")
        if infer is None or train is None:
            return False
        return bool(self.critic_receivers(infer, train))

    def critic_receivers(self, infer: TaskPlacement, train: TaskPlacement) -> tuple[str, ...]:
        """critic_inference's devices in critic_train's group that run on a copy of their own (every device of
        each replica laid out unlike any trainer replica: training.critic_sync_receivers), which the runtime's
        critic sync sends the weights to (runtime/weightsync.critic_shared_ranks); () for a shape that cannot run
        (its own violation says so)."""
        layouts = []
        for p in (infer, train):
            splits = p.layer_splits
            rep_key = self.cluster.class_layout(p.replicas)
            if splits is None and rep_key is not None and not self.shape_problem(p.task, rep_key, None, None):
                splits = self._splits(p.task, rep_key)
            if splits is None:
                return ()
            layouts.append(
                [(rep, split if len(rep) > 1 else ()) for rep, split in zip(p.replicas, splits, strict=True)]
            )
        zero3 = self.step.workload.sharding == "zero3" and train.dp > 1
        return critic_sync_receivers(layouts[0], layouts[1], zero3)

    def _splits(self, task: TaskName, rep_key: ClassLayout) -> tuple[tuple[int, ...], ...]:
        stage = self.cluster.stage
        return tuple(self.forward.split_of(task, rep, tuple(stage(s) for s in rep)) for rep in rep_key)

    # ---- class-level estimate ---------------------------------------------------------------------------
    def shape_problem(
        self,
        task: TaskName,
        rep_key: ClassLayout,
        shares: tuple[float, ...] | None,
        splits: tuple[tuple[int, ...], ...] | None,
    ) -> str | None:
        """Why a placement's shape cannot run at all (independent of which devices of a class it uses)."""
        if task == "reward" and self.step.rule_reward:
            return "reward is rule-based (workload.reward is None): omit the reward task from the placement"
        if task not in self.step.arch:
            return f"task {task} is not part of this {self.step.workload.algorithm} workload"
        if not rep_key or any(not rep for rep in rep_key) or any(not st for rep in rep_key for st in rep):
            return f"{task}: a placement needs at least one replica with one stage of one device"
        pp, tp = len(rep_key[0]), len(rep_key[0][0])
        if any(len(rep) != pp or any(len(st) != tp for st in rep) for rep in rep_key):
            return f"{task}: every replica must have pp={pp} stages of tp={tp} devices"
        arch = self.step.arch[task]
        if arch.num_heads % tp:
            return f"{task}: {arch.name} has {arch.num_heads} attention heads, not divisible by tp={tp}"
        if arch.vocab_size < tp:  # runtime/parallel.py: each TP rank holds ceil(V / tp) > 0 vocabulary rows
            return (f"{task}: {arch.name} has a vocabulary of {arch.vocab_size} tokens, fewer than tp={tp} ranks "
                    f"(each TP rank holds some of its rows): place {task} with tp <= {arch.vocab_size}")  # fmt: skip
        if pp > arch.num_layers:
            return f"{task}: {arch.name} has {arch.num_layers} layers, fewer than pp={pp} stages"
        dp = len(rep_key)
        if shares is not None and (len(shares) != dp or min(shares) <= 0 or abs(sum(shares) - 1) > 1e-6):
            return f"{task}: batch_shares must be {dp} positive numbers summing to 1"
        if splits is not None and (
            len(splits) != dp or any(len(x) != pp or sum(x) != arch.num_layers or min(x) < 1 for x in splits)
        ):
            return f"{task}: layer_splits need {pp} entries ≥ 1 per replica summing to {arch.num_layers} layers"
        for c in {c for rep in rep_key for st in rep for c in st}:
            if self.cluster.classes[c].compute_Fps <= 0:
                cls = self.cluster.classes[c]
                return f"{task}: {cls.name} on {cls.host} has no FLOP/s figure in the profile; re-profile it"
        return None

    def _class_estimate(
        self,
        task: TaskName,
        rep_key: ClassLayout,
        shares: tuple[float, ...] | None,
        splits: tuple[tuple[int, ...], ...] | None,
        offload: bool,
        names: frozenset[str],
        others: StageBytes | None,
    ) -> ClassEstimate:
        bad = self.shape_problem(task, rep_key, shares, splits)
        if bad:
            inf = TaskCost(total_s=math.inf)
            return ClassEstimate((), (), inf, {}, {}, [], [], bad, None, hard=True)
        if others is None:
            others = tuple((0.0,) * len(rep) for rep in rep_key)
        stages = [tuple(self.cluster.stage(s) for s in rep) for rep in rep_key]
        if splits is None:
            splits = tuple(self.forward.split_of(task, rep_key[r], stages[r]) for r in range(len(rep_key)))
        dp = len(rep_key)

        # replicas with the same device classes, split and co-resident bytes behave identically:
        # compute each kind once and give its replicas equal shares
        kind_of: dict[tuple, int] = {}
        kinds = [kind_of.setdefault((rep_key[r], splits[r], others[r]), len(kind_of)) for r in range(dp)]
        first = {k: kinds.index(k) for k in range(len(kind_of))}

        def run(k: int, share: float) -> ReplicaTimes:
            r = first[k]
            n_seq = share * self.step.n_samples
            key = (task, rep_key[r], splits[r], n_seq, others[r], offload, names, dp)
            return self._replicas.keyed(
                key, task, rep_key[r], stages[r], splits[r], n_seq, others[r], offload, names, dp
            )

        if shares is None:
            shares, reps = balance(kinds, run)
        else:
            memo: dict[tuple[int, float], ReplicaTimes] = {}
            reps = []
            for r, share in enumerate(shares):
                key = (kinds[r], share)
                if key not in memo:
                    memo[key] = run(kinds[r], share)
                reps.append(memo[key])
        crit = max(range(dp), key=lambda r: reps[r].total_s)
        terms = dict(reps[crit].terms)
        links = dict(reps[crit].links)
        if task in TRAIN_TASKS:
            add_train_sync(self.step, self.cluster, task, rep_key, stages, splits, terms, links, offload, shares)
        else:
            add_zero3_inference_gathers(self.step, self.cluster, task, rep_key, terms, links, names, shares)
        return ClassEstimate(
            shares=tuple(shares),
            splits=tuple(splits),
            cost=task_cost(terms),
            terms=terms,
            links=links,
            stage_bytes=[rep.stage_bytes for rep in reps],
            stage_parts=[rep.stage_parts for rep in reps],
            violation=next((rep.violation for rep in reps if rep.violation), None),
            mem_violation=next(((r, *rep.mem_violation) for r, rep in enumerate(reps) if rep.mem_violation), None),
        )

    def _replica(self, task, classes, stages, split, n_seq, others, offload, names, dp) -> ReplicaTimes:
        if task == "generation":
            rep = self.generation.replica(classes, stages, split, n_seq, others, offload, names)
        else:
            rep = self.forward.replica(task, classes, stages, split, n_seq, offload, names, dp)
        extra = self.task_overhead_s.get(task, 0.0)
        if extra:  # calibrated per-step overhead, per replica, at its host's speed
            extra *= self.cluster.layout_slowdown(classes, task)
            rep.terms["overhead"] = rep.terms.get("overhead", 0.0) + extra
            rep.total_s += extra
        return rep


def task_cost(terms: dict[str, float]) -> TaskCost:
    """The TaskCost of the critical replica's terms (they add up to total_s)."""
    return TaskCost.model_construct(
        compute_s=terms.get("compute", 0.0),
        memory_s=terms.get("memory", 0.0) + terms.get("optimizer", 0.0),
        comm_s=terms.get("tp_comm", 0.0) + terms.get("pp_p2p", 0.0) + terms.get("dp_allreduce", 0.0),
        bubble_s=terms.get("bubble", 0.0),
        other_s=terms.get("offload", 0.0) + terms.get("overhead", 0.0) + terms.get("host", 0.0),
        total_s=sum(terms.values()),
    )


def balance(
    kinds: list[int], run: Callable[[int, float], ReplicaTimes]
) -> tuple[tuple[float, ...], list[ReplicaTimes]]:
    """Load-balanced batch shares: start uniform, then share ∝ share / time (each replica's rate) a few
    times; keep the iterate with the lowest straggler time, so balancing never loses to uniform.
    `kinds[r]` groups identical replicas (equal shares); `run(kind, share)` scores one."""
    dp = len(kinds)
    count = [kinds.count(k) for k in range(max(kinds) + 1)]
    share = [1.0 / dp] * len(count)
    reps = [run(k, s) for k, s in enumerate(share)]
    best = (max(x.total_s for x in reps), share, reps)
    for _ in range(BALANCE_ROUNDS if len(count) > 1 else 0):
        times = [x.total_s for x in reps]
        if max(times) - min(times) <= BALANCE_TOLERANCE * best[0]:
            break
        rates = [s / max(t, 1e-12) for s, t in zip(share, times, strict=True)]
        total = sum(n * r for n, r in zip(count, rates, strict=True))
        share = [max(r / total, 1e-6) for r in rates]
        norm = sum(n * s for n, s in zip(count, share, strict=True))
        share = [s / norm for s in share]
        reps = [run(k, s) for k, s in enumerate(share)]
        t = max(x.total_s for x in reps)
        if t < best[0] - 1e-12:
            best = (t, share, reps)
    _, share, reps = best
    return tuple(share[k] for k in kinds), [reps[k] for k in kinds]


def class_inputs(
    task: TaskName, names: frozenset[str], others: StageBytes | None
) -> tuple[frozenset[str], tuple | None]:
    """The part of (group mates, their resident bytes per stage) a class-level estimate depends on, so that
    groups differing only in what cannot change it share one cache entry (exact, not an approximation).

    Mates matter by name only through residency (memory.weights_resident): whether actor_train is beside
    generation and critic_train beside critic_inference. Resident bytes change generation's KV capacity
    (hence its time); for the other tasks they only change the device memory that `Tasks.estimate` adds on
    top, so there only their equality pattern over replicas is kept (it decides which replicas are costed as
    one kind, so the balancing arithmetic stays the same)."""
    partner = {"generation": "actor_train", "critic_inference": "critic_train"}.get(task)
    key_names = frozenset({partner}) if partner in names else frozenset()
    if task == "generation" or others is None:
        return key_names, others
    first: dict[tuple[float, ...], int] = {}
    pattern = tuple((first.setdefault(o, len(first)),) for o in others)
    return key_names, (pattern if len(first) > 1 else None)
