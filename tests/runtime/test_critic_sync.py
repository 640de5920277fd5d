"""The critic's weight sync sends the trained critic only to the critic_inference ranks that hold a copy of their own
(runtime/weightsync.critic_shared_ranks), and the cost model charges exactly those copies (costmodel/weightsync.py:
`WeightSync.syncs` with `Tasks.critic_receivers`, relayed from the trainer's leader in critic_train's group).

Over real gloo ranks, Worker.sync_critic itself (its groups from `sync_specs`, the relay chain, a stand-in critic
whose weights are as many bf16 parameters as the cost model's critic) counts the bytes every rank receives, the
bytes each copy loads and the leader's full-weight gathers; the cost model's weight syncs of the same plan name the
devices it sends a copy to, at the same bytes a copy. Before the fix, ranks that share the trainer's weights
(same layout, TP 2) received every byte and the cost model charged no sync inside the group.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.multiprocessing as mp

from hetrl_cli.runtime.layout import Layout
from hetrl_cli.runtime.local import free_port

from .conftest import count_received
from .plans import hand_plan, on, replica, tiny_workload

A0, A1, B0, B1 = "a0/0", "a0/1", "b0/0", "b0/1"
ARCH = "tiny"
SYNCS = 2
CASES = {
    # critic_train's replicas, critic_inference's replicas
    "shared tp2": ([replica([[A0, A1]])], [replica([[A0, A1]])]),
    "tp2 beside dp2": ([replica([[A0, A1]])], [(A0, 0.5), (A1, 0.5)]),
    "partly shared, two hosts": (
        [replica([[A0, A1]], 0.5), replica([[B0, B1]], 0.5)],
        [replica([[A0, A1]], 0.5), replica([[B1, B0]], 0.5)],  # TP ranks swapped on b0: a copy of its own
    ),
    "another group": ([(A0, 1.0)], [(A1, 1.0)]),
}


def _plan(case: str):
    train, infer = CASES[case]
    workload = tiny_workload(algorithm="ppo", actor={"arch": ARCH}, critic={"arch": ARCH}, precision="bf16")
    rest = on(A0, ["generation", "reference", "reward", "actor_train"])
    return hand_plan(workload, rest | {"critic_train": train, "critic_inference": infer}, name=case)


def _weights():
    """The critic's weights as the cost model counts them: param_count('value') parameters in tensor_count tensors."""
    import torch

    from hetrl_cli.costmodel.architectures import BUILTIN

    arch = BUILTIN[ARCH]
    total, count = arch.param_count("value"), arch.tensor_count("value")
    sizes = [total // count] * (count - 1)
    return [(f"w{i}", torch.full((n,), float(i))) for i, n in enumerate([*sizes, total - sum(sizes)])]


class StandInCritic:
    """A critic's weight interface: the trainer's full weights (each call a gather), a copy's bucket loader."""

    def __init__(self, weights) -> None:
        self.weights, self.gathers, self.loaded_bytes = weights, 0, 0

    def named_weights(self):
        self.gathers += 1
        return self.weights

    def load_weights(self, bucket) -> None:
        self.loaded_bytes += sum(t.numel() * t.element_size() for _, t in bucket)


def _sync_worker(rank: int, port: int, case: str, out: str) -> None:
    import torch.distributed as dist

    from hetrl_cli.runtime import comm
    from hetrl_cli.runtime.weightsync import sync_group, sync_specs
    from hetrl_cli.runtime.worker import Worker

    plan = _plan(case)
    layout = Layout.from_plan(plan)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=layout.world_size)
    groups = comm.make_groups(sync_specs(layout, "hf", False), 60.0)
    received = count_received(dist)
    train, infer = layout.tasks["critic_train"], layout.tasks["critic_inference"]
    w = SimpleNamespace(rank=rank, layout=layout, groups=groups, channels={}, device="cpu", workload=plan.workload,
                        tasks=layout.tasks_of(rank), params_sharded=lambda task: False)  # fmt: skip
    w.in_first_replica = lambda task: rank in layout.tasks[task].replicas[0].ranks
    w.critic = StandInCritic(_weights()) if rank in train.ranks else None
    w.critic_infer = None
    if rank in infer.ranks:
        w.critic_infer = w.critic if Worker._critic_shared(w) else StandInCritic([])
    w._sync = lambda *args, **kwargs: sync_group(w, *args, **kwargs)
    for _ in range(SYNCS):
        Worker.sync_critic(w)
    copy = w.critic_infer is not None and w.critic_infer is not w.critic
    result = {"received": received[0], "copy": copy, "loaded": w.critic_infer.loaded_bytes if copy else 0,
              "gathers": w.critic.gathers if w.critic is not None else 0}  # fmt: skip
    Path(out, f"{layout.devices[rank]}.json".replace("/", "_")).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _runtime(tmp_path: Path, case: str) -> dict[str, dict]:
    layout = Layout.from_plan(_plan(case))
    mp.spawn(_sync_worker, args=(free_port(), case, str(tmp_path)), nprocs=layout.world_size, join=True)
    return {d: json.loads((tmp_path / d.replace("/", "_")).with_suffix(".json").read_text()) for d in layout.devices}


def _cost_model_copies(case: str) -> tuple[list[tuple], float, object]:
    """(the cost model's critic syncs as (train devices, devices sent a copy), bytes a copy, the model)."""
    from tests.costmodel.conftest import make_profile

    from hetrl_cli.costmodel.architectures import BUILTIN
    from hetrl_cli.costmodel.memory import weight_bytes_per_param
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.costmodel.types import GroupPlacement, TaskPlacement

    plan = _plan(case)
    cm = CostModel(make_profile([("a0", "A100", 2, "r"), ("b0", "A100", 2, "r")]), plan.workload)
    placements = [
        TaskPlacement(t.task, tuple(tuple(tuple(s) for s in r.stages) for r in t.replicas),
                      tuple(r.batch_share for r in t.replicas), tuple(tuple(r.layer_split) for r in t.replicas))
        for t in plan.tasks
    ]  # fmt: skip
    groups = [GroupPlacement(g.name, tuple(g.tasks), tuple(g.devices)) for g in plan.groups]
    syncs = [tuple(sync[1:]) for sync in cm.weight_syncs(placements, groups) if sync[0] == "critic"]
    return syncs, BUILTIN[ARCH].param_count("value") * weight_bytes_per_param(plan.workload), cm


@pytest.mark.parametrize("case", list(CASES))
def test_the_critic_sync_moves_the_bytes_the_cost_model_charges(tmp_path: Path, case: str) -> None:
    by_device = _runtime(tmp_path, case)
    syncs, copy_bytes, cm = _cost_model_copies(case)
    leader = Layout.from_plan(_plan(case)).devices[Layout.from_plan(_plan(case)).tasks["critic_train"].leader]
    if case == "shared tp2":  # inference runs on the trained critic: nothing moves, not even the leader's gather
        assert syncs == []
        assert all(r == {"received": 0, "copy": False, "loaded": 0, "gathers": 0} for r in by_device.values())
        return
    ((train, receivers, *rest),) = syncs
    feeders = rest[1] if rest else ()  # other replicas' leaders feeding their own host (host_feeds)
    assert train[0] == leader  # the cost model relays from the runtime's leader
    for device, r in by_device.items():
        copied = device in receivers
        assert r["copy"] == copied, device  # the cost model's receivers are the ranks holding a copy
        assert r["loaded"] == (SYNCS * copy_bytes if copied else 0), device  # each copy loads every byte
        # a copy crosses a link to every receiver but a sending leader, whose own copy loads in place
        assert r["received"] == (SYNCS * copy_bytes if copied and device not in (leader, *feeders) else 0), device
    assert all(by_device[d]["gathers"] == SYNCS for d in (leader, *feeders))
    local_s, remote_s, label, _, _ = cm.weight_sync_parts(train, receivers, "critic", *rest)
    links = cm.cluster.links
    if case == "tp2 beside dp2":  # the leader's own copy in place, the other over the host's NVLink
        intra = links.intra("a0")
        assert local_s > 0 and label == intra.label
        assert copy_bytes / intra.bandwidth_Bps < remote_s <= copy_bytes / intra.bandwidth_Bps + 3 * intra.latency_s
    elif case.startswith("partly shared"):  # the shared replica takes nothing; b0's own replica feeds b0
        assert feeders == (B0,)  # before: replica 0's leader relayed one copy over the a0-b0 link
        intra = links.intra("b0")
        assert local_s > 0 and label == intra.label
        assert copy_bytes / intra.bandwidth_Bps < remote_s <= copy_bytes / intra.bandwidth_Bps + 3 * intra.latency_s
