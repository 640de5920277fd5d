"""Plan -> ranks, shares and groups; which plans the runtime refuses, and how `hetrl run` says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.artifacts.workload import ModelSpec
from hetrl_cli.errors import BadInput
from hetrl_cli.runtime.api import RunOptions, check_runnable, run_plan
from hetrl_cli.runtime.layout import Layout, Position, apportion, plan_devices, supported

from .plans import D0, D1, GRPO_TASKS, colocated, disaggregated, hand_plan, on, replica, tiny_workload


@pytest.mark.parametrize(
    ("shares", "total", "expected"),
    [([0.25, 0.75], 16, [4, 12]), ([0.5, 0.5], 3, [2, 1]), ([0.1, 0.9], 4, [0, 4]), ([1.0], 7, [7])],
)
def test_apportion_sums_to_the_total(shares: list[float], total: int, expected: list[int]) -> None:
    assert apportion(shares, total) == expected


def test_ranks_follow_host_order_then_device_index() -> None:
    placement = on("b/1", GRPO_TASKS) | {"generation": [("b/0", 1.0)], "reference": [("a/0", 1.0)]}
    assert plan_devices(hand_plan(tiny_workload(), placement)) == ["b/0", "b/1", "a/0"]


def test_layout_of_a_colocated_uneven_plan() -> None:
    layout = Layout.from_plan(colocated(tiny_workload()))
    actor = layout.tasks["actor_train"]
    assert actor.ranks == (0, 1)
    assert actor.ranges == ((0, 4), (4, 16))
    assert layout.rest_ranks == [0, 1]
    assert not layout.overlaps_generation()
    # rank 1 runs one-rank replicas of both actor_train and generation: it syncs from its own copy
    assert layout.self_synced_ranks("actor_train", "generation") == {0, 1}
    assert layout.sync_ranks("actor_train", "generation") == [0]


def test_layout_of_a_disaggregated_plan() -> None:
    layout = Layout.from_plan(disaggregated(tiny_workload()))
    assert layout.tasks_of(0) == ["generation"]
    assert layout.tasks_of(1) == ["reference", "reward", "actor_train"]
    assert layout.rest_ranks == [1]
    assert layout.overlaps_generation()
    assert layout.self_synced_ranks("actor_train", "generation") == set()
    assert layout.sync_ranks("actor_train", "generation") == [0, 1]


def test_weight_sync_chain_crosses_each_host_boundary_once() -> None:
    """Generation on two east hosts (three devices), training on a west host: the chain starts at the leader,
    enters east once and visits each host's ranks together, whatever their rank numbers."""
    hosts = {"e1/0": 1 / 3, "e2/0": 1 / 3, "e1/1": 1 / 3}
    placement = {"generation": list(hosts.items())} | on("w/0", [t for t in GRPO_TASKS if t != "generation"])
    layout = Layout.from_plan(hand_plan(tiny_workload(), placement))
    assert layout.devices == ("e1/0", "e1/1", "e2/0", "w/0")
    assert layout.sync_chain("actor_train", "generation") == [3, 0, 1, 2]
    # the leader's own host first: its co-located generation ranks before the other hosts
    back = {"generation": [("w/0", 0.5), ("e1/0", 0.5)]} | on("e1/1", [t for t in GRPO_TASKS if t != "generation"])
    layout = Layout.from_plan(hand_plan(tiny_workload(), back))
    leader = layout.tasks["actor_train"].leader
    assert layout.devices[leader] == "e1/1"
    chain = layout.sync_chain("actor_train", "generation")
    assert [layout.devices[r] for r in chain] == ["e1/1", "e1/0", "w/0"]


def _with(plan, task: str, **changes):
    data = plan.model_dump()
    for g in data["groups"]:
        g["devices"] = [D0, D1]
    for t in data["tasks"]:
        if t["task"] == task:
            t.update(changes)
    return type(plan).model_validate(data)


def test_supported_accepts_tp_and_pp_and_refuses_what_does_not_run() -> None:
    wl = tiny_workload()
    base = hand_plan(wl, on(D0, GRPO_TASKS) | {"actor_train": [(D0, 1.0)]})
    tp = _with(base, "actor_train", tp=2, replicas=[{"stages": [[D0, D1]], "batch_share": 1.0, "layer_split": [2]}])
    two_stages = [{"stages": [[D0], [D1]], "batch_share": 1.0, "layer_split": [1, 1]}]
    pp = _with(base, "actor_train", pp=2, replicas=two_stages)
    gen_pp = _with(base, "generation", pp=2, replicas=two_stages)
    gen_tp = _with(base, "generation", tp=2, replicas=[{"stages": [[D0, D1]], "batch_share": 1.0, "layer_split": [2]}])
    assert supported(base) == supported(tp) == supported(pp) == supported(gen_tp) == []
    assert supported(gen_pp) == ["task generation: pp=2 (generation is not pipelined; use tp or dp instead)"]
    assert supported(gen_tp, "vllm") == []  # the replica's leader runs vLLM with TP 2 (engines/vllm_tp.py)
    with pytest.raises(BadInput, match=r"^plan 'hand' cannot run yet: task generation: pp=2 \(generation"):
        check_runnable(gen_pp)


def test_supported_checks_the_tiny_model_shape() -> None:
    base = on(D0, GRPO_TASKS)
    tp4 = hand_plan(tiny_workload(), base | {"reference": [replica([[D0, D1, "localhost/2", "localhost/3"]])]})
    split = hand_plan(tiny_workload(), base | {"reference": [replica([[D0], [D1]], split=[1, 2])]})
    assert supported(tp4) == ["task reference: tp=4 does not divide the tiny model (2 heads, 1 KV heads)"]
    assert supported(split) == ["task reference: a layer split does not sum to the tiny model's 2 layers"]


def test_layout_of_tp_and_uneven_pp_replicas() -> None:
    """actor_train: two replicas, each 2 stages x TP 2 (ranks 0-3 and 4-7), uneven splits; generation TP 2."""
    devices = [f"localhost/{i}" for i in range(8)]
    reps = [replica([devices[0:2], devices[2:4]], 0.25, [1, 3]), replica([devices[4:6], devices[6:8]], 0.75, [3, 1])]
    wl = tiny_workload(actor=ModelSpec(arch="tiny", path="/models/four-layers"))  # workers check its layer count
    plan = hand_plan(wl, {"generation": [replica([devices[0:2]])], "reference": reps, "actor_train": reps})
    layout = Layout.from_plan(plan)
    actor = layout.tasks["actor_train"]
    assert (actor.tp, actor.pp, actor.ranks, actor.ranges) == (2, 2, tuple(range(8)), ((0, 4), (4, 16)))
    assert actor.range_of(3) == (0, 4) and actor.range_of(6) == (4, 16)
    assert actor.position(3) == Position(replica=0, stage=1, tp_rank=1, tp=2, split=(1, 3), prev_rank=1)
    assert actor.position(4) == Position(replica=1, stage=0, tp_rank=0, tp=2, split=(3, 1), next_rank=6)
    assert [actor.position(r).output for r in range(8)] == [False, False, True, False, False, False, True, False]
    assert actor.group_specs() == {
        "dp:actor_train:0": [0, 2, 4, 6], "dp:actor_train:1": [1, 3, 5, 7],
        "mp:actor_train:0": [0, 1, 2, 3], "mp:actor_train:1": [4, 5, 6, 7],
        "tp:actor_train:0:0": [0, 1], "tp:actor_train:0:1": [2, 3],
        "tp:actor_train:1:0": [4, 5], "tp:actor_train:1:1": [6, 7],
    }  # fmt: skip
    assert layout.tasks["generation"].position(1) == Position(replica=0, stage=0, tp_rank=1, tp=2, split=())
    reward = layout.tasks["reward"]  # the rule reward scores once per actor replica, on its output rank
    assert reward.ranks == (2, 6) and reward.ranges == ((0, 4), (4, 16))
    assert layout.sync_ranks("actor_train", "generation") == [0, 1]
    assert supported(plan) == []


def test_multi_host_plans_need_a_hosts_file() -> None:
    plan = hand_plan(tiny_workload(), on("gpu-a/0", GRPO_TASKS) | {"generation": [("gpu-b/0", 1.0)]})
    check_runnable(plan)  # runnable: the shapes are fine, only the way to reach the hosts is missing
    with pytest.raises(BadInput, match=r"spans hosts gpu-b, gpu-a: pass --hosts hosts\.txt"):
        run_plan(plan, RunOptions(steps=1))


def test_hetrl_run_refusals_exit_with_one_line(hetrl, tmp_path: Path) -> None:
    multi = hand_plan(tiny_workload(), on("gpu-a/0", GRPO_TASKS) | {"generation": [("gpu-b/0", 1.0)]}, name="two")
    save_artifact(multi, tmp_path / "multi.json")
    result = hetrl("run", tmp_path / "multi.json", "--run-dir", tmp_path / "r", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "hetrl: error: plan 'two' spans hosts gpu-b, gpu-a: pass --hosts hosts.txt (the file 'hetrl profile' used) "
        "so run can reach them over SSH"
    )
    result = hetrl("run", tmp_path / "multi.json", "--engine", "tpu", cwd=tmp_path)
    assert result.returncode == 2
    assert not (tmp_path / "r").exists()


def test_an_unplaced_rule_reward_runs_on_the_actor_shares() -> None:
    plan = hand_plan(tiny_workload(), on(D0, ["generation", "reference"]) | {"actor_train": [(D0, 0.5), (D1, 0.5)]})
    assert supported(plan) == []
    layout = Layout.from_plan(plan)
    assert layout.tasks["reward"].ranks == (0, 1) and layout.tasks["reward"].ranges == ((0, 8), (8, 16))
    no_ref = hand_plan(tiny_workload(), on(D0, ["generation", "actor_train"]))
    assert supported(no_ref) == ["tasks not placed by the plan: reference"]
