"""The actor's weight sync where generation shares actor_train's group: what the runtime moves over links, and
that the cost model charges those copies (costmodel/weightsync.py: `WeightSync.actor_relay`, relayed from the
trainer's leader like the critic's in-group sync, tests/runtime/test_critic_sync.py).

Over real gloo ranks, Worker.sync_actor itself (its groups from `sync_specs` for the engine, the relay chain, a
stand-in trainer and engine whose weights are as many bf16 parameters as the cost model's actor) counts the bytes
every rank receives and the bytes each engine loads; the cost model's actor sync of the same plan names the
devices it relays a copy to and those loading in place. Before: every in-group actor sync was priced as a reshard
in HBM on each device, while a layout other than one-rank replicas on both sides moved whole copies over links.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp

from hetrl_cli.runtime.layout import Layout
from hetrl_cli.runtime.local import free_port

from .conftest import count_received
from .plans import hand_plan, on, replica, tiny_workload

A0, A1, B0, B1 = "a0/0", "a0/1", "b0/0", "b0/1"
ARCH = "tiny"
SYNCS = 2
CASES = {
    # engine, actor_train's replicas, generation's replicas (one group: the same devices)
    "one-rank both (verl-like)": ("hf", [(A0, 0.5), (A1, 0.5)], [(A0, 0.5), (A1, 0.5)]),
    "tp2 beside tp2, hf": ("hf", [replica([[A0, A1]])], [replica([[A0, A1]])]),
    "tp2 beside tp2, vllm": ("vllm", [replica([[A0, A1]])], [replica([[A0, A1]])]),
    "tp2 beside dp2": ("hf", [replica([[A0, A1]])], [(A0, 0.5), (A1, 0.5)]),
    "two hosts": (
        "hf",
        [replica([[A0, A1]], 0.5), replica([[B0, B1]], 0.5)],
        [(A0, 0.25), (A1, 0.25), (B0, 0.25), (B1, 0.25)],
    ),
}


def _plan(case: str):
    _, train, gen = CASES[case]
    workload = tiny_workload(actor={"arch": ARCH}, precision="bf16")
    return hand_plan(workload, on(B0, ["reference", "reward"]) | {"actor_train": train, "generation": gen}, name="x")


def _weights():
    """The actor's weights as the cost model counts them: param_count(head) parameters in tensor_count tensors."""
    import torch

    from hetrl_cli.artifacts.rl import HEAD
    from hetrl_cli.costmodel.architectures import BUILTIN

    arch = BUILTIN[ARCH]
    total, count = arch.param_count(HEAD["actor_train"]), arch.tensor_count(HEAD["actor_train"])
    sizes = [total // count] * (count - 1)
    return [(f"w{i}", torch.full((n,), float(i))) for i, n in enumerate([*sizes, total - sum(sizes)])]


class StandIn:
    """The trainer's full weights (each call a gather) and an engine's bucket loader (its duty)."""

    def __init__(self, weights) -> None:
        self.weights, self.loaded_bytes, self.checksum = weights, 0, None

    def named_weights(self):
        return self.weights

    def load_buckets(self, stream) -> None:
        import hashlib

        digest = hashlib.sha256()
        for bucket in stream:
            self.loaded_bytes += sum(t.numel() * t.element_size() for _, t in bucket)
            for name, t in bucket:  # what the engine holds, bit for bit
                digest.update(name.encode() + t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        self.checksum = digest.hexdigest() if self.loaded_bytes else self.checksum


def _sync_worker(rank: int, port: int, case: str, out: str) -> None:
    import torch.distributed as dist

    from hetrl_cli.runtime import comm
    from hetrl_cli.runtime.weightsync import sync_group, sync_specs
    from hetrl_cli.runtime.worker import Worker

    plan, engine = _plan(case), CASES[case][0]
    layout = Layout.from_plan(plan)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=layout.world_size)
    groups = comm.make_groups(sync_specs(layout, engine, False), 60.0)
    host = lambda r: layout.devices[r].split("/")[0]  # noqa: E731
    counts = count_received(dist, lambda src: host(src) != host(rank))  # [all, from another host]
    train, gen = layout.tasks["actor_train"], layout.tasks["generation"]
    w = SimpleNamespace(rank=rank, layout=layout, groups=groups, channels={}, device="cpu", workload=plan.workload,
                        manifest=SimpleNamespace(verify_weights=False))  # fmt: skip
    w.in_first_replica = lambda task: rank in layout.tasks[task].replicas[0].ranks
    w.actor = StandIn(_weights()) if rank in train.ranks else None
    w.duty = StandIn([]) if rank in gen.ranks else None
    w._sync = lambda *args, **kwargs: sync_group(w, *args, **kwargs)
    for _ in range(SYNCS):
        Worker.sync_actor(w)
    result = {"received": counts[0], "loaded": w.duty.loaded_bytes if w.duty is not None else 0,
              "crossing": counts[1], "checksum": w.duty.checksum if w.duty is not None else None}  # fmt: skip
    Path(out, f"{layout.devices[rank]}.json".replace("/", "_")).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _runtime(tmp_path: Path, case: str) -> dict[str, dict]:
    layout = Layout.from_plan(_plan(case))
    mp.spawn(_sync_worker, args=(free_port(), case, str(tmp_path)), nprocs=layout.world_size, join=True)
    return {d: json.loads((tmp_path / d.replace("/", "_")).with_suffix(".json").read_text()) for d in layout.devices}


def _cost_model(case: str):
    """(the cost model's actor sync: (train devices, inference devices[, in place]), bytes a copy, the model)."""
    from tests.costmodel.conftest import make_profile

    from hetrl_cli.artifacts.rl import HEAD
    from hetrl_cli.costmodel.architectures import BUILTIN
    from hetrl_cli.costmodel.memory import weight_bytes_per_param
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.costmodel.types import GroupPlacement, TaskPlacement

    plan, engine = _plan(case), CASES[case][0]
    cm = CostModel(make_profile([("a0", "A100", 2, "r"), ("b0", "A100", 2, "r")]), plan.workload, engine=engine)
    placements = [
        TaskPlacement(t.task, tuple(tuple(tuple(s) for s in r.stages) for r in t.replicas),
                      tuple(r.batch_share for r in t.replicas), tuple(tuple(r.layer_split) for r in t.replicas))
        for t in plan.tasks
    ]  # fmt: skip
    groups = [GroupPlacement(g.name, tuple(g.tasks), tuple(g.devices)) for g in plan.groups]
    ((_, *sync),) = [s for s in cm.weight_syncs(placements, groups) if s[0] == "actor"]
    return sync, BUILTIN[ARCH].param_count(HEAD["actor_train"]) * weight_bytes_per_param(plan.workload), cm


@pytest.mark.parametrize("case", list(CASES))
def test_the_actor_sync_in_its_group_moves_the_bytes_the_cost_model_charges(tmp_path: Path, case: str) -> None:
    by_device = _runtime(tmp_path, case)
    sync, copy_bytes, cm = _cost_model(case)
    layout = Layout.from_plan(_plan(case))
    leader = layout.devices[layout.tasks["actor_train"].leader]
    gen_devices = {layout.devices[r] for r in layout.tasks["generation"].ranks}
    relayed = {d for d, r in by_device.items() if r["received"]}
    for device, r in by_device.items():  # every byte that crosses a link is one whole copy a step
        assert r["received"] in (0, SYNCS * copy_bytes), device
    parts = cm.weight_sync_parts(*sync[:2], "actor", *sync[2:])
    assert parts is not None
    local_s, remote_s, label, _, _ = parts
    if len(sync) == 2:  # every engine loads in place: a local reshard on the group's devices, nothing relayed
        assert relayed == set() and local_s > 0 and remote_s == 0
        loaders = {d for d, r in by_device.items() if r["loaded"]}
        assert loaders <= gen_devices and leader in loaders
        return
    train, receivers, in_place, *feeders = sync
    assert train[0] == leader  # the cost model relays from the runtime's leader
    assert set(receivers) - set(in_place) == relayed  # ... to the devices the runtime sends a copy over a link
    assert set(in_place) == {d for d in gen_devices if d not in relayed and by_device[d]["loaded"]}
    assert all(by_device[d]["loaded"] == SYNCS * copy_bytes for d in receivers)  # each loads every byte
    links = cm.cluster.links
    fed_from_a0 = not feeders  # b0's replica leader feeds b0 itself where it has one (host_feeds)
    hop = links.between("a0", "b0") if fed_from_a0 and any(d.startswith("b0") for d in relayed) else links.intra("a0")
    assert label == hop.label
    assert copy_bytes / hop.bandwidth_Bps < remote_s <= copy_bytes / hop.bandwidth_Bps + 4 * hop.latency_s


def test_two_hosts_each_replica_leader_feeds_its_own_host_bit_identical(tmp_path: Path) -> None:
    """A group over two hosts, one actor_train replica on each: before, replica 0's leader relayed one full copy
    over the host link every sync (a0 -> b0); now b0's replica leader feeds b0's engines from its own gathered
    replica, so no weight byte crosses a host, and every engine holds exactly replica 0's weights."""
    import hashlib

    from hetrl_cli.runtime.precision import torch_dtype

    by_device = _runtime(tmp_path, "two hosts")
    layout = Layout.from_plan(_plan("two hosts"))
    replicas = [[layout.devices[r] for r in rep.ranks] for rep in layout.tasks["actor_train"].replicas]
    assert {d[:2] for d in replicas[0]} != {d[:2] for d in replicas[1]}  # one replica on each host
    assert all(by_device[d]["crossing"] == 0 for d in by_device)  # before: SYNCS copies into b0
    # every replica holds the same weights (the stand-in's gather on every rank: _sync_worker) ...
    first, second = _weights(), _weights()
    assert all(torch.equal(a, b) and n == m for (n, a), (m, b) in zip(first, second, strict=True))
    # ... and each engine loaded replica 0's, bit for bit, in the workload's precision
    dtype = torch_dtype(_plan("two hosts").workload.precision)
    digest = hashlib.sha256()
    for name, t in first:
        digest.update(name.encode() + t.to(dtype).contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    gen = [layout.devices[r] for r in layout.tasks["generation"].ranks]
    assert {by_device[d]["checksum"] for d in gen} == {digest.hexdigest()}


def test_hosts_without_a_replica_leader_keep_the_relay_from_replica_0() -> None:
    """host_feeds: a receiver on a host with another replica's leader is fed by that leader (a replica wholly on
    the host before one spread over hosts: feed_specs' order); one on replica 0's leader's host or on a host
    with no replica leader stays in replica 0's relay."""
    from hetrl_cli.costmodel.weightsync import host_feeds

    host = lambda d: d.split("/")[0]  # noqa: E731
    feeds = host_feeds(["a/0", "b/0", "b/2"], ["a/1", "b/0", "b/1", "c/0", "c/1"], host)
    assert feeds == {"a/0": ["a/1", "c/0", "c/1"], "b/0": ["b/0", "b/1"]}
    from hetrl_cli.runtime.weightsync import sync_specs

    layout = Layout.from_plan(_plan("two hosts"))
    rank = {d: r for r, d in enumerate(layout.devices)}
    specs = {name: {layout.devices[r] for r in ranks} for name, ranks in sync_specs(layout, "hf", False).items()}
    assert specs == {"sync:actor": {A0, A1}, f"sync:actor@{rank[B0]}": {B0, B1}}  # before: one group of all four
