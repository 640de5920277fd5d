"""Generation's host hand-off at TP > 1, as the runtime does it and the cost model prices it
(costmodel/weightsync.py: `WeightSync.handoff_s`; runtime/engines/vllm.py `_send_bucket`, engines/handoff.py).

A vLLM replica's leader receives the actor's weights alone (the registry's `leader_loads`) and hands each bucket
to vLLM's TP workers: at TP 1 by CUDA IPC handles on its own device (no host copy), at TP > 1 through a shared
host file that every worker maps and copies its slice from to its own device. So at TP > 1 every synced byte
crosses device -> host once and each worker's slice host -> device: bytes / HOST_DEVICE_Bps x (1 + 1/TP), after
each bucket arrives. Before, the cost model charged none of it (the hf engine's TP ranks each receive their copy
over links instead: no hand-off). The bucket itself no longer takes a staging copy on the host before the file:
`_share_shm` copies each tensor from its device into the file.
"""

from __future__ import annotations

import pytest
import torch

from hetrl_cli.artifacts.rl import HEAD
from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel.memory import weight_bytes_per_param
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.costmodel.types import GroupPlacement, TaskPlacement

from .conftest import make_profile


def _plan(cm: CostModel, tp: int) -> tuple[list[GroupPlacement], list[TaskPlacement]]:
    """actor_train on a0, generation apart on b0 in replicas of `tp` devices, the rest on a0."""
    gen_devices = tuple(f"b0/{i}" for i in range(4))
    gen = TaskPlacement("generation", tuple((gen_devices[i : i + tp],) for i in range(0, 4, tp)))
    train = TaskPlacement("actor_train", ((("a0/0",),),))
    rest = [TaskPlacement(t, ((("a0/1",),),)) for t in cm.required_tasks if t not in ("actor_train", "generation")]
    groups = [
        GroupPlacement("train", ("actor_train",), ("a0/0",)),
        GroupPlacement("gen", ("generation",), gen_devices),
        GroupPlacement("rest", tuple(p.task for p in rest), ("a0/1",)),
    ]
    return groups, [train, gen, *rest]


@pytest.mark.parametrize("engine", [None, "hf"])
def test_a_tp_engine_pays_the_host_hand_off_only_where_the_runtime_makes_one(engine: str | None) -> None:
    from hetrl_cli.artifacts.workload import paper_workload
    from hetrl_cli.runtime.engines.handoff import pick_mode

    profile = make_profile([("a0", "A100", 2, "r"), ("b0", "A100", 4, "r")])
    cm = CostModel(profile, paper_workload("8b", "grpo", "sync"), engine=engine)
    arch = cm.step.arch["actor_train"]
    nbytes = arch.param_count(HEAD["actor_train"]) * weight_bytes_per_param(cm.workload)
    sync_s = {tp: cm.evaluate(*_plan(cm, tp)).weight_sync_s for tp in (1, 2, 4)}
    for tp in (2, 4):
        # the runtime's path for a CUDA bucket at this TP (out of process): through the host at TP > 1
        host_path = pick_mode(False, cuda_ipc=tp == 1, nbytes=1 << 20, folder="/dev/shm") in ("shm", "pickle")
        assert host_path
        handoff = nbytes / C.HOST_DEVICE_Bps * (1 + 1 / tp) if engine is None else 0.0
        relays_differ = engine == "hf"  # the hf engine's every TP rank receives: other members, other relays
        if not relays_differ:
            assert sync_s[tp] == pytest.approx(sync_s[1] + handoff, rel=1e-9)
    assert pick_mode(False, cuda_ipc=True, nbytes=1 << 20) == "cuda"  # TP 1: on the device, no host copy


def test_the_shared_bucket_takes_each_tensor_once_without_a_staging_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_send_bucket` at TP 2 hands vLLM a SharedBucket whose file holds every byte of the bucket, copied there
    from the tensors themselves (no `.cpu()` staging copy first; on CUDA that copy was a second D2H-sized pass)."""
    from hetrl_cli.runtime.engines import vllm as vllm_engine

    calls: list = []

    class StubLLM:
        def collective_rpc(self, fn):
            calls.append(fn.args[0])

    engine = object.__new__(vllm_engine.VLLMEngine)
    engine.llm, engine.in_process, engine.tp, engine.bucket_paths = StubLLM(), False, 2, {}
    monkeypatch.setenv("HETRL_VLLM_BUCKETS", "shm")
    staged = []
    real_cpu = torch.Tensor.cpu
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: staged.append(self) or real_cpu(self, *a, **k))
    bucket = [("w0", torch.arange(1000, dtype=torch.bfloat16)), ("w1", torch.ones(24, 8, dtype=torch.bfloat16))]
    engine._send_bucket(bucket)
    (shared,) = calls
    assert engine.bucket_paths == {"shm": 1} and shared.kind == "shm"
    assert shared.nbytes >= sum(t.numel() * t.element_size() for _, t in bucket)
    assert staged == []  # before: every tensor of the bucket went through .cpu() first


@pytest.mark.parametrize("keep", [False, True])
def test_a_run_keeps_no_host_copy_of_the_weights_unless_it_verifies_them(
    monkeypatch: pytest.MonkeyPatch, keep: bool
) -> None:
    """VLLMEngine.load_weights kept a host copy of every tensor it loaded (a device-to-host pass of every synced
    byte each sync, and the whole model in host memory) for weights_checksum, which only --verify-weights asks
    for; now the worker builds it with keep_loaded = verify_weights (EngineBuild.keep_loaded), and without it the
    sync moves the bytes the cost model prices and no more."""
    from hetrl_cli.runtime.engines import vllm as vllm_engine

    class StubLLM:
        def collective_rpc(self, fn):
            return None

        def reset_prefix_cache(self):
            return None

    engine = object.__new__(vllm_engine.VLLMEngine)
    engine.llm, engine.in_process, engine.tp, engine.bucket_paths = StubLLM(), True, 2, {}
    engine.tied, engine._weights_asleep, engine._named, engine.keep_loaded = False, False, None, keep
    copied = []
    real_cpu = torch.Tensor.cpu
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: copied.append(self) or real_cpu(self, *a, **k))
    bucket = [("w0", torch.arange(100, dtype=torch.float32)), ("w1", torch.ones(3, 4))]
    engine.load_weights([bucket])
    assert len(copied) == (2 if keep else 0)  # before: 2 (a copy of every tensor) whatever the run asked
    assert (engine.weights_checksum() != "initial") == keep
