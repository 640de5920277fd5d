"""bench/run_vs_loop.py: its model is the ~2.5M-parameter Qwen2 it says, its plan is what `hetrl run` executes
(one rank, colocated GRPO), and one short round of all three sides writes the results it documents."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchload import bench_module

REPO = Path(__file__).resolve().parents[2]
TRL_PYTHON = REPO / ".venv-bench" / "bin" / "python"


@pytest.fixture(scope="module")
def bench():
    with bench_module("run_vs_loop") as module:  # it imports run_overhead beside it
        yield module


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


def test_the_cpu_clock_makes_perf_counter_count_cpu_seconds(bench, tmp_path: Path) -> None:
    """--cpu-rounds: a child started under the prefix times a 0.5 s sleep as (almost) nothing, a busy loop as
    the CPU it took; the phase timers of every side read time.perf_counter."""
    code = (
        "import time\n"
        "t = time.perf_counter(); time.sleep(0.5); slept = time.perf_counter() - t\n"
        "t, c = time.perf_counter(), time.process_time(); sum(range(3_000_000))\n"
        "print(slept, time.perf_counter() - t, time.process_time() - c)\n"
    )
    out = subprocess.run([*bench.cpu_clock_prefix(tmp_path), sys.executable, "-c", code], capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()  # fmt: skip
    slept, busy, cpu = map(float, out)
    assert slept < 0.05
    assert busy > 0 and abs(busy - cpu) < 0.02


@pytest.mark.slow
@pytest.mark.timeout(1800)  # six runs (a wall round and a CPU-clock round of three sides): ~10 min on a loaded box
@pytest.mark.skipif(not TRL_PYTHON.exists(), reason="no .venv-bench (make setup-bench)")
def test_one_round_of_all_three_sides(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    argv = [sys.executable, str(REPO / "bench" / "run_vs_loop.py"), "--rounds", "1", "--steps", "3", "--warmup", "1",
            "--cpu-rounds", "1"]  # fmt: skip
    result = subprocess.run([*argv, "--out", str(out)], capture_output=True, text=True, timeout=1700)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert set(data["step_s_median"]) == {"hetrl", "loop", "trl"}
    assert all(v > 0 for v in data["step_s_median"].values())
    assert set(data["ratios"]) == {"hetrl/loop", "hetrl/trl"}
    assert {"generation", "reference", "actor_train"} <= set(data["phase_s_median"]["hetrl"])
    assert {"generation_scoring", "train"} == set(data["phase_s_median"]["trl"])
    cpu = data["cpu_clock"]["phase_cpu_s_median"]  # the phases again, timed in CPU seconds
    assert {"generation", "reference", "actor_train", "weight_sync"} <= set(cpu["hetrl"])
    assert {"generation_scoring", "train"} == set(cpu["trl"]) and cpu["loop"]["generation"] > 0


@pytest.mark.slow
def test_the_in_process_phase_comparison_times_both_sides() -> None:
    """bench/run_vs_loop_ab.py: a real Worker and the loop's code, phase by phase, CPU milliseconds."""
    argv = [sys.executable, str(REPO / "bench" / "run_vs_loop_ab.py"), "--reps", "2"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    ms = json.loads(result.stdout[result.stdout.index("{") :])["ms_cpu_median"]
    assert set(ms) == {"generation", "weight_sync", "reference", "actor_train", "report"}
    assert all(ms[p]["hetrl"] > 0 and ms[p]["loop"] > 0 for p in ("generation", "reference", "actor_train"))
    assert set(ms["weight_sync"]) == set(ms["report"]) == {"hetrl"}
