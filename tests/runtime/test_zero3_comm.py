"""The cost model's zero3 traffic is what runtime/zero3.py moves (issue 21, item 7: the same terms for time).

One rank of a DP=2 zero3 actor (a gloo world of one process; the ZeRO gathers and reduce-scatters recorded and
stood in for) runs the actor's passes of one update as the worker does: the old log-probs' forward where the
runtime computes them, then the training epochs. The bytes it moves equal the count derived by hand from its own
units (each layer gathered forward and backward and reduce-scattered per micro-batch, gathered once per micro-batch
by a forward-only pass; the root unit twice per epoch and once per forward-only pass) and the cost model's
costmodel.training.zero3_step_bytes for the model's config, within the chunks' padding. Activation recomputation
adds no gather (the backward's gather serves the recomputed forward).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from hetrl_cli.artifacts.workload import RLSpec
from hetrl_cli.costmodel.architectures import from_hf_config
from hetrl_cli.costmodel.training import Zero3Passes, zero3_forward_passes, zero3_step_bytes
from hetrl_cli.runtime import zero3
from hetrl_cli.runtime.roles import Actor, pad_rows
from hetrl_cli.runtime.sharding import Zero

from .conftest import count_gathers
from .test_distributed import _batch
from .test_loading import _save


def test_zero3_bytes_per_update_equal_the_cost_models(tmp_path: Path, monkeypatch, one_rank_world) -> None:
    model_dir = _save(tmp_path / "m", "qwen3", False, vocab_size=400)
    size = 2
    moved = count_gathers(monkeypatch, size)

    def scatter(out: torch.Tensor, flat: torch.Tensor, group) -> None:
        moved.append(flat.numel() * flat.element_size())
        out.copy_(flat[: out.numel()])

    monkeypatch.setattr(zero3, "_reduce_scatter", scatter)
    rollouts, adv = _batch()
    micro_batch = 3
    m = math.ceil(len(rollouts) / micro_batch)
    steps = max(len(r.response_ids) for r in rollouts)
    mask = pad_rows([[1.0] * len(r.response_ids) for r in rollouts], steps)
    arch = from_hf_config(model_dir / "config.json")
    for algorithm, epochs in (("grpo", 1), ("grpo", 2), ("ppo", 1)):
        actor = Actor(
            model_dir,
            RLSpec(),
            algorithm,
            "adamw",
            epochs,
            1,
            micro_batch,
            precision="bf16",
            zero=Zero("zero3", one_rank_world, size, 0),
            recompute=epochs == 2,
        )  # recompute: no more
        units = actor.shard.units
        moved.clear()
        forward = 0 if actor.reuses_old_logprobs else 1  # the worker's old log-probs pass (worker.py)
        old = pad_rows(actor.logprobs(rollouts), steps) if forward else None
        ref = (old if old is not None else torch.zeros_like(mask) - 1.0) - 0.1 * mask
        actor.train_step(rollouts, adv * mask, old, ref, float(mask.sum()), (one_rank_world, 1))
        # by hand, from the runtime's own units: full-unit bytes (chunk x dp, in the weights' dtype)
        layer = sum(u.chunk * size * u.local.element_size() for u in units if u.layer)
        root = sum(u.chunk * size * u.local.element_size() for u in units if not u.layer)
        by_hand = m * (3 * epochs + forward) * layer + (2 * epochs + forward) * root
        where = f"{algorithm} x{epochs}"
        assert sum(moved) == by_hand, where
        assert zero3_forward_passes("actor_train", algorithm, epochs) == forward, where
        predicted = zero3_step_bytes(arch, "lm", 2, Zero3Passes.of(m, epochs, forward))
        assert abs(predicted - by_hand) <= 1e-3 * by_hand, f"{where}: predicted {predicted}, moved {by_hand}"
