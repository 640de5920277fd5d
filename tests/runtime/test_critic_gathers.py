"""Critic inference in critic_train's group: the cost model charges zero3 gathers exactly where the runtime runs
inference on the trainer's chunks (runtime/worker.py _critic_shared: the same layout, every replica in order under
zero3) and, where the layouts differ, the weights of the copy the runtime then holds, and no gathers.

Each layout pair goes through Worker._critic_shared on both ranks of a two-device world; the critic the worker
would run (the zero3 trainer, DP 2 in a one-rank world with its gathers recorded as test_zero3_comm does, or a copy
of its own) computes a batch's values on a saved model; the cost model's critic_inference estimate beside the
critic_train placement charges the gathers (its `dp_allreduce` term) exactly when they moved bytes.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from hetrl_cli.artifacts.workload import RLSpec, Workload
from hetrl_cli.costmodel.architectures import BUILTIN
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.costmodel.types import TaskPlacement
from hetrl_cli.runtime.layout import ReplicaLayout, TaskLayout
from hetrl_cli.runtime.roles import Critic
from hetrl_cli.runtime.sharding import Zero
from hetrl_cli.runtime.worker import Worker

from .conftest import count_gathers
from .test_distributed import _batch
from .test_loading import _save

DP2 = ((("a0/0",),), (("a0/1",),))
LAYOUTS = {
    "same": (DP2, DP2),
    "replicas swapped": (DP2[::-1], DP2),
    "tp2 beside dp2": (((("a0/0", "a0/1"),),), DP2),
}
"""critic_inference's and critic_train's replicas (device ids by stage) in one group."""


def _runtime_shares(infer, train) -> bool:
    """Worker._critic_shared on every rank of the two-device world (all of them decide the same way)."""
    rank_of = {"a0/0": 0, "a0/1": 1}

    def task(name: str, replicas) -> TaskLayout:
        grids = [tuple(tuple(rank_of[d] for d in stage) for stage in rep) for rep in replicas]
        return TaskLayout(name, tuple(ReplicaLayout(g, (28,), (0, 1)) for g in grids))

    tasks = {"critic_inference": task("critic_inference", infer), "critic_train": task("critic_train", train)}
    decided = set()
    for rank in rank_of.values():
        worker = SimpleNamespace(tasks=set(tasks), layout=SimpleNamespace(tasks=tasks), rank=rank,
                                 params_sharded=lambda t: t == "critic_train")  # fmt: skip
        decided.add(Worker._critic_shared(worker))
    assert len(decided) == 1
    return decided.pop()


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_zero3_critic_inference_gathers_are_charged_where_the_runtime_runs_them(
    case: str, tmp_path: Path, monkeypatch, one_rank_world
) -> None:
    from tests.costmodel.conftest import make_profile

    infer, train = LAYOUTS[case]
    shared = _runtime_shares(infer, train)
    assert shared == (case == "same")
    model_dir = _save(tmp_path / "m", "qwen3", False, vocab_size=400)
    moved = count_gathers(monkeypatch, 2)
    zero = Zero("zero3", one_rank_world, 2, 0) if shared else None  # worker.critic(): the trainer, or a copy
    critic = Critic(model_dir, RLSpec(), "adamw", 1, 1, 3, 0, precision="bf16", zero=zero, frozen=not shared)
    moved.clear()
    critic.values(_batch()[0])
    assert (sum(moved) > 0) == shared

    workload = Workload(actor={"arch": "qwen3-0.6b"}, critic={"arch": "qwen3-0.6b"}, algorithm="ppo",
                        sharding="zero3", prompts_per_step=16, responses_per_prompt=4, max_prompt_tokens=256,
                        max_response_tokens=256, micro_batch=4)  # fmt: skip
    cm = CostModel(make_profile([("a0", "A100", 2, "r")]), workload)
    trainer = TaskPlacement("critic_train", train)
    estimate = cm.task(TaskPlacement("critic_inference", infer), [trainer])
    assert ("dp_allreduce" in estimate.terms) == shared, estimate.terms
    if case == "replicas swapped":  # the same devices and shares: the copy's bf16 weights on each device, no more
        same = cm.task(TaskPlacement("critic_inference", DP2), [trainer])
        weights = BUILTIN["qwen3-0.6b"].param_count("value") * 2
        for device, held in estimate.memory_bytes.items():
            assert held - same.memory_bytes[device] == pytest.approx(weights, rel=1e-6), device
        beside = cm.task(trainer, [TaskPlacement("critic_inference", infer)])  # the trainer sees the copy resident
        alone = cm.task(trainer, [TaskPlacement("critic_inference", DP2)])
        for device, held in beside.memory_bytes.items():
            assert held - alone.memory_bytes[device] == pytest.approx(weights, rel=1e-6), device
