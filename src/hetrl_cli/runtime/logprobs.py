"""Token log-probs of responses without the full-vocabulary logits (issue 21, item 6).

The LM head runs on the hidden states of the response positions only, a chunk of tokens at a time: each chunk's
logits are made, log-softmaxed in fp32 and reduced to the response tokens' log-probs, then freed. With gradients
on, each chunk runs under non-reentrant activation checkpointing, so the backward recomputes the chunk's logits
instead of keeping them: the peak is one chunk's [tokens, vocab] fp32 logits (and their log-softmax and
gradient), not the micro-batch's [batch, sequence, vocab] logits plus their fp32 log-softmax copy. The values
are those of `algorithms.gather_logprobs` over the full logits (the same fp32 log-softmax per row; the head's
matmul on fewer rows may round differently, within 1e-6).

This module imports torch at the top: only worker processes and tests import it.
"""

from __future__ import annotations

import torch
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


def _chunk_logprobs(hidden: Tensor, targets: Tensor, head: nn.Module) -> Tensor:
    """hidden [c, H], targets [c] -> log p(targets) [c] in fp32."""
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
    size = chunk_tokens(head.weight.shape[0], budget_bytes)
    parts = []
    for lo in range(0, n * steps, size):
        h, t = picked[lo : lo + size], targets[lo : lo + size]
        if torch.is_grad_enabled() and h.requires_grad:
            parts.append(checkpoint(_chunk_logprobs, h, t, head, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(h, t, head))
    return torch.cat(parts).view(n, steps)
