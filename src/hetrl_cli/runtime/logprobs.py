"""Token log-probs of responses without the full-vocabulary logits (issue 21, item 6).

The LM head runs on the hidden states of the response positions only, a chunk of tokens at a time: each chunk's
logits are made, log-softmaxed in fp32 and reduced to the response tokens' log-probs, then freed. With gradients
on, each chunk runs under non-reentrant activation checkpointing, so the backward recomputes the chunk's logits
instead of keeping them: the peak is one chunk's [tokens, vocab] fp32 logits (and their log-softmax and
gradient), not the micro-batch's [batch, sequence, vocab] logits plus their fp32 log-softmax copy. The values
are those of `algorithms.gather_logprobs` over the full logits (the same fp32 log-softmax per row; the head's
matmul on fewer rows may round differently, within 1e-6).

Under tensor parallelism the head is vocabulary-parallel (parallel.VocabParallelHead): each TP rank makes the
logits of its vocabulary rows only, and a distributed log-softmax (`_VocabParallelLogProb`: max, sum of
exponentials and the target's logit, each all-reduced over the TP group) gives every rank the same log-probs.
Chunks are sized by the widest rank's rows, so every rank runs as many chunks (their collectives pair up).

This module imports torch at the top: only worker processes and tests import it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

CHUNK_LOGITS_BYTES = 64 * 2**20
"""fp32 logits of one chunk (tokens x vocab x 4 bytes) at most: 64 MiB is 110 tokens of a 152k vocabulary.
Not less than 2 x 32 MiB on purpose: glibc serves blocks below its largest mmap threshold (32 MiB) from the heap,
and a loop allocating and freeing ~33 MB blocks (55 tokens of 152k) left 2.6 GB resident on CPU (measured);
blocks of this size are mmapped and given back whole when freed (0.14 GB for the same loop)."""


def chunk_tokens(vocab_size: int, budget_bytes: int = CHUNK_LOGITS_BYTES) -> int:
    """Response tokens per chunk so that one chunk's fp32 logits stay within `budget_bytes`.

    >>> chunk_tokens(151_936)
    110
    """
    return max(1, budget_bytes // (4 * vocab_size))


class _VocabParallelLogProb(torch.autograd.Function):
    """log p(targets) from this TP rank's logit columns [c, lo:lo + width] of a vocabulary split over `group`.

    Forward: m = max over all ranks (all-reduce MAX; the result does not depend on it), s = sum of exp(x - m) over
    all ranks (all-reduce SUM), the target's logit from the rank that holds it (all-reduce SUM of zeros and it):
    log p = (x_t - m) - log s. Backward, exact and local: d/dx_j = g (1[j = t] - exp(log p_j)) on this rank's
    columns (the caller's `enter` sums the input gradient over the group). Both in the order torch's log_softmax
    and gather run them; the ranks' fp32 partial sums are added in fp64, so the split adds no rounding of its own.
    (Adam's steps on gradients near its eps amplify any rounding: test_sharding's dp2 x tp2 Adam updates against
    one process moved one element past their tolerance with fp32 partial sums.)"""

    @staticmethod
    def forward(ctx, local: Tensor, targets: Tensor, lo: int, group: Any) -> Tensor:  # type: ignore[override]
        width = local.shape[-1]
        inside = (targets >= lo) & (targets < lo + width)
        index = (targets - lo).clamp(0, width - 1).unsqueeze(-1)
        top = local.max(dim=-1).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        shifted = local - top.unsqueeze(-1)
        target = torch.where(inside, shifted.gather(-1, index).squeeze(-1), 0.0)
        dist.all_reduce(target, group=group)
        total = shifted.exp().sum(dim=-1).double()  # the ranks' partial sums added in fp64
        dist.all_reduce(total, group=group)
        log_total = total.log().to(shifted.dtype)
        logp = shifted.sub_(log_total.unsqueeze(-1))
        ctx.save_for_backward(logp, index, inside)
        return target - log_total

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:  # type: ignore[override]
        logp, index, inside = ctx.saved_tensors
        out = logp.exp().mul_(grad.unsqueeze(-1)).neg_()
        out.scatter_add_(-1, index, (grad * inside).unsqueeze(-1))
        return out, None, None, None


def _chunk_logprobs(hidden: Tensor, targets: Tensor, head: nn.Module) -> Tensor:
    """hidden [c, H], targets [c] -> log p(targets) [c] in fp32 (a vocabulary-parallel head: over its group)."""
    if hasattr(head, "local_logits"):
        return _VocabParallelLogProb.apply(head.local_logits(hidden).float(), targets, head.lo, head.group)
    logits = head(hidden).float()
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def response_logprobs(
    hidden: Tensor, positions: Tensor, response: Tensor, head: nn.Module, budget_bytes: int = CHUNK_LOGITS_BYTES
) -> Tensor:
    """log p(response) from final hidden states: hidden [n, L, H], positions and response [n, T] -> [n, T] fp32.

    positions[i, t] is the index of the hidden state that predicts response token t (roles.SeqBatch); one
    chunk's fp32 logits take at most `budget_bytes`."""
    n, steps = positions.shape
    width = hidden.shape[-1]
    picked = hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, width)).reshape(n * steps, width)
    targets = response.reshape(-1)
    if hasattr(head, "enter"):  # vocabulary-parallel: the input gradient summed over TP once, not per chunk
        picked = head.enter(picked)
    size = chunk_tokens(getattr(head, "widest", head.weight.shape[0]), budget_bytes)
    parts = []
    for lo in range(0, n * steps, size):
        h, t = picked[lo : lo + size], targets[lo : lo + size]
        if torch.is_grad_enabled() and h.requires_grad:
            parts.append(checkpoint(_chunk_logprobs, h, t, head, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(h, t, head))
    return torch.cat(parts).view(n, steps)
