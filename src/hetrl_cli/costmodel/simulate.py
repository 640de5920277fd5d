"""Re-score a plan on a changed profile or workload (what-if): same placement, fresh predictions."""

from __future__ import annotations

from pathlib import Path

from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.errors import BadInput

PROFILE_DIR = Path("profiles")
"""Where `rescore` looks for the plan's own profile (`profiles/NAME.json`) when none is given."""


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
) -> Plan:
    """The plan's placement (devices, layouts, batch shares, layer splits) scored on `profile`/`workload`.

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
    model = CostModel(profile, workload, calibration)
    groups, placements = model.placement_from_plan(plan)
    estimate = model.evaluate(groups, placements)
    note = f"re-scored on {' and '.join(what) or 'its own profile and workload'}"
    if plan.solver.note:
        note += f"; was: {plan.solver.note}"
    solver = plan.solver.model_copy(update={"note": note})
    return model.to_plan(estimate, groups, solver, plan.name)
