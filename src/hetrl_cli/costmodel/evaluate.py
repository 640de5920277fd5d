"""A whole plan's estimate: every task's time and memory, the transfers and weight syncs between groups,
composed into one iteration by costmodel/compose.py, with the timeline, the critical path's breakdown, the
bottleneck sentence and every violation found (docs/costmodel.md, 'Composition')."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hetrl_cli.artifacts.plan import TimelineEntry
from hetrl_cli.artifacts.rl import PHASES
from hetrl_cli.costmodel.compose import (
    BOUNDARIES,
    WEIGHT_SYNC,
    compose_iteration,
    critical_groups,
    critical_terms,
    is_async_split,
)
from hetrl_cli.costmodel.explain import PathItem, bottleneck, sync_label
from hetrl_cli.costmodel.types import GroupPlacement, PlanEstimate, TaskEstimate, TaskPlacement

if TYPE_CHECKING:
    from hetrl_cli.costmodel.model import CostModel


def evaluate(model: CostModel, groups: Sequence[GroupPlacement], placements: Sequence[TaskPlacement]) -> PlanEstimate:
    """Score a whole placement (CostModel.evaluate)."""
    groups = list(groups)
    violations = structure_violations(model, groups, placements)
    by_task = {p.task: p for p in placements}
    group_of = {t: g for g in groups for t in g.tasks}
    estimates: dict[str, TaskEstimate] = {}
    for p in placements:
        g = group_of.get(p.task)
        others = tuple(by_task[t] for t in (g.tasks if g else ()) if t != p.task and t in by_task)
        est = model.task(p, others)
        estimates[p.task] = est
        if est.violation:
            violations.append(est.violation)
    memory: dict[str, int] = {}
    for est in estimates.values():
        for d, b in est.memory_bytes.items():
            if b > memory.get(d, 0):
                memory[d] = b
    phases = phase_times(groups, estimates)
    transfers = model.boundary_transfers(groups)
    boundary = [sum(s for *_, s in pairs) for pairs in transfers]
    ws, ws_label, slowest = 0.0, "", -1.0
    for role, train, infer, *in_place in model.weight_syncs(placements, groups):
        seconds, label, _tensors = model.syncs.sync(train, infer, role, *in_place)
        ws += seconds  # the runtime syncs the actor, then the critic
        if seconds > slowest:  # the bottleneck sentence names the slower sync
            slowest, ws_label = seconds, sync_label(role, label)
    tasks = [p.task for p in placements]  # each sync starts with its trainer's gather (WeightSync.gather_s)
    ws += sum(model.sync_gathers_s([p for p in placements if p.task in g.tasks], tasks) for g in groups)
    asynchronous = model.workload.mode == "async" and is_async_split(groups)
    iteration = compose_iteration(phases, boundary, ws, asynchronous)
    timeline = build_timeline(groups, estimates, phases, transfers, boundary, ws, asynchronous)
    breakdown, path = critical_path(groups, estimates, phases, boundary, ws, asynchronous)
    gen_tokens = model.step.n_samples * model.step.resp_mean
    return PlanEstimate(
        tasks=estimates,
        iteration_s=iteration,
        samples_per_s=model.step.n_samples / iteration if iteration > 0 else 0.0,
        tokens_per_s=gen_tokens / iteration if iteration > 0 else 0.0,
        weight_sync_s=ws,
        transfer_s=sum(boundary),
        breakdown=breakdown,
        timeline=timeline,
        bottleneck=bottleneck(model.cluster, path, iteration, groups, estimates, ws_label),
        memory_per_device=memory,
        violations=violations,
    )


def phase_times(
    groups: Sequence[GroupPlacement], estimates: dict[str, TaskEstimate] | dict[str, float]
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


def structure_violations(
    model: CostModel, groups: list[GroupPlacement], placements: Sequence[TaskPlacement]
) -> list[str]:
    """What is wrong with the plan's shape itself: unknown or shared devices, tasks in no group or two,
    devices outside a task's group, tasks the workload needs that are not placed."""
    out: list[str] = []
    owner: dict[str, str] = {}
    for g in groups:
        for d in g.devices:
            if d not in model.cluster.device_class:
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
    for t in model.step.required_tasks:
        if t not in seen:
            out.append(f"task {t} is not placed; every {model.workload.algorithm} task needs a group and devices")
    return out


def build_timeline(groups, estimates, phases, transfers, boundary, ws, asynchronous) -> list[TimelineEntry]:
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
        if ws:  # the part of the sync generation waits for before its next rollout (compose.py: the rest overlaps)
            waited = min(ws, max(0.0, compose_iteration(phases, boundary, ws, True) - span[0]))
            out.append(TimelineEntry(name="weight_sync", group=gen_group, start_s=span[0], end_s=span[0] + waited))
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


def critical_path(groups, estimates, phases, boundary, ws, asynchronous) -> tuple[dict[str, float], list[PathItem]]:
    """Seconds by term along the critical path, and the path's items (kind, name, group, seconds)."""
    breakdown = dict.fromkeys(("compute", "memory", "comm", "bubble", "weight_sync", "transfer", "other"), 0.0)
    path: list[PathItem] = []
    crit = critical_groups(phases, boundary, ws, asynchronous)
    terms, f = critical_terms(phases, boundary, ws, asynchronous)  # f: 0.5 where async's sync straddles the lanes
    for k, g in enumerate(crit):
        if g is None:
            continue
        group = next(x for x in groups if x.name == g)
        for t in group.tasks:
            if t in PHASES[k] and t in estimates:
                c = estimates[t].cost
                breakdown["compute"] += c.compute_s * f
                breakdown["memory"] += c.memory_s * f
                breakdown["comm"] += c.comm_s * f
                breakdown["bubble"] += c.bubble_s * f
                breakdown["other"] += c.other_s * f
                path.append(("task", t, g, c.total_s * f))
    for k, name in enumerate(BOUNDARIES):
        if name in terms:
            breakdown["transfer"] += boundary[k] * f
            if boundary[k]:
                path.append(("transfer", f"boundary {k + 1}", "", boundary[k] * f))
    if WEIGHT_SYNC in terms:
        breakdown["weight_sync"] += ws * f
        if ws:
            path.append(("weight_sync", "weight_sync", "", ws * f))
    return breakdown, path
