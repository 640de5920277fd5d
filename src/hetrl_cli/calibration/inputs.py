"""What validating and fitting both read: a calibration file checked against its profile, and the profile a
plan was made for. Its own module so calibration/fit.py and calibration/validate.py need not import each other."""

from __future__ import annotations

from hetrl_cli.artifacts.calibration import Calibration
from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.errors import BadInput, one_line


def load_calibration(path: str, profile_fingerprint: str) -> Calibration:
    """A calibration file, refused (BadInput) when it was fitted for another profile."""
    from hetrl_cli.artifacts.io import load_artifact

    cal = load_artifact(path, Calibration)
    if cal.profile_fingerprint != profile_fingerprint:
        raise BadInput(
            f"{path}: calibration is for profile {one_line(repr(cal.profile_name), 80)} "
            f"({one_line(cal.profile_fingerprint, 80)}), not "
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


def run_engine(run_dir) -> str | None:
    """The rollout engine a run used, as CostModel's `engine` prices it: "hf" when its launch.json says hf (the
    hf engine's per-step host work: generation.decode_host_step_s), None for a vLLM-like engine or a run directory
    without a launch manifest (synthetic runs, runs from an older hetrl)."""
    import json
    from pathlib import Path

    from hetrl_cli.runtime.rundir import RunDir

    manifest = RunDir(Path(run_dir)).manifest
    if not manifest.is_file():
        return None
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # unreadable, not UTF-8, not JSON, nested too deeply
        data = None
    if not isinstance(data, dict):
        raise BadInput(f"{manifest}: not a readable launch manifest (a JSON object); remove it or re-run the plan")
    return "hf" if data.get("engine") == "hf" else None
