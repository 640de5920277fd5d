"""The workload's `precision` as the runtime executes it (issue 21, item 2); costmodel/memory.py charges the same
bytes per parameter, and tests/runtime/test_precision.py measures them per rank.

- Every role holds its weights in the workload's dtype (bf16/fp16: 2 bytes per parameter, fp32: 4): inference
  roles, the hf engine, and the trained models, which also compute in it (no autocast, no second copy).
- A trained model's gradients are in that dtype too (2 bytes; the DP sum moves them so).
- Mixed precision keeps fp32 master weights in the optimizer state, next to the fp32 moments (Adam/AdamW:
  4 + 8 = 12 bytes; SGD: 4): sharding.with_master_weights steps them and copies the result into the weights.
  ZeRO-1/2 therefore shard the master weights with the moments, as ZeRO (and the cost model) count them.
- fp16 training scales the loss (`LossScaler`); bf16 needs no scaling.
- fp32 matmuls on CUDA use TF32 (`enable_tf32`).

This module imports nothing heavy at the top; torch is imported inside the functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import Tensor


def torch_dtype(precision: str) -> torch.dtype:
    """The torch dtype of a workload precision (bf16, fp16, fp32)."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def enable_tf32() -> None:
    """fp32 matmuls and convolutions on CUDA run on TF32 tensor cores (the profile's tf32 peak)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


class LossScaler:
    """Dynamic loss scaling for fp16 training, with torch.amp.GradScaler's policy (start at 2**16, halve and skip
    the step on an inf/nan gradient, double after `growth_interval` clean steps).

    Hand-written because GradScaler unscales only fp32 gradients and decides per rank from the gradients that
    rank holds, while here the gradients are fp16 (divided by the scale only when the master step converts them
    to fp32: sharding.with_master_weights) and the decision must be the same on every rank of a task (pipeline
    stages and TP ranks hold different gradients, and a ZeRO step is a collective): the caller passes the
    replica's global gradient norm, identical on every rank after the DP sum and the norm's all-reduce.
    `enabled=False` (bf16, fp32): scale 1 and every step taken."""

    def __init__(self, enabled: bool, init_scale: float = 2.0**16, growth_interval: int = 2000) -> None:
        self.enabled = enabled
        self.scale = init_scale if enabled else 1.0
        self.growth_interval = growth_interval
        self.clean_steps = 0
        self.skipped = 0

    def scaled(self, loss: Tensor) -> Tensor:
        return loss * self.scale if self.enabled else loss

    def update(self, grad_norm: float) -> bool:
        """Whether the optimizer may step (the unscaled norm is finite); adjusts the scale."""
        import math

        if not self.enabled:
            return True
        if not math.isfinite(grad_norm):
            self.scale /= 2.0
            self.clean_steps = 0
            self.skipped += 1
            return False
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval:
            self.scale *= 2.0
            self.clean_steps = 0
        return True
