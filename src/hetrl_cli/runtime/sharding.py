"""ZeRO sharding, activation recomputation and offload for the runtime's roles (workload `sharding`,
`recompute`, and a placement's `offload`).

- zero1 / zero2: torch's ZeroRedundancyOptimizer over the task's *ZeRO group*: the ranks of the task that hold
  the same parameters in every replica (one rank per replica: equal TP index and, with PP, equal stage; the
  DP group itself when pp = 1). Each rank keeps the optimizer state of its partition of the parameters (whole
  tensors, greedily balanced by size), steps it, and broadcasts the updated parameters to the group. The
  gradient sum stays the runtime's flat all-reduce (exact over uneven shares, see comm.allreduce_gradients),
  so the update equals the unsharded one parameter by parameter. zero2 also frees, after the reduction and
  the clipping (which need the full gradient), the gradients of parameters other ranks step: the
  optimizer-step peak holds only this rank's partition of them. The backward still accumulates full
  gradients (no bucketed reduce-scatter; gloo has none), so zero2's saving is at the step, not during it.
- mixed precision (workload bf16/fp16): `with_master_weights` keeps fp32 master weights in the optimizer state
  next to the moments, so ZeRO shards them with the moments (runtime/precision.py).
- zero3 (parameters and gradients sharded too) is runtime/zero3.py: the optimizer made here steps its chunks,
  unsharded itself (`zero_for` still gives the ZeRO group it partitions over).
- recompute: every decoder layer of a trained shard runs under torch.utils.checkpoint (non-reentrant) when
  gradients are on; its activations are recomputed in the backward. Forward-only passes are unchanged.
- offload: a task's state goes to host memory after its phase and comes back before its next one (training:
  the optimizer state; inference and generation: the weights), as the cost model (costmodel/memory.py)
  counts it. On a CPU device the moves are no-ops, but the same code path runs.

This module imports torch at the top: only worker processes and tests import it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from hetrl_cli.runtime.layout import ZERO_KINDS as SHARDED_KINDS


@dataclass(frozen=True)
class Zero:
    """A training role's ZeRO setting: the kind, its group (handle, size) and the group rank of replica 0's
    member, where the full optimizer state is consolidated for checkpoints."""

    kind: str = "none"
    group: Any = None
    size: int = 1
    root: int = 0

    @property
    def active(self) -> bool:
        """Sharding with one replica shards nothing (as the cost model: ZeRO divides by dp only when dp > 1)."""
        return self.kind in SHARDED_KINDS and self.size > 1


def zero_for(task: Any, rank: int, groups: Any, kind: str) -> Zero:
    """`rank`'s Zero in `task` (layout.TaskLayout) from the groups comm.make_groups made of
    `task.group_specs(zero=True)`; kind "none" (or one replica) shards nothing."""
    if kind not in SHARDED_KINDS or len(task.replicas) == 1:
        return Zero()
    name, first = task.zero_group(rank)
    members = groups.members[name]
    return Zero(kind, groups.get(name), len(members), members.index(first))


def make_optimizer(
    params: list[nn.Parameter],
    kind: str,
    lr: float,
    weight_decay: float,
    zero: Zero | None = None,
    masters: list[torch.Tensor] | None = None,
):
    """The workload's optimizer over `params`, ZeRO-partitioned over `zero.group` when sharding is active.
    `masters` (fp32 copies of low-precision `params`, in order): the optimizer steps fp32 master weights
    (with_master_weights), each rank keeping those of its ZeRO partition only."""
    cls = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}.get(kind, torch.optim.Adam)
    if masters is not None:
        cls = with_master_weights(cls)
        optimizer = _plain_or_zero(cls, params, lr, weight_decay, zero)
        mine = {id(p) for p in local_params(optimizer)}
        inner_optimizer(optimizer).pending = {id(p): m for p, m in zip(params, masters, strict=True) if id(p) in mine}
        return optimizer
    return _plain_or_zero(cls, params, lr, weight_decay, zero)


def _plain_or_zero(cls: type, params: list[nn.Parameter], lr: float, weight_decay: float, zero: Zero | None):
    if zero is None or not zero.active:
        return cls(params, lr=lr, weight_decay=weight_decay)
    return ZeroRedundancyOptimizer(params, optimizer_class=cls, process_group=zero.group, lr=lr,
                                   weight_decay=weight_decay)  # fmt: skip


_MASTER_CLASSES: dict[type, type] = {}


def with_master_weights(cls: type) -> type:
    """`cls` (torch.optim.Adam, AdamW or SGD) over low-precision (bf16/fp16) parameters, stepping fp32 master
    copies of them: mixed precision as the cost model counts it (2-byte weights and gradients, 4-byte master +
    moments in the optimizer state; costmodel/memory.py).

    Each parameter's state holds `master` next to the moments, so ZeRO partitions the masters with them, offload
    moves them, and checkpoints carry them (canonical names, full shapes, TP-sliced like the weights). A step
    swaps each parameter's data and gradient for the master and the gradient in fp32 (divided by `loss_scale`,
    fp16's loss scale), runs `cls`'s own step on them, then writes the master back into the low-precision
    weights. Before its first step a parameter's master is `pending` (the fp32 weights the model was loaded
    with), so the first update starts from the exact fp32 weights, not their rounding."""
    if cls in _MASTER_CLASSES:
        return _MASTER_CLASSES[cls]

    class MasterWeights(cls):  # type: ignore[misc, valid-type]
        loss_scale: float = 1.0
        pending: dict[int, torch.Tensor]

        @torch.no_grad()
        def step(self, closure: Any = None) -> Any:
            swapped = []
            pending = getattr(self, "pending", {})
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    master = self.state[p].pop("master", None)
                    if master is None:
                        master = pending.pop(id(p), None)
                    if master is None:
                        master = p.detach().float()
                    grad = p.grad.float()
                    if self.loss_scale != 1.0:
                        grad.div_(self.loss_scale)
                    swapped.append((p, p.data, p.grad))
                    p.grad = None
                    p.data = master
                    p.grad = grad
            try:
                return super().step(closure)
            finally:
                for p, low, low_grad in swapped:
                    master = p.data
                    p.grad = None
                    low.copy_(master)
                    p.data = low
                    p.grad = low_grad
                    self.state[p]["master"] = master

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            """torch casts floating state to the parameter's dtype on load: keep the masters and moments fp32."""
            super().load_state_dict(state_dict)
            ids = [i for g in state_dict["param_groups"] for i in g["params"]]
            params = [p for g in self.param_groups for p in g["params"]]
            for index, p in zip(ids, params, strict=True):
                for key, value in (state_dict["state"].get(index) or {}).items():
                    if key != "step" and isinstance(value, torch.Tensor) and value.is_floating_point():
                        self.state[p][key] = value.to(p.device, torch.float32, copy=True)
            self.pending = {}

    MasterWeights.__name__ = MasterWeights.__qualname__ = f"MasterWeights{cls.__name__}"
    _MASTER_CLASSES[cls] = MasterWeights
    return MasterWeights


def inner_optimizer(optimizer: Any) -> Any:
    """The optimizer that steps this rank's parameters (ZeRO's local one, or the optimizer itself)."""
    return optimizer.optim if is_sharded(optimizer) else optimizer


def is_sharded(optimizer: Any) -> bool:
    return isinstance(optimizer, ZeroRedundancyOptimizer)


def local_params(optimizer: Any) -> list[nn.Parameter]:
    """The parameters this rank steps: its ZeRO partition, or every parameter when unsharded."""
    inner = optimizer.optim if is_sharded(optimizer) else optimizer
    return [p for group in inner.param_groups for p in group["params"]]


def free_foreign_grads(optimizer: Any) -> int:
    """zero2: drop the gradients of parameters other ranks of the ZeRO group step; -> how many were dropped."""
    if not is_sharded(optimizer):
        return 0
    mine = {id(p) for p in local_params(optimizer)}
    dropped = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in mine and p.grad is not None:
                p.grad = None
                dropped += 1
    return dropped


def consolidate(optimizer: Any, zero: Zero | None) -> None:
    """Collect the full optimizer state on the ZeRO group's root (collective over the group; no-op unsharded)."""
    if zero is not None and is_sharded(optimizer):
        optimizer.consolidate_state_dict(to=zero.root)


# --- recompute ------------------------------------------------------------------------------------


def enable_recompute(layers: Iterable[nn.Module]) -> int:
    """Run each layer under activation checkpointing when gradients are enabled; -> layers wrapped.

    The instance's `forward` is replaced (nn.Module.__call__ looks it up on the instance), so HF decoder layers
    and the TP-sliced ones of parallel.py are covered alike, and no train/eval mode flag is involved (the
    models stay in eval mode: no dropout). Non-reentrant checkpointing takes the layers' keyword arguments.
    """
    from torch.utils.checkpoint import checkpoint

    count = 0
    for layer in layers:
        plain = layer.forward

        def forward(*args: Any, _plain=plain, **kwargs: Any) -> Any:
            if torch.is_grad_enabled():
                return checkpoint(_plain, *args, use_reentrant=False, **kwargs)
            return _plain(*args, **kwargs)

        layer.forward = forward  # type: ignore[method-assign]
        count += 1
    return count


# --- offload --------------------------------------------------------------------------------------


def optimizer_tensors(optimizer: Any) -> list[dict[Any, Any]]:
    """The per-parameter state dicts this rank holds (its partition under ZeRO), and the master weights still
    waiting for their first step (with_master_weights), so offload moves them too."""
    inner = inner_optimizer(optimizer)
    pending = getattr(inner, "pending", None)
    return list(inner.state.values()) + ([pending] if pending else [])


@dataclass
class Offload:
    """Moves one task's state between its device and host memory (`home` = the device, `host` = "cpu").

    `modules` move their parameters and buffers (the Parameter objects stay, so optimizers keep them);
    `optimizers` move their state tensors (0-dim `step` counters stay on the CPU, as torch keeps them).
    `moves` counts the transfers, so tests can see the path ran where home is the CPU and a move is a no-op.
    """

    task: str
    home: str
    modules: tuple[nn.Module, ...] = ()
    optimizers: tuple[Any, ...] = ()
    host: str = "cpu"
    on_device: bool = True
    moves: int = 0

    def to_host(self) -> None:
        if self.on_device:
            self._move(self.host)
            self.on_device = False

    def to_device(self) -> None:
        if not self.on_device:
            self._move(self.home)
            self.on_device = True

    def _move(self, device: str) -> None:
        for module in self.modules:
            module.to(device)
        for optimizer in self.optimizers:
            for state in optimizer_tensors(optimizer):
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and value.dim() > 0:
                        state[key] = value.to(device, non_blocking=False)
        self.moves += 1
