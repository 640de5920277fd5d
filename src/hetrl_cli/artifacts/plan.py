"""Plan: which tasks share devices, which devices each task gets, how each is parallelised, and the
cost model's prediction for it. The single artifact `show`, `simulate` and `run` consume.

Glossary: a *group* is a set of tasks that share one device set and run one after another (colocated);
a *replica* is one data-parallel copy of a task's model; a *stage* is one pipeline stage of a replica,
run by a tensor-parallel group of devices.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field, ValidationInfo, model_validator

from hetrl_cli.artifacts.base import Artifact, Strict, check_artifact_name
from hetrl_cli.artifacts.hosts import check_device_id
from hetrl_cli.artifacts.rl import ALL_TASKS, TaskName
from hetrl_cli.artifacts.workload import Workload

MAX_LAYERS = 100_000
"""Bound of a stage's layers (models have tens to hundreds): 2^64 layers re-scored to a 1e37 s timeline."""
MAX_SECONDS = 1e30
"""Bound of a plan's iteration time and timeline: no planner output comes near it, and a hand-edited 1e308 made
`show`'s axis ticks overflow a float (tests/test_bad_inputs_fuzz.py)."""


def _loaded_seconds(seconds: float, info: ValidationInfo) -> float:
    """At most MAX_SECONDS in a plan read from JSON; a plan built in memory keeps the cost model's inf (a task
    that does not fit, which `run`'s memory check then refuses)."""
    if info.mode == "json" and abs(seconds) > MAX_SECONDS:
        raise ValueError(f"{seconds:g} s is past any plan (at most {MAX_SECONDS:g})")
    return seconds


LoadedSeconds = Annotated[float, AfterValidator(_loaded_seconds)]


class Replica(Strict):
    """One DP replica of a task: `stages[p]` is the TP group (device ids) of pipeline stage p."""

    stages: list[list[str]]
    batch_share: float = Field(gt=0, le=1)
    """Fraction of the task's sequences this replica processes (load-balanced, sums to 1 over replicas)."""
    layer_split: list[Annotated[int, Field(le=MAX_LAYERS)]]
    """Transformer layers per stage (uneven when stage devices differ in speed)."""

    @model_validator(mode="after")
    def _check_shape(self) -> Replica:
        if not self.stages or any(not s for s in self.stages):
            raise ValueError("a replica needs at least one stage with at least one device")
        if len(self.layer_split) != len(self.stages):
            raise ValueError("layer_split needs one entry per stage")
        if any(n < 1 for n in self.layer_split):
            raise ValueError("every stage needs at least one layer")
        return self

    @property
    def devices(self) -> list[str]:
        return [d for stage in self.stages for d in stage]


class TaskCost(Strict):
    """Predicted seconds of one task per iteration, by term (they add up to `total_s`)."""

    compute_s: float = 0.0
    memory_s: float = 0.0
    """Memory-traffic time beyond compute (dominant in decode)."""
    comm_s: float = 0.0
    """TP/PP/DP communication on the links the task uses."""
    bubble_s: float = 0.0
    """Pipeline bubble."""
    other_s: float = 0.0
    """Fixed overheads (launch, per-step latency)."""
    total_s: float = 0.0


class TaskPlan(Strict):
    """How one task runs."""

    task: TaskName
    group: str
    """Name of the group this task belongs to."""
    tp: int = Field(ge=1)
    pp: int = Field(ge=1)
    dp: int = Field(ge=1)
    replicas: list[Replica]
    predicted: TaskCost = Field(default_factory=TaskCost)
    memory_bytes: dict[str, int] = Field(default_factory=dict)
    """Predicted peak memory per device id while this task runs."""
    offload: bool = False
    """Whether this task's state is offloaded to host memory while other group tasks run."""

    @model_validator(mode="after")
    def _check_degrees(self) -> TaskPlan:
        if len(self.replicas) != self.dp:
            raise ValueError(f"{self.task}: dp={self.dp} but {len(self.replicas)} replicas are listed")
        for r in self.replicas:
            if len(r.stages) != self.pp or any(len(s) != self.tp for s in r.stages):
                raise ValueError(f"{self.task}: every replica must have pp={self.pp} stages of tp={self.tp} devices")
        total = sum(r.batch_share for r in self.replicas)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"{self.task}: batch shares sum to {total:.6f}, expected 1")
        return self

    @property
    def devices(self) -> list[str]:
        return [d for r in self.replicas for d in r.devices]


class TaskGroup(Strict):
    name: str
    tasks: list[TaskName]
    devices: list[Annotated[str, AfterValidator(check_device_id)]]


MAX_TIMELINE = 1000
"""A plan's timeline has a bar per task, transfer and sync (tens); more is not a plan hetrl wrote, and printing
it would cost minutes."""


class TimelineEntry(Strict):
    """When a task (or a transfer) runs inside one iteration, for the Gantt chart."""

    name: str
    """Task name, or `weight_sync` / `transfer:A->B`."""
    group: str
    start_s: LoadedSeconds
    end_s: LoadedSeconds


class PlanCost(Strict):
    """Predicted iteration: total, throughput and where the time goes."""

    iteration_s: Annotated[float, Field(gt=0), AfterValidator(_loaded_seconds)]
    samples_per_s: float
    tokens_per_s: float
    """Generated (response) tokens per second."""
    weight_sync_s: float = 0.0
    transfer_s: float = 0.0
    """Rollout/experience data moved between groups."""
    breakdown: dict[str, float] = Field(default_factory=dict)
    """Seconds on the critical path by term: compute, memory, comm, bubble, weight_sync, transfer, other."""
    timeline: list[TimelineEntry] = Field(default_factory=list, max_length=MAX_TIMELINE)
    bottleneck: str = ""
    """One sentence: what bounds the iteration."""


class PlanPrice(Strict):
    """What the plan costs to rent, from the profile's prices of the devices its groups hold (idle devices
    are not rented). docs/planner.md "Cost" defines each figure."""

    usd_per_hour: float = Field(ge=0)
    usd_per_iteration: float = Field(ge=0)
    usd_per_million_tokens: float = Field(ge=0)
    tokens_per_iteration: float = Field(gt=0)
    """Generated (response) tokens plus the tokens actor_train passes over (prompt + response, per PPO epoch)."""
    max_usd_per_hour: float | None = Field(default=None, gt=0)
    """The cap the plan was made under (`--max-cost-per-hour`), if any."""
    devices: int = Field(default=0, ge=0)
    """How many devices are rented."""


class SolverStats(Strict):
    solver: str
    """ilp, hybrid, verl, streamrl, manual."""
    status: str
    """optimal, feasible (time limit with an incumbent), heuristic."""
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    """(objective - bound) / objective; 0 when proven optimal; None for heuristics."""
    seconds: float = 0.0
    evaluations: int = 0
    """Cost-model evaluations (hybrid) or candidates scored (ilp)."""
    seed: int | None = None
    note: str = ""


class Plan(Artifact):
    KIND: ClassVar[str] = "plan"
    SCHEMA_VERSION: ClassVar[int] = 1

    kind: Literal["plan"] = "plan"
    name: Annotated[str, AfterValidator(check_artifact_name)]
    created_at: str
    profile_name: str
    profile_fingerprint: str
    workload: Workload
    groups: list[TaskGroup] = Field(max_length=len(ALL_TASKS))
    tasks: list[TaskPlan] = Field(max_length=len(ALL_TASKS))
    cost: PlanCost
    solver: SolverStats
    memory_per_device: dict[str, int] = Field(default_factory=dict)
    """Predicted peak memory per device over the whole iteration."""
    cluster_devices: list[Annotated[str, AfterValidator(check_device_id)]] = Field(default_factory=list)
    """Every device of the profile the plan was made for, idle ones included, so `show` without --profile
    knows the cluster's size (empty in plans written before hetrl recorded it)."""
    warnings: list[Annotated[str, Field(max_length=1000)]] = Field(default_factory=list, max_length=16)
    """What the plan means that a user must know before running it, one sentence each (bf16 on devices
    without bf16 arithmetic; async that cannot overlap): `plan` prints them on stderr, `show` under the
    summary. Empty in plans written before hetrl recorded them."""
    objective: Literal["time", "cost"] = "time"
    """What the planner minimised: seconds per iteration, or dollars per iteration (`--objective`); the solver's
    `objective` value is in that unit."""
    price: PlanPrice | None = None
    """Dollars per hour, iteration and million tokens; None where a used device has no price (and in plans
    written before hetrl recorded prices)."""

    @model_validator(mode="after")
    def _check_consistency(self) -> Plan:
        group_names = {g.name for g in self.groups}
        planned = [t.task for t in self.tasks]
        if sorted(planned) != sorted(set(planned)):
            raise ValueError("a task is planned twice")
        grouped: dict[str, str] = {}
        for g in self.groups:  # a task listed twice is found by the cost model only, as infeasible (exit 3)
            for name in g.tasks:
                if name in grouped:
                    raise ValueError(f"task {name} is in groups {grouped[name]} and {g.name}; put it in one group")
                grouped[name] = g.name
        for task in self.tasks:
            if task.group not in group_names:
                raise ValueError(f"task {task.task} names unknown group {task.group!r}")
            group = next(g for g in self.groups if g.name == task.group)
            stray = set(task.devices) - set(group.devices)
            if stray:
                raise ValueError(f"task {task.task} uses devices outside its group: {sorted(stray)}")
        return self

    def task(self, name: str) -> TaskPlan:
        for task in self.tasks:
            if task.task == name:
                return task
        raise KeyError(name)

    def peak_memory(self) -> dict[str, int]:
        """Peak bytes per device: the plan's own figure, else the max over the tasks that run there (what
        `show` draws and what a run's measured peaks are compared with)."""
        if self.memory_per_device:
            return dict(self.memory_per_device)
        peak: dict[str, int] = {}
        for task in self.tasks:
            for device_id, used in task.memory_bytes.items():
                peak[device_id] = max(peak.get(device_id, 0), used)
        return peak
