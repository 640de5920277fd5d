"""`hetrl run` end to end on one host: real accelerate launch, real gloo process groups, the tiny model.

Each run costs ~10 s (mostly process start-up and imports), so the plans are small and the steps few.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import save_artifact

from .plans import (
    D0,
    D1,
    GRPO_TASKS,
    colocated,
    disaggregated,
    hand_plan,
    interrupt_after_first_step,
    on,
    run_processes,
    tiny_workload,
)

pytestmark = pytest.mark.slow
HETRL = str(Path(sys.executable).with_name("hetrl"))


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def start(hetrl, plan, tmp_path: Path, name: str, *args: str):
    save_artifact(plan, tmp_path / f"{name}.json")
    run_dir = tmp_path / name
    result = hetrl("run", tmp_path / f"{name}.json", "--run-dir", run_dir, "--engine", "hf", *args, cwd=tmp_path)
    return result, run_dir


def assert_completed(result, run_dir: Path, steps: int) -> list[dict]:
    assert result.returncode == 0, result.stderr[-3000:]
    lines = metrics(run_dir)
    assert [m["step"] for m in lines] == list(range(1, steps + 1))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == steps
    assert {"generation", "actor_train", "weight_sync"} <= {t["task"] for t in summary["tasks"]}
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step-{steps:06d}"
    assert run_processes(run_dir) == []
    return lines


def test_grpo_sync_layouts_agree(hetrl, tmp_path: Path) -> None:
    """Single rank, colocated with uneven DP (0.25/0.75) and disaggregated: same prompts, same seeds per
    sequence, same weights -> the same rewards; after each sync the engines hold the trainer's weights."""
    wl = tiny_workload()
    plans = {
        "single": hand_plan(wl, on(D0, GRPO_TASKS), name="single"),
        "colocated": colocated(wl),
        "disaggregated": disaggregated(wl),
    }
    rewards = {}
    for name, plan in plans.items():
        result, run_dir = start(hetrl, plan, tmp_path, name, "--steps", "3", "--verify-weights")
        lines = assert_completed(result, run_dir, 3)
        for m in lines:
            assert m["engine_checksums"] == [m["actor_checksum"]], name
            assert m["response_tokens"] > 0 and m["tokens_per_s"] > 0
            assert set(m["seconds"]) >= {"generation", "reference", "reward", "actor_train"}
        rewards[name] = [m["reward_mean"] for m in lines]
        assert f"step 3/3 reward {lines[-1]['reward_mean']:.3f}" in result.stderr
    assert rewards["colocated"][0] == pytest.approx(rewards["single"][0], abs=1e-6)
    assert rewards["disaggregated"][0] == pytest.approx(rewards["single"][0], abs=1e-6)
    for name in ("colocated", "disaggregated"):
        assert rewards[name][1:] == pytest.approx(rewards["single"][1:], abs=1e-3)


def test_grpo_async_disaggregated(hetrl, tmp_path: Path) -> None:
    result, run_dir = start(hetrl, disaggregated(tiny_workload(mode="async")), tmp_path, "async", "--steps", "4",
                            "--verify-weights")  # fmt: skip
    lines = assert_completed(result, run_dir, 4)
    assert all(m["mode"] == "async" and m["engine_checksums"] == [m["actor_checksum"]] for m in lines)
    assert "generation" not in lines[-1]["seconds"]  # nothing left to generate during the last step


def test_ppo_sync_mixed_placement(hetrl, tmp_path: Path) -> None:
    """PPO with the critic trained on rank 1 but run for inference on rank 0 (a critic weight sync) and the
    actor trained data-parallel over both ranks with uneven shares."""
    wl = tiny_workload(algorithm="ppo")
    placement = on(D0, ["generation", "reward", "critic_inference"]) | on(D1, ["reference", "critic_train"])
    placement["actor_train"] = [(D0, 0.3), (D1, 0.7)]
    result, run_dir = start(hetrl, hand_plan(wl, placement, name="ppo"), tmp_path, "ppo", "--steps", "3",
                            "--verify-weights")  # fmt: skip
    lines = assert_completed(result, run_dir, 3)
    assert all(m["vf_loss"] > 0 and m["engine_checksums"] == [m["actor_checksum"]] for m in lines)
    assert {"critic_inference", "critic_train"} <= set(lines[0]["seconds"])


def test_toy_reward_rises(hetrl, tmp_path: Path) -> None:
    result, run_dir = start(hetrl, hand_plan(tiny_workload(), on(D0, GRPO_TASKS), name="learn"), tmp_path,
                            "learn", "--steps", "30")  # fmt: skip
    rewards = [m["reward_mean"] for m in assert_completed(result, run_dir, 30)]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.3, rewards


def test_killed_worker_stops_the_run_and_resume_continues(tmp_path: Path) -> None:
    plan_file, run_dir = tmp_path / "plan.json", tmp_path / "run"
    save_artifact(disaggregated(tiny_workload()), plan_file)
    args = [HETRL, "run", str(plan_file), "--engine", "hf", "--checkpoint-every", "3"]
    proc = subprocess.Popen([*args, "--steps", "1000", "--run-dir", str(run_dir)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not (run_dir / "metrics.jsonl").exists() or len(metrics(run_dir)) < 7:
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not get to step 7"
            time.sleep(0.2)
        killed_at = time.monotonic()
        os.kill(int((run_dir / "logs" / "rank-1.pid").read_text()), signal.SIGKILL)
        _, stderr = proc.communicate(timeout=30)
        assert time.monotonic() - killed_at < 30
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "rank 1 (device localhost/1) killed by signal 9" in stderr.splitlines()[-1]
    assert run_processes(run_dir) == []
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    step = int(latest.split("-")[1])
    assert step >= 6 and step % 3 == 0
    from hetrl_cli.runtime.checkpoint import read_full_state

    state = read_full_state(run_dir / "checkpoints" / latest, "actor")
    assert {"model", "optimizer"} <= set(state)
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"

    resumed = subprocess.run([*args, "--steps", str(step + 2), "--resume", str(run_dir)], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming after step {step}" in resumed.stderr
    assert [m["step"] for m in metrics(run_dir)] == list(range(1, step + 3))
    assert run_processes(run_dir) == []


def test_run_timeout_stops_every_worker(hetrl, tmp_path: Path) -> None:
    result, run_dir = start(hetrl, disaggregated(tiny_workload()), tmp_path, "slow", "--steps", "100000",
                            "--timeout", "6s")  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == "hetrl: error: run slow: timed out after 6 s (--timeout); workers stopped"
    assert run_processes(run_dir) == []


def test_ctrl_c_stops_every_worker(tmp_path: Path) -> None:
    plan_file, run_dir = tmp_path / "plan.json", tmp_path / "run"
    save_artifact(colocated(tiny_workload()), plan_file)
    returncode, stderr = interrupt_after_first_step(
        [HETRL, "run", str(plan_file), "--engine", "hf", "--steps", "1000", "--run-dir", str(run_dir)], run_dir, 90
    )
    assert returncode == 130
    assert stderr.splitlines()[-1] == "hetrl: error: run run: interrupted (Ctrl-C); every worker stopped"
    assert run_processes(run_dir) == []
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
