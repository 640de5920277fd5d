"""ZeRO-3 for the runtime's trained roles (workload `sharding: zero3`, training tasks with dp > 1): parameters,
gradients and optimizer state partitioned across the task's replicas, over the task's ZeRO group (one rank per
replica with equal stage and TP index: `layout.TaskLayout.zero_group`; TP and PP run inside each replica as
without sharding).

What a rank holds between uses. A shard's parameters form *units*: each decoder layer of its stage, the rest of
the shard (embedding, final norm, head) as the root unit, and with PP a tied embedding/head (held by the first
and the last stage) as a unit of its own. A unit's parameters are laid back to back in one flat buffer of
dp x ceil(numel / dp) elements; a rank keeps its chunk of it (`Unit.local`, the workload's dtype), that chunk's
gradient, and the optimizer state of the chunk (fp32 master weights and moments under mixed precision, as
sharding.with_master_weights keeps them). That is costmodel.memory.train_state_bytes' zero3 figure: weights,
gradients and optimizer state each / dp (tests/runtime/test_precision.py measures it per rank).

When they are used (the pattern of DeepSpeed ZeRO-3 and FSDP):
- a decoder layer is all-gathered into its flat buffer by a forward pre-hook and freed by a forward post-hook
  (the buffer's storage is resized to 0, so the views autograd saved for the backward free their memory too);
  when the gradient of its output arrives in the backward it is gathered again into the same storage, and once
  every parameter of the layer has its gradient (post-accumulate-grad hooks) the gradients are reduce-scattered
  into the chunk's gradient and freed: a layer's full weights and gradients exist only while it computes.
- the root unit is gathered for a whole pass over the micro-batches (the LM head runs in chunks whose number
  differs per rank: runtime/logprobs.py) and its gradient reduce-scattered once, after the last backward.
- replicated KV heads (TP > KV heads) sum their gradients over the TP group before the reduce-scatter; a tied
  embedding/head with PP sums its chunk over the task's DP group (the first and the last stage) afterwards.

Uneven batch shares. Every gather is a collective over the ZeRO group, so each rank runs the same number of
micro-batches in a pass: replicas with fewer sequences add dummy micro-batches (two tokens; the loss is 0 x the
output, so their gradients are exactly zero), the count agreed by one MAX all-reduce at the start of the pass.
Losses stay token sums over the step's global token count, so the reduce-scattered sums are exactly the
full-batch gradient, whatever the shares (tests/runtime/test_sharding.py: one process on the full batch).

Why hand-written and not FSDP2 `fully_shard` (checked: it runs on gloo with torch 2.13), as issue 21 allows where
heterogeneity needs it:
- uneven shares: FSDP2's gathers are per forward too, so the padding above would be needed anyway; the rest of
  the runtime's parallelism is hand-written for uneven layouts (Megatron-style TP with replicated KV heads summed
  over TP, a tied head summed across PP stages, canonical full-model names for weight syncs and checkpoints), and
  FSDP2's DTensor parameters would need all of it rewritten;
- precision: `MixedPrecisionPolicy` keeps the sharded parameters and their gradients in fp32 (4 + 4 bytes) and
  casts per use, where the runtime and the cost model hold bf16 weights and gradients and the fp32 masters in
  the optimizer state (2 + 2 + 12), as ZeRO-1/2 shard them;
- offload: `CPUOffloadPolicy` moves parameters, gradients and optimizer state and steps on the CPU; a training
  placement's `offload` is its optimizer state only (costmodel.memory.resident_bytes_per_param), which
  sharding.Offload moves (the chunks' masters and moments).
Collectives are all_gather_single / reduce_scatter_single (gloo and NCCL both run them).

Reading the state (checkpoints, weight sync): `full_weights()` and `full_optimizer_state()` keep Shard's results
(canonical names, full shapes, the replica's leader; masters under "master") but are collective over every rank
of the task, not only the replica: every replica's ranks must call them together. `load_full` and
`load_optimizer_state` take the same full tensors and keep this rank's chunk (no collective).

This module imports torch at the top: only worker processes and tests import it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor, nn

from hetrl_cli.runtime.parallel import Shard, pipeline_forward, pipeline_train


def _all_gather(out: Tensor, chunk: Tensor, group: Any) -> None:
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, chunk, group=group)


def _reduce_scatter(out: Tensor, flat: Tensor, group: Any) -> None:
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, flat, group=group)


@dataclass(eq=False)
class Unit:
    """Parameters gathered and reduce-scattered together, back to back in one flat buffer (`flat`, whose storage
    is empty while released); `local` is this rank's chunk, the parameter the optimizer steps."""

    names: list[str]
    params: list[nn.Parameter]
    offsets: list[int]
    chunk: int
    flat: Tensor
    local: nn.Parameter
    layer: bool
    users: int = 0
    ready: int = 0
    """Parameters of a layer whose gradient the running backward has accumulated."""

    def segments(self) -> Iterator[tuple[str, nn.Parameter, int]]:
        yield from zip(self.names, self.params, self.offsets, strict=True)


class ChunkSource(Protocol):
    """Fills a unit's chunk (`unit.local`) from somewhere other than full parameters (runtime/zero3load.py)."""

    dtype: torch.dtype
    device: str

    def fill(self, unit: Unit, ranges: Iterable[tuple[str, int, int]], base: int) -> None:
        """`ranges`: (name, lo, hi) chunk positions holding parameter `name`'s flat elements from
        lo + base - its offset in the unit."""


@dataclass
class _Dummy:
    """A micro-batch that only keeps a replica in step with the ZeRO group (its loss is 0 x the output)."""

    input_ids: Tensor
    attention_mask: Tensor


@dataclass(eq=False)
class Zero3Shard(Shard):
    """A Shard whose parameters live as ZeRO-3 chunks between uses (module docstring)."""

    zero: Any = None
    units: list[Unit] = field(default_factory=list)
    index: int = 0
    """This rank's chunk: its rank in the ZeRO group."""

    @classmethod
    def of(cls, shard: Shard, zero: Any, source: ChunkSource | None = None) -> Zero3Shard:
        """`shard` (cast to the workload's dtype) partitioned over `zero.group` (sharding.Zero, active). With
        `source`, `shard`'s parameters are on the meta device and each chunk is filled by `source` instead (a
        checkpoint read for this rank's chunks only: runtime/zero3load.py)."""
        out = cls(**{f.name: getattr(shard, f.name) for f in fields(Shard)}, zero=zero)
        out.index = dist.get_rank(zero.group)
        out._build_units(source)
        return out

    # layout ------------------------------------------------------------------------------------------
    def tied_name(self) -> str | None:
        """The canonical name of a parameter both the first and the last pipeline stage hold (a tied head)."""
        if len(self.stage_names) < 2:
            return None
        return next(iter(sorted(self.stage_names[0] & self.stage_names[-1])), None)

    def _build_units(self, source: ChunkSource | None = None) -> None:
        names = {id(p): n for n, p in self.held}
        tied = self.tied_name()
        in_layers: set[int] = set()
        for layer in self.model.model.layers:
            named = [(names[id(p)], p) for p in layer.parameters()]
            in_layers.update(id(p) for _, p in named)
            self._hook(layer, self._unit(named, layer=True, source=source))
        rest = [(n, p) for n, p in self.held if id(p) not in in_layers]
        for group in ([(n, p) for n, p in rest if n != tied], [(n, p) for n, p in rest if n == tied]):
            if group:
                self._unit(group, layer=False, source=source)

    def _unit(self, named: list[tuple[str, nn.Parameter]], layer: bool, source: ChunkSource | None = None) -> Unit:
        size = self.zero.size
        total = sum(p.numel() for _, p in named)
        chunk = -(-total // size)
        first = named[0][1]
        dtype, device = (first.dtype, first.device) if source is None else (source.dtype, source.device)
        # from a source the full buffer is never written here: torch.empty leaves its pages untouched (not resident)
        flat = (torch.zeros if source is None else torch.empty)(chunk * size, dtype=dtype, device=device)
        offsets, offset = [], 0
        for _, p in named:
            if source is None:
                flat[offset : offset + p.numel()].copy_(p.detach().reshape(-1))
            offsets.append(offset)
            offset += p.numel()
        mine = slice(self.index * chunk, (self.index + 1) * chunk)
        local = nn.Parameter(flat[mine].clone() if source is None else torch.zeros(chunk, dtype=dtype, device=device))
        for (_, p), start in zip(named, offsets, strict=True):
            view = flat[start : start + p.numel()].view(p.shape)
            if source is not None:  # a meta parameter: made a real (empty) one first, the same object (ties kept)
                torch.utils.swap_tensors(p, nn.Parameter(flat.new_empty(0), requires_grad=p.requires_grad))
            p.data = view  # `.data =` keeps the parameter's own version counter: gathers write into `flat` in place
        unit = Unit([n for n, _ in named], [p for _, p in named], offsets, chunk, flat, local, layer)
        self.units.append(unit)
        _free(unit)
        if source is not None:
            source.fill(unit, self._my_ranges(unit), self.index * unit.chunk)
        return unit

    def local_params(self) -> list[nn.Parameter]:
        """The chunks the optimizer steps, one per unit."""
        return [unit.local for unit in self.units]

    def local_masters(self, masters: list[Tensor]) -> list[Tensor]:
        """This rank's chunks of fp32 master weights given in `held` order (mixed precision)."""
        by_name = {name: m for (name, _), m in zip(self.held, masters, strict=True)}
        return [self._chunk_of(unit, by_name, torch.zeros(unit.chunk, dtype=torch.float32, device=unit.local.device))
                for unit in self.units]  # fmt: skip

    # gather / free -----------------------------------------------------------------------------------
    def _acquire(self, unit: Unit) -> None:
        if unit.users == 0:
            flat = unit.flat
            flat.untyped_storage().resize_(flat.numel() * flat.element_size())
            _all_gather(flat, unit.local.detach(), self.zero.group)
        unit.users += 1

    def _release(self, unit: Unit) -> None:
        unit.users -= 1
        if unit.users == 0:
            _free(unit)

    def _hook(self, layer: nn.Module, unit: Unit) -> None:
        def before(_module: nn.Module, _args: Any) -> None:
            self._acquire(unit)

        def after(_module: nn.Module, _args: Any, out: Any) -> None:
            tensor = out[0] if isinstance(out, tuple) else out
            if torch.is_grad_enabled() and isinstance(tensor, Tensor) and tensor.requires_grad:
                tensor.register_hook(lambda _grad: self._acquire(unit))  # gathered again for its backward
            self._release(unit)

        def accumulated(_param: Tensor) -> None:
            unit.ready += 1
            if unit.ready == len(unit.params):
                unit.ready = 0
                self._sum_shared_kv(set(unit.names))
                self._scatter_grads(unit)
                self._release(unit)

        layer.register_forward_pre_hook(before)
        layer.register_forward_hook(after)
        for p in unit.params:
            p.register_post_accumulate_grad_hook(accumulated)

    def _sum_shared_kv(self, names: set[str] | None = None) -> None:
        """Replicated KV heads (TP > KV heads) and per-head q/k norms: sum `names`' gradients over TP."""
        pos = self.par.pos
        if pos.tp <= 1:
            return
        held = self.held
        self.held = [(n, p) for n, p in held if names is None or n in names]
        try:
            if pos.tp > self.model.config.num_key_value_heads:
                super()._sum_shared_kv()
            self._sum_head_norms()
        finally:
            self.held = held

    def _scatter_grads(self, unit: Unit) -> None:
        """Reduce-scatter the unit's full gradients (zeros where a parameter has none) into its chunk's gradient."""
        flat = torch.zeros_like(unit.flat, memory_format=torch.contiguous_format)
        for _, p, start in unit.segments():
            if p.grad is not None:
                flat[start : start + p.numel()].copy_(p.grad.reshape(-1))
                p.grad = None
        mine = torch.empty_like(unit.local, memory_format=torch.contiguous_format).detach()
        _reduce_scatter(mine, flat, self.zero.group)
        unit.local.grad = mine if unit.local.grad is None else unit.local.grad.add_(mine)

    @contextmanager
    def passing(self, batches: int) -> Iterator[int]:
        """One pass over micro-batches: the root units gathered for it; -> the micro-batch count every rank of
        the ZeRO group runs (the largest)."""
        count = torch.tensor([batches], dtype=torch.int64, device=self.units[0].flat.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX, group=self.zero.group)
        roots = [unit for unit in self.units if not unit.layer]
        for unit in roots:
            self._acquire(unit)
        try:
            yield int(count.item())
        finally:
            for unit in roots:
                self._release(unit)

    def dummy(self, pad_id: int | None) -> _Dummy:
        device = self.units[0].flat.device
        ids = torch.full((1, 2), pad_id or 0, dtype=torch.long, device=device)
        return _Dummy(ids, torch.ones_like(ids))

    # gradients ---------------------------------------------------------------------------------------
    def reduce_gradients(self, dp_group: Any, dp_size: int) -> None:
        """After the last backward of a pass: the root units' gradients reduce-scattered, every chunk given a
        gradient (zeros where none arrived, so every rank steps every chunk), a tied head's chunk summed
        between the first and the last stage over `dp_group` (every stage and replica of this TP index)."""
        for unit in self.units:
            if unit.ready:
                raise RuntimeError(f"zero3: the backward reached {unit.ready} of {len(unit.params)} parameters "
                                   f"of the layer holding {unit.names[0]}")  # fmt: skip
            if not unit.layer:
                self._scatter_grads(unit)
            if unit.local.grad is None:
                unit.local.grad = torch.zeros_like(unit.local).detach()
        tied = self.tied_name()
        if tied is not None and dp_size > 1:
            self._sum_tied(tied, dp_group)

    def _sum_tied(self, name: str, dp_group: Any) -> None:
        size = self.zero.size
        chunk = -(-_numel(self._local_shape(name)) // size)  # its TP slice: tied vocabulary rows
        held = self.held[0][1]
        rows = torch.zeros((size, chunk), dtype=held.dtype, device=held.device)
        unit = next((u for u in self.units if u.names == [name]), None)
        if unit is not None:
            rows[self.index].copy_(unit.local.grad)
        dist.all_reduce(rows, group=dp_group)
        if unit is not None:
            unit.local.grad.copy_(rows[self.index])

    def clip_grad_norm(self, max_norm: float) -> float:
        """The full model's gradient norm from the chunks (each element once: owned names only), then clipping."""
        device = self.units[0].flat.device
        squares = torch.zeros((), dtype=torch.float64, device=device)
        for unit in self.units:
            grad = unit.local.grad
            if grad is None:
                continue
            for name, lo, hi in self._my_ranges(unit):
                if self.owned(name):
                    squares += grad[lo:hi].to(torch.float64, copy=True).pow_(2).sum()
        dist.all_reduce(squares, group=self.zero.group)
        if self.par.mp_size > 1:
            dist.all_reduce(squares, group=self.par.mp_group)
        norm = float(squares.sqrt())
        coef = min(1.0, max_norm / (norm + 1e-6))
        if coef < 1.0:
            for unit in self.units:
                if unit.local.grad is not None:
                    unit.local.grad.mul_(coef)
        return norm

    def _my_ranges(self, unit: Unit) -> Iterator[tuple[str, int, int]]:
        """(name, lo, hi): the part of each parameter inside this rank's chunk, as chunk positions."""
        base = self.index * unit.chunk
        for name, p, start in unit.segments():
            lo, hi = max(start, base), min(start + p.numel(), base + unit.chunk)
            if hi > lo:
                yield name, lo - base, hi - base

    # full state (weight sync, checkpoints) -----------------------------------------------------------
    def _gathered(self, unit: Unit, chunk: Tensor) -> Tensor:
        out = torch.empty(unit.chunk * self.zero.size, dtype=chunk.dtype, device=chunk.device)
        _all_gather(out, chunk.detach().contiguous(), self.zero.group)
        return out

    def _split(self, unit: Unit, flat: Tensor) -> Iterator[tuple[str, Tensor]]:
        for name, p, start in unit.segments():
            yield name, flat[start : start + p.numel()].view(p.shape)

    def full_weights(self, everyone: bool = False, grads: bool = False) -> list[tuple[str, Tensor]] | None:
        """Shard.full_weights from the chunks: collective over the ZeRO group (every rank of the task) and the
        replica; the full model on each replica's leader (every rank with `everyone`)."""
        tp_rank = self.par.pos.tp_rank
        pieces = []
        for unit in self.units:
            chunk = unit.local.grad if grads else unit.local
            if chunk is None:
                chunk = torch.zeros_like(unit.local)
            flat = self._gathered(unit, chunk)
            pieces.extend((n, tp_rank, t) for n, t in self._split(unit, flat) if self.owned(n))
        return self._full_weights_of(pieces, everyone)

    def full_optimizer_state(self, optimizer: Any) -> dict[str, Any] | None:
        """Shard.full_optimizer_state from the chunks' state (masters, moments): collective over the ZeRO group
        and the replica, the result on the replica's leader."""
        sd = optimizer.state_dict()
        index = {name: i for i, (name, _) in enumerate(self.held)}
        per_param: dict[int, dict[str, Any]] = {}
        for u, unit in enumerate(self.units):
            state = sd["state"].get(u, {})
            for key in sorted(state):
                value = state[key]
                if isinstance(value, Tensor) and value.dim() > 0:
                    for name, part in self._split(unit, self._gathered(unit, value)):
                        per_param.setdefault(index[name], {})[key] = part
                else:
                    for name in unit.names:
                        per_param.setdefault(index[name], {})[key] = value
        return super().full_optimizer_state(_StateDict({"state": per_param, "param_groups": sd["param_groups"]}))

    def _chunk_of(self, unit: Unit, full: dict[str, Tensor], out: Tensor) -> Tensor:
        """`out` (this rank's chunk) with the parts of `full`'s tensors (full or TP-local shapes) that fall in it."""
        for name, lo, hi in self._my_ranges(unit):
            if name in full:
                start = unit.offsets[unit.names.index(name)]
                base = self.index * unit.chunk
                flat = self.piece(name, full[name]).reshape(-1)
                out[lo:hi].copy_(flat[lo + base - start : hi + base - start])
        return out

    def load_full(self, named: Iterable[tuple[str, Tensor]]) -> None:
        """This rank's chunks of full, canonically named tensors, in place (no collective)."""
        full = dict(named)
        with torch.no_grad():
            for unit in self.units:
                self._chunk_of(unit, full, unit.local.data)

    def load_optimizer_state(self, optimizer: Any, full: dict[str, Any]) -> None:
        """The chunks' optimizer state from a full one (Shard.full_optimizer_state's form; no collective)."""
        state: dict[int, dict[str, Any]] = {}
        for u, unit in enumerate(self.units):
            slots = [full["state"].get(name) for name in unit.names]
            if any(slot is None for slot in slots):
                continue
            mine: dict[str, Any] = {}
            for key, value in slots[0].items():
                if isinstance(value, Tensor) and value.dim() > 0:
                    by_name = {name: slot[key] for name, slot in zip(unit.names, slots, strict=True)}
                    mine[key] = self._chunk_of(unit, by_name, torch.zeros(unit.chunk, dtype=value.dtype))
                else:
                    mine[key] = value
            state[u] = mine
        groups = [dict(g, params=list(range(len(self.units)))) for g in full["param_groups"]]
        optimizer.load_state_dict({"state": state, "param_groups": groups})

    def checkpoint_pieces(self, optimizer: Any) -> Iterator[tuple[str, str | None, Tensor, tuple[int, ...]]]:
        """(canonical name, optimizer state key or None for the weight, tensor, offsets in the full tensor): the
        part of every owned parameter, and of its optimizer state, inside this rank's chunks, as boxes of the full
        tensor (a chunk cuts a parameter anywhere: up to 2 x ndim - 1 boxes each). No collective: every rank of
        every replica writes its own, and together they tile each owned tensor once (a sharded checkpoint
        without a gather; runtime/checkpoint.py reads boxes back with Reader.region and load_full /
        load_optimizer_state take this rank's chunk)."""
        state = optimizer.state_dict()["state"]
        for u, unit in enumerate(self.units):
            chunks: list[tuple[str | None, Any]] = [(None, unit.local.detach())]
            chunks += sorted(state.get(u, {}).items())
            for name, lo, hi in self._my_ranges(unit):
                if not self.owned(name):
                    continue
                p = unit.params[unit.names.index(name)]
                start = unit.offsets[unit.names.index(name)] - self.index * unit.chunk
                tp = self._tp_offsets(name, p.dim())
                for key, value in chunks:
                    if isinstance(value, Tensor) and value.dim() == 0:
                        if lo == start and not any(tp):  # once: with the parameter's first element
                            yield name, key, value, ()
                        continue
                    for offsets, sizes in _boxes(tuple(p.shape), lo - start, hi - start):
                        flat = value[start + _flat_index(p.shape, offsets) :][: _numel(sizes)]
                        yield name, key, flat.view(sizes), tuple(a + b for a, b in zip(offsets, tp, strict=True))

    def _tp_offsets(self, name: str, ndim: int) -> tuple[int, ...]:
        offsets = [0] * ndim
        sl = self.slices.get(self.par.pos.tp_rank, {}).get(name)
        if sl is not None:
            offsets[sl[0]] = sl[1]
        return tuple(offsets)


def _flat_index(shape: tuple[int, ...], offsets: tuple[int, ...]) -> int:
    index = 0
    for size, offset in zip(shape, offsets, strict=True):
        index = index * size + offset
    return index


def _boxes(shape: tuple[int, ...], lo: int, hi: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The flat range [lo, hi) of a C-contiguous tensor of `shape` as (offsets, sizes) boxes, each itself a
    contiguous range, in order."""
    if lo >= hi:
        return []
    if len(shape) <= 1:
        return [((lo,), (hi - lo,))] if shape else [((), ())]
    inner = _numel(shape[1:])
    out = []
    row = lo // inner
    if lo % inner:  # the end of a first, partial row
        end = min(hi, (row + 1) * inner)
        out += [((row, *o), (1, *s)) for o, s in _boxes(shape[1:], lo - row * inner, end - row * inner)]
        lo, row = end, row + 1
    last = hi // inner
    if lo < hi and last > row:  # whole rows
        out.append(((row,) + (0,) * (len(shape) - 1), (last - row, *shape[1:])))
        lo = last * inner
    if lo < hi:  # the start of a last, partial row
        out += [((last, *o), (1, *s)) for o, s in _boxes(shape[1:], 0, hi - last * inner)]
    return out


@dataclass
class _StateDict:
    """An optimizer stand-in whose state_dict() is given (Shard.full_optimizer_state reads only that)."""

    sd: dict[str, Any]

    def state_dict(self) -> dict[str, Any]:
        return self.sd


def _free(unit: Unit) -> None:
    unit.flat.untyped_storage().resize_(0)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# --- passes over micro-batches (roles call these for every trained shard) -------------------------------


def forward_passes(shard: Shard, batches: list[Any], head_fn: Callable[[Tensor, int], Any], pad_id: int | None):
    """parallel.pipeline_forward, in step with the ZeRO group under zero3 (dummy micro-batches pad the pass)."""
    if not isinstance(shard, Zero3Shard):
        return pipeline_forward(shard, batches, head_fn)
    real = len(batches)
    with shard.passing(real) as count:
        padded = batches + [shard.dummy(pad_id)] * (count - real)
        outs = pipeline_forward(shard, padded, lambda out, i: head_fn(out, i) if i < real else None)
    return outs[:real]


def train_passes(shard: Shard, batches: list[Any], loss_fn: Callable[[Tensor, int], tuple[Tensor, Any]],
                 pad_id: int | None) -> list[Any]:  # fmt: skip
    """parallel.pipeline_train, in step with the ZeRO group under zero3 (dummy micro-batches add zero gradients)."""
    if not isinstance(shard, Zero3Shard):
        return pipeline_train(shard, batches, loss_fn)
    real = len(batches)

    def loss(out: Tensor, i: int) -> tuple[Tensor, Any]:
        return loss_fn(out, i) if i < real else (out.float().sum() * 0.0, None)

    with shard.passing(real) as count:
        infos = pipeline_train(shard, batches + [shard.dummy(pad_id)] * (count - real), loss)
    return infos[:real]
