"""Cost tables the solvers read: the best layouts of a group's tasks on a device set, and the pairwise terms
(weight sync, transfers) between two groups. Every number comes from the cost model; nothing is modelled here.

A plan's iteration is the cost model's composition (costmodel/compose.py) over these tables, with the
planner's floor under the phase spans (`Tables.compose`); tests assert it equals `CostModel.evaluate()` on
every plan a solver returns.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.artifacts.rl import PHASES, SYNCED, TASK_ROLE, TaskName, sync_roles
from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel.compose import iteration_s, overlaps, span
from hetrl_cli.costmodel.types import GroupPlacement, TaskEstimate, TaskPlacement
from hetrl_cli.planner.cost import Objective
from hetrl_cli.planner.space import (
    DeviceClass,
    Layout,
    ModelShape,
    device_classes,
    device_tasks,
    host_chunks,
    layouts,
    max_pp_of,
    place,
)

PHASE_OF: dict[TaskName, int] = {t: i for i, phase in enumerate(PHASES) for t in phase}
MAX_JOINT_TRIES = 32
"""Layout combinations tried per group when the per-task fastest ones do not fit together in memory."""
JOINT_OPTIONS = 4
"""Layouts per task considered for those combinations."""
JOINT_KEEP = 1
"""Fitting combinations scored exactly before the best is kept."""
DEPTHS = 3
"""Fitting pipeline depths kept per TP degree (the shallowest ones)."""


@dataclass(frozen=True)
class GroupOption:
    """The best layouts of a group's tasks on one device list, with the resulting per-phase seconds."""

    tasks: tuple[TaskName, ...]
    devices: tuple[str, ...]
    layouts: tuple[Layout, ...]
    placements: tuple[TaskPlacement, ...]
    task_s: tuple[float, ...]
    phase_s: tuple[float, ...]
    critic_sync_s: float = 0.0
    """The weight-sync seconds this option adds by itself: the critic's sync inside the group
    (`Tables.in_group_critic_sync`), the gathers of its trainers' replicas before their syncs and generation's
    host hand-off (CostModel.sync_gathers_s); part of the plan's weight sync."""


@dataclass
class Counters:
    task_calls: int = 0
    pair_calls: int = 0
    plan_scores: int = 0


@dataclass(frozen=True)
class PairSpec:
    """A cost between two different groups: a weight sync (actor_train → generation, critic_train →
    critic_inference) or a data transfer."""

    name: str
    src: int
    """Index of the source group in the grouping."""
    dst: int
    nbytes: float = 0.0
    """Bytes moved (transfers); 0 for weight sync (the cost model knows the weight bytes)."""
    role: str | None = None
    """Whose weights a weight sync moves (artifacts.rl.SYNCED); None for a data transfer."""
    boundary: int = -1
    """Phase boundary a transfer crosses (0: after generation, 1: after inference); -1 for weight sync."""

    @property
    def weight_sync(self) -> bool:
        return self.role is not None


class Tables:
    """Lazily filled, cached cost tables over one profile and workload."""

    def __init__(
        self,
        cost_model,
        profile: ClusterProfile,
        workload: Workload,
        depths: int = DEPTHS,
        joint_keep: int = JOINT_KEEP,
    ) -> None:
        from hetrl_cli.costmodel.architectures import resolve

        self.cm = cost_model
        self.profile = profile
        self.workload = workload
        self.tasks = device_tasks(workload)
        self.classes: list[DeviceClass] = device_classes(profile)
        self.host_of = {d.id: d.host for d in profile.devices}
        self.spec_of = {d.id: (d.name, d.memory_bytes) for d in profile.devices}
        self.shapes: dict[TaskName, ModelShape] = {}
        for task in self.tasks:
            arch = resolve(workload.model_for(TASK_ROLE[task]))
            self.shapes[task] = ModelShape(arch.num_heads, arch.num_kv_heads, arch.num_layers, arch.vocab_size)
        self.counters = Counters()
        self.objective = Objective()
        """What the searches minimise (time, or $/iteration under a $/hour cap: planner/cost.py); make_plan sets it."""
        self.depths = depths
        """Fitting pipeline depths kept per TP degree (the ILP: DEPTHS; the hybrid's quick tables: 1)."""
        self.joint_keep = joint_keep
        self._task: dict[tuple, TaskEstimate] = {}
        self._group: dict[tuple, GroupOption | None] = {}
        self._alone: dict[tuple, list] = {}
        rule = getattr(cost_model, "rule_reward_s", lambda: 0.0)()
        self.floor: tuple[float, ...] = tuple(rule if "reward" in phase else 0.0 for phase in PHASES)
        """Seconds per phase that run on no device (the rule-based reward, on the driver): the composition's
        floors, which the cost model's evaluate does not have (costmodel/compose.py says why)."""
        self._pair: dict[tuple, float] = {}
        self._specs: dict[tuple, list[PairSpec]] = {}
        self._shapes: dict[tuple, tuple[tuple[tuple[int, ...], ...], bool]] = {}

    # --- per task and per group ----------------------------------------------------------------

    def task_estimate(self, placement: TaskPlacement, context: tuple) -> TaskEstimate:
        key = (placement, context)
        if key not in self._task:
            self.counters.task_calls += 1
            self._task[key] = self.cm.task(placement, list(context) or None)
        return self._task[key]

    def alone(
        self, task: TaskName, devices: tuple[str, ...], depths: int | None = None
    ) -> list[tuple[float, Layout, TaskPlacement]]:
        """Layouts of `task` that fit on `devices` with nothing else resident, fastest first.

        The layouts are `space.layouts` pruned to the DEPTHS shallowest fitting pipeline depths per TP
        degree (deeper pipelines only add bubbles and stage hops in the cost model); shared by every
        group that holds `task` on these devices."""
        depths = depths or self.depths
        key = (task, devices, depths)
        if key in self._alone:
            return self._alone[key]
        chunks = host_chunks(devices, self.host_of)
        fitting: list[tuple[float, Layout, TaskPlacement]] = []
        depths_of: dict[int, int] = {}
        skipped: set[tuple[int, int]] = set()
        mixed = len({self.spec_of[d] for d in devices}) > 1
        for layout in layouts([len(c) for c in chunks], self.shapes[task], mixed, max_pp_of(task)):
            if (layout.tp, layout.pp) in skipped or (not layout.strided and depths_of.get(layout.tp, 0) >= depths):
                skipped.add((layout.tp, layout.pp))
                continue
            est = self.task_estimate(place(task, chunks, layout), ())
            if est.violation is None:
                fitting.append((est.cost.total_s, layout, est.placement))
                if not layout.strided:
                    depths_of[layout.tp] = depths_of.get(layout.tp, 0) + 1
        fitting.sort(key=lambda o: (o[0], o[1]))
        self._alone[key] = fitting
        return fitting

    def task_options(
        self, task: TaskName, tasks: tuple[TaskName, ...], devices: tuple[str, ...], limit: int = 1
    ) -> list[tuple[float, Layout, TaskPlacement]]:
        """Up to `limit` layouts of `task` that fit next to the other group tasks (by name), fastest first;
        offloaded variants only where nothing fits without (offload only adds time in the cost model)."""
        others = tuple(t for t in tasks if t != task)
        chunks = host_chunks(devices, self.host_of)
        out: list[tuple[float, Layout, TaskPlacement]] = []
        tried: set[Layout] = set()
        passes = [(False, self.depths)]
        if self.depths < DEPTHS:  # quick tables: deeper pipelines only when the shallow ones do not fit
            passes.append((False, DEPTHS))
        passes.append((True, max(self.depths, DEPTHS)))
        for offload, depths in passes:
            for seconds, layout, placement in self.alone(task, devices, depths):
                if offload:
                    layout = Layout(layout.tp, layout.pp, layout.strided, offload=True)
                    placement = place(task, chunks, layout)
                if layout in tried:
                    continue
                tried.add(layout)
                if not others and not offload:
                    out.append((seconds, layout, placement))
                else:
                    est = self.task_estimate(TaskPlacement(task, placement.replicas, offload=offload), others)
                    if est.violation is None:
                        out.append((est.cost.total_s, layout, est.placement))
                if len(out) >= limit:
                    return out
            if out:
                return out
        return out

    def group_option(self, tasks: tuple[TaskName, ...], devices: tuple[str, ...]) -> GroupOption | None:
        """The layouts of `tasks` on `devices` the planner uses; None when nothing fits.

        Selection rule (what "the space" means per group, docs/planner.md): per task, layouts that fit next
        to the group mates by name, fastest first; combinations in increasing sum of those times are scored
        exactly (each task against its mates' actual placements, as `evaluate()` does) until JOINT_KEEP fit
        or MAX_JOINT_TRIES were tried; the fitting one with the smallest exact total wins."""
        key = (tasks, devices)
        if key in self._group:
            return self._group[key]
        result = None
        for limit in (1, JOINT_OPTIONS) if len(tasks) > 1 else (1,):
            per_task = [self.task_options(t, tasks, devices, limit) for t in tasks]
            if not all(per_task):
                break
            found: list[tuple[float, tuple, list]] = []
            for combo in _combinations_by_sum(per_task, MAX_JOINT_TRIES):
                chosen = self._exact(tasks, [per_task[i][j] for i, j in enumerate(combo)])
                if chosen is not None:
                    found.append((sum(c[0] for c in chosen), combo, chosen))
                    if len(found) >= self.joint_keep:
                        break
            if found:
                result = self._option(tasks, devices, min(found, key=lambda f: (f[0], f[1]))[2])
                break
        self._group[key] = result
        return result

    def _exact(self, tasks: tuple[TaskName, ...], chosen: list) -> list | None:
        """Re-score a layout combination as evaluate() will (mates' exact placements); None if it does not fit."""
        if len(tasks) == 1:
            return chosen
        raw = [TaskPlacement(t, c[2].replicas, offload=c[2].offload) for t, c in zip(tasks, chosen, strict=True)]
        out = []
        for i, placement in enumerate(raw):
            context = tuple(p for j, p in enumerate(raw) if j != i)
            est = self.task_estimate(placement, context)
            if est.violation is not None:
                return None
            out.append((est.cost.total_s, chosen[i][1], est.placement))
        return out

    def _option(self, tasks: tuple[TaskName, ...], devices: tuple[str, ...], chosen: list) -> GroupOption:
        times, chosen_p = tuple(c[0] for c in chosen), [c[2] for c in chosen]
        phase = [0.0] * len(PHASES)
        for task, seconds in zip(tasks, times, strict=True):
            phase[PHASE_OF[task]] += seconds
        return GroupOption(
            tasks=tasks,
            devices=devices,
            layouts=tuple(c[1] for c in chosen),
            placements=tuple(c[2] for c in chosen),
            task_s=times,
            phase_s=tuple(phase),
            critic_sync_s=self.in_group_critic_sync(chosen_p) + self.cm.sync_gathers_s(chosen_p, self.tasks, False),
        )

    def in_group_critic_sync(self, placements: Sequence[TaskPlacement]) -> float:
        """Seconds of the critic's sync when both critic tasks are in this group: evaluate() charges it to the
        critic_inference devices that hold a copy of their own (CostModel.weight_syncs), on the placements
        `placements()` hands it; 0 when they share the trainer's weights or are apart."""
        by_task = {p.task: TaskPlacement(p.task, p.replicas, offload=p.offload) for p in placements}
        infer, train = by_task.get("critic_inference"), by_task.get("critic_train")
        if infer is None or train is None:
            return 0.0
        receivers = self.cm.tasks.critic_receivers(infer, train)
        feeders = self.cm.syncs.feeders(train)  # other replicas' leaders feeding their hosts (WeightSync.parts)
        return self.cm.weight_sync_s(train.devices, receivers, "critic", None, feeders) if receivers else 0.0

    # --- between groups ------------------------------------------------------------------------

    def pair_specs(self, grouping: Sequence[tuple[TaskName, ...]]) -> list[PairSpec]:
        """Weight sync and transfers the cost model charges between different groups of `grouping` (memoised:
        they depend on the grouping only, and every plan score reads them)."""
        key = tuple(grouping)
        if key not in self._specs:
            self._specs[key] = pair_specs(self.cm, self.workload, grouping)
        return self._specs[key]

    def pair_cost(self, spec: PairSpec, src: tuple[str, ...], dst: tuple[str, ...]) -> float:
        key = (spec.role, spec.nbytes, src, dst)
        if key not in self._pair:
            self.counters.pair_calls += 1
            if spec.weight_sync:
                self._pair[key] = self.cm.weight_sync_s(src, dst, spec.role)
            else:
                self._pair[key] = self.cm.transfer_s(src, dst, spec.nbytes)
        return self._pair[key]

    def same_group_weight_sync(self, devices: tuple[str, ...], placements: Sequence[TaskPlacement] = ()) -> float:
        """Weight sync when actor_train and generation share a group: resharding on the same devices, or, on the
        group option's `placements` where the runtime relays the weights between the group's devices
        (WeightSync.actor_relay), what evaluate() charges for that relay (CostModel.weight_syncs)."""
        by_task = {p.task: p for p in placements}
        train, gen = by_task.get("actor_train"), by_task.get("generation")
        relay = self.cm.syncs.actor_relay(train, gen) if train is not None and gen is not None else None
        # plus the trainer's gather and generation's host hand-off on their layouts (WeightSync.gather_s,
        # handoff_s); none known on devices alone
        gather = 0.0
        if train is not None and gen is not None:
            args = relay if relay is not None else (gen.devices,)
            gather = self.cm.syncs.in_group_gather_s("actor", train, *args) + self.cm.syncs.handoff_s(gen)
        if relay is not None:
            return self.cm.weight_sync_s(train.devices, relay[0], "actor", *relay[1:]) + gather
        spec = PairSpec("weight_sync", 0, 0, role="actor")
        return self.pair_cost(spec, devices, devices) + gather

    # --- whole plans ---------------------------------------------------------------------------

    def score(self, grouping: Sequence[tuple[TaskName, ...]], options: Sequence[GroupOption]) -> float:
        """Iteration seconds of a plan from its group options (`compose` over cached tables)."""
        self.counters.plan_scores += 1
        weight_sync, boundary = self.terms(grouping, options)
        return self.compose(grouping, [o.phase_s for o in options], weight_sync, boundary)

    def compose(
        self,
        grouping: Sequence[tuple[TaskName, ...]],
        phase_s: Sequence[Sequence[float]],
        weight_sync: float,
        boundary: Sequence[float],
    ) -> float:
        """The iteration (`costmodel.compose.iteration_s`) from per-group phase seconds, each phase's span at
        least its `floor` (the rule-based reward on the driver CPU in phase 2)."""
        members, overlap = self._shape(grouping)
        spans = [span([phase_s[j][i] for j in held], self.floor[i]) for i, held in enumerate(members)]
        return iteration_s(spans, boundary, weight_sync, overlap)

    def _shape(self, grouping: Sequence[tuple[TaskName, ...]]) -> tuple[tuple[tuple[int, ...], ...], bool]:
        """(per phase, the indices of the groups holding a task of it; whether the async overlap applies),
        once per grouping: the search composes the same groupings tens of thousands of times."""
        key = tuple(grouping)
        shape = self._shapes.get(key)
        if shape is None:
            members = tuple(tuple(j for j, g in enumerate(key) if _in_phase(g, i)) for i in range(len(PHASES)))
            shape = self._shapes[key] = (members, overlaps(self.workload.mode, key))
        return shape

    def terms(
        self, grouping: Sequence[tuple[TaskName, ...]], options: Sequence[GroupOption]
    ) -> tuple[float, list[float]]:
        """(weight sync seconds, per-boundary transfer seconds) of a plan; the syncs add up (the runtime runs
        the actor's, then the critic's)."""
        train = next(i for i, g in enumerate(grouping) if "actor_train" in g)
        gen = next(i for i, g in enumerate(grouping) if "generation" in g)
        same = options[gen]
        weight_sync = self.same_group_weight_sync(same.devices, same.placements) if train == gen else 0.0
        weight_sync += sum(o.critic_sync_s for o in options)  # the critic's inside its group, if any
        boundary = [0.0, 0.0]
        for spec in self.pair_specs(grouping):
            seconds = self.pair_cost(spec, options[spec.src].devices, options[spec.dst].devices)
            if spec.weight_sync:
                weight_sync += seconds
            else:  # hand-overs funnel through the single controller: they add up
                boundary[spec.boundary] += seconds
        return weight_sync, boundary

    def groups(self, grouping: Sequence[tuple[TaskName, ...]], options: Sequence[GroupOption]) -> list[GroupPlacement]:
        return [
            GroupPlacement(name=group_name(g), tasks=g, devices=o.devices)
            for g, o in zip(grouping, options, strict=True)
        ]

    def placements(self, options: Sequence[GroupOption]) -> list[TaskPlacement]:
        """Placements to hand to evaluate(): layouts only, shares and layer splits left to the balancer."""
        return [TaskPlacement(p.task, p.replicas, offload=p.offload) for o in options for p in o.placements]


def group_name(tasks: Sequence[TaskName]) -> str:
    """`gen`, `train`, ... : a short stable name from the group's first task, e.g. `generation+reference`."""
    return "+".join(tasks)


def pair_specs(cost_model, workload: Workload, grouping: Sequence[tuple[TaskName, ...]]) -> list[PairSpec]:
    """What the cost model charges between different groups: the weight syncs (the actor's when actor_train and
    generation are apart, the critic's when critic_train and critic_inference are) and every data hand-over
    of `CostModel.transfers` (boundary 0 after generation, boundary 1, named `...:experience`, after
    inference)."""
    group_of = {t: i for i, g in enumerate(grouping) for t in g}
    specs: list[PairSpec] = []
    for role, apart in sync_roles(group_of):
        if apart:
            train, infer = SYNCED[role]
            name = "weight_sync" if role == "actor" else f"weight_sync:{role}"
            specs.append(PairSpec(name, group_of[train], group_of[infer], role=role))
    index = {group_name(g): i for i, g in enumerate(grouping)}
    groups = [GroupPlacement(group_name(g), g, ()) for g in grouping]
    for name, src, dst, nbytes in cost_model.transfers(groups):
        boundary = 1 if name.endswith(":experience") else 0
        specs.append(PairSpec(name, index[src], index[dst], float(nbytes), boundary=boundary))
    return specs


def _in_phase(group: Sequence[TaskName], phase: int) -> bool:
    return any(PHASE_OF[t] == phase for t in group)


def _combinations_by_sum(options: list[list[tuple]], limit: int):
    """Index combinations (one option per task) in increasing sum of times, at most `limit` of them."""
    start = tuple(0 for _ in options)
    heap = [(sum(o[0][0] for o in options), start)]
    seen = {start}
    while heap and limit > 0:
        _, combo = heapq.heappop(heap)
        limit -= 1
        yield combo
        for i in range(len(combo)):
            if combo[i] + 1 < len(options[i]):
                nxt = (*combo[:i], combo[i] + 1, *combo[i + 1 :])
                if nxt not in seen:
                    seen.add(nxt)
                    heapq.heappush(heap, (sum(options[k][c][0] for k, c in enumerate(nxt)), nxt))
