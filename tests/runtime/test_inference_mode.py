"""The frozen reference's pass runs under torch.inference_mode (no autograd metadata or version counters: cheaper
on CPU, bench/run_vs_loop.py) and gives the values a no_grad pass gives, bit for bit."""

from __future__ import annotations

from pathlib import Path

import torch

from hetrl_cli.runtime.roles import Reference, Rollout, _logprobs_lists
from hetrl_cli.runtime.tinymodel import load_tokenizer


def test_the_reference_pass_runs_in_inference_mode_with_the_same_values(tiny_dir: Path) -> None:
    pad = load_tokenizer(tiny_dir).pad_token_id
    reference = Reference(tiny_dir, pad, micro_batch=2)
    rollouts = [Rollout(0, (58, 381, 72), (5, 6, 7, 8)), Rollout(1, (74, 68), (9, 10)),
                Rollout(2, (20, 21, 22, 23), (11,))]  # fmt: skip
    modes: list[bool] = []
    hook = reference.model.model.register_forward_pre_hook(lambda *_: modes.append(torch.is_inference_mode_enabled()))
    got = reference.logprobs(rollouts)
    hook.remove()
    assert modes and all(modes)  # every micro-batch's forward
    with torch.no_grad():
        expected = _logprobs_lists(reference.shard, rollouts, pad, 2, "cpu")
    assert got == expected
    assert [len(row) for row in got] == [4, 2, 1]
