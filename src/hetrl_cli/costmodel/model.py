"""CostModel: predicted time and memory of RL tasks on a heterogeneous cluster, and of a whole iteration.

One model for every solver, `show`, `simulate` and `validate` (docs/costmodel.md has every formula). This is
the facade callers use; the physics lives in one module each:

  devices.py     device classes, slowdowns, TP stages and the links between them
  step.py        the workload's step: models per task, token counts, per-stage parameters and FLOPs
  generation.py  prefill + continuous-batching decode per replica
  forward.py     inference and training passes per replica (1F1B), layer splits
  training.py    DP gradient all-reduce, optimizer step, optimizer offload
  memory.py      bytes per parameter, residency between colocated tasks, per-stage peak bytes
  tasks.py       one task's estimate: class-level estimate, balanced batch shares, per-device memory
  weightsync.py  weight syncs and data transfers between groups
  evaluate.py    a plan's iteration through compose.py, its timeline, critical path and violations
  explain.py     the bottleneck sentence

Interchangeable devices (same host, same device name) form a *class*; estimates are cached by the
placement's shape in classes (memo.py), so the search can call `task()` tens of thousands of times.
"""

from __future__ import annotations

from collections.abc import Sequence

from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.artifacts.rl import TaskName
from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel import evaluate as _evaluate
from hetrl_cli.costmodel.devices import Cluster
from hetrl_cli.costmodel.forward import Forward
from hetrl_cli.costmodel.generation import Generation
from hetrl_cli.costmodel.memo import Memo
from hetrl_cli.costmodel.step import Step
from hetrl_cli.costmodel.tasks import Tasks
from hetrl_cli.costmodel.types import GroupPlacement, PlanEstimate, TaskEstimate, TaskPlacement
from hetrl_cli.costmodel.weightsync import Transfer, WeightSync


class CostModel:
    """Scores placements of the workload's tasks on the profile's devices (docs/costmodel.md)."""

    def __init__(
        self, profile: ClusterProfile, workload: Workload, calibration: dict | None = None, engine: str | None = None
    ) -> None:
        self.profile = profile
        self.workload = workload
        self.calibration = calibration or {}
        self.task_overhead_s: dict[str, float] = dict(self.calibration.get("task_overhead_s", {}))
        """Calibration: fixed seconds per step added to a task's `overhead` term (and to the weight sync under
        `weight_sync`) — launch and Python overhead that dominates tiny models and no efficiency factor expresses."""
        self.overhead_factor: dict[str, float] = dict(self.calibration.get("overhead_factor", {}))
        """Calibrated multipliers on the built-in per-step host costs: generation's DECODE_STEP_OVERHEAD_S and
        the weight sync's WEIGHT_SYNC_PER_TENSOR_S (constants for GPU engines; a runtime may do less)."""
        self.cluster = Cluster(profile, workload.precision, self.calibration)
        self.step = Step(workload)
        self.forward = Forward(self.step, self.cluster)
        self.generation = Generation(self.step, self.cluster, self.overhead_factor, engine)
        """`engine`: the rollout engine priced (None: a vLLM-like engine; "hf": generation.decode_host_step_s)."""
        self.tasks = Tasks(self.step, self.cluster, self.forward, self.generation, self.task_overhead_s)
        self.syncs = WeightSync(  # the hf engine's every TP rank receives the weights; vLLM's leader alone
            self.step, self.cluster, self.task_overhead_s, self.overhead_factor, leader_loads=engine != "hf"
        )
        self.links = self.cluster.links
        self.required_tasks: tuple[TaskName, ...] = self.step.required_tasks
        """The tasks a plan must place (a rule-based reward runs on the driver, not on a device)."""
        self._estimates: Memo[TaskEstimate] = Memo(self.tasks.estimate)

    # ---- one task -----------------------------------------------------------------------------------------
    def task(
        self, placement: TaskPlacement, group_tasks: Sequence[TaskName | TaskPlacement] | None = None
    ) -> TaskEstimate:
        """Time terms and per-device peak memory of one task (shares and splits filled in when None).

        `group_tasks` are the other tasks of its group: names (their resident state is assumed spread like
        `placement`) or placements (exact). The result is cached and shared: do not mutate it."""
        gkey = tuple(group_tasks) if group_tasks else ()
        return self._estimates.keyed((placement, gkey), placement, gkey)

    def overhead_scale(self, devices: Sequence[str], task: str | None = None) -> float:
        """The factor on per-step fixed overheads of `task`'s work on `devices`: its slowest host's
        `host_slowdown` (`decode_slowdown` for generation; the overhead is per replica and does not shrink with
        a smaller batch share, so the slowest sets it)."""
        return self.cluster.overhead_scale(devices, task)

    def rule_reward_s(self) -> float:
        """Driver-CPU time of a rule-based reward (0 when a reward model is used). Not in the iteration: it
        overlaps phase 2 on the driver and is ~1e-4 of a step (docs/costmodel.md, 'Not modelled')."""
        return self.step.n_samples * C.RULE_REWARD_S_PER_SAMPLE if self.step.rule_reward else 0.0

    # ---- weight syncs and transfers -----------------------------------------------------------------------
    def weight_sync_s(
        self,
        train_devices: Sequence[str],
        gen_devices: Sequence[str],
        role: str = "actor",
        in_place: Sequence[str] | None = None,
        feeders: Sequence[str] = (),
    ) -> float:
        """Seconds to move a trained model's weights to its inference copy each step (docs: weight sync): the
        actor's from actor_train to generation, or (role 'critic') the critic's to critic_inference; `in_place`:
        a sync relayed inside the trainer's group, these receivers loading in place, `feeders` the other
        replicas' leaders feeding their own hosts (WeightSync.parts)."""
        key = tuple(in_place) if in_place is not None else None
        return self.syncs.sync(tuple(train_devices), tuple(gen_devices), role, key, tuple(feeders))[0]

    def weight_sync_parts(
        self,
        train: Sequence[str],
        gen: Sequence[str],
        role: str,
        in_place: Sequence[str] | None = None,
        feeders: Sequence[str] = (),
    ) -> tuple[float, float, str, float, float] | None:
        """WeightSync.parts of this model's syncs (its five terms; None when the sync moves nothing)."""
        return self.syncs.parts(train, gen, role, in_place, feeders)

    def weight_syncs(self, placements: Sequence[TaskPlacement], groups: Sequence[GroupPlacement]) -> list[tuple]:
        """The weight syncs a plan runs each step, as (role, train devices, inference devices[, those of them
        loading in place where the runtime relays inside the group])."""
        return self.syncs.syncs(placements, groups, self.tasks.critic_receivers)

    def sync_gathers_s(self, group: Sequence[TaskPlacement], tasks: Sequence[str], actor_beside: bool = True) -> float:
        """Seconds the syncs of the tasks in `group` (one group's placements; `tasks`: the plan's) spend on their
        layouts: the trainers' gathers onto the sending leaders, generation's host hand-off at TP > 1
        (WeightSync.group_gathers_s)."""
        return self.syncs.group_gathers_s(group, tasks, self.tasks.critic_receivers, actor_beside)

    def transfer_s(self, src_devices: Sequence[str], dst_devices: Sequence[str], nbytes: float) -> float:
        """Rollouts/experience between groups: α + bytes/β on the best host pair; 0 on the same device set."""
        return self.syncs.transfer(tuple(src_devices), tuple(dst_devices), nbytes)[0]

    def rollout_bytes(self) -> float:
        """Bytes of one step's rollouts (token ids + mask of prompt and response)."""
        return self.syncs.rollout_bytes()

    def experience_bytes(self, task: TaskName) -> float:
        """Bytes an inference task hands to training: a scalar per response token, or per sample (reward)."""
        return self.syncs.experience_bytes(task)

    def transfers(self, groups: Sequence[GroupPlacement]) -> list[Transfer]:
        """(name, src group, dst group, bytes) of every data hand-over between different groups."""
        return self.syncs.transfers(groups)

    def boundary_transfers(self, groups: Sequence[GroupPlacement]) -> list[list[Transfer]]:
        """transfers() priced and split by boundary (after phase 1, after phase 2)."""
        return self.syncs.boundary_transfers(groups)

    # ---- a whole plan -------------------------------------------------------------------------------------
    def phase_times(
        self, groups: Sequence[GroupPlacement], estimates: dict[str, TaskEstimate] | dict[str, float]
    ) -> list[dict[str, float]]:
        """Per PHASE, seconds per group holding a task of that phase (evaluate.phase_times)."""
        return _evaluate.phase_times(groups, estimates)

    def evaluate(self, groups: Sequence[GroupPlacement], placements: Sequence[TaskPlacement]) -> PlanEstimate:
        """Score a whole placement: per-task estimates, the iteration composition (sync or async), memory
        and every violation found (docs/costmodel.md, 'Composition')."""
        return _evaluate.evaluate(self, groups, placements)


__all__ = ["CostModel"]
