"""A zero3 rank loads only its chunks (runtime/zero3load.py; issue 21, item 4 under zero3).

The chunks read from the files equal Zero3Shard.of's cut of the whole piece bit for bit (weights and fp32 masters,
Qwen3 and Llama, tied and untied, single and sharded files, TP/PP positions, uneven chunk padding, a critic's fresh
head); the peak memory while loading a 42M-parameter Qwen3 as one rank of a DP=2 zero3 group stays within 1.2x its
steady state, where loading the whole piece first (the old way) does not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hetrl_cli.runtime import zero3load
from hetrl_cli.runtime.layout import Position
from hetrl_cli.runtime.loading import load_shard
from hetrl_cli.runtime.parallel import Parallel
from hetrl_cli.runtime.sharding import Zero
from hetrl_cli.runtime.zero3 import Zero3Shard
from hetrl_cli.runtime.zero3load import load_trained

from .test_loading import BIG, POSITIONS, _save


def _old_chunks(model_dir: Path, par: Parallel, dtype: str, head: str, zero: Zero) -> tuple[Zero3Shard, list | None]:
    """The path before: the whole TP/PP piece loaded, then cut into chunks (roles._zero3)."""
    loaded = load_shard(model_dir, par, "cpu", dtype, head, seed=5, trained=True)
    sharded = Zero3Shard.of(loaded.shard, zero)
    return sharded, None if loaded.masters is None else sharded.local_masters(loaded.masters)


@pytest.mark.parametrize(("family", "tie", "shard_size"), [("qwen3", True, None), ("llama", False, "60KB")])
def test_chunks_read_from_the_files_equal_the_whole_piece_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, family: str, tie: bool, shard_size: str | None
) -> None:
    model_dir = _save(tmp_path / family, family, tie, shard_size)
    monkeypatch.setattr(zero3load, "BLOCK_ELEMENTS", 100)  # several blocks per tensor, rows cut at both ends
    for tp, split, stage, tp_rank in POSITIONS[1:]:
        par = Parallel(Position(replica=0, stage=stage, tp_rank=tp_rank, tp=tp, split=split))
        for size, index in ((2, 1), (3, 0), (3, 2)):
            monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None, i=index: i)
            zero = Zero("zero3", None, size, 0)
            for head, dtype in (("causal", "bf16"), ("causal", "fp32"), ("token", "bf16")):
                where = f"{family} tp{tp} split{split} stage{stage} tp_rank{tp_rank} dp{size}[{index}] {head} {dtype}"
                old, old_masters = _old_chunks(model_dir, par, dtype, head, zero)
                new = load_trained(model_dir, par, "cpu", dtype, head, seed=5, zero=zero)
                assert isinstance(new.shard, Zero3Shard), where
                assert len(new.shard.units) == len(old.units), where
                for a, b in zip(old.units, new.shard.units, strict=True):
                    assert (a.names, a.offsets, a.chunk, a.layer) == (b.names, b.offsets, b.chunk, b.layer), where
                    assert a.local.dtype == b.local.dtype and torch.equal(a.local, b.local), f"{where}: {a.names}"
                    assert b.local.requires_grad and b.flat.untyped_storage().nbytes() == 0, where
                    assert [tuple(p.shape) for p in a.params] == [tuple(p.shape) for p in b.params], where
                if old_masters is None:
                    assert new.masters is None, where
                else:
                    assert new.masters is not None and len(new.masters) == len(old_masters), where
                    for x, y in zip(old_masters, new.masters, strict=True):
                        assert y.dtype == torch.float32 and torch.equal(x, y), where
                old_buffers = dict(old.model.named_buffers())
                for name, buf in new.shard.model.named_buffers():
                    assert buf.dtype == old_buffers[name].dtype and torch.equal(buf, old_buffers[name]), where
                assert not any(p.is_meta for p in new.shard.model.parameters()), where


@pytest.mark.parametrize("mismatch", [{"vocab_size": 300}, {"num_attention_heads": 2}])
def test_a_checkpoint_larger_than_its_config_is_refused_at_every_tp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mismatch: dict
) -> None:
    """config.json says a smaller vocabulary (or fewer heads) than the safetensors hold: the rank's TP slice of the
    larger tensor has the rank's shape, so a check of the slice passed at tp 2 what tp 1 refuses (the embedding
    rows, q_proj's rows and o_proj's columns of another model loaded silently). Every TP rank refuses it, naming
    the tensor and both shapes."""
    model_dir = _save(tmp_path / "qwen3", "qwen3", False)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(config | mismatch))
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)  # rank 0 of a DP=2 zero3 group
    zero = Zero("zero3", None, 2, 0)
    for tp, tp_rank in ((1, 0), (2, 0), (2, 1)):
        par = Parallel(Position(replica=0, stage=0, tp_rank=tp_rank, tp=tp, split=()))
        with pytest.raises(ValueError, match=r"has shape \(\d+, \d+\); the config implies \(\d+, \d+\)"):
            load_trained(model_dir, par, "cpu", "bf16", seed=5, zero=zero)


# --- peak memory while loading ------------------------------------------------------------------------------------

_MEASURE = r"""
import gc, json, sys, torch
torch.set_num_threads(1)
from hetrl_cli.runtime import tracking
from hetrl_cli.runtime.loading import load_shard
from hetrl_cli.runtime.sharding import Zero
from hetrl_cli.runtime.zero3 import Zero3Shard
from hetrl_cli.runtime.zero3load import load_trained
from transformers import AutoConfig, AutoModelForCausalLM, Qwen3ForCausalLM  # code imported before the baseline

model_dir, how, dtype, index, tiny = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
torch.distributed.get_rank = lambda group=None: index  # rank `index` of a DP=2 ZeRO group: loading is collective-free
zero = Zero("zero3", None, 2, 0)


def load(folder):
    if how == "chunks":
        loaded = load_trained(folder, None, "cpu", dtype, zero=zero)
        return loaded.shard, loaded.masters or []
    loaded = load_shard(folder, None, "cpu", dtype, trained=True)  # the old way: the whole piece, then cut
    sharded = Zero3Shard.of(loaded.shard, zero)
    return sharded, sharded.local_masters(loaded.masters) if loaded.masters else []


# a warm-up load of a tiny model of the same family touches the libraries' pages before the baseline (as
# tests/runtime/test_loading.py), so the growth measured below is the rank's tensors and modules
warm = load(tiny)
del warm

def rss():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024

gc.collect()
assert tracking._reset_hwm()
base = rss()
shard, masters = load(model_dir)
gc.collect()
held = sum(u.local.numel() * u.local.element_size() for u in shard.units) + sum(m.numel() * 4 for m in masters)
print(json.dumps({"base": base, "steady": rss(), "peak": tracking.rss_high_water_bytes(), "held": held}))
"""


def _measure(model_dir: Path, how: str, dtype: str, index: int) -> dict[str, int]:
    tiny = model_dir.parent / "warm-up"
    if not tiny.exists():
        _save(tiny, "qwen3", False)
    argv = [str(model_dir), how, dtype, str(index), str(tiny)]
    out = subprocess.run([sys.executable, "-c", _MEASURE, *argv],
                         capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_zero3_ranks_peak_while_loading_stays_within_1_2x_its_steady_state(tmp_path: Path) -> None:
    """A 42M-parameter Qwen3 (untied head, three files) as rank 0 and rank 1 of a DP=2 zero3 group: the resident
    set's growth while loading (its high-water mark) stays within 1.2x its growth once loaded, and that growth is
    the chunks held. Loading the whole piece first (the old way) exceeds 1.2x (the test sees it)."""
    model_dir = _save(tmp_path / "big", "qwen3", False, "40MB", **BIG)
    mib = 2**20
    for dtype, index in (("bf16", 0), ("fp32", 1)):
        new = _measure(model_dir, "chunks", dtype, index)
        steady, peak = new["steady"] - new["base"], new["peak"] - new["base"]
        where = f"{dtype} rank {index} of dp 2: peak {peak / mib:.1f} MiB, steady {steady / mib:.1f} MiB"
        assert peak <= 1.2 * steady, where
        assert new["held"] <= steady <= 1.5 * new["held"], f"{where}, held {new['held'] / mib:.1f} MiB"
        old = _measure(model_dir, "whole", dtype, index)
        old_peak = old["peak"] - old["base"]
        assert old_peak > 1.2 * steady, f"{where}; whole piece first: {old_peak / mib:.1f} MiB"
        print(f"{where}, held {new['held'] / mib:.1f} MiB; whole piece first: peak {old_peak / mib:.1f} MiB, "
              f"steady {(old['steady'] - old['base']) / mib:.1f} MiB")  # fmt: skip
