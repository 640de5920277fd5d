"""make_plan and the real CLI: solver choice, infeasible clusters, exit codes, the plan | show pipe."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.errors import BadInput, Infeasible
from hetrl_cli.planner.api import make_plan
from hetrl_cli.planner.baselines import ordered_devices
from hetrl_cli.planner.space import device_classes, groupings
from hetrl_cli.planner.tables import Tables

from .conftest import TINY, cluster, workload

HETRL = str(Path(sys.executable).parent / "hetrl")
FOUR_L4 = [{"gpu": "L4", "gpus_per_node": 4, "nodes": 1, "region": "r1"}]


def test_groupings_are_bell_numbers():
    assert [len(groupings(tuple(f"t{i}" for i in range(n)))) for n in (1, 2, 3, 4, 5)] == [1, 2, 5, 15, 52]


def test_device_classes_merge_interchangeable_hosts():
    profile = cluster(
        "two-a100",
        [
            {"gpu": "A100 80GB", "gpus_per_node": 8, "nodes": 2, "region": "r1"},
            {"gpu": "L4", "gpus_per_node": 8, "nodes": 1, "region": "r2"},
        ],
    )
    classes = device_classes(profile)
    assert sorted((c.name.removeprefix("NVIDIA "), c.n_hosts, c.per_host) for c in classes) == [
        ("A100-SXM4-80GB", 2, 8),
        ("L4", 1, 8),
    ]


def test_too_big_model_is_infeasible_with_the_binding_constraint():
    with pytest.raises(Infeasible) as err:
        make_plan(cluster("four-l4", FOUR_L4), workload("grpo", "sync", "qwen3-32b"), solver="auto", budget_s=10)
    assert str(err.value) == "actor_train of qwen3-32b needs ≥ 23 L4-equivalents of memory; the cluster has 4 GPUs"


def test_task_that_fits_only_on_the_big_device_is_planned_there():
    """actor_train (PPO, Qwen3-0.6B, 16 × 2048-token micro-batches) fits on the A100 but on no layout of the
    A100 + 2 L4 together: the plan puts it on the A100 instead of calling the cluster infeasible. (16: since the
    cost model charges chunked log-probs and no autocast copies, 8-sequence micro-batches fit over all three.)"""
    profile = cluster("1p2", TINY["1p2"])
    w = workload("ppo", "sync").model_copy(update={"micro_batch": 16})
    tables = Tables(CostModel(profile, w), profile, w)
    assert tables.alone("actor_train", ordered_devices(tables)) == []
    plan = make_plan(profile, w, solver="ilp", budget_s=30)
    (train_group,) = [g for g in plan.groups if "actor_train" in g.tasks]
    assert train_group.devices == ["a100-0/0"]


def test_unknown_solver_is_bad_input():
    with pytest.raises(BadInput, match="unknown solver 'magic'"):
        make_plan(cluster("t", TINY["2x2"]), workload("grpo", "sync"), solver="magic", budget_s=10)


def test_auto_says_which_solver_and_why():
    plan = make_plan(cluster("t", TINY["2x2"]), workload("grpo", "sync"), solver="auto", budget_s=30)
    assert plan.solver.solver == "ilp"
    assert plan.solver.note.startswith("auto: ILP")
    assert plan.name == "t-auto"


def test_cli_infeasible_exits_3_with_one_line(tmp_path):
    save_artifact(cluster("four-l4", FOUR_L4), str(tmp_path / "prof.json"))
    (tmp_path / "w.yaml").write_text("algorithm: grpo\nactor: {arch: qwen3-32b}\n")
    run = subprocess.run(
        [HETRL, "plan", "prof.json", "--workload", "w.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 3
    assert run.stdout == ""
    assert run.stderr == (
        "hetrl: error: actor_train of qwen3-32b needs ≥ 23 L4-equivalents of memory; the cluster has 4 GPUs\n"
    )


def test_cli_plan_pipes_into_show(tmp_path):
    pytest.importorskip("hetrl_cli.render.plan").show_plan  # noqa: B018 — `show` ships with the renderer
    save_artifact(cluster("tiny", TINY["2x2"]), str(tmp_path / "prof.json"))
    (tmp_path / "w.yaml").write_text("algorithm: grpo\nactor: {arch: qwen3-0.6b}\n")
    plan = subprocess.run(
        [HETRL, "plan", "prof.json", "-w", "w.yaml", "--solver", "ilp", "-o", "-"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert plan.stdout.lstrip().startswith("{")
    show = subprocess.run([HETRL, "show", "-"], input=plan.stdout, cwd=tmp_path, capture_output=True, text=True)
    assert show.returncode == 0, show.stderr
    assert "ilp" in show.stdout and "optimal" in show.stdout
