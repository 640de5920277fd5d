"""The shapes the cost model scores and returns; the planner builds `TaskPlacement`s and reads estimates.

A placement says which devices run a task and how (replicas × stages × TP group); the cost model fills in
load-balanced batch shares and layer splits when they are left as None.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetrl_cli.artifacts.plan import TaskCost, TimelineEntry
from hetrl_cli.artifacts.rl import TaskName


@dataclass(frozen=True)
class TaskPlacement:
    """Devices and parallel layout of one task. `replicas[r][p]` = device ids of stage p's TP group."""

    task: TaskName
    replicas: tuple[tuple[tuple[str, ...], ...], ...]
    batch_shares: tuple[float, ...] | None = None
    """None: the cost model balances shares by replica speed."""
    layer_splits: tuple[tuple[int, ...], ...] | None = None
    """None: the cost model splits layers by stage speed."""
    offload: bool = False

    def __hash__(self) -> int:
        # Placements key the cost model's and the planner's caches: hash the nested tuples once, not per lookup.
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.task, self.replicas, self.batch_shares, self.layer_splits, self.offload))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:
        # str hashes differ between processes: a pickled placement must not carry its cached hash along
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @property
    def dp(self) -> int:
        return len(self.replicas)

    @property
    def pp(self) -> int:
        return len(self.replicas[0])

    @property
    def tp(self) -> int:
        return len(self.replicas[0][0])

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(d for replica in self.replicas for stage in replica for d in stage)


@dataclass(frozen=True)
class GroupPlacement:
    """Tasks that share one device set (run one after another on it)."""

    name: str
    tasks: tuple[TaskName, ...]
    devices: tuple[str, ...]


@dataclass
class TaskEstimate:
    placement: TaskPlacement
    """With batch shares and layer splits filled in."""
    cost: TaskCost
    memory_bytes: dict[str, int]
    """Peak bytes per device while the task runs (including what stays resident for other group tasks)."""
    violation: str | None = None
    """Why it does not fit (memory, layers < stages, ...); None when it fits."""
    terms: dict[str, float] = field(default_factory=dict)
    """Finer seconds on the critical replica: compute, memory, tp_comm, pp_p2p, dp_allreduce, bubble,
    optimizer, offload, overhead (they add up to cost.total_s); for explanations."""
    links: dict[str, str] = field(default_factory=dict)
    """For communication terms, the bottleneck link they ran on (e.g. '1 Gbps wan link a<->b')."""


@dataclass
class PlanEstimate:
    tasks: dict[str, TaskEstimate]
    iteration_s: float
    samples_per_s: float
    tokens_per_s: float
    weight_sync_s: float
    transfer_s: float
    breakdown: dict[str, float]
    timeline: list[TimelineEntry]
    bottleneck: str
    memory_per_device: dict[str, int]
    violations: list[str] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return not self.violations


@dataclass
class ReplicaTimes:
    """One replica's time terms (seconds) and per-stage own bytes: what generation.py and forward.py return
    for one replica and its share of the batch, before tasks.py picks the critical replica."""

    total_s: float
    terms: dict[str, float]
    stage_bytes: list[float]
    stage_parts: list[str]
    """What each stage's bytes are, for the memory sentence (e.g. 'weights + KV cache')."""
    links: dict[str, str] = field(default_factory=dict)
    violation: str | None = None
    mem_violation: tuple[int, float, str] | None = None
    """(stage, bytes needed, what) when one sequence/micro-batch cannot fit at all."""
