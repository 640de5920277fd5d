"""The hf engine's own decode loop (runtime/engines/hfdecode.py) returns what transformers' `generate` returns with
the same token choice, token for token: left-padded batches, greedy and seeded sampling, rows that end early, one
new token; and the engine runs it rather than `generate`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessorList, Qwen3Config

from hetrl_cli.runtime.engines import Sampling
from hetrl_cli.runtime.engines.hf import HFEngine, _SeededGumbel
from hetrl_cli.runtime.engines.hfdecode import decode

PAD, EOS = 1, 3


def _left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :], mask[row, width - len(prompt) :] = torch.tensor(prompt), 1
    return ids, mask


def _both(model, prompts, seeds, temperature: float, new_tokens: int, eos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(generate's new tokens, decode's) with a fresh seeded sampler each."""
    ids, mask = _left_padded(prompts)

    def sampler() -> _SeededGumbel:
        return _SeededGumbel(tuple(seeds), temperature, (0, PAD, 2), new_tokens)

    with torch.inference_mode():
        reference = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                   logits_processor=LogitsProcessorList([sampler()]), eos_token_id=eos,
                                   pad_token_id=PAD)[:, ids.shape[1] :]  # fmt: skip
        pick = sampler()
        ours = decode(model, ids, mask, new_tokens, lambda logits: pick(None, logits).argmax(-1), eos, PAD)
    return reference, ours


def _qwen3(folder: Path) -> Path:
    """A second architecture (Qwen3: q/k norms), random, saved as an HF directory."""
    torch.manual_seed(1)
    config = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
                         tie_word_embeddings=True)  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("arch", ["tiny", "qwen3"])
def test_decode_returns_generates_tokens(arch: str, tiny_dir: Path, tmp_path: Path) -> None:
    model = HFEngine(tiny_dir if arch == "tiny" else _qwen3(tmp_path / "qwen3")).model
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    batches = [[[5, 6, 7]]] + [
        [torch.randint(4, vocab, (int(torch.randint(1, 12, (1,), generator=gen)),), generator=gen).tolist()
         for _ in range(rows)] for rows in (6,)
    ]  # fmt: skip
    ended_early = 0
    for prompts in batches:
        seeds = range(10, 10 + len(prompts))
        for temperature in (1.0, 0.0):
            reference, ours = _both(model, prompts, seeds, temperature, 24, eos=vocab + 7)  # no row ends
            assert torch.equal(ours, reference) and ours.shape == (len(prompts), 24)
            # an EOS the rows really produce (row 0's token at step 2): rows end, the batch stops when all have
            reference, ours = _both(model, prompts, seeds, temperature, 24, eos=int(ours[0, 2]))
            assert ours.shape == reference.shape and torch.equal(ours, reference), (prompts, temperature)
            ended_early += ours.shape[1] < 24
            reference, ours = _both(model, prompts, seeds, temperature, 1, eos=vocab + 7)  # the prefill alone
            assert ours.shape == reference.shape == (len(prompts), 1) and torch.equal(ours, reference)
    assert ended_early > 0  # some batches stopped before max_new_tokens (every row ended)


def test_the_engine_decodes_without_generate(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = HFEngine(tiny_dir)
    sampling = Sampling(max_new_tokens=8, temperature=1.0, seeds=(1, 2, 3), eos_token_id=EOS, pad_token_id=PAD,
                        suppress_ids=(0, PAD, 2))  # fmt: skip
    prompts = [[58, 381, 72], [74, 68, 293, 29, 323], [20, 21]]
    before = engine.generate(prompts, sampling)

    def refuse(*args, **kwargs):
        raise AssertionError("the hf engine called transformers' generate")

    monkeypatch.setattr(engine.model, "generate", refuse)
    assert engine.generate(prompts, sampling) == before
    assert all(len(row) <= 8 for row in before) and any(before)
