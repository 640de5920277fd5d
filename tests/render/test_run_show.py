"""`hetrl show runs/ID`: a run directory in every format, a half-finished run, bad directories, and the live
panel of `hetrl run`. The run directories here are written by the runtime's own functions (summarize, RunDir)
from metrics lines shaped like the worker's; tests/runtime/test_run_watch.py shows a real run."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.render.run import LiveState, live_panel, load_run_view, parse_step_line, run_series, sparkline
from hetrl_cli.runtime.rundir import RunDir, summarize

from .inprocess import hetrl

GIB = 2**30
REWARDS = [0.1, 0.2, 0.4, 0.3, 0.8]


def metrics_line(plan: Plan, step: int, reward: float) -> dict:
    """One metrics.jsonl line as merge_reports writes it: every task 1 s slower on step 1 (warm-up)."""
    warm = 1.0 if step == 1 else 0.0
    seconds = {t.task: t.predicted.total_s * 1.5 + warm for t in plan.tasks}
    seconds["rollout_transfer"] = 0.25
    devices = sorted({d for t in plan.tasks for d in t.memory_bytes})
    return {
        "step": step,
        "time": f"2026-01-03T09:00:{step:02d}Z",
        "reward_mean": reward,
        "reward_std": 0.05,
        "kl_ref_k3": 0.001 * step,
        "response_length_mean": 100.0 + step,
        "response_tokens": 1000 * step,
        "seconds": seconds,
        "weight_sync_s": 0.2,
        "step_s": 10.0 + warm,
        "tokens_per_s": 1000 * step / (10.0 + warm),
        "peak_memory_bytes": {
            d: {"generation": 50 * GIB + step, "actor_train": 60 * GIB + i} for i, d in enumerate(devices)
        },
        "memory_measure": {d: "cuda_max_allocated" for d in devices},
    }


def write_run(root: Path, plan: Plan, rewards: list[float], finished: bool = True) -> RunDir:
    run = RunDir(root)
    run.logs.mkdir(parents=True)
    save_artifact(plan, run.plan)
    for step, reward in enumerate(rewards, start=1):
        run.append_metrics(metrics_line(plan, step, reward))
    if finished:
        save_artifact(summarize(plan, root.name, run.read_metrics(), "completed", "2026-01-03T09:00:00Z"), run.summary)
    return run


@pytest.fixture
def run_dir(tmp_path: Path, grpo_plan: Plan) -> Path:
    return write_run(tmp_path / "lab-grpo-1", grpo_plan, REWARDS).root


def test_table_has_sparklines_and_measured_vs_predicted(monkeypatch, capsys, run_dir: Path) -> None:
    code, out, err = hetrl(monkeypatch, capsys, "show", str(run_dir))
    assert code == 0, err
    assert "completed" in out and "5 logged" in out
    reward_row = next(line for line in out.splitlines() if "reward (mean)" in line)
    assert sparkline(REWARDS) == "▁▂▄▃█" and "▁▂▄▃█" in reward_row
    # generation: predicted 5.2 s, measured 7.8 s on every step after warm-up -> -33 %
    gen_row = next(line for line in out.splitlines() if line.strip().startswith("generation") and "%" in line)
    assert "5.2 s" in gen_row and "7.8 s" in gen_row and "-33 %" in gen_row
    assert "48 GiB" in gen_row and "50 GiB" in gen_row  # predicted for generation (52 GB); its measured peak
    assert "a100-0/7" in out and "cuda_max_allocated" in out


def test_json_series_follow_the_metrics_and_keep_the_summary(monkeypatch, capsys, run_dir: Path) -> None:
    code, out, _ = hetrl(monkeypatch, capsys, "show", str(run_dir), "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["status"] == "completed" and data["finished"] is True and data["steps"] == [1, 2, 3, 4, 5]
    assert data["series"]["reward_mean"] == REWARDS
    assert data["series"]["seconds.generation"][1] == pytest.approx(5.2 * 1.5)
    assert "seconds.rollout_transfer" not in data["series"]
    assert data["tokens_per_s"] == pytest.approx(15000 / 51.0)
    memory = {d["device"]: d for d in data["summary"]["memory"]}
    assert memory["a100-0/0"]["predicted_bytes"] == 66 * 10**9 and memory["a100-0/3"]["peak_bytes"] == 60 * GIB + 3


def test_markdown_has_a_table_per_section(monkeypatch, capsys, run_dir: Path) -> None:
    code, out, _ = hetrl(monkeypatch, capsys, "show", str(run_dir), "--format", "markdown")
    assert code == 0
    assert out.startswith("## Run `lab-grpo-1`")
    for title in ("### Over steps 1–5", "### Measured vs predicted", "### Peak memory per device"):
        assert title in out


def test_svg_draws_each_series_and_the_predictions(monkeypatch, capsys, run_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "run.svg"
    code, _, err = hetrl(monkeypatch, capsys, "show", str(run_dir), "--svg", str(target))
    assert code == 0 and err == f"wrote {target}\n"
    root = ET.fromstring(target.read_text())
    ns = "{http://www.w3.org/2000/svg}"
    lines = {p.get("data-key"): p for p in root.iter(f"{ns}polyline")}
    series = run_series(load_run_view(run_dir))
    assert set(lines) == {s.key for s in series}
    assert len(lines["reward_mean"].get("points").split()) == len(REWARDS)
    # the highest reward is drawn highest (smallest y)
    ys = [float(p.split(",")[1]) for p in lines["reward_mean"].get("points").split()]
    assert ys.index(min(ys)) == REWARDS.index(max(REWARDS))
    predicted = [e for e in root.iter(f"{ns}line") if e.get("class") == "predicted"]
    assert len(predicted) == sum(s.predicted is not None for s in series)


def test_half_finished_run_renders_from_its_metrics(monkeypatch, capsys, tmp_path: Path, grpo_plan: Plan) -> None:
    run = write_run(tmp_path / "killed", grpo_plan, REWARDS[:3], finished=False)
    code, out, err = hetrl(monkeypatch, capsys, "show", str(run.root), "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["status"] == "unfinished" and data["finished"] is False
    assert data["series"]["reward_mean"] == REWARDS[:3]
    assert {t["task"] for t in data["summary"]["tasks"]} >= {"generation", "actor_train", "weight_sync"}
    code, out, _ = hetrl(monkeypatch, capsys, "show", str(run.root))
    assert code == 0 and "unfinished: no summary.json yet" in out


def test_run_without_steps_still_renders(monkeypatch, capsys, tmp_path: Path, grpo_plan: Plan) -> None:
    run = write_run(tmp_path / "fresh", grpo_plan, [], finished=False)
    code, out, _ = hetrl(monkeypatch, capsys, "show", str(run.root))
    assert code == 0 and "no completed step yet" in out


def test_directory_that_is_not_a_run_is_exit_2_and_one_line(monkeypatch, capsys, tmp_path: Path) -> None:
    code, out, err = hetrl(monkeypatch, capsys, "show", str(tmp_path))
    assert code == 2 and out == ""
    assert err == (
        f"hetrl: error: {tmp_path}: not a run directory (no plan.json); show takes a plan file or a runs/ID directory\n"
    )


def test_plan_options_with_a_run_directory_are_exit_2(monkeypatch, capsys, run_dir: Path) -> None:
    code, _, err = hetrl(monkeypatch, capsys, "show", str(run_dir), "--compare", str(run_dir / "plan.json"))
    assert code == 2 and err.count("\n") == 1 and "apply to plans" in err
    code, _, err = hetrl(monkeypatch, capsys, "show", str(run_dir), "--format", "xml")
    assert code == 2 and err == "hetrl: error: unknown format 'xml'; choose one of: table, json, markdown\n"


def test_a_plan_still_shows_as_a_plan(monkeypatch, capsys, run_dir: Path) -> None:
    code, out, _ = hetrl(monkeypatch, capsys, "show", str(run_dir / "plan.json"), "--format", "json")
    assert code == 0 and json.loads(out)["plan"] == "lab-grpo"


def render(panel) -> str:
    console = Console(record=True, width=140, force_terminal=False)
    console.print(panel)
    return console.export_text()


def test_live_panel_shows_the_latest_row(grpo_plan: Plan) -> None:
    lines = [metrics_line(grpo_plan, s, r) for s, r in enumerate(REWARDS[:2], start=1)]
    text = render(live_panel(LiveState("lab-grpo-1", total_steps=10, lines=lines, elapsed_s=75.0)))
    assert "hetrl run lab-grpo-1" in text
    assert "2/10" in text and "1m15s elapsed" in text and "about 1m24s left" in text  # 8 steps x 10.5 s
    assert "0.200 ± 0.050" in text and "KL 0.0020" in text and "length 102.0 tokens" in text
    assert "10 s/step" in text and "200 tokens/s" in text
    assert "generation 7.8 s" in text and "actor_train 5.25 s" in text and "weight sync 200 ms" in text
    assert "rollout_transfer" not in text


def test_live_panel_before_the_first_step() -> None:
    text = render(live_panel(LiveState("r", total_steps=3, elapsed_s=4.0)))
    assert "0/3" in text and "starting the workers" in text


def test_step_line_feeds_the_panel_when_metrics_are_elsewhere() -> None:
    row = parse_step_line("[10.0.0.2:22] [rank 0] step 4/9 reward 0.500±0.100 kl 0.0100 len 11.0 | 2.00s: gen 1.20 "
                          "train 0.70 sync 0.050")  # fmt: skip
    assert row is not None
    text = render(live_panel(LiveState("r", total_steps=9, lines=[row], elapsed_s=8.0)))
    assert "4/9" in text and "0.500" in text and "generation 1.2 s" in text and "weight sync 50 ms" in text
