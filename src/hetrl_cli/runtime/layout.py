"""From a Plan to processes: which rank is which device, which ranks run each task, how many sequences each gets.

Rank mapping (the launch manifest records it, workers only read it): the plan's device ids, sorted by host in
order of first appearance in the plan's groups and then by device index, are ranks 0..W-1. Ranks of one host
are therefore contiguous, which is what `accelerate launch --machine_rank` expects across hosts.

With TP = PP = 1 (the shapes the runtime executes today) a replica is one device, so a task's replicas are a
list of ranks, each with an integer share of the step's sequences.

This module imports no torch: the launcher, `supported()` and the tests use it without starting anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.workload import ALL_TASKS


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
class TaskLayout:
    """One task: the rank of each DP replica and the half-open range of step sequences it processes."""

    task: str
    ranks: tuple[int, ...]
    ranges: tuple[tuple[int, int], ...]

    def range_of(self, rank: int) -> tuple[int, int]:
        """Sequences [start, stop) this rank handles for the task; (0, 0) when it has no replica of it."""
        for r, span in zip(self.ranks, self.ranges, strict=True):
            if r == rank:
                return span
        return (0, 0)

    @property
    def leader(self) -> int:
        """Rank of replica 0: the source of weight syncs and the writer of this task's checkpoint."""
        return self.ranks[0]


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
        for task in plan.tasks:
            ranks = tuple(rank_of[r.devices[0]] for r in task.replicas)
            counts = apportion([r.batch_share for r in task.replicas], total)
            starts = [sum(counts[:i]) for i in range(len(counts))]
            ranges = tuple((s, s + c) for s, c in zip(starts, counts, strict=True))
            tasks[task.task] = TaskLayout(task.task, ranks, ranges)
        if "reward" not in tasks and plan.workload.reward is None and "actor_train" in tasks:
            # A rule-based reward needs no device, so planners may leave it out: score on the actor's shares.
            tasks["reward"] = TaskLayout("reward", tasks["actor_train"].ranks, tasks["actor_train"].ranges)
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
        """The weight-sync group: the source task's leader plus every rank of the target task."""
        return sorted({self.tasks[source_task].leader, *self.tasks[target_task].ranks})

    def overlaps_generation(self) -> bool:
        """Async mode overlaps generation with training only when no generation rank runs another task."""
        return not set(self.tasks["generation"].ranks) & set(self.rest_ranks)


def supported(plan: Plan) -> list[str]:
    """What in `plan` the runtime cannot execute yet, one line each (empty = runnable)."""
    problems = []
    for task in plan.tasks:
        if task.tp > 1:
            problems.append(f"task {task.task}: tp={task.tp} (the runtime has no tensor parallelism yet)")
        if task.pp > 1:
            problems.append(f"task {task.task}: pp={task.pp} (the runtime has no pipeline parallelism yet)")
    placed = {task.task for task in plan.tasks}
    if plan.workload.reward is None:
        placed.add("reward")  # rule-based: runs on the actor_train ranks when the plan does not place it
    missing = [t for t in plan.workload.tasks if t not in placed]
    if missing:
        problems.append(f"tasks not placed by the plan: {', '.join(missing)}")
    return problems
