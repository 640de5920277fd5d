"""The hf rollout engine: seeded sampling, in-place weight updates, and what a sync must guarantee."""

from __future__ import annotations

from pathlib import Path

import torch

from hetrl_cli.artifacts.workload import RLSpec
from hetrl_cli.runtime.engines import HFEngine, Sampling, checksum_named
from hetrl_cli.runtime.roles import Actor, Generator, Rollout, pad_rows
from hetrl_cli.runtime.tinymodel import load_tokenizer

PROMPTS = [[58, 381, 72], [74, 68, 293, 29, 323], [20, 21]]


def sampling(seeds, temperature: float = 1.0) -> Sampling:
    return Sampling(max_new_tokens=8, temperature=temperature, seeds=tuple(seeds), eos_token_id=3, pad_token_id=1,
                    suppress_ids=(0, 1, 2))  # fmt: skip


def test_seeded_sampling_depends_on_the_seed_not_the_batch(tiny_dir: Path) -> None:
    engine = HFEngine(tiny_dir)
    together = engine.generate(PROMPTS, sampling([1, 2, 3]))
    assert engine.generate(PROMPTS, sampling([1, 2, 3])) == together
    alone = [engine.generate([p], sampling([s]))[0] for p, s in zip(PROMPTS, [1, 2, 3], strict=True)]
    assert alone == together
    assert engine.generate(PROMPTS, sampling([4, 5, 6])) != together
    assert all(t not in (0, 1, 2) for row in together for t in row)


def test_weight_update_makes_checksums_and_greedy_generations_equal(tiny_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_dir)
    actor = Actor(tiny_dir, RLSpec(lr=1e-2), "grpo", "adam", 1, tokenizer.pad_token_id, 8)
    engine = HFEngine(tiny_dir)
    rollouts = Generator(engine, tokenizer, 8, 1.0, seed=0).generate(1, [(i, tuple(p)) for i, p in enumerate(PROMPTS)])
    steps = max(len(r.response_ids) for r in rollouts)
    mask = pad_rows([[1.0] * len(r.response_ids) for r in rollouts], steps)
    old = pad_rows(actor.logprobs(rollouts), steps)
    actor.train_step(rollouts, torch.tensor([[1.0], [-1.0], [0.5]]) * mask, old, old, float(mask.sum()), (None, 1))
    assert checksum_named(actor.named_weights()) != engine.weights_checksum()

    engine.update_weights(actor.named_weights())
    assert engine.weights_checksum() == checksum_named(actor.named_weights())
    greedy = engine.generate(PROMPTS, sampling([0, 0, 0], temperature=0.0))
    for prompt, got in zip(PROMPTS, greedy, strict=True):
        ids = actor.model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                                   suppress_tokens=[0, 1, 2], eos_token_id=3, pad_token_id=1)  # fmt: skip
        assert got == [t for t in ids[0, len(prompt) :].tolist()][: len(got)]
        assert len(got) == 8 or got[-1] == 3


def test_rollout_is_a_plain_picklable_value() -> None:
    import pickle

    r = Rollout(3, (1, 2), (4, 3))
    assert pickle.loads(pickle.dumps(r)) == r
