"""validate -> calibrate -> validate --calibration on real runs through the real CLI.

Two tiny-GRPO plans with different layouts (1 rank, everything colocated; 2 ranks, generation disaggregated),
`hetrl validate PLAN` runs each, `hetrl calibrate` fits on the first, and `hetrl validate RUN --calibration`
re-reports the second with calibrated predictions. What is asserted is what holds whatever else loads the
machine: the least-squares fit never worsens the squared relative error of the runs it was fitted on. Whether
it improves a held-out run is measured in bench/validate_local.py (docs/benchmarks.md) and checked on
synthetic runs in test_validate_fit.py: on a shared 2-core box one run can be slowed many-fold by other load,
so a live held-out comparison is noise, not a test. ~30 s on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import load_artifact, save_artifact
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.artifacts.workload import load_workload
from hetrl_cli.calibration.candidates import candidate_plans

pytestmark = pytest.mark.slow
PROFILE = Path(__file__).parent / "data" / "localhost-2cpu.json"
WORKLOAD = Path(__file__).resolve().parents[2] / "examples" / "tiny-grpo.yaml"


def test_calibration_fitted_on_one_layout_improves_another(hetrl, tmp_path: Path) -> None:
    profile = load_artifact(PROFILE, ClusterProfile)
    plans = candidate_plans(profile, load_workload(WORKLOAD), "localhost/0", "localhost/1")
    save_artifact(profile, tmp_path / "profile.json")
    reports = {}
    for name in ("single", "gen|ref+train"):
        save_artifact(plans[name], tmp_path / f"{name.replace('|', '_')}.json")
        run = f"runs/{name.replace('|', '_')}"
        args = (
            "validate",
            f"{name.replace('|', '_')}.json",
            "--steps",
            "8",
            "--warmup",
            "2",
            "--engine",
            "hf",
            "--run-dir",
            run,
        )
        result = hetrl(*args, "--json", cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        reports[name] = json.loads(result.stdout)
        assert (tmp_path / run / "validation.json").is_file()
        assert {c["task"] for c in reports[name]["tasks"]} == {"generation", "reference", "actor_train", "weight_sync"}

    fit = hetrl(
        "calibrate", "runs/single", "--warmup", "2", "--profile", "profile.json", "-o", "cal.json", cwd=tmp_path
    )
    assert fit.returncode == 0, fit.stderr
    calibrated = ("--warmup", "2", "--calibration", "cal.json", "--profile", "profile.json", "--json")
    held_out = hetrl("validate", "runs/gen_ref+train", *calibrated, cwd=tmp_path)
    assert held_out.returncode == 0, held_out.stderr
    after = json.loads(held_out.stdout)
    before = reports["gen|ref+train"]
    assert after["predictions"] == "calibration:cal.json"
    assert {c["task"] for c in after["tasks"]} == {c["task"] for c in before["tasks"]}
    assert [c["predicted_s"] for c in after["tasks"]] != [c["predicted_s"] for c in before["tasks"]]
    cal = json.loads((tmp_path / "cal.json").read_text())
    assert cal["kind"] == "calibration" and cal["runs"] == ["single"]
    squared_before = sum(r["error_before"] ** 2 for r in cal["residuals"])
    squared_after = sum(r["error_after"] ** 2 for r in cal["residuals"])
    assert squared_after <= squared_before * (1 + 1e-9), (squared_before, squared_after)
