"""Tensor and pipeline parallelism for the runtime's HF decoder models (Qwen2/Llama-style), on torch.distributed.

Glossary:
- *position* (layout.Position): where a rank sits in one replica of a task: pipeline stage, TP index, layers.
- *shard*: what a position holds of the model: its stage's layers, TP-sliced, plus the embedding (stage 0)
  or the final norm and head (last stage).
- *canonical name*: a parameter's name in the full HF model (a tied head under the embedding's name). Weight
  syncs, checkpoints and gradient reductions use these names and full-model shapes, whatever the layout.

Tensor parallelism (Megatron-style, explicit autograd functions over the TP sub-group; no DTensor, so the
same code runs on gloo and NCCL): q/k/v and gate/up are column-parallel (output features split by head, by
intermediate unit), o_proj and down_proj row-parallel (input features split) followed by an all-reduce; the
input of a column-parallel linear passes an identity whose backward all-reduces. KV heads are split when
kv % tp == 0 and replicated when tp % kv == 0 (ranks that share a KV head sum its gradient). Attention reshapes
use -1 heads; the GQA group count is set to the local one.

The token embedding and the LM head are vocabulary-parallel (as Megatron's): TP rank r holds rows
`vocab_range(V, r, tp)` of each (uneven when tp does not divide V; a tied head shares the embedding's slice). The
embedding looks up the ids it holds, zeros the others and all-reduces; the head's token log-probs come from a
distributed log-softmax (runtime/logprobs.py), and its module forward (HF `generate`) all-gathers the full
logits. Norms and a critic's or reward model's scalar head stay whole: outside the parallel regions activations
and gradients are equal on every TP rank.

Pipeline parallelism (1F1B, `pipeline_train`): stage s holds layers [lo, hi). After a warm-up of forwards each
stage alternates one forward and one backward, so it holds at most S - s micro-batches' activations (inference
passes are forward-only); activations and their gradients travel by send/recv
between the ranks of equal TP index in adjacent stages. Every stage collates the same micro-batches from the
same rollouts itself, so only activations travel and no shapes need to be exchanged.

This module imports torch at the top: only worker processes and tests import it (never the CLI).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn import functional as F

from hetrl_cli.runtime.layout import Position, TaskLayout

Slice = tuple[int, int, int]
"""(dim, start, stop) of a parameter's TP shard in its full tensor."""

SHARED_KV_BUCKET_BYTES = 16 << 20
"""Replicated KV heads' gradients are summed over TP in full-shape buckets of at most this many bytes (one
parameter when a parameter is larger), read when the sum runs."""


@dataclass
class Parallel:
    """A rank's position plus the groups it talks over. Sizes of 1 skip the collective."""

    pos: Position
    tp_group: Any = None
    mp_group: Any = None
    """Every rank of the replica: global gradient norms and weight gathers."""
    mp_ranks: tuple[int, ...] = ()
    """Global ranks of the replica, stage-major then TP index; mp_ranks[0] is the replica's leader."""

    @classmethod
    def single(cls) -> Parallel:
        return cls(Position(replica=0, stage=0, tp_rank=0, tp=1, split=()))

    @property
    def mp_size(self) -> int:
        return max(1, len(self.mp_ranks))

    @classmethod
    def of(cls, task: TaskLayout, rank: int, groups: Any) -> Parallel:
        """`rank`'s place in `task` with the groups comm.make_groups created from `task.group_specs()`."""
        pos = task.position(rank)
        assert pos is not None, f"rank {rank} runs no part of {task.task}"
        ranks = task.replicas[pos.replica].ranks
        tp_group = groups.handles.get(f"tp:{task.task}:{pos.replica}:{pos.stage}")
        mp_group = groups.handles.get(f"mp:{task.task}:{pos.replica}")
        return cls(pos, tp_group=tp_group, mp_group=mp_group, mp_ranks=ranks if len(ranks) > 1 else ())


def dp_group(task: TaskLayout, rank: int, groups: Any) -> tuple[Any, int]:
    """(group, size) of `rank`'s gradient sum in `task`: every rank of its TP index, all replicas and stages."""
    pos = task.position(rank)
    assert pos is not None
    name = f"dp:{task.task}:{pos.tp_rank}"
    return groups.get(name), groups.size(name)


# --- tensor parallelism ---------------------------------------------------------------------------


class _CopyToTP(torch.autograd.Function):
    """Identity forward; backward sums the input gradient over the TP group (entry of a parallel region)."""

    @staticmethod
    def forward(ctx, x: Tensor, group: Any) -> Tensor:  # type: ignore[override]
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Forward sums the partial outputs over the TP group; backward passes the gradient through (exit)."""

    @staticmethod
    def forward(ctx, x: Tensor, group: Any) -> Tensor:  # type: ignore[override]
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return grad, None


class ColumnParallelLinear(nn.Module):
    """Rows [start, stop) of a Linear's weight (and bias): this rank's output features."""

    def __init__(self, linear: nn.Linear, start: int, stop: int, group: Any) -> None:
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(linear.weight.detach()[start:stop].clone())
        self.bias = nn.Parameter(linear.bias.detach()[start:stop].clone()) if linear.bias is not None else None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(_CopyToTP.apply(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Columns [start, stop) of a Linear's weight; partial outputs summed over the group, then the whole bias."""

    def __init__(self, linear: nn.Linear, start: int, stop: int, group: Any) -> None:
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(linear.weight.detach()[:, start:stop].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None

    def forward(self, x: Tensor) -> Tensor:
        out = _ReduceFromTP.apply(F.linear(x, self.weight), self.group)
        return out + self.bias if self.bias is not None else out


def vocab_range(vocab: int, tp_rank: int, tp: int) -> tuple[int, int]:
    """Rows [lo, hi) of a vocabulary of `vocab` that TP rank `tp_rank` holds: contiguous, the first vocab % tp
    ranks one row more (no padding, so every canonical tensor keeps its shape).

    >>> [vocab_range(389, r, 3) for r in range(3)]
    [(0, 130), (130, 260), (260, 389)]
    """
    base, extra = divmod(vocab, tp)
    lo = tp_rank * base + min(tp_rank, extra)
    return lo, lo + base + (1 if tp_rank < extra else 0)


class _GatherFromTP(torch.autograd.Function):
    """Forward concatenates every TP rank's last-dimension piece (uneven widths: padded to the widest for the
    all-gather, then cut); backward keeps this rank's columns of the (TP-identical) gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, group: Any, widths: tuple[int, ...], rank: int) -> Tensor:  # type: ignore[override]
        ctx.lo, ctx.hi = sum(widths[:rank]), sum(widths[: rank + 1])
        widest = max(widths)
        padded = F.pad(x, (0, widest - x.shape[-1])).contiguous()
        parts = [torch.empty_like(padded) for _ in widths]
        dist.all_gather(parts, padded, group=group)
        return torch.cat([part[..., :w] for part, w in zip(parts, widths, strict=True)], dim=-1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:  # type: ignore[override]
        return grad[..., ctx.lo : ctx.hi].contiguous(), None, None, None


class VocabParallelEmbedding(nn.Module):
    """Rows [lo, hi) of a token embedding: ids outside them look up zeros, and the partial embeddings are summed
    over the TP group (each id's row lives on exactly one rank, so the sum is the whole embedding, exactly).
    Its backward passes the (TP-identical) output gradient through: each rank's rows get the one-process rows'
    gradient."""

    def __init__(self, embedding: nn.Embedding, lo: int, hi: int, group: Any) -> None:
        super().__init__()
        self.lo, self.hi, self.group = lo, hi, group
        self.num_embeddings, self.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        pad = embedding.padding_idx
        self.padding_idx = pad - lo if pad is not None and lo <= pad < hi else None
        self.weight = nn.Parameter(embedding.weight.detach()[lo:hi].clone(), embedding.weight.requires_grad)

    def forward(self, ids: Tensor) -> Tensor:
        outside = (ids < self.lo) | (ids >= self.hi)
        local = F.embedding((ids - self.lo).masked_fill(outside, 0), self.weight, self.padding_idx)
        return _ReduceFromTP.apply(local.masked_fill(outside.unsqueeze(-1), 0.0), self.group)


class VocabParallelHead(nn.Module):
    """Rows [lo, hi) of an LM head (of the embedding when tied: the same Parameter), V = `vocab` rows in all.

    `local_logits` gives this rank's logit columns; runtime/logprobs.py turns them into token log-probs with a
    distributed log-softmax (max, sum-exp and the target's logit all-reduced), never making the full logits.
    The module's own forward, which HF `generate` calls, all-gathers the full logits instead: the hf engine's
    seeded sampler (engines/hf.py) draws one Gumbel noise row over the whole vocabulary per sequence from its own
    generator, so sampling over the distributed softmax would need the noise split by vocabulary range and would
    no longer reproduce the whole-model engine's tokens; generation's logits are one position per sequence, small
    next to the weights the sharding saves."""

    def __init__(self, head: nn.Linear, lo: int, hi: int, group: Any, tp_rank: int, tp: int,
                 weight: nn.Parameter | None = None) -> None:  # fmt: skip
        super().__init__()
        self.lo, self.hi, self.group, self.tp_rank = lo, hi, group, tp_rank
        self.vocab = head.weight.shape[0]
        self.widths = tuple(b - a for a, b in (vocab_range(self.vocab, r, tp) for r in range(tp)))
        self.weight = weight if weight is not None else nn.Parameter(head.weight.detach()[lo:hi].clone(),
                                                                     head.weight.requires_grad)  # fmt: skip
        bias = head.bias
        self.bias = nn.Parameter(bias.detach()[lo:hi].clone(), bias.requires_grad) if bias is not None else None

    @property
    def widest(self) -> int:
        """The most rows any TP rank holds: chunk sizes derive from it, so every rank runs as many chunks."""
        return max(self.widths)

    def enter(self, x: Tensor) -> Tensor:
        """`x` into the parallel region: identity forward, its gradient summed over the TP group in backward."""
        return _CopyToTP.apply(x, self.group)

    def local_logits(self, x: Tensor) -> Tensor:
        """Logits of this rank's vocabulary rows for an input that went through `enter`."""
        return F.linear(x, self.weight, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return _GatherFromTP.apply(self.local_logits(self.enter(x)), self.group, self.widths, self.tp_rank)


def _shard_vocab(model: nn.Module, canon: dict[int, str], pos: Position, group: Any) -> None:
    """Replace the embedding (first stage) and a causal LM's head (last stage) by their vocabulary slices, in
    place; a tied head takes the embedding's sliced Parameter where one stage holds both."""
    inner, head, kind = _named_modules_of(model)
    embedding = inner.embed_tokens
    tied = kind == "causal" and head.weight is embedding.weight
    sliced: nn.Parameter | None = None
    if pos.first:
        name = canon[id(embedding.weight)]
        inner.embed_tokens = VocabParallelEmbedding(embedding, *vocab_range(embedding.num_embeddings, pos.tp_rank,
                                                                            pos.tp), group)  # fmt: skip
        sliced = inner.embed_tokens.weight
        canon[id(sliced)] = name
    if pos.last and kind == "causal":
        names = {k: canon[id(p)] for k, p in head.named_parameters()}
        lo, hi = vocab_range(head.weight.shape[0], pos.tp_rank, pos.tp)
        model.lm_head = VocabParallelHead(head, lo, hi, group, pos.tp_rank, pos.tp, sliced if tied else None)
        canon.update({id(p): names[k] for k, p in model.lm_head.named_parameters()})


def vocab_slices(model: nn.Module, canon: dict[int, str], tp_rank: int, tp: int) -> dict[str, Slice]:
    """The vocabulary slices (canonical names) of the embedding and a causal LM's head on TP rank `tp_rank`."""
    inner, head, kind = _named_modules_of(model)
    tensors = [inner.embed_tokens.weight]
    if kind == "causal":
        tensors.extend(p for p in (head.weight, head.bias) if p is not None)
    return {canon[id(t)]: (0, *vocab_range(t.shape[0], tp_rank, tp)) for t in tensors}


def check_tp(config: Any, tp: int) -> None:
    """Refuse TP degrees the sharding cannot honour, naming the numbers."""
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    inter = config.intermediate_size
    if config.vocab_size < tp:
        raise ValueError(f"tp={tp} exceeds the model's vocabulary of {config.vocab_size} tokens (each TP rank holds "
                         f"some of its rows): place the task with tp <= {config.vocab_size}")  # fmt: skip
    if heads % tp or not (kv % tp == 0 or tp % kv == 0) or inter % tp:
        raise ValueError(
            f"tp={tp} does not divide the model: {heads} attention heads, {kv} KV heads (split or replicated), "
            f"intermediate size {inter}"
        )


def tp_slices(config: Any, layer: int, tp_rank: int, tp: int) -> dict[str, Slice]:
    """The TP slices of one decoder layer's parameters (canonical names) on TP rank `tp_rank`."""
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    q_width = heads // tp * head_dim
    if kv % tp == 0:
        kv_lo, kv_width = tp_rank * (kv // tp) * head_dim, kv // tp * head_dim
    else:  # tp % kv == 0: each KV head replicated on tp // kv consecutive ranks
        kv_lo, kv_width = tp_rank // (tp // kv) * head_dim, head_dim
    inter = config.intermediate_size // tp
    p = f"model.layers.{layer}."
    out: dict[str, Slice] = {}
    for name in ("q_proj", "k_proj", "v_proj"):
        lo, width = (tp_rank * q_width, q_width) if name == "q_proj" else (kv_lo, kv_width)
        out[f"{p}self_attn.{name}.weight"] = out[f"{p}self_attn.{name}.bias"] = (0, lo, lo + width)
    out[f"{p}self_attn.o_proj.weight"] = (1, tp_rank * q_width, (tp_rank + 1) * q_width)
    for name in ("gate_proj", "up_proj"):
        out[f"{p}mlp.{name}.weight"] = out[f"{p}mlp.{name}.bias"] = (0, tp_rank * inter, (tp_rank + 1) * inter)
    out[f"{p}mlp.down_proj.weight"] = (1, tp_rank * inter, (tp_rank + 1) * inter)
    return out


def _shard_layer(layer: nn.Module, config: Any, tp_rank: int, tp: int, group: Any) -> None:
    """Replace a decoder layer's projections by their TP shards, in place."""
    attn, mlp = layer.self_attn, layer.mlp
    slices = tp_slices(config, 0, tp_rank, tp)
    for owner, name, kind in (
        (attn, "q_proj", "col"), (attn, "k_proj", "col"), (attn, "v_proj", "col"), (attn, "o_proj", "row"),
        (mlp, "gate_proj", "col"), (mlp, "up_proj", "col"), (mlp, "down_proj", "row"),
    ):  # fmt: skip
        prefix = "self_attn" if owner is attn else "mlp"
        _, lo, hi = slices[f"model.layers.0.{prefix}.{name}.weight"]
        cls = ColumnParallelLinear if kind == "col" else RowParallelLinear
        setattr(owner, name, cls(getattr(owner, name), lo, hi, group))
    kv = config.num_key_value_heads
    attn.num_key_value_groups = (config.num_attention_heads // tp) // max(1, kv // tp)


# --- the shard ------------------------------------------------------------------------------------


def _named_modules_of(model: nn.Module) -> tuple[nn.Module, nn.Module | None, str]:
    """(decoder backbone, head module, head kind): causal | token | sequence."""
    inner = model.model
    if hasattr(model, "lm_head"):
        return inner, model.lm_head, "causal"
    kind = "sequence" if type(model).__name__.endswith("ForSequenceClassification") else "token"
    return inner, model.score, kind


@dataclass
class Shard:
    """This rank's piece of a model (the whole model when alone), addressed in canonical names.

    `model` stays an HF module: with pp = 1 its own forward (and `generate`) works, TP-sharded or not.
    """

    model: nn.Module
    par: Parallel
    held: list[tuple[str, nn.Parameter]] = field(default_factory=list)
    """Parameters this rank holds, canonical names, in optimizer order."""
    full_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    slices: dict[int, dict[str, Slice]] = field(default_factory=dict)
    """slices[tp_rank][name]: where each TP rank's piece sits in the full tensor (absent = whole)."""
    stage_names: list[set[str]] = field(default_factory=list)
    """Canonical names each stage of the replica holds."""
    head_outside: bool = False
    """A causal LM's last stage returns its final hidden states, not the logits: the caller applies `lm_head` to
    the response positions in chunks (runtime/logprobs.py), never making the [n, L, vocab] logits."""

    @classmethod
    def build(cls, model: nn.Module, par: Parallel) -> Shard:
        """Cut `model` (a full HF model, already on its device) down to `par`'s position."""
        config = model.config
        pos = par.pos
        n_layers = config.num_hidden_layers
        split = pos.split or (n_layers,)
        if sum(split) != n_layers:
            raise ValueError(f"layer split {list(split)} covers {sum(split)} layers; the model has {n_layers}")
        if pos.tp > 1:
            check_tp(config, pos.tp)
        canon = {id(p): n for n, p in model.named_parameters()}
        shard = cls(model, par, full_shapes={n: tuple(p.shape) for n, p in model.named_parameters()})
        shard.slices = {r: {} for r in range(pos.tp)}
        if pos.tp > 1:
            for r in range(pos.tp):
                for layer in range(n_layers):
                    shard.slices[r].update(tp_slices(config, layer, r, pos.tp))
                shard.slices[r].update(vocab_slices(model, canon, r, pos.tp))
        bounds = [sum(split[:s]) for s in range(len(split) + 1)]
        stages = len(split)
        shard.stage_names = [_stage_names(model, canon, bounds[s], bounds[s + 1], s, stages) for s in range(stages)]
        lo, hi = bounds[pos.stage], bounds[pos.stage + 1]
        inner = model.model
        if pos.tp > 1:
            for i in range(lo, hi):
                layer = inner.layers[i]
                names = {name: canon[id(p)] for name, p in layer.named_parameters()}
                _shard_layer(layer, config, pos.tp_rank, pos.tp, par.tp_group)
                canon.update({id(p): names[name] for name, p in layer.named_parameters()})
            _shard_vocab(model, canon, pos, par.tp_group)
        if len(split) > 1:
            inner.layers = nn.ModuleList(list(inner.layers)[lo:hi])
            inner.config = copy.deepcopy(config)
            inner.config.num_hidden_layers = hi - lo
            if getattr(config, "layer_types", None):
                inner.config.layer_types = list(config.layer_types[lo:hi])
            if not pos.first:
                inner.embed_tokens = None
            if not pos.last:
                inner.norm = nn.Identity()
                setattr(model, "lm_head" if hasattr(model, "lm_head") else "score", None)
        shard.held = [(canon[id(p)], p) for p in model.parameters()]
        return shard

    # forward -----------------------------------------------------------------------------------------
    def forward(self, input_ids: Tensor, attention_mask: Tensor, hidden: Tensor | None = None) -> Tensor:
        """Stage forward: hidden states out of a non-last stage, the head's logits out of the last
        (as the HF model's `.logits`: [n, L, V], [n, L, labels], or [n, labels] pooled for sequence heads)."""
        inner, head, kind = _named_modules_of(self.model)
        if self.par.pos.first:
            out = inner(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        else:
            out = inner(inputs_embeds=hidden, attention_mask=attention_mask, use_cache=False).last_hidden_state
        if not self.par.pos.last:
            return out
        assert head is not None
        if kind == "causal" and self.head_outside:
            return out
        if kind == "token":
            return head(self.model.dropout(out))
        logits = head(out)
        if kind == "sequence":
            pad = self.model.config.pad_token_id
            index = torch.arange(input_ids.shape[-1], device=logits.device)
            last = (index * (input_ids != pad).to(index.dtype)).argmax(-1)
            return logits[torch.arange(input_ids.shape[0], device=logits.device), last]
        return logits

    @property
    def lm_head(self) -> nn.Module:
        """The causal LM's head (a VocabParallelHead under TP), for callers of a `head_outside` forward."""
        return self.model.lm_head

    # gradients ---------------------------------------------------------------------------------------
    def owned(self, name: str) -> bool:
        """Whether this rank's copy of `name` counts once per replica (norms, gathers): the first stage that
        holds it, TP index 0 for whole tensors, the first of the ranks that share a replicated KV head."""
        pos = self.par.pos
        if any(name in names for names in self.stage_names[: pos.stage]):
            return False
        sl = self.slices.get(pos.tp_rank, {}).get(name)
        if sl is None:
            return pos.tp_rank == 0
        first = min(r for r in range(pos.tp) if self.slices[r][name] == sl)
        return pos.tp_rank == first

    def reduce_gradients(self, dp_group: Any, dp_size: int) -> None:
        """Make every held gradient the full-batch gradient of the full model: (1) sum replicated KV heads and
        per-head q/k norms over the TP group; (2) sum over the DP group (every rank of equal TP index in the task,
        all stages), which also adds a tied head's gradient (last stage) to the embedding's (stage 0)."""
        from hetrl_cli.runtime.comm import allreduce_gradients

        for _, p in self.held:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        pos = self.par.pos
        config = self.model.config
        if pos.tp > 1 and pos.tp > config.num_key_value_heads:
            self._sum_shared_kv()
        if pos.tp > 1:
            self._sum_head_norms()
        layout = None
        if len(self.stage_names) > 1:
            layout = [(n, self._local_shape(n)) for n in self.full_shapes]
        allreduce_gradients(self.held, dp_group, dp_size, layout)

    def _local_shape(self, name: str) -> tuple[int, ...]:
        shape = list(self.full_shapes[name])
        sl = self.slices.get(self.par.pos.tp_rank, {}).get(name)
        if sl is not None:
            shape[sl[0]] = sl[2] - sl[1]
        return tuple(shape)

    def _sum_head_norms(self) -> None:
        """Qwen3's per-head q/k norms are whole on every TP rank but applied to its heads only: each rank's
        gradient is its heads' part, so the one-process gradient is their sum over the TP group."""
        norms = [p for n, p in self.held if n.endswith((".q_norm.weight", ".k_norm.weight"))]
        if not norms:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in norms])
        dist.all_reduce(flat, group=self.par.tp_group)
        offset = 0
        for p in norms:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()

    def _sum_shared_kv(self) -> None:
        """Replicated KV heads (TP > KV heads): the ranks that share a head each hold its gradient from their own
        query heads, and the one-process gradient is their sum. Each rank writes its slices into a zeroed
        full-shape buffer laid out as one flat run of the k/v parameters, all-reduces it over TP and takes its
        slices back, one bucket of at most `SHARED_KV_BUCKET_BYTES` (or one parameter) at a time in one reused
        buffer: the temporary is one bucket, not every layer's full K/V twice (Qwen2.5-7B at TP 8: 2 x 205 MB)."""
        pos = self.par.pos
        shared = [(n, p) for n, p in self.held if ".k_proj." in n or ".v_proj." in n]
        if not shared:
            return
        runs = _buckets([_numel(self.full_shapes[n]) for n, _ in shared],
                        SHARED_KV_BUCKET_BYTES // shared[0][1].grad.element_size())  # fmt: skip
        grad = shared[0][1].grad
        buffer = torch.empty(max(sum(run) for run in runs), dtype=grad.dtype, device=grad.device)
        start = 0
        for run in runs:
            flat = buffer[: sum(run)].zero_()
            views, offset = [], 0
            for (n, p), numel in zip(shared[start : start + len(run)], run, strict=True):
                dim, lo, hi = self.slices[pos.tp_rank][n]
                view = flat[offset : offset + numel].view(self.full_shapes[n]).narrow(dim, lo, hi - lo)
                views.append((p, view.copy_(p.grad)))
                offset += numel
            dist.all_reduce(flat, group=self.par.tp_group)
            for p, view in views:
                p.grad.copy_(view)
            start += len(run)

    def clip_grad_norm(self, max_norm: float) -> float:
        """torch's clip_grad_norm_ over the whole replica: the norm of the full model's gradient."""
        squares = torch.zeros((), dtype=torch.float64, device=self.held[0][1].device if self.held else "cpu")
        for name, p in self.held:
            if p.grad is not None and self.owned(name):
                squares += p.grad.detach().to(torch.float64, copy=True).pow_(2).sum()  # one fp64 temporary, not two
        if self.par.mp_size > 1:
            dist.all_reduce(squares, group=self.par.mp_group)
        norm = float(squares.sqrt())
        coef = min(1.0, max_norm / (norm + 1e-6))
        if coef < 1.0:
            for _, p in self.held:
                if p.grad is not None:
                    p.grad.mul_(coef)
        return norm

    # weights -----------------------------------------------------------------------------------------
    def full_weights(self, everyone: bool = False, grads: bool = False) -> list[tuple[str, Tensor]] | None:
        """The full model's weights (or gradients), canonical names, on the replica's leader (None elsewhere;
        on every rank of the replica when `everyone`). Collective over the replica."""
        pieces = [(n, self.par.pos.tp_rank, (p.grad if grads else p).detach()) for n, p in self.held if self.owned(n)]
        return self._full_weights_of(pieces, everyone)

    def _full_weights_of(
        self, pieces: list[tuple[str, int, Tensor]], everyone: bool
    ) -> list[tuple[str, Tensor]] | None:
        full = self._gather([(n, r, None, t) for n, r, t in pieces], everyone)
        if full is None:
            return None
        return [(n, full[(n, None)]) for n in self.full_shapes if (n, None) in full]

    def _gather(
        self, pieces: list[tuple[str, int, str | None, Any]], everyone: bool, keyed: bool = False
    ) -> dict[tuple[str, str | None], Any] | None:
        """{(canonical name, optimizer key or None): full value} from every replica member's (name, TP rank, key,
        value) pieces, on the leader (None elsewhere; everywhere with `everyone`). Tensors move as tensors in
        bounded buckets on the ranks' device (runtime/gather.py); with `keyed` (optimizer state) the key names and
        any non-tensor state, the only pickled part, go through one small object all-gather first."""
        from hetrl_cli.runtime.gather import Assembly, Exchange

        if self.par.mp_size == 1:
            return {(n, k): v for n, _, k, v in pieces}
        names = list(self.full_shapes)
        number = {n: i for i, n in enumerate(names)}
        keys = sorted({k for _, _, k, _ in pieces if k is not None})
        extras = {i: v for i, (_, _, _, v) in enumerate(pieces) if not isinstance(v, Tensor)}
        meta: list[Any] = [(keys, extras)] * self.par.mp_size
        if keyed:
            dist.all_gather_object(meta, (keys, extras), group=self.par.mp_group)
        assembly = Assembly(
            [self.full_shapes[n] for n in names],
            lambda name, tp_rank: self.slices.get(tp_rank, {}).get(names[name]),
            keys=[m[0] for m in meta],
            extras=[m[1] for m in meta],
        )
        device = self.held[0][1].device if self.held else torch.device("cpu")
        exchange = Exchange(self.par.mp_group, self.par.mp_ranks, everyone, device)
        exchange.run([(number[n], r, keys.index(k) if k is not None else -1, v) for n, r, k, v in pieces],
                     assembly.prepare)  # fmt: skip
        if not exchange.receiving:
            return None
        return {(names[n], k): v for (n, k), v in assembly.out.items()}

    def piece(self, name: str, full: Tensor) -> Tensor:
        """This rank's slice of a full tensor named `name`."""
        sl = self.slices.get(self.par.pos.tp_rank, {}).get(name)
        if sl is None or tuple(full.shape) != self.full_shapes[name]:
            return full
        dim, lo, hi = sl
        return full.narrow(dim, lo, hi - lo)

    def load_full(self, named: Iterable[tuple[str, Tensor]]) -> None:
        """Copy this rank's pieces of full, canonically named tensors into the held parameters, in place."""
        params = dict(self.held)
        with torch.no_grad():
            for name, tensor in named:
                if name in params:
                    params[name].copy_(self.piece(name, tensor))

    # optimizer state (checkpoints) -------------------------------------------------------------------
    def full_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """The optimizer's state keyed by canonical name, full shapes (leader only; collective)."""
        sd = optimizer.state_dict()
        pos = self.par.pos
        pieces = []
        for i, (name, _) in enumerate(self.held):
            if self.owned(name) and i in sd["state"]:
                pieces.extend((name, pos.tp_rank, key, value) for key, value in sd["state"][i].items())
        full = self._gather(pieces, everyone=False, keyed=True)
        if full is None:
            return None
        state: dict[str, dict[str, Any]] = {}
        for (name, key), value in full.items():
            state.setdefault(name, {})[key] = value
        groups = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
        return {"state": state, "param_groups": groups}

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, full: dict[str, Any]) -> None:
        """Load full_optimizer_state's form (canonical names, full shapes) into this rank's optimizer: each tensor
        cut to this rank's slice, scalars (Adam's step) as they are; checkpoints stay independent of the layout."""
        state = {}
        for i, (name, _) in enumerate(self.held):
            if name in full["state"]:
                state[i] = {
                    k: self.piece(name, v) if isinstance(v, Tensor) and v.dim() > 0 else v
                    for k, v in full["state"][name].items()
                }
        groups = [dict(g, params=list(range(len(self.held)))) for g in full["param_groups"]]
        optimizer.load_state_dict({"state": state, "param_groups": groups})


def _stage_names(model: nn.Module, canon: dict[int, str], lo: int, hi: int, stage: int, stages: int) -> set[str]:
    """Canonical names stage `stage` (layers [lo, hi)) holds."""
    inner, head, _ = _named_modules_of(model)
    modules: list[nn.Module] = list(inner.layers)[lo:hi]
    if stage == 0:
        modules.append(inner.embed_tokens)
    if stage == stages - 1:
        modules.extend(m for m in (inner.norm, head) if m is not None)
    return {canon[id(p)] for m in modules for p in m.parameters()}


def _buckets(sizes: list[int], limit: int) -> list[list[int]]:
    """`sizes` cut into consecutive runs whose sum is at most `limit` (a larger size alone in its run)."""
    runs: list[list[int]] = [[]]
    for size in sizes:
        if runs[-1] and sum(runs[-1]) + size > limit:
            runs.append([])
        runs[-1].append(size)
    return runs


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# --- the pipeline schedule ------------------------------------------------------------------------


def _recv(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, src: int) -> Tensor:
    buf = torch.empty(shape, dtype=dtype, device=device)
    dist.recv(buf, src=src)
    return buf


def _hidden_shape(shard: Shard, batch: Any) -> tuple[int, ...]:
    """The activation a stage receives for `batch`: every stage collates the same micro-batches, so the receiver
    knows the shape without a message."""
    return (*batch.input_ids.shape, shard.model.config.hidden_size)


def _param_meta(shard: Shard) -> tuple[torch.dtype, torch.device]:
    """dtype and device of the activations on the wire: the stages compute in their weights' dtype (no autocast)."""
    p = shard.held[0][1]
    return p.dtype, p.device


def pipeline_forward(shard: Shard, batches: list[Any], head_fn: Callable[[Tensor, int], Any]) -> list[Any]:
    """Forward-only over the stages (no autograd): `head_fn(logits, i)` per micro-batch on the last stage,
    whose results are returned there (an empty list on every other stage)."""
    pos = shard.par.pos
    dtype, device = _param_meta(shard)
    results = []
    with torch.no_grad():
        for i, batch in enumerate(batches):
            hidden = None if pos.first else _recv(_hidden_shape(shard, batch), dtype, device, pos.prev_rank)
            out = shard.forward(batch.input_ids, batch.attention_mask, hidden)
            if pos.last:
                results.append(head_fn(out, i))
            else:
                dist.send(out.contiguous(), dst=pos.next_rank)
    return results


def _exchange(send: Tensor | None, dst: int | None, recv: Tensor | None, src: int | None) -> Tensor | None:
    """Send `send` to `dst` and receive into `recv` from `src` as one batch (either may be None): two neighbouring
    stages that both send before they receive (1F1B's steady state) cannot deadlock, on gloo or NCCL."""
    ops = []
    if send is not None:
        ops.append(dist.P2POp(dist.isend, send, dst))
    if recv is not None:
        ops.append(dist.P2POp(dist.irecv, recv, src))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return recv


def pipeline_train(shard: Shard, batches: list[Any], loss_fn: Callable[[Tensor, int], tuple[Tensor, Any]]) -> list[Any]:
    """Forward and backward of every micro-batch (1F1B): gradients accumulate in the held parameters.

    `loss_fn(logits, i) -> (loss to back-propagate, info)` runs on the last stage; the infos come back
    there (an empty list elsewhere). With one stage this is the plain micro-batch loop. Stage s of S runs
    min(S - s - 1, m) forwards, then alternates one forward and one backward, then the remaining backwards
    (Narayanan et al. 2021, PipeDream-Flush): it holds at most min(S - s, m) micro-batches' activations, as the
    cost model charges (costmodel/memory.py), where GPipe held all m. Backwards run in micro-batch order, so the
    gradients accumulate in the single-stage loop's order.
    """
    pos = shard.par.pos
    if pos.stages == 1:
        infos = []
        for i, batch in enumerate(batches):
            loss, info = loss_fn(shard.forward(batch.input_ids, batch.attention_mask), i)
            loss.backward()
            infos.append(info)
        return infos
    return _one_f_one_b(shard, batches, loss_fn)


def _one_f_one_b(shard: Shard, batches: list[Any], loss_fn: Callable[[Tensor, int], tuple[Tensor, Any]]) -> list[Any]:
    """pipeline_train's schedule over S > 1 stages (hand-written over this module's send/recv of activations:
    torch.distributed.pipelining's schedules want one module per stage and equal micro-batch shapes, while here
    every stage collates its own micro-batches and splits are uneven)."""
    pos = shard.par.pos
    dtype, device = _param_meta(shard)
    m = len(batches)
    warmup = min(pos.stages - pos.stage - 1, m)
    infos: list[Any] = []
    saved: list[tuple[Tensor | None, Tensor]] = []  # micro-batches forwarded and not yet backwarded, oldest first

    def buffer(i: int) -> Tensor:
        return torch.empty(_hidden_shape(shard, batches[i]), dtype=dtype, device=device)

    def forward(i: int, hidden: Tensor | None) -> Tensor | None:
        out = shard.forward(batches[i].input_ids, batches[i].attention_mask, hidden)
        if pos.last:
            out, info = loss_fn(out, i)
            infos.append(info)
        saved.append((hidden, out))
        return None if pos.last else out.detach().contiguous()

    def backward(grad: Tensor | None) -> Tensor | None:
        hidden, out = saved.pop(0)
        if pos.last:
            out.backward()
        else:
            out.backward(grad)
        return None if hidden is None else hidden.grad.contiguous()

    def recv_forward(i: int) -> Tensor | None:
        return None if pos.first else _exchange(None, None, buffer(i), pos.prev_rank).requires_grad_()

    for i in range(warmup):
        _exchange(forward(i, recv_forward(i)), pos.next_rank, None, None)
    hidden = recv_forward(warmup) if warmup < m else None
    for i in range(warmup, m):  # steady state: forward i, backward i - warmup
        out = forward(i, hidden)
        grad = _exchange(out, pos.next_rank, None if pos.last else buffer(i - warmup), pos.next_rank)
        grad_in = backward(grad)
        more = i + 1 < m and not pos.first
        hidden = _exchange(grad_in, pos.prev_rank, buffer(i + 1) if more else None, pos.prev_rank)
        if more:
            hidden.requires_grad_()
    for j in range(m - warmup, m):  # cool-down: the remaining backwards
        grad = _exchange(None, None, None if pos.last else buffer(j), pos.next_rank)
        _exchange(backward(grad), pos.prev_rank, None, None)
    return infos
