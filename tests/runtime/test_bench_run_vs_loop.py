"""bench/run_vs_loop.py: its model is the ~2.5M-parameter Qwen2 it says, its plan is what `hetrl run` executes
(one rank, colocated GRPO), and one short round of all three sides writes the results it documents."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRL_PYTHON = REPO / ".venv-bench" / "bin" / "python"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(REPO / "bench"))  # run_vs_loop imports run_overhead beside it
    try:
        spec = importlib.util.spec_from_file_location("run_vs_loop", REPO / "bench" / "run_vs_loop.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(REPO / "bench"))


def test_the_bench_model_and_plan(bench, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.plan import Plan
    from hetrl_cli.runtime.layout import supported

    model_dir = bench.build_model(tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    count = sum(p.numel() for p in model.parameters())
    assert count == bench._parameters() and 2.3e6 < count < 2.7e6
    assert type(model).__name__ == "Qwen2ForCausalLM"
    bench.write_plan(bench.bench_workload(model_dir), tmp_path / "plan.json")
    plan = load_artifact(tmp_path / "plan.json", Plan)
    assert {d for t in plan.tasks for r in t.replicas for d in r.devices} == {"localhost/0"}
    assert set(plan.workload.tasks) == {"generation", "reference", "reward", "actor_train"}
    assert plan.workload.prompts_per_step * plan.workload.responses_per_prompt == 16
    assert not supported(plan, "hf")


@pytest.mark.slow
@pytest.mark.skipif(not TRL_PYTHON.exists(), reason="no .venv-bench (make setup-bench)")
def test_one_round_of_all_three_sides(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    argv = [sys.executable, str(REPO / "bench" / "run_vs_loop.py"), "--rounds", "1", "--steps", "3", "--warmup", "1"]
    result = subprocess.run([*argv, "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert set(data["step_s_median"]) == {"hetrl", "loop", "trl"}
    assert all(v > 0 for v in data["step_s_median"].values())
    assert set(data["ratios"]) == {"hetrl/loop", "hetrl/trl"}
    assert {"generation", "reference", "actor_train"} <= set(data["phase_s_median"]["hetrl"])
    assert {"generation_scoring", "train"} == set(data["phase_s_median"]["trl"])
