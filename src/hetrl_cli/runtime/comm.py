"""Process groups and the few collectives the RL step needs, all with the run's collective timeout.

Groups (created once, in a fixed order, by every rank, as torch.distributed requires):
- world: every rank; rollouts are all-gathered here (as tensors, runtime/wire.py) and per-step metrics
  gathered to rank 0 (small pickled reports);
- rest: the ranks of every task after generation; experience (rewards, reference log-probs, values) is
  all-gathered here (as tensors), so async generation ranks are never waited for while training runs;
- dp:<task>:<t>: every rank of TP index t of one task (all replicas, all pipeline stages); gradients are
  all-reduced here (layout.TaskLayout.group_specs);
- mp:<task>:<r>, tp:<task>:<r>:<s>: replica r of a task (gradient norm, weight gathers) and the TP group of its
  stage s (the TP all-reduces), for tasks with tp or pp above 1 (runtime/parallel.py);
- sync:actor / sync:critic: a training leader plus the ranks that run inference with those weights and do not
  hold them in a one-rank training replica of their own; the weights go here in bounded buckets of flat buffers
  in the workload's precision (not one message per tensor, nor the whole model at once), each relayed along a
  chain that crosses each host boundary once (`relay`); sync:actor@<rank> / sync:critic@<rank>: another
  training replica's leader and the receivers on its host, which it feeds itself (weightsync.feed_specs).
Gloo on CPU, NCCL on GPU (with gloo for object collectives).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from torch import Tensor
    from torch.nn import Module

    from hetrl_cli.runtime.engines import Bucket

DEFAULT_COLLECTIVE_TIMEOUT_S = 120.0
"""Rendezvous and every collective give up after this long: a dead peer becomes an error, not a 30-min hang.
It must exceed the longest phase a rank waits through (e.g. a generation-only rank waits for training)."""


@dataclass
class Groups:
    """The process groups of one run, by name; a group of one rank is kept but collectives on it are skipped."""

    world: Any
    members: dict[str, list[int]] = field(default_factory=dict)
    handles: dict[str, Any] = field(default_factory=dict)

    def has(self, name: str, rank: int) -> bool:
        return rank in self.members.get(name, [])

    def size(self, name: str) -> int:
        return len(self.members.get(name, []))

    def get(self, name: str) -> Any:
        return self.handles[name]


def init_world(backend: str, timeout_s: float) -> None:
    """Join the global group from the env:// variables torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
    import torch.distributed as dist

    dist.init_process_group(backend=backend, init_method="env://", timeout=_dt.timedelta(seconds=timeout_s))


def leave_world() -> None:
    """After a finished run every rank meets before any closes its groups, so no rank exits while a peer is still
    in a collective with it. The process must then end through `exit_process`: the groups' gloo threads outlive
    destroy_process_group and abort a normal interpreter teardown."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def exit_process(code: int) -> NoReturn:
    """End a worker process without Python's interpreter teardown, which gloo cannot survive.

    destroy_process_group stops nothing: each gloo group's threads live on until its last reference goes, and
    a thread drops a finished collective's tensors after the caller's wait() returned. A tensor whose Python
    object died meanwhile needs the GIL to be freed; once the interpreter is finalizing, taking the GIL ends
    the thread with pthread_exit, whose unwinding meets a noexcept destructor: std::terminate ("terminate
    called without an active exception"), SIGABRT after the rank wrote `done` (core backtrace:
    ProcessGroupGloo::runLoop -> ~AsyncWork -> TensorImpl::decref_pyobject -> take_gil -> PyThread_exit_thread;
    bench/gloo_exit_race.py reproduces it). So everything a normal exit does for the program runs here, with
    the interpreter intact (non-daemon threads joined, atexit handlers: vLLM's engine shutdown, logging; the
    streams flushed), then the process ends at once with `code`."""
    import atexit
    import threading

    try:
        shutdown = getattr(threading, "_shutdown", None)  # what Py_Finalize runs first: join non-daemon threads
        if shutdown is not None:
            shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def make_groups(specs: dict[str, list[int]], timeout_s: float) -> Groups:
    """Create every named group in sorted-name order (same order on every rank)."""
    import torch.distributed as dist

    groups = Groups(world=dist.group.WORLD)
    for name in sorted(specs):
        ranks = sorted(set(specs[name]))
        groups.members[name] = ranks
        groups.handles[name] = dist.new_group(ranks=ranks, timeout=_dt.timedelta(seconds=timeout_s))
    return groups


def gather_to_zero(obj: Any) -> list[Any] | None:
    """Every rank's `obj` on global rank 0 (None elsewhere): pickled, for the per-step reports (a few hundred
    bytes of timings and sums a rank), never for data that grows with the batch or the model."""
    import torch.distributed as dist

    world = dist.get_world_size()
    if world == 1:
        return [obj]
    out: list[Any] | None = [None] * world if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def allreduce_gradients(
    params: Module | list[tuple[str, Tensor]],
    group: Any,
    size: int,
    layout: list[tuple[str, tuple[int, ...]]] | None = None,
) -> None:
    """Sum gradients over the DP group in one flat buffer (in the gradients' dtype: the workload's precision).

    Each replica back-propagates its token-loss *sum* divided by the global token count, so the sum over
    replicas is exactly the full-batch gradient whatever the (uneven) shares are: no averaging here.
    `params` is a model or (name, parameter) pairs. `layout` ((name, shape) of every parameter any member
    holds) is for members that hold different pieces (pipeline stages): each fills its own slots, zeros
    elsewhere, so one sum adds each layer over the replicas and a tied head to its embedding.
    """
    import torch
    import torch.distributed as dist

    if size == 1:
        return
    named = list(params.named_parameters()) if hasattr(params, "named_parameters") else list(params)
    named = [(n, p) for n, p in named if p.requires_grad]
    for _, p in named:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if layout is None:
        layout = [(n, tuple(p.shape)) for n, p in named]
    mine = {n: p for n, p in named}
    like = named[0][1].grad if named else torch.zeros(())
    flat = torch.cat([mine[n].grad.reshape(-1) if n in mine else like.new_zeros(_numel(shape)) for n, shape in layout])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    offset = 0
    for n, shape in layout:
        count = _numel(shape)
        if n in mine:
            mine[n].grad.copy_(flat[offset : offset + count].view_as(mine[n].grad))
        offset += count


SYNC_CHUNK_BYTES = 1 << 20
"""The relay chain forwards each bucket in chunks of this size, so the hops after the first overlap it."""


class WeightChannel:
    """One weight-sync group. The first transfer sends names, shapes and dtypes, later ones only the weights, as
    buckets of at most `bucket_bytes` (runtime/engines.buckets) of flat buffers in the workload's precision
    (`dtype`, else the weights' own) on `device` (a CUDA rank's GPU: NCCL carries them; the CPU: gloo), each
    relayed along `chain` (global ranks, `src` first; Layout.sync_chain) or, without one, one collective.
    With `wait=False` the source returns while its sends are on the wire (async training goes on; the buffers
    are copies, so training may change the weights); they are waited for before its next transfer or `drain`."""

    def __init__(
        self,
        src: int,
        group: Any,
        size: int,
        chain: list[int] | None = None,
        device: str = "cpu",
        dtype: Any = None,
        bucket_bytes: int | None = None,
    ) -> None:
        from hetrl_cli.runtime.engines import DEFAULT_BUCKET_BYTES

        self.src, self.group, self.size, self.chain = src, group, size, chain
        self.device, self.dtype = device, dtype
        self.bucket_bytes = bucket_bytes or DEFAULT_BUCKET_BYTES
        self.specs: list[tuple[str, tuple[int, ...], str]] | None = None
        self._sending: list[tuple[Tensor, list[Any]]] = []

    def transfer(self, named: Iterable[tuple[str, Tensor]] | None, wait: bool = True) -> list[tuple[str, Tensor]]:
        """Send (on `src`, `named`) or receive the weights; every member returns the whole (name, tensor) list."""
        return [pair for bucket in self.stream(named, wait) for pair in bucket]

    def stream(self, named: Iterable[tuple[str, Tensor]] | None, wait: bool = True) -> Iterator[Bucket]:
        """Send or receive the weights bucket by bucket: each bucket moves when the consumer asks for it (an engine
        loads one before the next is allocated). Every member must consume every bucket, in order."""
        import torch.distributed as dist

        from hetrl_cli.runtime.engines import buckets

        items = [(n, t.detach()) for n, t in named] if named is not None else None
        if self.size == 1:
            assert items is not None
            yield from buckets(items, self.bucket_bytes)
            return
        self.drain()
        if self.specs is None:
            meta = [[(n, tuple(t.shape), str(t.dtype)) for n, t in items]] if items is not None else [None]
            dist.broadcast_object_list(meta, src=self.src, group=self.group)
            self.specs = meta[0]
        tensors = dict(items) if items is not None else None
        tag = 0
        for names in self._bucket_names():
            bucket, tag = self._move_bucket(names, tensors, wait, tag)
            yield bucket

    def _bucket_names(self) -> list[list[tuple[str, tuple[int, ...]]]]:
        """The specs cut into buckets of at most bucket_bytes on the wire (the same cut on every member)."""
        assert self.specs is not None
        size = _wire_dtype(self.specs, self.dtype).itemsize
        out: list[list[tuple[str, tuple[int, ...]]]] = [[]]
        used = 0
        for name, shape, _ in self.specs:
            nbytes = _numel(shape) * size
            if out[-1] and used + nbytes > self.bucket_bytes:
                out.append([])
                used = 0
            out[-1].append((name, shape))
            used += nbytes
        return [b for b in out if b]

    def _move_bucket(
        self, names: list[tuple[str, tuple[int, ...]]], tensors: dict[str, Tensor] | None, wait: bool, tag: int
    ) -> tuple[list[tuple[str, Tensor]], int]:
        """One bucket's flat buffer from the source to every member: its (name, view) pairs and the next free
        relay tag."""
        import torch
        import torch.distributed as dist

        assert self.specs is not None
        dtype = _wire_dtype(self.specs, self.dtype)
        if tensors is not None:
            flat = torch.cat([tensors[n].to(device=self.device, dtype=dtype).reshape(-1) for n, _ in names])
        else:
            flat = torch.empty(sum(_numel(shape) for _, shape in names), dtype=dtype, device=self.device)
        if self.chain is None:
            dist.broadcast(flat, src=self.src, group=self.group)
        else:
            sends = relay(flat, self.chain, self.group, wait=wait, tag_base=tag)
            if sends:
                self._sending.append((flat, sends))
            tag += -(-flat.numel() // max(1, SYNC_CHUNK_BYTES // flat.element_size()))
        out, offset = [], 0
        for name, shape in names:
            n = _numel(shape)
            out.append((name, flat[offset : offset + n].view(shape)))
            offset += n
        return out, tag

    def drain(self) -> None:
        """Wait for the sends a `wait=False` transfer left on the wire."""
        for _, sends in self._sending:
            for work in sends:
                work.wait()
        self._sending = []


def _wire_dtype(specs: list[tuple[str, tuple[int, ...], str]], wanted: Any = None) -> Any:
    """`wanted` (the workload's precision: bf16 moves 2 bytes a parameter, as the cost model's weight sync counts),
    else the weights' own dtype when they share one, else fp32."""
    import torch

    if wanted is not None:
        return wanted
    dtypes = {dtype for _, _, dtype in specs}
    if len(dtypes) == 1:
        found = getattr(torch, next(iter(dtypes)).removeprefix("torch."), None)
        if isinstance(found, torch.dtype) and found.is_floating_point:
            return found
    return torch.float32


def relay(
    flat: Tensor,
    chain: list[int],
    group: Any,
    chunk_bytes: int = SYNC_CHUNK_BYTES,
    wait: bool = True,
    tag_base: int = 0,
) -> list:
    """Pipelined chain broadcast of `flat` from chain[0]: each member receives chunk i from its predecessor
    and forwards it to its successor while chunk i+1 arrives. A collective broadcast sends the root's copy to
    every member (gloo) or over a ring the library picks, so a slow link between regions may carry one copy
    per member behind it; along the chain it carries one. Returns the sends still pending (none if `wait`).
    `tag_base`: the first chunk's tag (successive buckets use disjoint tags)."""
    import torch.distributed as dist

    me = chain.index(dist.get_rank())
    prev = chain[me - 1] if me > 0 else None
    succ = chain[me + 1] if me + 1 < len(chain) else None
    step = max(1, chunk_bytes // flat.element_size())
    chunks = [flat[start : start + step] for start in range(0, flat.numel(), step)]
    # Every receive is posted before the first is waited for: gloo sends a chunk only once its receive is
    # posted, so posting them one at a time cost a round trip per chunk (bench/sync_links.py: 1 MiB chunks over
    # a 40 ms RTT link ran at 1/6 of the link's rate).
    recvs = (
        [dist.irecv(c, src=prev, group=group, tag=t) for t, c in enumerate(chunks, tag_base)]
        if prev is not None
        else []
    )
    sends = []
    for tag, chunk in enumerate(chunks, start=tag_base):
        if recvs:
            recvs[tag - tag_base].wait()
        if succ is not None:
            sends.append(dist.isend(chunk, dst=succ, group=group, tag=tag))
    if wait:
        for work in sends:
            work.wait()
        return []
    return sends


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def barrier(group: Any = None) -> None:
    import torch.distributed as dist

    if dist.get_world_size() > 1:
        dist.barrier(group=group)
