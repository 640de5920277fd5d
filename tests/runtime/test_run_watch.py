"""Watching a real `hetrl run`: plain prefixed lines in a pipe, the live panel on a terminal, TensorBoard events,
peak memory per device, a `module:function` reward, and `show`/`validate` of the finished run directory.

One run (3 steps, piped, user reward, TensorBoard on) serves most tests; a second, 2-step run under a pty checks
the live panel. Each costs ~12 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.render.run import parse_step_line
from hetrl_cli.runtime.datasets import load_records, step_records

from .plans import D0, GRPO_TASKS, hand_plan, on, tiny_workload

pytestmark = pytest.mark.slow
HETRL = str(Path(sys.executable).with_name("hetrl"))
STEPS = 3
REWARD_MODULE = '''
def prompt_score(prompt, response, answer):
    """A reward of the prompt and the answer only, so the test can predict it."""
    return len(prompt) / 100 + (0.5 if answer == "a" else 0.0) + 0.0 * len(response)
'''


def expected_reward(workload, step: int) -> float:
    records = step_records(load_records("toy", None, workload.seed), step, workload.prompts_per_step, workload.seed)
    return statistics.fmean(len(r.prompt) / 100 + 0.5 for r in records)


def cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI with both streams piped (what CI and `| tee` give it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TERM")}
    env["COLUMNS"] = "200"
    return subprocess.run([HETRL, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory):
    """(workload, run dir, completed process) of the piped 3-step run with the user reward."""
    tmp = tmp_path_factory.mktemp("watched")
    (tmp / "my_rewards.py").write_text(REWARD_MODULE)
    workload = tiny_workload(reward_rule="my_rewards:prompt_score")
    save_artifact(hand_plan(workload, on(D0, GRPO_TASKS), name="single"), tmp / "plan.json")
    run_dir = tmp / "run"
    result = cli("run", "plan.json", "--steps", str(STEPS), "--run-dir", run_dir, "--engine", "hf",
                       "--allow-user-reward", cwd=tmp)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return workload, run_dir, result


def test_a_piped_run_prints_plain_prefixed_lines(watched) -> None:
    _, run_dir, result = watched
    assert "\x1b[" not in result.stderr  # no live panel, no cursor movement
    rows = [row for line in result.stderr.splitlines() if (row := parse_step_line(line))]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for row, line in zip(rows, metrics(run_dir), strict=True):
        assert row["reward_mean"] == pytest.approx(line["reward_mean"], abs=5e-4)


def test_user_reward_scores_every_step(watched) -> None:
    workload, run_dir, _ = watched
    for line in metrics(run_dir):
        assert line["reward_mean"] == pytest.approx(expected_reward(workload, line["step"]), rel=1e-6)


def test_tensorboard_events_hold_the_reward(watched) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, run_dir, _ = watched
    events = list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    logged = {e.step: e.value for e in acc.Scalars("reward/mean")}
    assert logged == pytest.approx({m["step"]: m["reward_mean"] for m in metrics(run_dir)}, rel=1e-6)
    assert {"time/generation_s", "time/actor_train_s", "memory/localhost/0/peak_bytes"} <= set(acc.Tags()["scalars"])


def test_peak_memory_per_device_reaches_summary_and_validate(watched) -> None:
    _, run_dir, _ = watched
    lines = metrics(run_dir)
    for line in lines:
        assert line["memory_measure"] == {"localhost/0": "rss"}
        peaks = line["peak_memory_bytes"]["localhost/0"]
        assert set(GRPO_TASKS) <= set(peaks)
        assert all(50 * 2**20 < v < 16 * 2**30 for v in peaks.values())  # torch + the tiny model, far below RAM
    top = max(max(m["peak_memory_bytes"]["localhost/0"].values()) for m in lines)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(d["device"], d["peak_bytes"]) for d in summary["memory"]] == [("localhost/0", top)]
    result = cli("validate", run_dir, "--json")
    assert result.returncode == 0, result.stderr
    validation = json.loads(result.stdout)
    assert validation["memory"][0]["peak_bytes"] == top
    assert all(c["peak_memory_bytes"] for c in validation["tasks"] if c["task"] != "weight_sync")
    table = cli("validate", run_dir)
    assert "memory per device: predicted vs peak measured" in table.stdout and "localhost/0" in table.stdout


def test_show_renders_the_real_run(watched) -> None:
    _, run_dir, _ = watched
    result = cli("show", run_dir, "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["status"] == "completed" and data["series"]["reward_mean"] == [
        m["reward_mean"] for m in metrics(run_dir)
    ]
    assert {"seconds.generation", "seconds.actor_train", "weight_sync_s"} <= set(data["series"])


def run_in_pty(argv: list[str], cwd: Path, timeout_s: float) -> tuple[int, str]:
    """Run argv with stdout and stderr on a pseudo-terminal (what a user's shell gives it); -> (code, output)."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR")}
    env.update(TERM="xterm-256color", COLUMNS="150")
    proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return code, b"".join(chunks).decode(errors="replace")


def test_a_terminal_gets_the_live_panel(tmp_path: Path) -> None:
    save_artifact(hand_plan(tiny_workload(), on(D0, GRPO_TASKS), name="single"), tmp_path / "plan.json")
    argv = [HETRL, "run", "plan.json", "--steps", "2", "--run-dir", "live", "--engine", "hf", "--no-tensorboard"]
    code, output = run_in_pty(argv, tmp_path, timeout_s=150)
    assert code == 0, output[-3000:]
    assert "\x1b[" in output  # drawn with terminal control sequences ...
    output = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output)  # ... read here without them
    assert "hetrl run live" in output and "2/2" in output and "per task" in output
    assert "[rank 0] step" not in output  # rank 0's step lines are folded into the panel
    assert "run live: completed, 2 steps" in output
    assert not (tmp_path / "live" / "tensorboard").exists()
    assert len(metrics(tmp_path / "live")) == 2
