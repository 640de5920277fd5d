"""Plans as artifacts: a scored placement becomes a `Plan` (`to_plan`), a `Plan` becomes a placement again
(`placement_from_plan`), and a plan is re-scored on a changed profile or workload (`rescore`, the what-if of
`hetrl simulate`).

Building the artifact is the planner's job, not the cost model's: the cost model scores placements and
knows nothing of files, names or solvers.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from hetrl_cli.artifacts.plan import Plan, PlanCost, Replica, SolverStats, TaskCost, TaskGroup, TaskPlan
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.artifacts.rl import ALL_TASKS, TaskName
from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel.types import GroupPlacement, PlanEstimate, TaskEstimate, TaskPlacement
from hetrl_cli.errors import BadInput, Infeasible

if TYPE_CHECKING:
    from hetrl_cli.costmodel.model import CostModel

PROFILE_DIR = Path("profiles")
"""Where `rescore` looks for the plan's own profile (`profiles/NAME.json`) when none is given."""


def to_plan(
    model: CostModel, estimate: PlanEstimate, groups: Sequence[GroupPlacement], solver: SolverStats, name: str
) -> Plan:
    """The Plan artifact of a feasible estimate (Infeasible names the first violation otherwise)."""
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
        profile_name=model.profile.name,
        profile_fingerprint=model.profile.fingerprint or model.profile.compute_fingerprint(),
        workload=model.workload,
        groups=[TaskGroup(name=g.name, tasks=list(g.tasks), devices=list(g.devices)) for g in groups],
        tasks=tasks,
        cost=cost,
        solver=solver,
        memory_per_device=dict(estimate.memory_per_device),
        cluster_devices=[d.id for d in model.profile.devices],
        warnings=plan_warnings(model.profile, model.workload, groups),
    )


def plan_warnings(profile: ClusterProfile, workload: Workload, groups: Sequence[GroupPlacement]) -> list[str]:
    """The sentences a plan carries (`Plan.warnings`): async that has no effect because generation shares its
    group (the cost model prices it as sync: costmodel/compose.overlaps), and bf16 on devices that have no
    bf16 arithmetic (they run it at their fp32 rate; fp16 is their tensor-core rate)."""
    out = []
    generation = next((g for g in groups if "generation" in g.tasks), None)
    if workload.mode == "async" and generation is not None and tuple(generation.tasks) != ("generation",):
        mates = [t for t in generation.tasks if t != "generation"]
        named = "actor_train" if "actor_train" in mates else ", ".join(mates)
        out.append(
            f"async has no effect: generation shares devices with {named}, so the step runs as sync "
            "(priced so); a plan with generation in a group of its own overlaps it"
        )
    used = {d for g in groups for d in g.devices}
    if workload.precision == "bf16":
        lacking: dict[str, list[str]] = {}
        for device in profile.devices:
            if device.id in used and not has_bf16(device):
                lacking.setdefault(device.name, []).append(device.id)
        if lacking:
            named = "; ".join(f"{len(ids)}× {name} ({_first(ids)})" for name, ids in lacking.items())
            out.append(
                f"bf16 on devices without bf16 arithmetic: {named}; they run it at their fp32 rate "
                "(priced so): set precision: fp16 in the workload for their tensor-core rate"
            )
    return out


def has_bf16(device) -> bool:
    """bf16 arithmetic: compute capability 8.0 and up (Ampere on) where known, else a bf16 datasheet figure
    (the catalog gives none for V100 and T4); CPUs count as having it (they do not plan bf16 rates)."""
    if device.kind != "cuda":
        return True
    if device.compute_capability:
        try:
            return float(device.compute_capability) >= 8.0
        except ValueError:
            pass
    return not device.peak_tflops or "bf16" in device.peak_tflops


def _first(ids: list[str], limit: int = 3) -> str:
    return ", ".join(ids[:limit]) + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


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


def estimates_in_order(tasks: dict[str, TaskEstimate]) -> list[tuple[TaskName, TaskEstimate]]:
    """Task estimates in the workload's dependency order."""
    return [(t, tasks[t]) for t in ALL_TASKS if t in tasks]


def _normalised(shares: Sequence[float]) -> list[float]:
    total = sum(shares)
    return [s / total for s in shares]


def _own_profile(plan: Plan) -> ClusterProfile:
    """The profile the plan was made on, from profiles/NAME.json if its fingerprint matches."""
    from hetrl_cli.artifacts.io import load_artifact

    path = PROFILE_DIR / f"{plan.profile_name}.json"
    if path.is_file():
        profile = load_artifact(str(path), ClusterProfile)
        fingerprint = profile.fingerprint or profile.compute_fingerprint()
        if fingerprint == plan.profile_fingerprint:
            return profile
    raise BadInput(
        f"plan {plan.name!r} was made on profile {plan.profile_name!r} ({plan.profile_fingerprint}); "
        "pass it with --profile PATH to re-score"
    )


def rescore(
    plan: Plan,
    profile: ClusterProfile | None = None,
    workload: Workload | None = None,
    calibration: dict | None = None,
    engine: str | None = None,
) -> Plan:
    """The plan's placement (devices, layouts, batch shares, layer splits) scored on `profile`/`workload`
    (`engine`: the rollout engine priced, CostModel's; "hf" for a run that used it).

    Devices the new profile lacks → BadInput; a placement that no longer fits → Infeasible (from to_plan)."""
    what = []
    if profile is not None:
        what.append(f"profile {profile.name}")
    if workload is not None and workload != plan.workload:
        what.append(f"workload {workload.name}")
    profile = profile or _own_profile(plan)
    workload = workload or plan.workload
    known = {d.id for d in profile.devices}
    missing = sorted({d for g in plan.groups for d in g.devices} - known)
    if missing:
        raise BadInput(
            f"plan {plan.name!r} uses {len(missing)} device(s) profile {profile.name!r} lacks "
            f"(first: {missing[0]}); re-plan with `hetrl plan` on this profile"
        )
    from hetrl_cli.costmodel.model import CostModel

    model = CostModel(profile, workload, calibration, engine)
    groups, placements = placement_from_plan(plan)
    estimate = model.evaluate(groups, placements)
    note = f"re-scored on {' and '.join(what) or 'its own profile and workload'}"
    if plan.solver.note:
        note += f"; was: {plan.solver.note}"
    solver = plan.solver.model_copy(update={"note": note})
    from hetrl_cli.planner.cost import repriced

    return repriced(to_plan(model, estimate, groups, solver, plan.name), plan, profile)
