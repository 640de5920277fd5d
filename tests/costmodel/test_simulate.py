import pytest

from hetrl_cli.artifacts.plan import SolverStats
from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.costmodel.types import GroupPlacement, TaskPlacement
from hetrl_cli.errors import BadInput, Infeasible
from hetrl_cli.planner.build import rescore, to_plan

from .conftest import make_profile

HOSTS = [("a0", "A100", 2, "east"), ("l0", "L4", 2, "west")]


def make_plan(profile, workload):
    groups = [
        GroupPlacement("gen", ("generation",), ("l0/0", "l0/1")),
        GroupPlacement("train", ("reference", "actor_train"), ("a0/0", "a0/1")),
    ]
    placements = [
        TaskPlacement("generation", ((("l0/0",),), (("l0/1",),))),
        TaskPlacement("reference", ((("a0/0",),), (("a0/1",),))),
        TaskPlacement("actor_train", ((("a0/0", "a0/1"),),)),
    ]
    cm = CostModel(profile, workload)
    return to_plan(cm, cm.evaluate(groups, placements), groups, SolverStats(solver="manual", status="heuristic"), "p")


def test_rescore_on_slower_link_is_slower(grpo_small) -> None:
    prof = make_profile(HOSTS, wan_between_regions=(5e9 / 8, 0.01))
    plan = make_plan(prof, grpo_small)
    slow = make_profile(HOSTS, wan_between_regions=(0.5e9 / 8, 0.05))
    again = rescore(plan, profile=slow)
    assert again.cost.iteration_s > plan.cost.iteration_s
    assert again.cost.weight_sync_s > 5 * plan.cost.weight_sync_s
    assert again.solver.note == "re-scored on profile test"
    assert [t.replicas for t in again.tasks] == [t.replicas for t in plan.tasks]


def test_rescore_same_inputs_reproduces_prediction(grpo_small) -> None:
    prof = make_profile(HOSTS, wan_between_regions=(5e9 / 8, 0.01))
    plan = make_plan(prof, grpo_small)
    again = rescore(plan, profile=prof)
    assert again.cost.iteration_s == pytest.approx(plan.cost.iteration_s)


def test_rescore_bigger_workload(grpo_small) -> None:
    prof = make_profile(HOSTS, wan_between_regions=(5e9 / 8, 0.01))
    plan = make_plan(prof, grpo_small)
    bigger = grpo_small.model_copy(update={"prompts_per_step": 64, "name": "big"})
    again = rescore(plan, profile=prof, workload=bigger)
    assert again.cost.iteration_s > plan.cost.iteration_s
    assert again.workload.prompts_per_step == 64
    assert "workload big" in again.solver.note


def test_rescore_missing_devices_is_bad_input(grpo_small) -> None:
    prof = make_profile(HOSTS, wan_between_regions=(5e9 / 8, 0.01))
    plan = make_plan(prof, grpo_small)
    smaller = make_profile([("a0", "A100", 2, "east"), ("l0", "L4", 1, "west")])
    with pytest.raises(BadInput, match=r"uses 1 device\(s\) profile 'test' lacks \(first: l0/1\)"):
        rescore(plan, profile=smaller)


def test_rescore_now_infeasible(grpo_small) -> None:
    prof = make_profile(HOSTS, wan_between_regions=(5e9 / 8, 0.01))
    plan = make_plan(prof, grpo_small)
    tiny_memory = make_profile(HOSTS, memory_gb={"A100": 8})
    with pytest.raises(Infeasible, match="does not fit: a0/"):
        rescore(plan, profile=tiny_memory)
    ppo = Workload(algorithm="ppo", actor={"arch": "qwen3-0.6b"}, critic={"arch": "qwen3-0.6b"})
    with pytest.raises(Infeasible, match="task critic_inference is not placed"):
        rescore(plan, profile=prof, workload=ppo)


def test_rescore_without_profile_needs_one(grpo_small, tmp_path, monkeypatch) -> None:
    prof = make_profile(HOSTS)
    plan = make_plan(prof, grpo_small)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadInput, match="pass it with --profile PATH"):
        rescore(plan)
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "test.json").write_text(prof.model_dump_json())
    assert rescore(plan).cost.iteration_s == pytest.approx(plan.cost.iteration_s)
