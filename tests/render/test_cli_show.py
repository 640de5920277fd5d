"""`hetrl show` through the real CLI: exit codes and one-line errors, stdin, and plan | show end to end."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import dump_artifact
from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.profile import ClusterProfile

from .inprocess import hetrl

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture
def files(tmp_path: Path, ppo_plan: Plan, baseline_plan: Plan, cluster: ClusterProfile) -> dict[str, Path]:
    paths = {"a": tmp_path / "a.json", "b": tmp_path / "b.json", "profile": tmp_path / "profile.json"}
    for key, artifact in (("a", ppo_plan), ("b", baseline_plan), ("profile", cluster)):
        paths[key].write_text(dump_artifact(artifact))
    return paths


def test_unknown_format_is_exit_2_and_one_line(monkeypatch, capsys, files) -> None:
    code, out, err = hetrl(monkeypatch, capsys, "show", str(files["a"]), "--format", "xml")
    assert code == 2 and out == ""
    assert err == "hetrl: error: unknown format 'xml'; choose one of: table, json, markdown\n"


def test_profile_given_as_plan_is_exit_2_and_one_line(monkeypatch, capsys, files) -> None:
    code, out, err = hetrl(monkeypatch, capsys, "show", str(files["profile"]))
    assert code == 2 and out == ""
    assert err == f"hetrl: error: {files['profile']}: is a 'cluster-profile' artifact, expected 'plan'\n"


def test_compare_with_a_non_plan_is_exit_2(monkeypatch, capsys, files) -> None:
    code, _, err = hetrl(monkeypatch, capsys, "show", str(files["a"]), "--compare", str(files["profile"]))
    assert code == 2 and err.count("\n") == 1 and "expected 'plan'" in err


def test_svg_dash_is_exit_2(monkeypatch, capsys, files) -> None:
    code, out, err = hetrl(monkeypatch, capsys, "show", str(files["a"]), "--svg", "-")
    assert code == 2 and out == "" and err.startswith("hetrl: error: --svg -: give a file path")


def test_show_table_with_profile_and_compare(monkeypatch, capsys, files, tmp_path: Path) -> None:
    svg = tmp_path / "t.svg"
    args = ("show", str(files["a"]), "--profile", str(files["profile"]), "--compare", str(files["b"]))
    code, out, err = hetrl(monkeypatch, capsys, *args, "--svg", str(svg))
    assert code == 0 and "a (lab-ilp) is 2.31× faster than b (lab-verl)" in out
    assert err == f"wrote {svg}\n" and svg.exists()


def test_show_reads_stdin_and_prints_json(files) -> None:
    result = subprocess.run(
        [str(BIN / "hetrl"), "show", "-", "--format", "json"],
        input=files["a"].read_text(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["plan"] == "lab-ilp"


def _planner_ready() -> bool:
    if importlib.util.find_spec("hetrl_cli.planner.api") is None:
        return False
    from hetrl_cli.planner import api

    return hasattr(api, "make_plan") and (ROOT / "profiles" / "paper-single-region.json").exists()


@pytest.mark.skipif(not _planner_ready(), reason="hetrl_cli.planner.api.make_plan or profiles/ not there yet")
@pytest.mark.parametrize("columns", [80, 160])
def test_plan_pipe_show_end_to_end(columns: int) -> None:
    """The README's pipeline through real processes and a shell pipe; every section shows, lines fit."""
    env = {**os.environ, "COLUMNS": str(columns), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        "hetrl plan profiles/paper-single-region.json -o - --budget 5s | hetrl show -",
        shell=True,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    for title in ("workload", "Groups", "Tasks", "Device map", "Iteration timeline", "Peak memory", "Bottleneck:"):
        assert title in result.stdout, title
    assert "\x1b[" not in result.stdout
    assert max(len(line.rstrip()) for line in result.stdout.splitlines()) <= columns


def test_show_without_a_profile_knows_the_cluster_size_from_the_plan(tmp_path) -> None:
    """The single-region ILP plan leaves the 16 L4s idle: without --profile, show still counts all 64."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    argv = ["hetrl", "plan", "profiles/paper-single-region.json", "--solver", "ilp", "--budget", "30s", "-o"]
    made = subprocess.run([*argv, str(tmp_path / "p.json")], cwd=ROOT, env=env, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    shown = subprocess.run(["hetrl", "show", str(tmp_path / "p.json")], env=env, capture_output=True, text=True)
    line = next(x for x in shown.stdout.splitlines() if x.startswith("devices"))
    assert " used of 64 on 8 hosts" in line and "idle" in line
