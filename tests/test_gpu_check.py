"""bench/gpu_check.py on a CPU: the tiny model at tiny shapes, measured for real and predicted by the cost
model, so the script's logic is tested here and only its numbers wait for a GPU (issue 5)."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from benchload import load_bench

REPO = Path(__file__).resolve().parent.parent
PROFILE = REPO / "tests" / "calibration" / "data" / "localhost-2cpu.json"
TINY = ["--device", "cpu", "--arch", "tiny", "--batch", "4", "--prompt", "16", "--response", "8",
        "--micro-batch", "2", "--repeats", "2"]  # fmt: skip
MEASURED = ("generation_hf", "inference", "training")


def load_script() -> ModuleType:
    """bench/ is not a package: load the script as a module (registered first: its dataclasses look it up)."""
    return load_bench("gpu_check")


def assert_measured_and_predicted(result: dict) -> None:
    for name in MEASURED:
        check = result["checks"][name]
        assert check["status"] == "ok", check.get("reason")
        measured, predicted = check["measured_s"], check["predicted_s"]
        assert math.isfinite(measured) and measured > 0
        assert math.isfinite(predicted) and predicted > 0
        assert check["error"] == pytest.approx((predicted - measured) / measured)
        assert check["terms"]["compute"] > 0
    if importlib.util.find_spec("vllm") is None:
        assert result["checks"]["generation_vllm"]["status"] == "skipped"


def test_measures_three_checks_against_a_given_profile(tmp_path: Path) -> None:
    result = load_script().main([*TINY, "--profile", str(PROFILE), "--out", str(tmp_path)])
    assert_measured_and_predicted(result)
    assert result["architecture"] == {"name": "tiny", "params": 345216}
    training = result["checks"]["training"]
    phases = ("old_logprobs_s", "forward_backward_s", "optimizer_s")
    floor = ("forward_per_layer_s", "forward_backward_per_layer_s")
    assert set(training["detail"]) == {*phases, *floor}  # on a CPU: no kernel time, launch time or peaks
    assert training["measured_s"] >= sum(training["detail"][k] for k in phases) * 0.99
    assert 0 < training["detail"]["forward_per_layer_s"] < training["detail"]["forward_backward_per_layer_s"]
    assert set(result["checks"]["inference"]["detail"]) == {"forward_per_layer_s"}
    assert training["terms"]["optimizer"] > 0
    on_disk = json.loads((tmp_path / "gpu_check.json").read_text())
    assert on_disk["checks"]["training"]["error"] == pytest.approx(training["error"])
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| training step | actor_train |" in table
    assert "| generation, vllm | generation |" in table


@pytest.mark.slow
def test_profiles_this_host_then_repredicts_from_profile_or_bare_probe(tmp_path: Path) -> None:
    """The GPU machine's path: `hetrl profile`'s code on localhost; then --predict-from, also from the bare
    probe's facts (what the script saves where the profile code does not import)."""
    script = load_script()
    run = tmp_path / "run"
    result = script.main([*TINY, "--quick", "--out", str(run)])
    assert_measured_and_predicted(result)
    assert result["profile"]["device"]["id"] == "localhost/0"
    again = script.main(["--predict-from", str(run), "--out", str(tmp_path / "again")])
    for name in MEASURED:
        assert again["checks"][name]["predicted_s"] == pytest.approx(result["checks"][name]["predicted_s"])
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(run / "gpu_check.json", bare)
    (bare / "probe.json").write_text(json.dumps(script.run_probe(quick=True)))
    from_facts = script.main(["--predict-from", str(bare), "--out", str(bare)])
    assert_measured_and_predicted(from_facts)
