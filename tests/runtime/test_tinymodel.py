"""The tiny model: the same seed builds the same tokenizer and weights, in any process."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetrl_cli.errors import BadInput
from hetrl_cli.runtime.engines import checksum_named
from hetrl_cli.runtime.tinymodel import build_model, build_tokenizer, ensure_tiny, load_causal_lm, resolve_model_dir


def test_same_seed_same_build(tiny_dir: Path, tmp_path: Path) -> None:
    again = ensure_tiny(tmp_path, seed=0)
    assert again.name == tiny_dir.name
    assert (again / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    assert checksum_named(load_causal_lm(again).named_parameters()) == checksum_named(
        load_causal_lm(tiny_dir).named_parameters()
    )
    assert ensure_tiny(tmp_path, seed=0) == again  # cached: loaded, not rebuilt


def test_shape_and_tokenizer(tiny_dir: Path) -> None:
    from hetrl_cli.runtime.tinymodel import load_tokenizer

    model = load_causal_lm(tiny_dir)
    tokenizer = load_tokenizer(tiny_dir)
    assert 340_000 < sum(p.numel() for p in model.parameters()) < 350_000
    assert model.config.head_dim == 64 and model.config.tie_word_embeddings
    assert len(tokenizer) <= model.config.vocab_size
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["<unk>", "<pad>", "<s>", "</s>"]
    text = "Write the letter a: aaa 12 + 7 = 19"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_other_seed_other_weights() -> None:
    tokenizer = build_tokenizer(0)
    assert checksum_named(build_model(tokenizer, 0).named_parameters()) != checksum_named(
        build_model(tokenizer, 1).named_parameters()
    )


def test_model_dirs_must_exist(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"no config\.json there"):
        resolve_model_dir(str(tmp_path), "hf", tmp_path, 0)
    with pytest.raises(BadInput, match="model 'qwen3-8b' has no 'path'"):
        resolve_model_dir(None, "qwen3-8b", tmp_path, 0)
