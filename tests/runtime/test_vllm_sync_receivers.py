"""The weight sync sends a vLLM TP replica's weights to its leader only (runtime/weightsync.sync_specs): over three
real gloo ranks (the trainer on one device, a TP-2 generation replica on two more), the run's own sync
(`weightsync.sync_group` over the groups `sync_specs` defines, the relay chain, the engines' duties) counts the
bytes every rank receives. With the vllm engine the follower receives none and still records the load (its
duty's version and events move with the leader's); with the hf engine (each TP rank keeps its slices) both TP
ranks receive the whole weights, as every engine's did before. The leader's stand-in engine stands for vLLM
(test_vllm_tp_run.py runs the real one)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp

from hetrl_cli.runtime.layout import Layout
from hetrl_cli.runtime.local import free_port
from hetrl_cli.runtime.weightsync import engine_followers, sync_specs

from .conftest import count_received
from .plans import D0, D1, hand_plan, on, replica, tiny_workload
from .test_vllm_tp_roles import FakeVLLM

D2 = "localhost/2"
WEIGHTS = [(f"w{i}", torch.full((4096 * (i + 1),), float(i))) for i in range(3)]  # fp32: 96 KiB in all
WEIGHT_BYTES = sum(t.numel() * t.element_size() for _, t in WEIGHTS)
SYNCS = 2


def _plan():
    placement = {"generation": [replica([[D1, D2]])]} | on(D0, ["reference", "reward", "actor_train"])
    return hand_plan(tiny_workload(), placement, name="vllm-tp2-apart")


class CountingVLLM(FakeVLLM):
    """FakeVLLM that also counts the bytes of the buckets it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded_bytes = 0

    def load_weights(self, named_buckets) -> None:
        for bucket in named_buckets:
            self.buckets += 1
            self.loaded_bytes += sum(t.numel() * t.element_size() for _, t in bucket)


def _sync_worker(rank: int, port: int, engine_name: str, out: str) -> None:
    import torch.distributed as dist

    from hetrl_cli.runtime import comm
    from hetrl_cli.runtime.engines.duty import EngineDuty
    from hetrl_cli.runtime.engines.vllm_tp import ReplicaFollower, ReplicaLeader
    from hetrl_cli.runtime.weightsync import sync_group

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3)
    plan = _plan()
    layout = Layout.from_plan(plan)
    gen = layout.tasks["generation"].replicas[0]
    groups = comm.make_groups(sync_specs(layout, engine_name) | {"tp:generation:0:0": list(gen.ranks)}, 60.0)
    received = count_received(dist)
    tp_group = groups.get("tp:generation:0:0")
    leader_rank = gen.grid[0][0]
    engine = duty = None
    if rank == leader_rank:
        engine = ReplicaLeader(CountingVLLM(), leader_rank, tp_group)
    elif rank in gen.ranks:
        engine = ReplicaFollower(2, leader_rank, tp_group, "cpu")
    if engine is not None:
        duty = EngineDuty(engine, colocated=False, dtype=torch.float32)
    w = SimpleNamespace(rank=rank, layout=layout, groups=groups, channels={}, device="cpu", workload=plan.workload)
    trainer = rank == layout.tasks["actor_train"].leader
    for _ in range(SYNCS):
        sync_group(w, "actor_train", "generation", None, WEIGHTS if trainer else None,
                   duty.load_buckets if duty is not None else None)  # fmt: skip
    result = {"received": received[0], "role": "trainer" if trainer else engine.describe()["role"]}
    if duty is not None:
        result |= {"version": duty.version, "loads": [e for _, e in duty.events].count("load_weights")}
    if isinstance(engine, ReplicaLeader):
        result["engine_loaded_bytes"] = engine.engine.loaded_bytes
    Path(out, f"rank-{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _run(tmp_path: Path, engine_name: str) -> dict[str, dict]:
    mp.spawn(_sync_worker, args=(free_port(), engine_name, str(tmp_path)), nprocs=3, join=True)
    results = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(3)]
    return {r["role"]: r for r in results}


def test_the_followers_of_a_vllm_replica_are_left_out_of_the_sync_group() -> None:
    layout = Layout.from_plan(_plan())
    gen = layout.tasks["generation"].replicas[0]
    follower = gen.ranks[1]
    assert engine_followers(layout, "vllm") == {follower} and engine_followers(layout, "hf") == set()
    assert follower not in sync_specs(layout, "vllm")["sync:actor"]
    assert sync_specs(layout, "hf")["sync:actor"] == layout.sync_ranks("actor_train", "generation")


@pytest.mark.parametrize("engine_name", ["vllm", "hf"])
def test_bytes_each_rank_receives_in_the_weight_sync(tmp_path: Path, engine_name: str) -> None:
    by_role = _run(tmp_path, engine_name)
    trainer, leader, follower = by_role["trainer"], by_role["leader"], by_role["follower"]
    assert trainer["received"] == 0
    assert leader["received"] == SYNCS * WEIGHT_BYTES
    assert leader["engine_loaded_bytes"] == SYNCS * WEIGHT_BYTES  # the leader hands every byte to vLLM
    # vLLM's follower takes none of them; an hf TP rank needs its slices, so it receives the whole weights
    assert follower["received"] == (0 if engine_name == "vllm" else SYNCS * WEIGHT_BYTES)
    # every rank of the replica records each load, so sleep/wake and the weights version stay in step
    assert leader["version"] == follower["version"] == SYNCS - 1
    assert leader["loads"] == follower["loads"] == SYNCS
