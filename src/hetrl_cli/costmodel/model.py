"""CostModel: predicted time and memory of RL tasks on a heterogeneous cluster, and of a whole iteration.

One model for every solver, `show`, `simulate` and `validate` (docs/costmodel.md has every formula).
Interchangeable devices (same host, same device name) form a *class*; estimates are cached by the
placement's shape in classes, so the search can call `task()` tens of thousands of times.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple

from hetrl_cli.artifacts.plan import (
    Plan,
    PlanCost,
    Replica,
    SolverStats,
    TaskCost,
    TaskGroup,
    TaskPlan,
    TimelineEntry,
)
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.artifacts.rl import (
    ALL_TASKS,
    HEAD,
    PHASES,
    SYNC_WORDS,
    SYNCED,
    TASK_ROLE,
    TRAIN_TASKS,
    TaskName,
    sync_roles,
)
from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel.architectures import DTYPE_BYTES, TRAIN_FORWARD_MULTIPLE, ArchSpec, resolve
from hetrl_cli.costmodel.comm import (
    LOCAL,
    LinkInfo,
    Links,
    allgather_s,
    allreduce_s,
    describe_bandwidth,
    p2p_s,
    reduce_scatter_s,
)
from hetrl_cli.costmodel.compose import (
    compose_iteration,
    critical_groups,
    is_async_split,
)
from hetrl_cli.costmodel.memory import (
    grad_bytes_per_param,
    optimizer_bytes_per_param,
    optimizer_step_traffic_bytes_per_param,
    resident_bytes_per_param,
    weight_bytes_per_param,
    weights_resident,
)
from hetrl_cli.costmodel.types import GroupPlacement, PlanEstimate, TaskEstimate, TaskPlacement

GB = 1e9
BALANCE_ROUNDS = 4
"""Rate-proportional re-balancing rounds (forward tasks are ~linear in their share: one round suffices)."""
BALANCE_TOLERANCE = 5e-3
"""Stop balancing when the replicas' times agree within this fraction (0.5 % of the iteration)."""
TERM_LABEL: dict[str, str] = {
    "compute": "compute",
    "memory": "memory traffic",
    "tp_comm": "TP all-reduces",
    "pp_p2p": "pipeline sends",
    "dp_allreduce": "DP all-reduce",
    "bubble": "pipeline bubble",
    "optimizer": "optimizer step",
    "offload": "offload copies",
    "overhead": "per-step overhead",
    "host": "host dispatch (eager launches)",
}


@dataclass(frozen=True)
class _DevClass:
    """Devices of one name and core share on one host: interchangeable for the cost model."""

    idx: int
    host: str
    name: str
    region: str
    compute_Fps: float
    """FLOP/s at the workload precision (profile figure × calibration; the tasks' efficiency constants apply on top)."""
    mem_Bps: float
    memory_bytes: int
    host_slowdown: float = 1.0
    """How much slower than one full core this device's host runs the per-step Python and launch work:
    1 / min(1, cores) for a CPU device under a cgroup quota, 1 where the profile records no core count."""
    decode_slowdown: float = 1.0
    """The same for generation's per-step work (decode_slowdowns(): measured where the profile has
    decode_steps_per_s, else host_slowdown)."""
    opt_Bps: float = 0.0
    """The memory traffic rate of the optimizer step (mem_Bps × the calibrated `optimizer` factor): an
    elementwise update, bandwidth-bound when fused on a GPU, bound by unfused element work on a CPU."""
    launches: bool = False
    """An accelerator fed by asynchronous kernel launches: its eager passes cannot run faster than the host
    dispatches them (constants.EAGER_DISPATCH_S_PER_LAYER_*). False for a CPU device."""


@dataclass(frozen=True)
class _Stage:
    """One TP group: it runs at its slowest member's speed and on its bottleneck link."""

    tp: int
    compute_Fps: float
    """Summed over the TP group at the slowest member's rate."""
    mem_Bps: float
    """Per device (slowest member)."""
    memory_bytes: int
    hosts: tuple[str, ...]
    link: LinkInfo
    missing_flops: bool
    opt_Bps: float = 0.0
    """The optimizer step's traffic rate per device (slowest member)."""
    launches: bool = False
    """Every member is an accelerator fed by asynchronous launches (_DevClass.launches)."""


class _FwdConsts(NamedTuple):
    """What every stage's timing row of a forward task shares (CostModel._fwd_consts)."""

    arch: ArchSpec
    head: str
    context: float
    """Keys a token attends to on average (half the mean sequence: causal)."""
    mult: float
    """Forward passes per pass: 1 inference, 3 training, 4 with recompute."""
    matmul_efficiency: float
    allreduces_per_layer: int
    """Megatron TP all-reduces per layer and pass."""
    sends_per_stage: int
    passes: tuple[float, float, float]
    """Passes of (compute and bubble, TP all-reduces, stage sends) in units of one task pass."""
    dispatch_s_per_layer: float
    mixed_bytes_per_param: int
    """Mixed-precision casts and gradient accumulation per parameter and micro-batch pass (0 without)."""


@dataclass
class _Rep:
    """One replica's time terms (seconds) and per-stage own bytes."""

    total_s: float
    terms: dict[str, float]
    stage_bytes: list[float]
    stage_parts: list[str]
    links: dict[str, str] = field(default_factory=dict)
    violation: str | None = None
    mem_violation: tuple[int, float, str] | None = None
    """(stage, bytes needed, what) when one sequence/micro-batch cannot fit at all."""


@dataclass
class _ClassEst:
    shares: tuple[float, ...]
    splits: tuple[tuple[int, ...], ...]
    cost: TaskCost
    terms: dict[str, float]
    links: dict[str, str]
    stage_bytes: list[list[float]]
    stage_parts: list[list[str]]
    violation: str | None
    mem_violation: tuple[int, int, float, str] | None
    hard: bool = False
    """The shape cannot run at all (violation set, times inf, no memory)."""


def host_slowdown(device) -> float:
    """_DevClass.host_slowdown of a profiled device: per-step host work (Python, launches) runs at the core
    share the host's processes get, so a CPU device capped to 0.25 of a core does it 4× slower."""
    if device.kind == "cpu" and device.cores:
        return 1.0 / min(1.0, device.cores)
    return 1.0


def decode_slowdowns(devices) -> dict[str, float]:
    """_DevClass.decode_slowdown per device id. Where the profile measured decode_steps_per_s on CPU devices,
    their rates set the ratios: the fastest-measured device keeps its host_slowdown and every other measured
    one is slower by its rate's ratio to it (a decode loop under a cgroup quota pays more than the share:
    docs/costmodel.md); every other device keeps its host_slowdown."""
    measured = [d for d in devices if d.kind == "cpu" and d.decode_steps_per_s]
    anchor = max(measured, key=lambda d: d.decode_steps_per_s, default=None)
    out = {d.id: host_slowdown(d) for d in devices}
    for d in measured:
        out[d.id] = host_slowdown(anchor) * anchor.decode_steps_per_s / d.decode_steps_per_s
    return out


def compute_tflops(devices, dtype: str) -> dict[str, float]:
    """Each device's TFLOP/s at `dtype` (0 where the profile has no figure). Where the profile measured
    forward_tokens_per_s on CPU devices, their rates set the ratios: the fastest-measured device keeps its
    matmul figure and every other measured one is slower by its rate's ratio to it (a small model's passes
    under a cgroup quota on a shared machine can scale unlike the large matmul probe: docs/costmodel.md),
    like decode_slowdowns does for generation's host work."""

    def own(device) -> float:
        try:
            return device.tflops(dtype)
        except KeyError:
            return 0.0

    out = {d.id: own(d) for d in devices}
    measured = [d for d in devices if d.kind == "cpu" and d.forward_tokens_per_s and out[d.id]]
    anchor = max(measured, key=lambda d: d.forward_tokens_per_s, default=None)
    for d in measured:
        out[d.id] = out[anchor.id] * d.forward_tokens_per_s / anchor.forward_tokens_per_s
    return out


def _stage_parts(
    per_stage, mb_tok: float, mult: float, msg: float, passes
) -> list[tuple[float, float, float, float, float, float]]:
    """(busy, TP all-reduces, send to the next stage, compute, memory, host wait) seconds of one micro-batch
    per pipeline stage over all its passes (_fwd_static's `passes`), from _fwd_static's per-stage inputs:
    _fwd_replica's stage times, also what _refine_split balances. busy = max(compute + memory, host dispatch
    floor) = compute + memory + host wait: the matmuls and the memory-bound ops run one after another on the
    device, which cannot run ahead of the host that launches them."""
    p_compute, p_tp, p_p2p = passes
    out = []
    for fpt, c_den, ar_mult, tp, ar_link, p2p_mult, hop, mem_tok_s, mem_fixed_s, floor_s in per_stage:
        c = mb_tok * mult * fpt / c_den
        mem = mb_tok * mult * mem_tok_s + mem_fixed_s
        wait = floor_s - (c + mem) if floor_s > c + mem else 0.0
        tpc = ar_mult * allreduce_s(msg, tp, ar_link)
        hop_s = 0.0 if hop is None else p2p_mult * p2p_s(msg, hop)
        out.append((p_compute * (c + mem + wait), p_tp * tpc, p_p2p * hop_s, p_compute * c, p_compute * mem,
                    p_compute * wait))  # fmt: skip
    return out


def _short_name(name: str) -> str:
    return name.removeprefix("NVIDIA ").removeprefix("Tesla ").strip()


class CostModel:
    """Scores placements of the workload's tasks on the profile's devices (docs/costmodel.md)."""

    def __init__(self, profile: ClusterProfile, workload: Workload, calibration: dict | None = None) -> None:
        self.profile = profile
        self.workload = workload
        self.calibration = calibration or {}
        self.links = Links(profile, self.calibration.get("link_class"))
        self.task_overhead_s: dict[str, float] = dict(self.calibration.get("task_overhead_s", {}))
        """Calibration: fixed seconds per step added to a task's `overhead` term (and to the weight sync under
        `weight_sync`) — launch and Python overhead that dominates tiny models and no efficiency factor expresses."""
        self.overhead_factor: dict[str, float] = dict(self.calibration.get("overhead_factor", {}))
        """Calibrated multipliers on the built-in per-step host costs: generation's DECODE_STEP_OVERHEAD_S and
        the weight sync's WEIGHT_SYNC_PER_TENSOR_S (constants for GPU engines; a runtime may do less)."""
        self._init_devices()
        self._init_workload()
        self._l1: dict[tuple, TaskEstimate] = {}
        self._l2: dict[tuple, _ClassEst] = {}
        self._resident_cache: dict[tuple, dict[str, float]] = {}
        self._ws_cache: dict[tuple, tuple[float, str, float]] = {}
        self._stage_cache: dict[tuple[int, ...], _Stage] = {}
        self._hop_cache: dict[tuple[tuple[str, ...], tuple[str, ...]], LinkInfo] = {}
        self._params_cache: dict[tuple, float] = {}
        self._flops_cache: dict[tuple, float] = {}
        self._split_cache: dict[tuple, tuple[int, ...]] = {}
        self._rep_cache: dict[tuple, _Rep] = {}
        self._static_cache: dict[tuple, tuple] = {}
        self._consts_cache: dict[str, _FwdConsts] = {}
        self._shape_cache: dict[tuple, tuple] = {}
        self._others_cache: dict[tuple, tuple[float, dict[str, float] | None]] = {}
        self._low_cache: dict[tuple, tuple[str, float]] = {}
        self._rep_key_cache: dict[tuple, tuple | None] = {}

    # ---- set-up ---------------------------------------------------------------------------------------------
    def _init_devices(self) -> None:
        dev_cal = self.calibration.get("device_class", {})
        dtype = self.workload.precision
        regions = {h.name: h.region for h in self.profile.hosts}
        self.device_class: dict[str, int] = {}
        self.classes: list[_DevClass] = []
        index: dict[tuple[str, str, float, float], int] = {}
        decode = decode_slowdowns(self.profile.devices)
        tflops = compute_tflops(self.profile.devices, dtype)
        for d in self.profile.devices:
            key = (d.host, d.name, host_slowdown(d), decode[d.id])
            if key not in index:
                cal = dev_cal.get(d.name, {})
                flops = tflops[d.id] * 1e12 * cal.get("compute", 1.0)
                mem_Bps = d.memory_gbps * 1e9 * cal.get("memory", 1.0)
                opt_Bps = mem_Bps * cal.get("optimizer", 1.0)
                index[key] = len(self.classes)
                self.classes.append(
                    _DevClass(
                        len(self.classes),
                        d.host,
                        d.name,
                        regions.get(d.host, "default"),
                        flops,
                        mem_Bps,
                        d.memory_bytes,
                        host_slowdown(d),
                        decode[d.id],
                        opt_Bps,
                        d.kind != "cpu",
                    )
                )
            else:
                cls = self.classes[index[key]]
                if d.memory_bytes < cls.memory_bytes:  # same name, smaller memory share: keep the smaller
                    self.classes[index[key]] = dataclasses.replace(cls, memory_bytes=d.memory_bytes)
            self.device_class[d.id] = index[key]
        self.devices = {d.id: d for d in self.profile.devices}
        self._usable = {d.id: d.memory_bytes * C.USABLE_MEMORY_FRACTION for d in self.profile.devices}
        """What training/inference may allocate per device."""
        self._usable_gen = {
            d.id: d.memory_bytes * max(C.GEN_MEMORY_UTILIZATION, C.USABLE_MEMORY_FRACTION) for d in self.profile.devices
        }
        """Generation: the engine sizes its KV pool to GEN_MEMORY_UTILIZATION itself."""

    def _init_workload(self) -> None:
        w = self.workload
        self.arch: dict[str, ArchSpec] = {}
        for task in w.tasks:
            spec = w.model_for(TASK_ROLE[task])
            if spec is not None:
                self.arch[task] = resolve(spec)
        self.rule_reward = w.reward is None
        self.n_samples = float(w.samples_per_step)
        self.prompt_tokens = float(w.max_prompt_tokens)
        self.resp_mean = w.response_length.mean_fraction * w.max_response_tokens
        self.resp_tail = max(self.resp_mean, w.response_length.p99_fraction * w.max_response_tokens)
        self.seq_mean = self.prompt_tokens + self.resp_mean
        self.seq_max = float(w.max_prompt_tokens + w.max_response_tokens)
        self.act_bytes = DTYPE_BYTES[w.precision]
        self.required_tasks: tuple[TaskName, ...] = tuple(
            t for t in w.tasks if not (t == "reward" and self.rule_reward)
        )

    # ---- public API -----------------------------------------------------------------------------------------
    def task(
        self, placement: TaskPlacement, group_tasks: Sequence[TaskName | TaskPlacement] | None = None
    ) -> TaskEstimate:
        """Time terms and per-device peak memory of one task (shares and splits filled in when None).

        `group_tasks` are the other tasks of its group: names (their resident state is assumed spread like
        `placement`) or placements (exact). The result is cached and shared: do not mutate it."""
        gkey = tuple(group_tasks) if group_tasks else ()
        key = (placement, gkey)
        hit = self._l1.get(key)
        if hit is not None:
            return hit
        est = self._task(placement, gkey)
        self._l1[key] = est
        return est

    def weight_sync_s(self, train_devices: Sequence[str], gen_devices: Sequence[str], role: str = "actor") -> float:
        """Seconds to move a trained model's weights to its inference copy each step (docs: weight sync): the
        actor's from actor_train to generation, or (role 'critic') the critic's to critic_inference."""
        return self._weight_sync(tuple(train_devices), tuple(gen_devices), role)[0]

    def weight_syncs(self, placements: Sequence[TaskPlacement], groups: Sequence[GroupPlacement]) -> list[tuple]:
        """The weight syncs a plan runs each step, as (role, train devices, inference devices): the actor's
        always (a local reshard when colocated), the critic's when critic_inference is in another group than
        critic_train (in one group it runs on the trainer's own weights, as the runtime does)."""
        by_task = {p.task: p for p in placements}
        group_of = {t: g.name for g in groups for t in g.tasks if t in by_task}
        return [
            (role, by_task[SYNCED[role][0]].devices, by_task[SYNCED[role][1]].devices)
            for role, _apart in sync_roles(group_of)
        ]

    def overhead_scale(self, devices: Sequence[str], task: str | None = None) -> float:
        """The factor on per-step fixed overheads of `task`'s work on `devices`: its slowest host's
        `host_slowdown` (`decode_slowdown` for generation; the overhead is per replica and does not shrink with
        a smaller batch share, so the slowest sets it)."""
        return self._slowest((self.device_class[d] for d in devices if d in self.device_class), task)

    def _slowest(self, class_ids, task: str | None = None) -> float:
        """The largest host_slowdown (decode_slowdown for generation) among device classes (1 for none)."""
        if task == "generation":
            return max((self.classes[c].decode_slowdown for c in class_ids), default=1.0)
        return max((self.classes[c].host_slowdown for c in class_ids), default=1.0)

    def transfer_s(self, src_devices: Sequence[str], dst_devices: Sequence[str], nbytes: float) -> float:
        """Rollouts/experience between groups: α + bytes/β on the best host pair; 0 on the same device set."""
        return self._transfer(tuple(src_devices), tuple(dst_devices), nbytes)[0]

    def rollout_bytes(self) -> float:
        """Bytes of one step's rollouts (token ids + mask of prompt and response)."""
        return self.n_samples * self.seq_mean * C.ROLLOUT_BYTES_PER_TOKEN

    def experience_bytes(self, task: TaskName) -> float:
        """Bytes an inference task hands to training: a scalar per response token, or per sample (reward)."""
        if task == "reward":
            return self.n_samples * C.REWARD_BYTES_PER_SAMPLE
        return self.n_samples * self.resp_mean * C.EXPERIENCE_BYTES_PER_TOKEN

    def rule_reward_s(self) -> float:
        """Driver-CPU time of a rule-based reward (0 when a reward model is used). Not in the iteration: it
        overlaps phase 2 on the driver and is ~1e-4 of a step (docs/costmodel.md, 'Not modelled')."""
        return self.n_samples * C.RULE_REWARD_S_PER_SAMPLE if self.rule_reward else 0.0

    def phase_times(
        self, groups: Sequence[GroupPlacement], estimates: dict[str, TaskEstimate] | dict[str, float]
    ) -> list[dict[str, float]]:
        """Per PHASE, seconds per group holding a task of that phase: the sum of the group's task times in
        the phase (they share devices). `estimates` maps task → TaskEstimate or seconds."""
        total = {t: (e if isinstance(e, int | float) else e.cost.total_s) for t, e in estimates.items()}
        out: list[dict[str, float]] = []
        for phase in PHASES:
            times: dict[str, float] = {}
            for g in groups:
                if any(t in phase for t in g.tasks):
                    times[g.name] = sum(total.get(t, 0.0) for t in g.tasks if t in phase)
            out.append(times)
        return out

    def transfers(self, groups: Sequence[GroupPlacement]) -> list[tuple[str, str, str, float]]:
        """(name, src group, dst group, bytes) of every data hand-over between different groups; devices are
        not needed. Boundary 1 (after generation): the rollouts go from the generation group to every group
        with a later task, named `transfer:SRC->DST`. Boundary 2 (after inference): each group's inference
        outputs go to every group with a training task, named `transfer:SRC->DST:experience`.
        Each costs transfer_s(src devices, dst devices, bytes); the iteration adds them all up (they funnel
        through the single controller, as in verl), so the ILP can sum them too."""
        out: list[tuple[str, str, str, float]] = []
        gen = next((g for g in groups if "generation" in g.tasks), None)
        if gen is not None:
            for g in groups:
                if g is not gen and any(t in PHASES[1] + PHASES[2] for t in g.tasks):
                    out.append((f"transfer:{gen.name}->{g.name}", gen.name, g.name, self.rollout_bytes()))
        trainers = [g for g in groups if any(t in PHASES[2] for t in g.tasks)]
        for src in groups:
            produced = sum(self.experience_bytes(t) for t in src.tasks if t in PHASES[1] and t in self.arch)
            if produced <= 0:
                continue
            for dst in trainers:
                if dst is not src:
                    out.append((f"transfer:{src.name}->{dst.name}:experience", src.name, dst.name, produced))
        return out

    def boundary_transfers(self, groups: Sequence[GroupPlacement]) -> list[list[tuple[str, str, str, float]]]:
        """transfers() priced and split by boundary: [[(name, src, dst, seconds), ...] after phase 1, [...]
        after phase 2]. A boundary costs the sum of its entries."""
        by_name = {g.name: g for g in groups}
        out: list[list[tuple[str, str, str, float]]] = [[], []]
        for name, src, dst, nbytes in self.transfers(groups):
            seconds = self._transfer(by_name[src].devices, by_name[dst].devices, nbytes)[0]
            out[1 if name.endswith(":experience") else 0].append((name, src, dst, seconds))
        return out

    def evaluate(self, groups: Sequence[GroupPlacement], placements: Sequence[TaskPlacement]) -> PlanEstimate:
        """Score a whole placement: per-task estimates, the iteration composition (sync or async), memory
        and every violation found (docs/costmodel.md, 'Composition')."""
        groups = list(groups)
        violations = self._structure_violations(groups, placements)
        by_task = {p.task: p for p in placements}
        group_of = {t: g for g in groups for t in g.tasks}
        estimates: dict[str, TaskEstimate] = {}
        for p in placements:
            g = group_of.get(p.task)
            others = tuple(by_task[t] for t in (g.tasks if g else ()) if t != p.task and t in by_task)
            est = self.task(p, others)
            estimates[p.task] = est
            if est.violation:
                violations.append(est.violation)
        memory: dict[str, int] = {}
        for est in estimates.values():
            for d, b in est.memory_bytes.items():
                if b > memory.get(d, 0):
                    memory[d] = b
        phases = self.phase_times(groups, estimates)
        transfers = self.boundary_transfers(groups)
        boundary = [sum(s for *_, s in pairs) for pairs in transfers]
        ws, ws_label, slowest = 0.0, "", -1.0
        for role, train, infer in self.weight_syncs(placements, groups):
            seconds, label, _tensors = self._weight_sync(train, infer, role)
            ws += seconds  # the runtime syncs the actor, then the critic
            if seconds > slowest:  # the bottleneck sentence names the slower sync
                slowest, ws_label = seconds, f"{SYNC_WORDS[role]}) over the {label}"
        asynchronous = self.workload.mode == "async" and is_async_split(groups)
        iteration = compose_iteration(phases, boundary, ws, asynchronous)
        timeline = self._timeline(groups, estimates, phases, transfers, boundary, ws, asynchronous)
        breakdown, path = self._critical_path(groups, estimates, phases, boundary, ws, asynchronous)
        bottleneck = self._bottleneck(path, iteration, groups, estimates, ws_label)
        gen_tokens = self.n_samples * self.resp_mean
        return PlanEstimate(
            tasks=estimates,
            iteration_s=iteration,
            samples_per_s=self.n_samples / iteration if iteration > 0 else 0.0,
            tokens_per_s=gen_tokens / iteration if iteration > 0 else 0.0,
            weight_sync_s=ws,
            transfer_s=sum(boundary),
            breakdown=breakdown,
            timeline=timeline,
            bottleneck=bottleneck,
            memory_per_device=memory,
            violations=violations,
        )

    def to_plan(self, estimate: PlanEstimate, groups: Sequence[GroupPlacement], solver: SolverStats, name: str) -> Plan:
        """The Plan artifact of a feasible estimate (Infeasible names the first violation otherwise)."""
        from hetrl_cli.errors import Infeasible

        if estimate.violations:
            more = f" (and {len(estimate.violations) - 1} more)" if len(estimate.violations) > 1 else ""
            raise Infeasible(f"plan {name!r} does not fit: {estimate.violations[0]}{more}")
        group_of = {t: g.name for g in groups for t in g.tasks}
        tasks: list[TaskPlan] = []
        for t, est in estimates_in_order(estimate.tasks):
            p = est.placement
            shares = _normalised(p.batch_shares or ())
            replicas = [
                Replica(stages=[list(s) for s in rep], batch_share=shares[r], layer_split=list(p.layer_splits[r]))
                for r, rep in enumerate(p.replicas)
            ]
            tasks.append(
                TaskPlan(
                    task=t,
                    group=group_of[t],
                    tp=p.tp,
                    pp=p.pp,
                    dp=p.dp,
                    replicas=replicas,
                    predicted=TaskCost(**est.cost.model_dump()),
                    memory_bytes=dict(est.memory_bytes),
                    offload=p.offload,
                )
            )
        cost = PlanCost(
            iteration_s=estimate.iteration_s,
            samples_per_s=estimate.samples_per_s,
            tokens_per_s=estimate.tokens_per_s,
            weight_sync_s=estimate.weight_sync_s,
            transfer_s=estimate.transfer_s,
            breakdown=dict(estimate.breakdown),
            timeline=list(estimate.timeline),
            bottleneck=estimate.bottleneck,
        )
        return Plan(
            name=name,
            created_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            profile_name=self.profile.name,
            profile_fingerprint=self.profile.fingerprint or self.profile.compute_fingerprint(),
            workload=self.workload,
            groups=[TaskGroup(name=g.name, tasks=list(g.tasks), devices=list(g.devices)) for g in groups],
            tasks=tasks,
            cost=cost,
            solver=solver,
            memory_per_device=dict(estimate.memory_per_device),
        )

    @staticmethod
    def placement_from_plan(plan: Plan) -> tuple[list[GroupPlacement], list[TaskPlacement]]:
        """The groups and placements a plan encodes (its shares and splits kept), to re-score it."""
        groups = [GroupPlacement(g.name, tuple(g.tasks), tuple(g.devices)) for g in plan.groups]
        placements = [
            TaskPlacement(
                task=t.task,
                replicas=tuple(tuple(tuple(s) for s in r.stages) for r in t.replicas),
                batch_shares=tuple(r.batch_share for r in t.replicas),
                layer_splits=tuple(tuple(r.layer_split) for r in t.replicas),
                offload=t.offload,
            )
            for t in plan.tasks
        ]
        return groups, placements

    # ---- one task -------------------------------------------------------------------------------------------
    def _task(self, placement: TaskPlacement, group_tasks: tuple) -> TaskEstimate:
        task = placement.task
        # 1) device ids → classes (what the class-level cache is keyed by), once per device layout
        shape = self._shape_cache.get(placement.replicas)
        if shape is None:
            shape = self._shape_cache[placement.replicas] = self._layout_classes(placement)
        rep_key, bad = shape
        if bad is not None:
            return TaskEstimate(placement, TaskCost(total_s=math.inf), {}, task + bad)
        # 2) what the group's other tasks keep resident on these devices: one figure for every device (mates
        # by name) or a figure per device (mates' placements)
        names = frozenset(t if isinstance(t, str) else t.task for t in group_tasks) - {task}
        uniform, others_dev = 0.0, None
        if group_tasks:
            okey = (task, placement.replicas, group_tasks)
            hit = self._others_cache.get(okey)
            if hit is None:
                hit = self._others_cache[okey] = self._others_resident(placement, group_tasks, names)
            uniform, others_dev = hit
        if others_dev:
            others_key = tuple(
                tuple(max(others_dev.get(d, 0.0) for d in st) for st in rep) for rep in placement.replicas
            )
        elif uniform:
            others_key = tuple((uniform,) * len(rep) for rep in placement.replicas)
        else:
            others_key = None
        # 3) the class-level estimate (cached on what it depends on: see _class_inputs)
        shares, splits, offload = placement.batch_shares, placement.layer_splits, placement.offload
        cnames, cothers = _class_inputs(task, names, others_key)
        ckey = (task, rep_key, shares, splits, offload, cnames, cothers)
        ce = self._l2.get(ckey)
        if ce is None:
            ce = self._class_estimate(task, rep_key, shares, splits, offload, cnames, cothers)
            self._l2[ckey] = ce
        if ce.hard:
            return TaskEstimate(placement, ce.cost, {}, ce.violation)
        # 4) per-device memory and the worst overflow (per stage when the resident bytes are uniform: a stage's
        # devices then hold the same bytes and the one with the least usable memory overflows most)
        filled = TaskPlacement(task, placement.replicas, ce.shares, ce.splits, offload)
        gen = task == "generation"
        usable = self._usable_gen if gen else self._usable
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
                    d, room = self._least_usable(st, gen)
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
        if violation is None and ce.mem_violation is not None:
            r, p, need, what = ce.mem_violation
            d = placement.replicas[r][p][0]
            violation = (
                f"{d} needs {need / GB:.1f} GB for {task} {what}, has "
                f"{self.devices[d].memory_bytes / GB:.1f} GB; use more devices (tp/pp) or shorter sequences"
            )
        if violation is None and worst is not None:
            _, d, total, what = worst
            resident = others_dev.get(d) if others_dev else uniform
            extra = " + resident state of " + ", ".join(sorted(names)) if resident else ""
            violation = (
                f"{d} needs {total / GB:.1f} GB for {task} {what}{extra}, has "
                f"{usable[d] / GB:.1f} GB usable of {self.devices[d].memory_bytes / GB:.1f} GB; "
                "use more devices, ZeRO sharding, recompute or offload"
            )
        return TaskEstimate(filled, ce.cost, memory, violation, terms=ce.terms, links=ce.links)

    def _layout_classes(self, placement: TaskPlacement) -> tuple[tuple | None, str | None]:
        """(device classes per replica/stage, None), or (None, why the ids cannot be used: follows the task name)."""
        dc = self.device_class
        try:
            rep_key = tuple(tuple(tuple(dc[d] for d in st) for st in rep) for rep in placement.replicas)
        except KeyError as exc:
            return None, f" uses device {exc.args[0]} that the profile does not have; check the profile"
        devs = placement.devices
        if len(set(devs)) != len(devs):
            dup = next(d for d in devs if devs.count(d) > 1)
            return None, f" uses device {dup} twice; each tasklet needs its own device"
        return rep_key, None

    def _shape_problem(
        self,
        task: TaskName,
        rep_key: tuple[tuple[tuple[int, ...], ...], ...],
        shares: tuple[float, ...] | None,
        splits: tuple[tuple[int, ...], ...] | None,
    ) -> str | None:
        """Why a placement's shape cannot run at all (independent of which devices of a class it uses)."""
        if task == "reward" and self.rule_reward:
            return "reward is rule-based (workload.reward is None): omit the reward task from the placement"
        if task not in self.arch:
            return f"task {task} is not part of this {self.workload.algorithm} workload"
        if not rep_key or any(not rep for rep in rep_key) or any(not st for rep in rep_key for st in rep):
            return f"{task}: a placement needs at least one replica with one stage of one device"
        pp, tp = len(rep_key[0]), len(rep_key[0][0])
        if any(len(rep) != pp or any(len(st) != tp for st in rep) for rep in rep_key):
            return f"{task}: every replica must have pp={pp} stages of tp={tp} devices"
        arch = self.arch[task]
        if arch.num_heads % tp:
            return f"{task}: {arch.name} has {arch.num_heads} attention heads, not divisible by tp={tp}"
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
            if self.classes[c].compute_Fps <= 0:
                cls = self.classes[c]
                return f"{task}: {cls.name} on {cls.host} has no FLOP/s figure in the profile; re-profile it"
        return None

    # ---- memory of colocated tasks --------------------------------------------------------------------------
    def _others_resident(
        self, placement: TaskPlacement, group_tasks: tuple, names: frozenset[str]
    ) -> tuple[float, dict[str, float] | None]:
        """Bytes the other tasks of the group keep resident while this task runs: (bytes on every device, None)
        when the mates are given by name (spread like this placement), else (0, bytes per device)."""
        group_all = names | {placement.task}
        if all(isinstance(t, str) for t in group_tasks):
            total = 0.0
            for other in group_tasks:
                if other == placement.task or other not in self.arch:
                    continue
                per_param = resident_bytes_per_param(other, group_all - {other}, False, self.workload, placement.dp)
                per_dev = self.arch[other].param_count(HEAD[other]) * per_param / (placement.tp * placement.pp)
                total += per_dev
            return total, None
        out: dict[str, float] = {}
        for other in group_tasks:
            if isinstance(other, str):
                if other == placement.task or other not in self.arch:
                    continue
                arch = self.arch[other]
                per_param = resident_bytes_per_param(other, group_all - {other}, False, self.workload, placement.dp)
                per_dev = arch.param_count(HEAD[other]) * per_param / (placement.tp * placement.pp)
                if per_dev:
                    for d in placement.devices:
                        out[d] = out.get(d, 0.0) + per_dev
            else:
                if other.task == placement.task:
                    continue
                for d, b in self._resident_map(other, group_all - {other.task}).items():
                    out[d] = out.get(d, 0.0) + b
        return 0.0, out

    def _least_usable(self, stage: tuple[str, ...], gen: bool) -> tuple[str, float]:
        """The first device of a TP group with the least usable memory, and that memory (cached)."""
        key = (stage, gen)
        hit = self._low_cache.get(key)
        if hit is None:
            usable = self._usable_gen if gen else self._usable
            d = min(stage, key=usable.__getitem__)
            hit = self._low_cache[key] = (d, usable[d])
        return hit

    def _resident_map(self, placement: TaskPlacement, group: frozenset[str]) -> dict[str, float]:
        """Bytes per device a task keeps resident between its runs (memory.py module docstring)."""
        key = (placement, group)
        hit = self._resident_cache.get(key)
        if hit is not None:
            return hit
        out: dict[str, float] = {}
        rep_key = self._rep_key(placement)
        if rep_key is not None and not self._shape_problem(placement.task, rep_key, None, placement.layer_splits):
            arch = self.arch[placement.task]
            per_param = resident_bytes_per_param(placement.task, group, placement.offload, self.workload, placement.dp)
            splits = placement.layer_splits or self._splits_for(placement)
            for r, rep in enumerate(placement.replicas):
                for p, st in enumerate(rep):
                    b = self._stage_params(arch, HEAD[placement.task], splits[r], p) * per_param / placement.tp
                    for d in st:
                        out[d] = b
        self._resident_cache[key] = out
        return out

    def _rep_key(self, placement: TaskPlacement) -> tuple | None:
        """Device classes per replica and stage (None if a device is unknown), cached per device layout."""
        hit = self._rep_key_cache.get(placement.replicas, False)
        if hit is False:
            try:
                hit = tuple(tuple(tuple(self.device_class[d] for d in st) for st in rep) for rep in placement.replicas)
            except KeyError:
                hit = None
            self._rep_key_cache[placement.replicas] = hit
        return hit

    def _splits_for(self, placement: TaskPlacement) -> tuple[tuple[int, ...], ...]:
        rep_key = self._rep_key(placement)
        return tuple(self._split_of(placement.task, rep, tuple(self._stage(s) for s in rep)) for rep in rep_key)

    def _split_of(self, task: str, classes: tuple[tuple[int, ...], ...], stages: tuple[_Stage, ...]) -> tuple[int, ...]:
        """_balanced_split, cached by the replica's device classes (what the stages are made of)."""
        key = (task, classes)
        hit = self._split_cache.get(key)
        if hit is None:
            hit = self._split_cache[key] = self._balanced_split(task, stages)
        return hit

    # ---- class-level estimate -------------------------------------------------------------------------------
    def _stage(self, classes: tuple[int, ...]) -> _Stage:
        hit = self._stage_cache.get(classes)
        if hit is not None:
            return hit
        cls = [self.classes[c] for c in classes]
        hosts = tuple(c.host for c in cls)
        counts: dict[str, int] = {}
        for h in hosts:
            counts[h] = counts.get(h, 0) + 1
        multi = frozenset(h for h, n in counts.items() if n > 1)
        link = self.links.ring(frozenset(hosts), multi) if len(cls) > 1 else LOCAL
        st = _Stage(
            tp=len(cls),
            compute_Fps=len(cls) * min(c.compute_Fps for c in cls),
            mem_Bps=min(c.mem_Bps for c in cls),
            memory_bytes=min(c.memory_bytes for c in cls),
            hosts=hosts,
            link=link,
            missing_flops=any(c.compute_Fps <= 0 for c in cls),
            opt_Bps=min(c.opt_Bps for c in cls),
            launches=all(c.launches for c in cls),
        )
        self._stage_cache[classes] = st
        return st

    def _stage_link(self, a: _Stage, b: _Stage) -> LinkInfo:
        """Pipeline hop: TP rank t of one stage sends to rank t of the next; the slowest pair bounds it."""
        key = (a.hosts, b.hosts)
        hit = self._hop_cache.get(key)
        if hit is not None:
            return hit
        link: LinkInfo | None = None
        for ha, hb in zip(a.hosts, b.hosts, strict=True):
            hop = self.links.between(ha, hb)
            link = hop if link is None else link.worst(hop)
        self._hop_cache[key] = link = link or LOCAL
        return link

    def _stage_params(self, arch: ArchSpec, head: str, split: Sequence[int], p: int) -> float:
        """Parameters on stage p: its layers, the embedding on the first stage, final norm + head on the last
        (a tied embedding is duplicated on the last stage when pp > 1, as Megatron does)."""
        key = (arch.name, head, split[p], p == 0, p == len(split) - 1, len(split) > 1)
        hit = self._params_cache.get(key)
        if hit is None:
            hit = self._params_cache[key] = self._stage_params_uncached(arch, head, split, p)
        return hit

    @staticmethod
    def _stage_params_uncached(arch: ArchSpec, head: str, split: Sequence[int], p: int) -> float:
        n = split[p] * arch.layer_params
        last = p == len(split) - 1
        if p == 0:
            n += arch.embedding_params
        if last:
            n += arch.hidden_size + arch.head_params(head)
            if head == "lm" and arch.tie_embeddings and len(split) > 1:
                n += arch.embedding_params
        return float(n)

    def _stage_flops_per_token(self, arch: ArchSpec, head: str, layers: int, last: bool, context: float) -> float:
        """Forward FLOPs per token of a stage's layers (+ the output projection on the last stage)."""
        key = (arch.name, head, layers, last, context)
        hit = self._flops_cache.get(key)
        if hit is None:
            hit = layers * arch.layer_flops_per_token(context)
            if last:
                hit += 2.0 * arch.head_matmul_params(head)
            self._flops_cache[key] = hit
        return hit

    def _balanced_split(self, task: str, stages: tuple[_Stage, ...]) -> tuple[int, ...]:
        """Integer layers per stage ∝ stage speed (≥ 1 each, summing to num_layers); the output head counts
        on the last stage. Generation balances memory bandwidth (decode reads weights), the rest FLOP/s."""
        arch = self.arch[task]
        pp = len(stages)
        L = arch.num_layers
        if pp == 1:
            return (L,)
        if task == "generation":
            speed = [s.mem_Bps * s.tp for s in stages]
            layer_cost = float(arch.layer_params)
            head_cost = float(arch.hidden_size * arch.vocab_size)
        else:  # the FLOPs per token _fwd_replica charges (attention included), so the split minimises its max
            speed = [s.compute_Fps for s in stages]
            layer_cost = arch.layer_flops_per_token(self.seq_mean / 2)
            head_cost = 2.0 * arch.head_matmul_params(HEAD[task])
        extra = [0.0] * pp
        extra[-1] = head_cost
        target = (L * layer_cost + head_cost) / sum(speed)
        want = [max(1.0, (target * s - e) / layer_cost) for s, e in zip(speed, extra, strict=True)]
        scale = L / sum(want)
        want = [w * scale for w in want]
        layers = [max(1, int(w)) for w in want]
        while sum(layers) > L:
            i = max((i for i in range(pp) if layers[i] > 1), key=lambda i: layers[i] - want[i])
            layers[i] -= 1
        while sum(layers) < L:
            i = max(range(pp), key=lambda i: want[i] - layers[i])
            layers[i] += 1

        def times(ls: list[int]) -> list[float]:
            return [(ls[i] * layer_cost + extra[i]) / speed[i] for i in range(pp)]

        for _ in range(L):  # local improvement: move one layer off the slowest stage while it helps
            t = times(layers)
            hi = max(range(pp), key=t.__getitem__)
            if layers[hi] <= 1:
                break
            lo = min(range(pp), key=t.__getitem__)
            trial = list(layers)
            trial[hi] -= 1
            trial[lo] += 1
            if max(times(trial)) < max(t) - 1e-12:
                layers = trial
            else:
                break
        if task != "generation":
            layers = self._refine_split(task, stages, layers)
        return tuple(layers)

    def _refine_split(self, task: str, stages: tuple[_Stage, ...], layers: list[int]) -> list[int]:
        """Move single layers off the slowest stage while the 1F1B time of the whole step's batch on this
        replica drops, with _fwd_replica's own stage times (compute, TP all-reduces and the send to the next
        stage, which the FLOP proxy leaves out); a move must not put the receiving stage over its usable
        memory (the task alone, no sharding: conservative), so the proxy's split stays where nothing else fits.
        Without it a 3 % faster first stage could take a layer and become the straggler of its send."""
        micro_batch = self.workload.micro_batch
        m = max(1, math.ceil(self.n_samples / micro_batch))
        mb_tok = micro_batch * self.seq_mean
        msg = mb_tok * self.arch[task].hidden_size * self.act_bytes
        alone = frozenset({task})
        usable = [st.memory_bytes * C.USABLE_MEMORY_FRACTION for st in stages]

        consts = self._fwd_consts(task)
        mult, passes = consts.mult, consts.passes
        seconds: dict[tuple[int, int], float] = {}  # a stage's time depends on its position and layers only
        fitting: dict[tuple[int, int], bool] = {}  # and so does its memory

        def stage_s(p: int, layers_p: int) -> float:
            if (p, layers_p) not in seconds:
                row = self._stage_row(task, stages, p, layers_p, consts)
                busy, tpc, hop_s = _stage_parts([row], mb_tok, mult, msg, passes)[0][:3]
                seconds[(p, layers_p)] = busy + tpc + hop_s
            return seconds[(p, layers_p)]

        def times(ls: list[int]) -> list[float]:
            return [stage_s(p, n) for p, n in enumerate(ls)]

        def total(t: list[float]) -> float:
            return m * max(t) + sum(t) - max(t)

        def fits(ls: list[int], stage: int) -> bool:
            if (stage, ls[stage]) not in fitting:
                stage_bytes = self._stage_memory(task, stages, tuple(ls), stage, m, False, alone, 1)[0]
                fitting[(stage, ls[stage])] = stage_bytes <= usable[stage]
            return fitting[(stage, ls[stage])]

        current = times(layers)
        for _ in range(self.arch[task].num_layers):
            hi = max(range(len(layers)), key=current.__getitem__)
            if layers[hi] <= 1:
                break
            best = None
            for j in range(len(layers)):
                if j == hi:
                    continue
                trial = list(layers)
                trial[hi] -= 1
                trial[j] += 1
                t = times(trial)
                better = total(t) < total(current) * (1 - 1e-12) and (best is None or total(t) < total(best[1]))
                if better and fits(trial, j):
                    best = (trial, t)
            if best is None:
                break
            layers, current = best
        return layers

    def _class_estimate(
        self,
        task: TaskName,
        rep_key: tuple[tuple[tuple[int, ...], ...], ...],
        shares: tuple[float, ...] | None,
        splits: tuple[tuple[int, ...], ...] | None,
        offload: bool,
        names: frozenset[str],
        others: tuple[tuple[float, ...], ...] | None,
    ) -> _ClassEst:
        bad = self._shape_problem(task, rep_key, shares, splits)
        if bad:
            inf = TaskCost(total_s=math.inf)
            return _ClassEst((), (), inf, {}, {}, [], [], bad, None, hard=True)
        if others is None:
            others = tuple((0.0,) * len(rep) for rep in rep_key)
        stages = [tuple(self._stage(s) for s in rep) for rep in rep_key]
        if splits is None:
            splits = tuple(self._split_of(task, rep_key[r], stages[r]) for r in range(len(rep_key)))
        dp = len(rep_key)

        # replicas with the same device classes, split and co-resident bytes behave identically:
        # compute each kind once and give its replicas equal shares
        kind_of: dict[tuple, int] = {}
        kinds = [kind_of.setdefault((rep_key[r], splits[r], others[r]), len(kind_of)) for r in range(dp)]
        first = {k: kinds.index(k) for k in range(len(kind_of))}

        def run(k: int, share: float) -> _Rep:
            r = first[k]
            n_seq = share * self.n_samples
            key = (task, rep_key[r], splits[r], n_seq, others[r], offload, names, dp)
            hit = self._rep_cache.get(key)
            if hit is None:
                hit = self._rep_cache[key] = self._replica(
                    task, rep_key[r], stages[r], splits[r], n_seq, others[r], offload, names, dp
                )
            return hit

        if shares is None:
            shares, reps = self._balance(kinds, run)
        else:
            memo: dict[tuple[int, float], _Rep] = {}
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
            self._add_train_sync(task, rep_key, stages, splits, terms, links, offload)
        total = sum(terms.values())
        cost = TaskCost.model_construct(
            compute_s=terms.get("compute", 0.0),
            memory_s=terms.get("memory", 0.0) + terms.get("optimizer", 0.0),
            comm_s=terms.get("tp_comm", 0.0) + terms.get("pp_p2p", 0.0) + terms.get("dp_allreduce", 0.0),
            bubble_s=terms.get("bubble", 0.0),
            other_s=terms.get("offload", 0.0) + terms.get("overhead", 0.0) + terms.get("host", 0.0),
            total_s=total,
        )
        violation = next((rep.violation for rep in reps if rep.violation), None)
        mem_v = next(((r, *rep.mem_violation) for r, rep in enumerate(reps) if rep.mem_violation), None)
        return _ClassEst(
            shares=tuple(shares),
            splits=tuple(splits),
            cost=cost,
            terms=terms,
            links=links,
            stage_bytes=[rep.stage_bytes for rep in reps],
            stage_parts=[rep.stage_parts for rep in reps],
            violation=violation,
            mem_violation=mem_v,
        )

    @staticmethod
    def _balance(kinds: list[int], run) -> tuple[tuple[float, ...], list[_Rep]]:
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

    def _replica(self, task, classes, stages, split, n_seq, others, offload, names, dp) -> _Rep:
        if task == "generation":
            rep = self._gen_replica(classes, stages, split, n_seq, others, offload, names)
        else:
            rep = self._fwd_replica(task, classes, stages, split, n_seq, offload, names, dp)
        extra = self.task_overhead_s.get(task, 0.0)
        if extra:  # calibrated per-step overhead, per replica, at its host's speed
            extra *= self._class_slowdown(classes, task)
            rep.terms["overhead"] = rep.terms.get("overhead", 0.0) + extra
            rep.total_s += extra
        return rep

    def _decode_overhead_scale(self, classes: tuple[tuple[int, ...], ...]) -> float:
        """Per decode step: the host slowdown times the calibrated factor on DECODE_STEP_OVERHEAD_S."""
        return self._class_slowdown(classes, "generation") * self.overhead_factor.get("generation", 1.0)

    def _class_slowdown(self, classes: tuple[tuple[int, ...], ...], task: str | None = None) -> float:
        """The slowest slowdown (_slowest) among a replica's device classes (per stage)."""
        return self._slowest((c for stage in classes for c in stage), task)

    # ---- generation -----------------------------------------------------------------------------------------
    def _gen_replica(self, classes, stages, split, n_seq, others, offload, names) -> _Rep:
        """Prefill (compute bound, chunked) + continuous-batching decode (each step max(compute, HBM traffic)).

        Everything but the batch-dependent arithmetic is computed once per (classes, split, resident state)
        in _gen_static; the expressions below keep the reference evaluation order (bit-for-bit results)."""
        key = (classes, split, others, offload, names)
        g = self._static_cache.get(key)
        if g is None:
            g = self._static_cache[key] = self._gen_static(stages, split, others, offload, names)
        pp, h, cap, per_stage, prefill, static_tail = g
        P, Rm, Rt = self.prompt_tokens, self.resp_mean, self.resp_tail
        batch = max(1.0, min(math.floor(cap) if cap >= 1 else 1.0, C.MAX_NUM_SEQS, max(n_seq, 1e-9)))
        steps = max(Rt, n_seq * Rm / batch + Rt - Rm)
        avg_batch = n_seq * Rm / steps
        ctx = P + Rm / 2
        mb = avg_batch / pp  # pp micro-batches in flight (vLLM virtual engines)
        msg = mb * h * self.act_bytes
        best = None
        for p, (fpt, c_den, wd, kvd, m_den, ar_mult, tp, ar_link, hop) in enumerate(per_stage):
            c = mb * fpt / c_den
            m = (wd + mb * ctx * kvd) / m_den
            tpc = ar_mult * allreduce_s(msg, tp, ar_link)
            p2p = 0.0 if hop is None else p2p_s(msg, hop)
            step = max(c, m) + tpc + p2p
            if best is None or step > best[0]:
                best = (step, c, max(0.0, m - c), tpc, p2p, p)
        assert best is not None
        _, c, m_extra, tpc, p2p, crit = best
        k = steps * pp
        terms = {
            "compute": k * c,
            "memory": k * m_extra,
            "tp_comm": k * tpc,
            "pp_p2p": k * p2p,
            "overhead": steps * C.DECODE_STEP_OVERHEAD_S * self._decode_overhead_scale(classes),
        }
        # prefill: prompt tokens in chunks of MAX_NUM_BATCHED_TOKENS; the slowest stage sets the pace
        slow_tok, bubble_tok, split_slow, slow_tp, slow_link, hop01 = prefill
        prompt_tokens = n_seq * P
        chunk = min(float(C.MAX_NUM_BATCHED_TOKENS), prompt_tokens)
        chunks = prompt_tokens / chunk if chunk > 0 else 0.0
        terms["compute"] += prompt_tokens * slow_tok
        terms["bubble"] = bubble_tok * chunk
        chunk_msg = chunk * h * self.act_bytes
        terms["tp_comm"] += chunks * 2 * split_slow * allreduce_s(chunk_msg, slow_tp, slow_link)
        if hop01 is not None:
            terms["pp_p2p"] += chunks * p2p_s(chunk_msg, hop01)
        offload_s, labels, pp_label, stage_bytes, parts, mem_violation = static_tail
        links = {"tp_comm": labels[crit]}
        if pp_label is not None:
            links["pp_p2p"] = pp_label
        if offload_s is not None:  # weights reloaded from host memory each step
            terms["offload"] = offload_s
        return _Rep(sum(terms.values()), terms, stage_bytes, parts, links, None, mem_violation)

    def _gen_static(self, stages, split, others, offload, names) -> tuple:
        """The batch-independent part of _gen_replica: memory per stage (weights, KV per token, work space),
        the KV-bound sequence cap, and per-stage speeds, links and FLOPs per token."""
        arch = self.arch["generation"]
        w = self.workload
        pp = len(stages)
        wb = weight_bytes_per_param(w)
        kv_b = DTYPE_BYTES[w.precision]
        h = arch.hidden_size
        P, Rm = self.prompt_tokens, self.resp_mean
        footprint = P + Rm  # constants.KV_FOOTPRINT
        resident = weights_resident("generation", names, offload)
        weights_dev, kv_dev, work_dev, cap = [], [], [], math.inf
        mem_violation = None
        for p, st in enumerate(stages):
            last = p == pp - 1
            wd = self._stage_params(arch, "lm", split, p) * wb / st.tp
            kv_heads = max(1, math.ceil(arch.num_kv_heads / st.tp))
            kvd = 2 * split[p] * kv_heads * arch.head_dim * kv_b
            per_tok = 2.0 * (h + arch.q_dim + 2 * arch.kv_dim) + 4.0 * arch.intermediate_size
            work = C.MAX_NUM_BATCHED_TOKENS * per_tok * self.act_bytes / st.tp
            if last:
                work += C.MAX_NUM_SEQS * arch.vocab_size * 4 / st.tp
            budget = st.memory_bytes * C.GEN_MEMORY_UTILIZATION - others[p] - wd - work
            seqs = budget / (kvd * footprint)
            if seqs < 1 and mem_violation is None:
                need = others[p] + wd + work + kvd * footprint
                mem_violation = (p, need / C.GEN_MEMORY_UTILIZATION, "weights + activations + one sequence's KV cache")
            cap = min(cap, seqs)
            weights_dev.append(wd)
            kv_dev.append(kvd)
            work_dev.append(work)
        ctx = P + Rm / 2
        per_stage = []
        for p, st in enumerate(stages):
            last = p == pp - 1
            per_stage.append(
                (
                    self._stage_flops_per_token(arch, "lm", split[p], last, ctx),
                    st.compute_Fps * C.DECODE_MFU,
                    weights_dev[p],
                    kv_dev[p],
                    st.mem_Bps * C.HBM_EFFICIENCY,
                    2 * split[p],
                    st.tp,
                    st.link,
                    None if last else self._stage_link(st, stages[p + 1]),
                )
            )
        per_tok = [
            self._stage_flops_per_token(arch, "lm", split[p], p == pp - 1, P / 2) / (st.compute_Fps * C.PREFILL_MFU)
            for p, st in enumerate(stages)
        ]
        slow = max(range(pp), key=per_tok.__getitem__)
        prefill = (
            per_tok[slow],
            sum(per_tok) - per_tok[slow],
            split[slow],
            stages[slow].tp,
            stages[slow].link,
            self._stage_link(stages[0], stages[1]) if pp > 1 else None,
        )
        offload_s = None
        if not resident and "actor_train" not in names:
            offload_s = max(weights_dev) / C.HOST_DEVICE_Bps
        labels = [st.link.label for st in stages]  # the critical decode stage's TP link (chosen per batch)
        pp_label = self._stage_link(stages[0], stages[1]).label if pp > 1 else None
        stage_bytes = [st.memory_bytes * C.GEN_MEMORY_UTILIZATION - others[p] for p, st in enumerate(stages)]
        if mem_violation is not None:
            stage_bytes = [
                max(b, weights_dev[p] + work_dev[p] + kv_dev[p] * footprint) for p, b in enumerate(stage_bytes)
            ]
        parts = ["weights + KV cache" for _ in stages]
        return pp, h, cap, per_stage, prefill, (offload_s, labels, pp_label, stage_bytes, parts, mem_violation)

    # ---- forward tasks (inference and training) -------------------------------------------------------------
    def _fwd_replica(self, task, classes, stages, split, n_seq, offload, names, dp) -> _Rep:
        """Micro-batched 1F1B pipeline: time = m · max_p t_p + (Σ_p t_p − max_p t_p), t_p = compute + TP
        all-reduces + the send to the next stage (Narayanan et al. 2021, §2.2).

        Per-stage speeds, links and FLOPs per token come from _fwd_static (once per classes and split) and
        memory from _fwd_memory; the expressions keep the reference evaluation order (bit-for-bit results)."""
        key = (task, classes, split)
        g = self._static_cache.get(key)
        if g is None:
            g = self._static_cache[key] = self._fwd_static(task, stages, split)
        per_stage, labels, pp_label, passes, mult, micro_batch, h = g
        m = max(1, math.ceil(n_seq / micro_batch - 1e-9))
        mb_tok = n_seq * self.seq_mean / m
        msg = mb_tok * h * self.act_bytes
        parts_t = _stage_parts(per_stage, mb_tok, mult, msg, passes)
        times = [busy + tpc + hop_s for busy, tpc, hop_s, *_ in parts_t]
        pp = len(per_stage)
        crit = max(range(pp), key=times.__getitem__) if pp > 1 else 0
        _busy, tpc, hop_s, c, mem, wait = parts_t[crit]
        terms = {
            "compute": m * c,
            "memory": m * mem,
            "host": m * wait,
            "tp_comm": m * tpc,
            "pp_p2p": m * hop_s,
            "bubble": sum(times) - times[crit],
        }
        links = {"tp_comm": labels[crit]}
        if pp_label is not None:
            links["pp_p2p"] = pp_label
        if task in TRAIN_TASKS:  # memory depends on the micro-batch count only through min(m, pp)
            mkey = (task, classes, split, names, offload, dp, min(m, pp))
        else:
            mkey = (task, classes, split, names, offload)
        mem = self._static_cache.get(mkey)
        if mem is None:
            mem = self._static_cache[mkey] = self._fwd_memory(task, stages, split, m, offload, names, dp)
        stage_bytes, parts, load_s = mem
        if load_s:
            terms["offload"] = load_s
        return _Rep(sum(terms.values()), terms, stage_bytes, parts, links)

    def _fwd_static(self, task, stages, split) -> tuple:
        """The batch-independent timing inputs of _fwd_replica, per stage."""
        consts = self._fwd_consts(task)
        per_stage = [self._stage_row(task, stages, p, split[p], consts) for p in range(len(stages))]
        labels = [st.link.label for st in stages]
        pp_label = self._stage_link(stages[0], stages[1]).label if len(stages) > 1 else None
        passes, mult = consts.passes, consts.mult
        return per_stage, labels, pp_label, passes, mult, self.workload.micro_batch, self.arch[task].hidden_size

    def _fwd_consts(self, task) -> _FwdConsts:
        """What every stage's timing row of a forward task shares, cached per task."""
        hit = self._consts_cache.get(task)
        if hit is not None:
            return hit
        arch = self.arch[task]
        w = self.workload
        train = task in TRAIN_TASKS
        ctx = self.seq_mean / 2  # causal: a token attends to half the sequence on average
        epochs = w.ppo_epochs if train else 1
        if train:
            mult = _train_multiple(w.recompute)
            mfu = C.TRAIN_MATMUL_EFFICIENCY
            dispatch = C.EAGER_DISPATCH_S_PER_LAYER_TRAIN
            mixed = 0 if w.precision == "fp32" else C.MIXED_PRECISION_BYTES_PER_PARAM
            n_ar = 4 + (2 if w.recompute else 0)  # Megatron TP: 2 all-reduces fwd, 2 bwd (+2 recomputed fwd)
            n_p2p = 2  # activation forward, its gradient backward
        else:
            mult, mfu, n_ar, n_p2p = 1.0, C.INFERENCE_MATMUL_EFFICIENCY, 2, 1
            dispatch, mixed = C.EAGER_DISPATCH_S_PER_LAYER_FORWARD, 0
        # passes of (compute and bubble, TP all-reduces, stage sends), in units of one training (inference) pass;
        # actor_train first runs one forward of its batch on the training layout for the old log-probs
        passes = (epochs, epochs, epochs)
        if task == "actor_train":
            passes = (epochs + 1 / mult, epochs + 2 / n_ar, epochs + 1 / n_p2p)
        hit = self._consts_cache[task] = _FwdConsts(
            arch, HEAD[task], ctx, mult, mfu, n_ar, n_p2p, passes, dispatch, mixed
        )
        return hit

    def _stage_row(self, task, stages, p: int, layers: int, consts: _FwdConsts) -> tuple:
        """Stage p's timing inputs with `layers` layers (_stage_parts' row): they depend on nothing else of
        the split."""
        arch, head, ctx, _mult, mfu, n_ar, n_p2p, _passes, dispatch, mixed = consts
        st = stages[p]
        last = p == len(stages) - 1
        act = self.act_bytes
        traffic = layers * arch.layer_traffic_bytes_per_token(act, st.tp)
        params = layers * arch.layer_params
        if last and head == "lm":
            response_share = self.resp_mean / self.seq_mean
            traffic += arch.vocab_size / st.tp * (act + response_share * C.LOGITS_TRAFFIC_BYTES_PER_RESPONSE_ENTRY)
        if last:
            params += arch.head_matmul_params(head)
        mem_Bps = st.mem_Bps * C.ELEMENTWISE_HBM_EFFICIENCY
        return (
            self._stage_flops_per_token(arch, head, layers, last, ctx),
            st.compute_Fps * mfu,
            n_ar * layers,
            st.tp,
            st.link,
            n_p2p,
            None if last else self._stage_link(st, stages[p + 1]),
            traffic / mem_Bps,
            params / st.tp * mixed / mem_Bps,
            layers * dispatch if st.launches else 0.0,
        )

    def _fwd_memory(self, task, stages, split, m, offload, names, dp) -> tuple[list[float], list[str], float]:
        """Peak bytes per stage, what they are, and the weight reload time of an offloaded inference task."""
        stage_bytes, parts = [], []
        load_s = 0.0
        for p in range(len(stages)):
            b, what, reload_s = self._stage_memory(task, stages, split, p, m, offload, names, dp)
            stage_bytes.append(b)
            parts.append(what)
            load_s = max(load_s, reload_s)
        return stage_bytes, parts, load_s

    def _stage_memory(self, task, stages, split, p, m, offload, names, dp) -> tuple[float, str, float]:
        """Stage p's peak bytes, what they are, and its weight reload seconds (offloaded inference); of the
        split only its length and split[p] matter."""
        arch = self.arch[task]
        head = HEAD[task]
        w = self.workload
        st = stages[p]
        mb_tok_max = w.micro_batch * self.seq_max
        params_dev = self._stage_params(arch, head, split, p) / st.tp
        if task in TRAIN_TASKS:
            b, what = self._train_stage_bytes(arch, head, split, p, st, params_dev, m, mb_tok_max, dp, offload)
            return b, what, 0.0
        wb = weight_bytes_per_param(w)
        shares_trainer = task == "critic_inference" and "critic_train" in names  # runs on the trainer's weights
        load_s = 0.0
        wts = 0.0 if shares_trainer else params_dev * wb
        if not shares_trainer and not weights_resident(task, names, offload):
            load_s = params_dev * wb / C.HOST_DEVICE_Bps
        work = mb_tok_max * arch.activation_bytes_per_token_layer(st.tp, False)
        last = p == len(stages) - 1
        logits = mb_tok_max * arch.vocab_size / st.tp * C.LOGITS_BYTES_PER_ENTRY if last and head == "lm" else 0
        return wts + work + logits, "activations" if shares_trainer else "weights + activations", load_s

    def _train_stage_bytes(self, arch, head, split, p, st, params_dev, m, mb_tok_max, dp, offload):
        """Peak bytes on a training stage's device: model states (ZeRO-sharded) + 1F1B activations + logits."""
        w = self.workload
        pp = len(split)
        zero = w.sharding if dp > 1 else "none"
        weights = params_dev * weight_bytes_per_param(w) / (dp if zero == "zero3" else 1)
        grads = params_dev * grad_bytes_per_param(w) / (dp if zero in ("zero2", "zero3") else 1)
        opt = params_dev * optimizer_bytes_per_param(w) / (dp if zero != "none" else 1)
        in_flight = min(pp - p, m)  # 1F1B: stage p holds pp − p micro-batches' activations
        acts = in_flight * mb_tok_max * split[p] * arch.activation_bytes_per_token_layer(st.tp, w.recompute)
        if w.recompute:  # one layer's full activations while it is recomputed
            acts += mb_tok_max * arch.activation_bytes_per_token_layer(st.tp, False)
        logits = 0.0
        if p == pp - 1 and head == "lm":
            response_share = w.max_response_tokens / self.seq_max
            per_entry = C.TRAIN_LOGITS_BYTES_PER_ENTRY + response_share * C.TRAIN_LOGITS_BYTES_PER_RESPONSE_ENTRY
            logits = mb_tok_max * arch.vocab_size / st.tp * per_entry
        if w.precision != "fp32" and zero != "zero3":  # under ZeRO-3 only the gathered layers are cast (gather)
            weights += params_dev * C.AUTOCAST_WEIGHT_COPY_BYTES_PER_PARAM
        gather = 0.0
        if zero == "zero3":
            gather = C.ZERO3_PREFETCH_LAYERS * arch.layer_params * weight_bytes_per_param(w) / st.tp
        total = weights + grads + opt + acts + logits + gather
        what = "weights+grads+optimizer+activations"
        if opt >= 0.5 * total:
            what = "weights+grads+optimizer (mostly optimizer state)"
        elif acts + logits >= 0.5 * total:
            what = "weights+grads+optimizer+activations (mostly activations)"
        return total, what

    def _add_train_sync(self, task, rep_key, stages, splits, terms, links, offload) -> None:
        """DP gradient sync (hierarchical), the optimizer step (HBM bound) and optimizer offload copies."""
        w = self.workload
        arch = self.arch[task]
        head = HEAD[task]
        dp = len(rep_key)
        epochs = w.ppo_epochs
        if dp > 1:
            dp_s, label = self._dp_allreduce(rep_key, arch.param_count(head) * grad_bytes_per_param(w))
            if w.sharding == "zero3":
                dp_s *= C.ZERO3_COMM_FACTOR
            terms["dp_allreduce"] = epochs * dp_s
            links["dp_allreduce"] = label
        shard = dp if (w.sharding != "none" and dp > 1) else 1
        traffic = optimizer_step_traffic_bytes_per_param(w)
        opt_s, off_s = 0.0, 0.0
        for r, rep in enumerate(stages):
            for p, st in enumerate(rep):
                params_dev = self._stage_params(arch, head, splits[r], p) / st.tp / shard
                opt_s = max(opt_s, params_dev * traffic / st.opt_Bps)
                if offload:
                    off_s = max(off_s, 2 * params_dev * optimizer_bytes_per_param(w) / C.HOST_DEVICE_Bps)
        terms["optimizer"] = epochs * opt_s
        if offload:
            terms["offload"] = off_s

    def _dp_allreduce(self, rep_key, grad_bytes: float) -> tuple[float, str]:
        """Hierarchical gradient all-reduce (as NCCL does across nodes): replicas on one host reduce-scatter
        and all-gather over the intra link; one copy of each host's shards all-reduces over a ring across
        hosts, which crosses the ring's bottleneck (a host holding a full replica moves all G bytes)."""
        tp, pp = len(rep_key[0][0]), len(rep_key[0])
        shards = tp * pp
        shard_bytes = grad_bytes / shards
        per_host: dict[str, dict[tuple[int, int], int]] = {}
        for rep in rep_key:
            for p, st in enumerate(rep):
                for t, c in enumerate(st):
                    host = self.classes[c].host
                    d = per_host.setdefault(host, {})
                    d[(p, t)] = d.get((p, t), 0) + 1
        intra_s, intra_label = 0.0, ""
        for host, counts in per_host.items():
            n = max(counts.values())
            if n > 1:
                link = self.links.intra(host)
                s = reduce_scatter_s(shard_bytes, n, link) + allgather_s(shard_bytes, n, link)
                if s > intra_s:
                    intra_s, intra_label = s, link.label
        inter_s, label = 0.0, intra_label
        if len(per_host) > 1:
            ring = self.links.ring(frozenset(per_host))
            frac = max(len(c) for c in per_host.values()) / shards
            inter_s = allreduce_s(grad_bytes * frac, len(per_host), ring)
            label = ring.label
        return intra_s + inter_s, label

    # ---- weight sync and transfers --------------------------------------------------------------------------
    def _weight_sync(self, train: tuple[str, ...], gen: tuple[str, ...], role: str) -> tuple[float, str, float]:
        """_weight_sync_uncached, cached by (train, gen, role)."""
        key = (train, gen, role)
        hit = self._ws_cache.get(key)
        if hit is not None:
            return hit
        result = self._weight_sync_uncached(train, gen, role)
        self._ws_cache[key] = result
        return result

    def _weight_sync_uncached(
        self, train: tuple[str, ...], gen: tuple[str, ...], role: str
    ) -> tuple[float, str, float]:
        """The role's trained weights (workload precision) to every device of its inference task, once per step:
        (seconds, the bottleneck's label, the per-tensor host part of the seconds) from weight_sync_parts:
        the slower of the local reshard and the remote copies, plus the host part."""
        parts = self.weight_sync_parts(train, gen, role)
        if parts is None:
            return 0.0, "", 0.0
        local_s, remote_s, label, tensors_s, host_s = parts
        return max(local_s, remote_s) + host_s, label, tensors_s

    def weight_sync_parts(
        self, train: Sequence[str], gen: Sequence[str], role: str
    ) -> tuple[float, float, str, float, float] | None:
        """(local reshard seconds, remote copy seconds, the remote bottleneck's label or "local reshard",
        the per-tensor host seconds, all host seconds) of one weight sync; None when it moves nothing.

        Colocated devices: a local reshard (LOCAL_RESHARD_PASSES over HBM; an all-gather first under ZeRO-3).
        Other devices: a pipelined broadcast tree over regions (_broadcast_tree_s).
        Plus WEIGHT_SYNC_PER_TENSOR_S per tensor and the calibrated overhead, both host work at the slowest
        involved host's speed."""
        train_task, infer_task = SYNCED[role]
        head = HEAD[train_task]
        arch = self.arch.get(train_task) or self.arch.get(infer_task)
        known_t = [d for d in train if d in self.device_class]
        known_g = [d for d in gen if d in self.device_class]
        if arch is None or not known_t or not known_g:
            return None
        nbytes = arch.param_count(head) * weight_bytes_per_param(self.workload)
        tset = set(known_t)
        local = [d for d in known_g if d in tset]
        remote = [d for d in known_g if d not in tset]
        local_s = 0.0
        label = "local reshard"
        if local:
            hbm = min(self.classes[self.device_class[d]].mem_Bps for d in local)
            local_s = C.LOCAL_RESHARD_PASSES * nbytes / hbm
            if self.workload.sharding == "zero3" and len(known_t) > 1:
                hosts = [self.classes[self.device_class[d]].host for d in known_t]
                multi = frozenset(h for h in hosts if hosts.count(h) > 1)
                local_s += allgather_s(nbytes, len(known_t), self.links.ring(frozenset(hosts), multi))
        remote_s = 0.0
        if remote:
            remote_s, label = self._broadcast_tree_s(known_t, remote, nbytes)
        scale = self.overhead_scale((*known_t, *known_g))
        tensors_s = arch.tensor_count(head) * C.WEIGHT_SYNC_PER_TENSOR_S * self.overhead_factor.get("weight_sync", 1.0)
        host_s = (tensors_s + self.task_overhead_s.get("weight_sync", 0.0)) * scale
        return local_s, remote_s, label, tensors_s * scale, host_s

    def _broadcast_tree_s(self, train: Sequence[str], gen: Sequence[str], nbytes: float) -> tuple[float, str]:
        """Pipelined broadcast tree from the training hosts to the generation devices, region by region.

        Greedy (Prim-like) over regions of generation hosts: each step attaches the region that can get its
        copy soonest from any host already holding the weights (training hosts, or generation hosts fed
        before it — relaying through a fed region avoids a slow direct link), given what that host already
        sends. Inside a region the copy fans out over its hosts' ring and each host's intra link. A region's
        time = Σ latencies on its path + bytes / the narrowest hop (chunks stream through); a host sending
        k copies needs k × bytes / its link. Returns (seconds, label of the narrowest link used)."""
        regions: dict[str, dict[str, int]] = {}
        for d in gen:
            cls = self.classes[self.device_class[d]]
            hosts = regions.setdefault(cls.region, {})
            hosts[cls.host] = hosts.get(cls.host, 0) + 1
        # host -> (path bandwidth, path latency, narrowest link) for hosts that already have the weights
        have: dict[str, tuple[float, float, LinkInfo | None]] = {
            self.classes[self.device_class[d]].host: (math.inf, 0.0, None) for d in train
        }
        uplink: dict[str, float] = {}
        finish, narrowest = 0.0, None
        todo = dict(regions)
        while todo:
            best = None
            for region, hosts in todo.items():
                for src, (bw, lat, narrow) in have.items():
                    link, _, _ = self.links.best_between(frozenset({src}), frozenset(hosts), nbytes)
                    path_bw = min(bw, link.bandwidth_Bps)
                    t = max(lat + link.latency_s + nbytes / path_bw, uplink.get(src, 0.0) + nbytes / link.bandwidth_Bps)
                    if best is None or t < best[0]:
                        n = link if narrow is None or link.bandwidth_Bps < narrow.bandwidth_Bps else narrow
                        best = (t, region, src, link, path_bw, lat + link.latency_s, n)
            assert best is not None
            _, region, src, link, path_bw, path_lat, narrow = best
            hosts = todo.pop(region)
            uplink[src] = uplink.get(src, 0.0) + nbytes / link.bandwidth_Bps
            fan = [self.links.ring(frozenset(hosts))] if len(hosts) > 1 else []
            fan += [self.links.intra(h) for h, n in hosts.items() if n > 1]
            for hop in fan:
                path_lat += hop.latency_s
                if hop.bandwidth_Bps < path_bw:
                    path_bw, narrow = hop.bandwidth_Bps, hop
            finish = max(finish, path_lat + nbytes / path_bw)
            if narrowest is None or (narrow is not None and narrow.bandwidth_Bps < narrowest.bandwidth_Bps):
                narrowest = narrow
            for h in hosts:
                have.setdefault(h, (path_bw, path_lat, narrow))
        finish = max(finish, max(uplink.values(), default=0.0))
        return finish, narrowest.label if narrowest is not None else "local copy"

    def _transfer(self, src: Sequence[str], dst: Sequence[str], nbytes: float) -> tuple[float, str]:
        if nbytes <= 0 or set(src) == set(dst):
            return 0.0, ""
        sh = frozenset(self.classes[self.device_class[d]].host for d in src if d in self.device_class)
        dh = frozenset(self.classes[self.device_class[d]].host for d in dst if d in self.device_class)
        if not sh or not dh:
            return 0.0, ""
        link, _, _ = self.links.best_between(sh, dh, nbytes)
        return p2p_s(nbytes, link), link.label

    # ---- composition helpers --------------------------------------------------------------------------------
    def _structure_violations(self, groups: list[GroupPlacement], placements: Sequence[TaskPlacement]) -> list[str]:
        out: list[str] = []
        owner: dict[str, str] = {}
        for g in groups:
            for d in g.devices:
                if d not in self.device_class:
                    out.append(f"group {g.name} names device {d} that the profile does not have; check the profile")
                elif d in owner and owner[d] != g.name:
                    out.append(f"device {d} is in groups {owner[d]} and {g.name}; a device belongs to one group")
                owner.setdefault(d, g.name)
        group_of: dict[str, str] = {}
        for g in groups:
            for t in g.tasks:
                if t in group_of:
                    out.append(f"task {t} is in groups {group_of[t]} and {g.name}; put it in one group")
                group_of[t] = g.name
        seen: set[str] = set()
        gmap = {g.name: g for g in groups}
        for p in placements:
            if p.task in seen:
                out.append(f"task {p.task} is placed twice; give each task one placement")
            seen.add(p.task)
            if p.task not in group_of:
                out.append(f"task {p.task} is placed but in no group; add it to the group whose devices it uses")
                continue
            stray = sorted(set(p.devices) - set(gmap[group_of[p.task]].devices))
            if stray:
                out.append(f"task {p.task} uses {stray[0]} outside its group {group_of[p.task]}")
        for t in self.required_tasks:
            if t not in seen:
                out.append(f"task {t} is not placed; every {self.workload.algorithm} task needs a group and devices")
        return out

    def _timeline(self, groups, estimates, phases, transfers, boundary, ws, asynchronous) -> list[TimelineEntry]:
        """Start/end of every task, transfer and the weight sync inside one (steady-state) iteration."""
        out: list[TimelineEntry] = []
        gen_group = next((g.name for g in groups if "generation" in g.tasks), "")

        def run_phase(k: int, start: float) -> None:
            for g in groups:
                t0 = start
                for t in g.tasks:
                    if t in PHASES[k] and t in estimates:
                        t1 = t0 + estimates[t].cost.total_s
                        out.append(TimelineEntry(name=t, group=g.name, start_s=t0, end_s=t1))
                        t0 = t1

        def run_transfers(k: int, start: float) -> None:
            for name, src, _dst, s in transfers[k]:  # one after another through the controller
                out.append(TimelineEntry(name=name, group=src, start_s=start, end_s=start + s))
                start += s

        span = [max(p.values(), default=0.0) for p in phases]
        if asynchronous:
            run_phase(0, 0.0)
            if ws:
                out.append(TimelineEntry(name="weight_sync", group=gen_group, start_s=span[0], end_s=span[0] + ws))
            t = 0.0
            run_transfers(0, t)
            t += boundary[0]
            run_phase(1, t)
            t += span[1]
            run_transfers(1, t)
            t += boundary[1]
            run_phase(2, t)
            return out
        t = 0.0
        for k in range(len(PHASES)):
            run_phase(k, t)
            t += span[k]
            if k < len(boundary):
                run_transfers(k, t)
                t += boundary[k]
        if ws:
            out.append(TimelineEntry(name="weight_sync", group=gen_group, start_s=t, end_s=t + ws))
        return out

    def _critical_path(self, groups, estimates, phases, boundary, ws, asynchronous):
        """Seconds by term along the critical path, and the path's items (kind, name, group, seconds)."""
        breakdown = dict.fromkeys(("compute", "memory", "comm", "bubble", "weight_sync", "transfer", "other"), 0.0)
        path: list[tuple[str, str, str, float]] = []
        crit = critical_groups(phases, boundary, ws, asynchronous)
        for k, g in enumerate(crit):
            if g is None:
                continue
            group = next(x for x in groups if x.name == g)
            for t in group.tasks:
                if t in PHASES[k] and t in estimates:
                    c = estimates[t].cost
                    breakdown["compute"] += c.compute_s
                    breakdown["memory"] += c.memory_s
                    breakdown["comm"] += c.comm_s
                    breakdown["bubble"] += c.bubble_s
                    breakdown["other"] += c.other_s
                    path.append(("task", t, g, c.total_s))
        on_path_boundaries = [0, 1] if not (asynchronous and crit[0] is not None) else []
        for k in on_path_boundaries:
            breakdown["transfer"] += boundary[k]
            if boundary[k]:
                path.append(("transfer", f"boundary {k + 1}", "", boundary[k]))
        if not asynchronous or crit[0] is not None:
            breakdown["weight_sync"] += ws
            if ws:
                path.append(("weight_sync", "weight_sync", "", ws))
        return breakdown, path

    def _group_desc(self, group: GroupPlacement) -> str:
        counts: dict[str, int] = {}
        regions: list[str] = []
        for d in group.devices:
            dev = self.devices.get(d)
            if dev is None:
                continue
            name = _short_name(dev.name)
            counts[name] = counts.get(name, 0) + 1
            region = self.links.region(dev.host)
            if region not in regions:
                regions.append(region)
        kinds = " + ".join(f"{n}×{name}" for name, n in counts.items())
        return f"{kinds}, {'/'.join(regions)}" if regions else kinds

    def _bottleneck(self, path, iteration, groups, estimates, ws_label) -> str:
        if not path or iteration <= 0:
            return ""
        kind, name, g, s = max(path, key=lambda x: x[3])
        pct = 100 * s / iteration
        if kind == "weight_sync":
            return f"weight sync ({ws_label} takes {pct:.0f} % of the iteration"
        if kind == "transfer":
            return f"moving data between groups at {name} takes {pct:.0f} % of the iteration"
        group = next(x for x in groups if x.name == g)
        sentence = f"{name} on group {g} ({self._group_desc(group)}) takes {pct:.0f} % of the iteration"
        est = estimates[name]
        if est.terms and s > 0:
            term, ts = max(est.terms.items(), key=lambda kv: kv[1])
            label = TERM_LABEL.get(term, term)
            link = est.links.get(term)
            if link:
                sentence += f"; its {label} over the {link} is {100 * ts / s:.0f} % of it"
            else:
                sentence += f"; {label} is {100 * ts / s:.0f} % of it"
        return sentence


def _class_inputs(
    task: TaskName, names: frozenset[str], others: tuple[tuple[float, ...], ...] | None
) -> tuple[frozenset[str], tuple | None]:
    """The part of (group mates, their resident bytes per stage) a class-level estimate depends on, so that
    groups differing only in what cannot change it share one cache entry (exact, not an approximation).

    Mates matter by name only through residency (memory.weights_resident): whether actor_train is beside
    generation and critic_train beside critic_inference. Resident bytes change generation's KV capacity
    (hence its time); for the other tasks they only change the device memory that `_task` adds on top,
    so there only their equality pattern over replicas is kept (it decides which replicas are costed as
    one kind, so the balancing arithmetic stays the same)."""
    partner = {"generation": "actor_train", "critic_inference": "critic_train"}.get(task)
    key_names = frozenset({partner}) if partner in names else frozenset()
    if task == "generation" or others is None:
        return key_names, others
    first: dict[tuple[float, ...], int] = {}
    pattern = tuple((first.setdefault(o, len(first)),) for o in others)
    return key_names, (pattern if len(first) > 1 else None)


def _train_multiple(recompute: bool) -> float:
    """Training FLOPs per forward FLOP: 3 (fwd + bwd), 4 with full recomputation (ArchSpec.train_flops_per_token)."""
    return TRAIN_FORWARD_MULTIPLE + (1.0 if recompute else 0.0)


def estimates_in_order(tasks: dict[str, TaskEstimate]) -> list[tuple[TaskName, TaskEstimate]]:
    """Task estimates in the workload's dependency order."""
    return [(t, tasks[t]) for t in ALL_TASKS if t in tasks]


def _normalised(shares: Sequence[float]) -> list[float]:
    total = sum(shares)
    return [s / total for s in shares]


__all__ = ["CostModel", "describe_bandwidth"]
