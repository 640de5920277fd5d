"""From a Plan to processes: which rank is which device, which ranks run each task, how many sequences each gets.

Rank mapping (the launch manifest records it, workers only read it): the plan's device ids, sorted by host in
order of first appearance in the plan's groups and then by device index, are ranks 0..W-1. Ranks of one host
are therefore contiguous, which is what `accelerate launch --machine_rank` expects across hosts.

A task's replica is a grid of ranks, stages x TP index (Replica.stages of the plan), with the replica's layer
split and an integer share of the step's sequences; every rank of a replica sees the same sequences (TP ranks
compute on them together, PP stages pass activations). With TP = PP = 1 a replica is one rank.

This module imports no torch: the launcher, `supported()` and the tests use it without starting anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetrl_cli.artifacts.plan import Plan, TaskPlan
from hetrl_cli.artifacts.rl import ALL_TASKS, TASK_ROLE, TRAIN_TASKS
from hetrl_cli.runtime.engines import FALLBACK, generation_problems

ZERO_KINDS = ("zero1", "zero2", "zero3")
"""The workload `sharding` values the runtime executes across DP replicas (runtime/sharding.py, runtime/zero3.py)."""


def split_device_id(device_id: str) -> tuple[str, int]:
    """`host/index` -> (host, index); the host part may itself contain '/' only before the last one.

    >>> split_device_id("localhost/1")
    ('localhost', 1)
    """
    host, _, index = device_id.rpartition("/")
    if not host or not index.isdigit():
        raise ValueError(f"device id {device_id!r} is not of the form host/index")
    return host, int(index)


def plan_devices(plan: Plan) -> list[str]:
    """Every device the plan uses, in rank order (host by first appearance, then index)."""
    seen: list[str] = []
    for group in plan.groups:
        seen.extend(d for d in group.devices if d not in seen)
    for task in plan.tasks:
        seen.extend(d for d in task.devices if d not in seen)
    host_order: dict[str, int] = {}
    for device in seen:
        host_order.setdefault(split_device_id(device)[0], len(host_order))
    return sorted(seen, key=lambda d: (host_order[split_device_id(d)[0]], split_device_id(d)[1]))


def plan_hosts(plan: Plan) -> list[str]:
    """Hosts of the plan's devices, in rank order."""
    hosts: list[str] = []
    for device in plan_devices(plan):
        host = split_device_id(device)[0]
        if host not in hosts:
            hosts.append(host)
    return hosts


def apportion(shares: list[float], total: int) -> list[int]:
    """Integer counts proportional to `shares` that sum to `total` (largest remainder; ties to the first).

    >>> apportion([0.25, 0.75], 16)
    [4, 12]
    >>> apportion([1 / 3, 1 / 3, 1 / 3], 16)
    [6, 5, 5]
    """
    weight = sum(shares)
    exact = [s / weight * total for s in shares]
    counts = [int(x) for x in exact]
    order = sorted(range(len(shares)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


@dataclass(frozen=True)
class Position:
    """Where one rank sits in one replica of a task: pipeline stage, TP index, and the replica's layer split."""

    replica: int
    stage: int
    tp_rank: int
    tp: int
    split: tuple[int, ...]
    """Layers per stage of this replica (empty: the whole model in one stage)."""
    prev_rank: int | None = None
    """Global rank of equal TP index in the previous stage (activations come from it)."""
    next_rank: int | None = None

    @property
    def stages(self) -> int:
        return max(1, len(self.split))

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1

    @property
    def output(self) -> bool:
        """Whether this rank's results count for the replica (last stage, TP index 0): no duplicates."""
        return self.last and self.tp_rank == 0


@dataclass(frozen=True)
class ReplicaLayout:
    """One DP replica: grid[stage][tp index] = rank; its layer split; the step sequences [start, stop) it gets."""

    grid: tuple[tuple[int, ...], ...]
    layer_split: tuple[int, ...]
    span: tuple[int, int]

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(r for stage in self.grid for r in stage)

    @property
    def output_rank(self) -> int:
        return self.grid[-1][0]


@dataclass(frozen=True)
class TaskLayout:
    """One task: its replicas, each a stage x TP grid of ranks with a share of the step's sequences.

    With TP = PP = 1 a replica is one rank, and `ranks` / `ranges` list one entry per replica.
    """

    task: str
    replicas: tuple[ReplicaLayout, ...]

    @property
    def ranks(self) -> tuple[int, ...]:
        """Every rank of the task, replica by replica (stage-major, then TP index)."""
        return tuple(r for rep in self.replicas for r in rep.ranks)

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        """Sequences [start, stop) of each replica."""
        return tuple(rep.span for rep in self.replicas)

    @property
    def tp(self) -> int:
        return len(self.replicas[0].grid[0])

    @property
    def pp(self) -> int:
        return len(self.replicas[0].grid)

    def replica_of(self, rank: int) -> ReplicaLayout | None:
        return next((rep for rep in self.replicas if rank in rep.ranks), None)

    def range_of(self, rank: int) -> tuple[int, int]:
        """Sequences [start, stop) this rank's replica handles (every rank of it sees them); (0, 0) outside."""
        rep = self.replica_of(rank)
        return rep.span if rep is not None else (0, 0)

    def position(self, rank: int) -> Position | None:
        """Where `rank` sits in its replica of this task (None when it runs no part of the task)."""
        for index, rep in enumerate(self.replicas):
            for stage, tp_group in enumerate(rep.grid):
                if rank in tp_group:
                    t = tp_group.index(rank)
                    prev = rep.grid[stage - 1][t] if stage > 0 else None
                    nxt = rep.grid[stage + 1][t] if stage + 1 < len(rep.grid) else None
                    split = rep.layer_split if len(rep.grid) > 1 else ()
                    return Position(index, stage, t, len(tp_group), split, prev, nxt)
        return None

    @property
    def leader(self) -> int:
        """Rank of replica 0's first stage, TP index 0: the source of weight syncs and the checkpoint writer."""
        return self.replicas[0].grid[0][0]

    def group_specs(self, zero: bool = False) -> dict[str, list[int]]:
        """Process groups this task needs: `dp:<task>:<t>` (every rank of TP index t, all replicas and
        stages: gradient sums), `mp:<task>:<r>` (replica r: norms, gathers) and `tp:<task>:<r>:<s>`; with
        `zero` and pp > 1 also the ZeRO groups `zero:<task>:<s>:<t>` (see `zero_group`)."""
        specs = {f"dp:{self.task}:{t}": [rep.grid[s][t] for rep in self.replicas for s in range(self.pp)]
                 for t in range(self.tp)}  # fmt: skip
        if zero and self.pp > 1:
            for s in range(self.pp):
                for t in range(self.tp):
                    specs[f"zero:{self.task}:{s}:{t}"] = [rep.grid[s][t] for rep in self.replicas]
        for r, rep in enumerate(self.replicas):
            if len(rep.ranks) > 1:
                specs[f"mp:{self.task}:{r}"] = list(rep.ranks)
            if self.tp > 1:
                specs.update({f"tp:{self.task}:{r}:{s}": list(group) for s, group in enumerate(rep.grid)})
        return specs

    def zero_group(self, rank: int) -> tuple[str, int]:
        """(name, global rank of replica 0's member) of `rank`'s ZeRO group: the ranks that hold the same
        parameters in every replica (equal stage and TP index). With pp = 1 that is the DP group itself;
        with pp > 1 it needs equal layer splits in every replica (`supported` checks)."""
        pos = self.position(rank)
        assert pos is not None, f"rank {rank} runs no part of {self.task}"
        first = self.replicas[0].grid[pos.stage][pos.tp_rank]
        if self.pp == 1:
            return f"dp:{self.task}:{pos.tp_rank}", first
        return f"zero:{self.task}:{pos.stage}:{pos.tp_rank}", first


@dataclass(frozen=True)
class Layout:
    devices: tuple[str, ...]
    """devices[rank] = plan device id."""
    tasks: dict[str, TaskLayout]
    sequences: int
    """Sequences per step (prompts * responses)."""

    @classmethod
    def from_plan(cls, plan: Plan, devices: list[str] | None = None) -> Layout:
        """The layout of `plan`; `devices` is the manifest's rank order (default: plan_devices)."""
        order = devices or plan_devices(plan)
        rank_of = {d: i for i, d in enumerate(order)}
        total = plan.workload.samples_per_step
        tasks = {}

        def grid(stages: list[list[str]]) -> tuple[tuple[int, ...], ...]:
            return tuple(tuple(rank_of[d] for d in stage) for stage in stages)

        for task in plan.tasks:
            counts = apportion([r.batch_share for r in task.replicas], total)
            starts = [sum(counts[:i]) for i in range(len(counts))]
            replicas = tuple(
                ReplicaLayout(grid(r.stages), tuple(r.layer_split), (start, start + count))
                for r, start, count in zip(task.replicas, starts, counts, strict=True)
            )
            tasks[task.task] = TaskLayout(task.task, replicas)
        if "reward" not in tasks and plan.workload.reward is None and "actor_train" in tasks:
            # A rule-based reward needs no device, so planners may leave it out: score on the actor's shares,
            # once per replica (on its output rank).
            rule = tuple(ReplicaLayout(((rep.output_rank,),), (1,), rep.span) for rep in tasks["actor_train"].replicas)
            tasks["reward"] = TaskLayout("reward", rule)
        return cls(tuple(order), tasks, total)

    @property
    def world_size(self) -> int:
        return len(self.devices)

    def tasks_of(self, rank: int) -> list[str]:
        """The tasks this rank runs, in dependency order."""
        return [t for t in ALL_TASKS if t in self.tasks and rank in self.tasks[t].ranks]

    def ranks_of(self, *tasks: str) -> list[int]:
        """Sorted ranks that run any of `tasks`."""
        return sorted({r for t in tasks if t in self.tasks for r in self.tasks[t].ranks})

    @property
    def rest_ranks(self) -> list[int]:
        """Ranks that run anything after generation: they exchange experience among themselves."""
        return self.ranks_of(*(t for t in self.tasks if t != "generation"))

    def sync_ranks(self, source_task: str, target_task: str) -> list[int]:
        """The weight-sync group: the source task's leader plus every rank of the target task that does not
        hold the trained weights itself (`self_synced_ranks`)."""
        local = self.self_synced_ranks(source_task, target_task)
        return sorted({self.tasks[source_task].leader, *(r for r in self.tasks[target_task].ranks if r not in local)})

    def sync_chain(self, source_task: str, target_task: str) -> list[int]:
        """The sync group as a relay chain: the leader, the other members on its host, then the other hosts'
        members host by host in rank order (hosts of a region are next to each other there). Each member
        forwards what it receives to the next, so every link of the chain carries one copy of the weights —
        a slow link between regions is crossed once, the cost model's broadcast tree (docs/costmodel.md)."""
        leader = self.tasks[source_task].leader
        members = [r for r in self.sync_ranks(source_task, target_task) if r != leader]
        host = split_device_id(self.devices[leader])[0]
        hosts = list(dict.fromkeys(split_device_id(self.devices[r])[0] for r in members))
        rank_of_host = {h: (h != host, i) for i, h in enumerate(hosts)}
        return [leader, *sorted(members, key=lambda r: (rank_of_host[split_device_id(self.devices[r])[0]], r))]

    def self_synced_ranks(self, source_task: str, target_task: str) -> set[int]:
        """Ranks that run a one-rank replica of both tasks (TP = PP = 1 on each side): after the step's gradient
        sum every training replica holds the same weights, so such a rank updates its inference copy from its
        own replica and nothing crosses a link (the colocated, verl-like layout)."""
        solo = {rep.grid[0][0] for rep in self.tasks[source_task].replicas if len(rep.ranks) == 1}
        return {rep.grid[0][0] for rep in self.tasks[target_task].replicas if len(rep.ranks) == 1} & solo

    def overlaps_generation(self) -> bool:
        """Async mode overlaps generation with training only when no generation rank runs another task."""
        return not set(self.tasks["generation"].ranks) & set(self.rest_ranks)


def supported(plan: Plan, engine: str = FALLBACK) -> list[str]:
    """What in `plan` the runtime cannot execute, one line each (empty = runnable).

    Runs: any TP degree that divides the model (heads, KV heads split or replicated, intermediate size) for
    every task, generation included with the hf engine; any PP depth and (uneven) layer split for every task but
    generation; sharding zero1/zero2/zero3 (with pp > 1: equal layer splits across replicas); recompute; offload
    (generation: hf engine). `engine` is the resolved or requested engine (`auto` may still become vllm); what
    each engine runs of a generation placement is the engine registry's answer (runtime/engines).
    """
    problems = _sharding_problems(plan)
    for task in plan.tasks:
        if task.task == "generation":
            problems.extend(f"task generation: {line}" for line in generation_problems(engine, task))
        used = task.devices
        if len(set(used)) != len(used):
            problems.append(f"task {task.task}: a device appears twice in its replicas")
        problems.extend(f"task {task.task}: {line}" for line in _model_fits(plan, task))
    placed = {task.task for task in plan.tasks}
    if plan.workload.reward is None:
        placed.add("reward")  # rule-based: runs on the actor_train ranks when the plan does not place it
    missing = [t for t in plan.workload.tasks if t not in placed]
    if missing:
        problems.append(f"tasks not placed by the plan: {', '.join(missing)}")
    return problems


def _sharding_problems(plan: Plan) -> list[str]:
    """The workload's `sharding` against the training tasks' layouts. It only acts across DP replicas (dp > 1),
    as in the cost model; zero1/zero2 (runtime/sharding.py) and zero3 (runtime/zero3.py) run."""
    kind = plan.workload.sharding
    out = []
    for task in plan.tasks:
        if task.task not in TRAIN_TASKS or task.dp == 1 or kind == "none":
            continue
        if task.pp > 1 and len({tuple(r.layer_split) for r in task.replicas}) > 1:
            out.append(
                f"task {task.task}: sharding {kind} with pp={task.pp} needs the same layer split in every replica "
                f"(got {', '.join(str(list(r.layer_split)) for r in task.replicas)})"
            )
    return out


def _model_fits(plan: Plan, task: TaskPlan) -> list[str]:
    """TP and layer-split checks for the built-in tiny model (an HF model directory is checked by the workers)."""
    from hetrl_cli.runtime.tinymodel import TINY_CONFIG

    spec = plan.workload.model_for(TASK_ROLE[task.task]) if task.task in TASK_ROLE else None
    if spec is None or spec.path or spec.arch != "tiny":
        return []
    heads, kv = TINY_CONFIG["num_attention_heads"], TINY_CONFIG["num_key_value_heads"]
    layers, out = TINY_CONFIG["num_hidden_layers"], []
    if heads % task.tp or not (kv % task.tp == 0 or task.tp % kv == 0) or TINY_CONFIG["intermediate_size"] % task.tp:
        out.append(f"tp={task.tp} does not divide the tiny model ({heads} heads, {kv} KV heads)")
    if any(sum(r.layer_split) != layers for r in task.replicas):
        out.append(f"a layer split does not sum to the tiny model's {layers} layers")
    return out
