"""What validating and fitting both read: a calibration file checked against its profile, and the profile a
plan was made for. Its own module so calibration/fit.py and calibration/validate.py need not import each other."""

from __future__ import annotations

from hetrl_cli.artifacts.calibration import Calibration
from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.errors import BadInput


def load_calibration(path: str, profile_fingerprint: str) -> Calibration:
    """A calibration file, refused (BadInput) when it was fitted for another profile."""
    from hetrl_cli.artifacts.io import load_artifact

    cal = load_artifact(path, Calibration)
    if cal.profile_fingerprint != profile_fingerprint:
        raise BadInput(
            f"{path}: calibration is for profile {cal.profile_name!r} ({cal.profile_fingerprint}), not "
            f"{profile_fingerprint}; run 'hetrl calibrate' on runs of this profile"
        )
    return cal


def find_profile(plan: Plan, given: str | None = None) -> ClusterProfile:
    """`given`, or profiles/NAME.json when its fingerprint is the plan's (as `hetrl simulate` looks)."""
    from pathlib import Path

    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.planner.build import PROFILE_DIR

    if given is not None:
        return load_artifact(given, ClusterProfile)
    path = Path(PROFILE_DIR) / f"{plan.profile_name}.json"
    if path.is_file():
        profile = load_artifact(path, ClusterProfile)
        if (profile.fingerprint or profile.compute_fingerprint()) == plan.profile_fingerprint:
            return profile
    raise BadInput(
        f"plan {plan.name!r} was made on profile {plan.profile_name!r} ({plan.profile_fingerprint}) and "
        f"{path} is not it; pass the profile with --profile PATH"
    )
