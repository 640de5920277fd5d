"""Issue 24: a plan says what it means. Async with generation colocated with actor_train runs as sync, and
bf16 on devices without bf16 arithmetic (V100, T4) runs at their fp32 rate: `plan` warns on stderr, the plan
carries the sentences, `show` prints them (text, markdown, json). Before: PPO async plans read "PPO async"
and bf16 on T4 went without a word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.artifacts.workload import ModelSpec, Workload
from hetrl_cli.planner.api import make_plan
from hetrl_cli.profiling.catalog import profile_from_cluster

from .inprocess import hetrl

LAN = {"bandwidth": "100Gbps", "latency": "0.1ms"}
NET = {"intra_region": LAN, "inter_region": {"default": {"bandwidth": "5Gbps", "latency": "10ms"}}}


def profile(gpus: list[str]):
    groups = [{"gpu": g, "gpus_per_node": 2, "nodes": 1, "region": "r1"} for g in gpus]
    return profile_from_cluster({"name": "mixed", "node_groups": groups, "network": NET})


def ppo(mode: str, precision: str = "bf16") -> Workload:
    small = ModelSpec(arch="qwen3-0.6b")
    return Workload(algorithm="ppo", mode=mode, actor=small, critic=small, precision=precision)


def test_verl_async_on_v100_carries_both_warnings():
    plan = make_plan(profile(["A100 80GB", "V100"]), ppo("async"), solver="verl", budget_s=30)
    async_note, bf16_note = plan.warnings
    assert async_note.startswith("async has no effect: generation shares devices with actor_train")
    assert "bf16 on devices without bf16 arithmetic: 2× Tesla V100-SXM2-32GB (v100-0/0, v100-0/1)" in bf16_note
    assert "precision: fp16" in bf16_note


QUIET = [("sync", "bf16", ["A100 80GB", "L4"]), ("sync", "fp16", ["A100 80GB", "V100"])]


@pytest.mark.parametrize(("mode", "precision", "gpus"), QUIET)
def test_no_warning_where_there_is_nothing_to_say(mode, precision, gpus):
    plan = make_plan(profile(gpus), ppo(mode, precision), solver="verl", budget_s=30)
    assert plan.warnings == []


def test_a_separate_generation_group_has_no_async_warning():
    plan = make_plan(profile(["A100 80GB", "L4"]), ppo("async"), solver="streamrl", budget_s=30)
    assert ("generation",) in [tuple(g.tasks) for g in plan.groups]
    assert plan.warnings == []


def test_plan_warns_on_stderr_and_show_says_it(monkeypatch, capsys, tmp_path: Path):
    cluster = tmp_path / "p.json"
    save_artifact(profile(["A100 80GB", "V100"]), cluster)
    workload = tmp_path / "w.json"
    workload.write_text(ppo("async").model_dump_json())
    out = tmp_path / "plan.json"
    args = ("plan", str(cluster), "-w", str(workload), "--solver", "verl", "-o", str(out))
    code, _, err = hetrl(monkeypatch, capsys, *args)
    assert code == 0
    assert "hetrl: warning: async has no effect: generation shares devices with actor_train" in err
    assert "hetrl: warning: bf16 on devices without bf16 arithmetic: 2× Tesla V100" in err
    code, text, _ = hetrl(monkeypatch, capsys, "show", str(out))
    assert code == 0 and "async has no effect" in " ".join(text.split())
    code, md, _ = hetrl(monkeypatch, capsys, "show", str(out), "--format", "markdown")
    assert code == 0 and "bf16 on devices without bf16 arithmetic" in md
    code, js, _ = hetrl(monkeypatch, capsys, "show", str(out), "--json")
    assert code == 0 and len(json.loads(js)["warnings"]) == 2
