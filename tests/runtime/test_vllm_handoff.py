"""engines/handoff.py, the CPU path a weight bucket takes to vLLM's worker processes, without vLLM: the bucket is
written once into a /dev/shm file that another (spawned) process maps, not unpickles; the RPC's pickled payload
is a few hundred bytes instead of the bucket's; the file's name goes after the RPC while the mapping stays
valid; the path is picked as documented (in-process, forced, no room in /dev/shm). The real vLLM workers open it
in test_vllm.py and test_vllm_tp_run.py (greedy equality with transformers after bucketed updates)."""

from __future__ import annotations

import functools
import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from hetrl_cli.runtime.engines import handoff
from hetrl_cli.runtime.engines.handoff import SharedBucket, open_shared, pick_mode, release, share
from hetrl_cli.runtime.engines.vllm import _reload_bucket


def _bucket() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("model.layers.0.self_attn.q_proj.weight", torch.randn(96, 64, generator=g)),
        ("model.layers.0.input_layernorm.weight", torch.randn(7, generator=g).to(torch.bfloat16)),  # odd size
        ("model.norm.weight", torch.randn(0)),
        ("model.embed_tokens.weight", torch.randn(33, 16, generator=g).to(torch.float16)),
    ]


def _worker_side(shared: SharedBucket, ready, release_done, out) -> None:
    """Another process (as vLLM's worker): map the bucket, wait until the leader has removed the file's name,
    then read it and say whether it is a mapping of that file (not a private copy)."""
    opened = open_shared(shared)
    ready.set()
    release_done.wait(60)
    with open("/proc/self/maps") as maps:
        mapped = any(shared.where in line for line in maps)
    out.put(({name: t.float().tolist() for name, t in opened}, [str(t.dtype) for _, t in opened], mapped))


def test_a_shared_bucket_is_mapped_by_another_process_and_outlives_its_name(tmp_path: Path) -> None:
    bucket = _bucket()
    shared = share(bucket, "shm", folder=str(tmp_path))
    assert Path(shared.where).exists() and shared.nbytes >= sum(t.numel() * t.element_size() for _, t in bucket)
    ctx = mp.get_context("spawn")
    ready, release_done, out = ctx.Event(), ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_worker_side, args=(shared, ready, release_done, out))
    child.start()
    try:
        assert ready.wait(120)
        release(shared)  # what the leader does when the RPC returns
        assert not Path(shared.where).exists()
        release_done.set()
        values, dtypes, mapped = out.get(timeout=60)
    finally:
        child.join(60)
    assert child.exitcode == 0
    assert mapped, "the worker's tensors are not a mapping of the leader's file"
    assert dtypes == [str(t.dtype) for _, t in bucket]
    assert values == {name: t.float().tolist() for name, t in bucket}


def test_the_rpc_carries_where_the_bucket_is_not_its_bytes(tmp_path: Path) -> None:
    """vLLM pickles a functools.partial RPC: with the bucket inside it every byte goes into the pickle; with a
    SharedBucket a few hundred bytes do (measured for a 64 MiB bucket in bench/engine_bench.py --vllm-buckets)."""
    bucket = [(f"w{i}", torch.full((256, 1024), float(i))) for i in range(4)]  # 4 MiB
    nbytes = sum(t.numel() * t.element_size() for _, t in bucket)
    shared = share(bucket, "shm", folder=str(tmp_path))
    try:
        inline = len(pickle.dumps(functools.partial(_reload_bucket, bucket), protocol=pickle.HIGHEST_PROTOCOL))
        mapped = len(pickle.dumps(functools.partial(_reload_bucket, shared), protocol=pickle.HIGHEST_PROTOCOL))
    finally:
        release(shared)
    assert inline >= nbytes
    assert mapped < 1024


def test_the_path_a_bucket_takes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HETRL_VLLM_BUCKETS", raising=False)
    assert pick_mode(in_process=True, cuda_ipc=False, nbytes=1) == "inline"
    assert pick_mode(in_process=False, cuda_ipc=True, nbytes=1) == "cuda"
    assert pick_mode(in_process=False, cuda_ipc=False, nbytes=1, folder=str(tmp_path)) == "shm"
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    assert pick_mode(in_process=False, cuda_ipc=False, nbytes=free, folder=str(tmp_path)) == "pickle"  # no room
    assert pick_mode(in_process=False, cuda_ipc=False, nbytes=1, folder=str(tmp_path / "absent")) == "pickle"
    monkeypatch.setenv("HETRL_VLLM_BUCKETS", "pickle")
    assert pick_mode(in_process=False, cuda_ipc=True, nbytes=1) == "pickle"
    monkeypatch.setenv("HETRL_VLLM_BUCKETS", "shm")
    assert pick_mode(in_process=False, cuda_ipc=True, nbytes=1) == "shm"
    monkeypatch.setenv("HETRL_VLLM_BUCKETS", "ipc")
    with pytest.raises(RuntimeError, match="HETRL_VLLM_BUCKETS='ipc' is not a bucket path; unset it or give"):
        pick_mode(in_process=False, cuda_ipc=False, nbytes=1)


def test_a_failed_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(handoff, "_view", boom)
    with pytest.raises(OSError, match="No space left"):
        share(_bucket(), "shm", folder=str(tmp_path))
    assert list(tmp_path.iterdir()) == []
