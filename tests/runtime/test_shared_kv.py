"""Replicated KV heads' gradient sum over TP (parallel.Shard._sum_shared_kv), over real gloo groups.

The sum used to build a full-shape copy of every layer's K/V gradient and then concatenate them (two full-size
temporaries, ~2 x 205 MB bf16 for Qwen2.5-7B at TP 8, which the cost model does not charge); it now sums in
buckets of at most SHARED_KV_BUCKET_BYTES in one reused buffer. Where at most two ranks share a KV head (Qwen2.5-7B
at TP 8: 4 KV heads, 2 ranks each) the gradients are the old ones bit for bit: a + b (+ zeros) is exact in any
order. Where more share one, the all-reduce adds them in an order set by where the element sits in the reduced
tensor (gloo's ring segments; NCCL's choice of algorithm by size), so the old values were one association among
several and the buckets give another: equal to fp32 rounding.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from hetrl_cli.runtime.layout import ReplicaLayout, TaskLayout
from hetrl_cli.runtime.local import free_port


def _old_sum_shared_kv(shard) -> None:
    """The sum as it was before the buckets (the reference the new one must equal bit for bit)."""
    import torch.distributed as dist

    from hetrl_cli.runtime.parallel import _numel

    pos = shard.par.pos
    shared = [(n, p) for n, p in shard.held if ".k_proj." in n or ".v_proj." in n]
    bufs = []
    for n, p in shared:
        full = torch.zeros(shard.full_shapes[n], dtype=p.grad.dtype, device=p.grad.device)
        dim, lo, hi = shard.slices[pos.tp_rank][n]
        full.narrow(dim, lo, hi - lo).copy_(p.grad)
        bufs.append(full.reshape(-1))
    flat = torch.cat(bufs)
    dist.all_reduce(flat, group=shard.par.tp_group)
    offset = 0
    for n, p in shared:
        numel = _numel(shard.full_shapes[n])
        dim, lo, hi = shard.slices[pos.tp_rank][n]
        p.grad.copy_(flat[offset : offset + numel].view(shard.full_shapes[n]).narrow(dim, lo, hi - lo))
        offset += numel


def _worker(rank: int, port: int, tp: int, kv: int, dtype: str, out: str) -> None:
    import torch.distributed as dist
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hetrl_cli.runtime import comm, parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp,
                            timeout=datetime.timedelta(seconds=90))  # fmt: skip
    task = TaskLayout("actor_train", (ReplicaLayout((tuple(range(tp)),), (3,), (0, 8)),))
    groups = comm.make_groups(task.group_specs(), 90)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=kv, head_dim=16)  # fmt: skip
    shard = parallel.Shard.build(
        Qwen2ForCausalLM(config).to(getattr(torch, dtype)), parallel.Parallel.of(task, rank, groups)
    )
    generator = torch.Generator().manual_seed(1 + rank)  # each rank's gradients its own
    grads = {n: torch.randn(p.shape, generator=generator).to(p.dtype) for n, p in shard.held}
    sizes: list[int] = []
    all_reduce = dist.all_reduce

    def recording(tensor, *args, **kwargs):
        sizes.append(tensor.numel() * tensor.element_size())
        return all_reduce(tensor, *args, **kwargs)

    found = {}
    for label in ("old", "one bucket", "small buckets"):
        for n, p in shard.held:
            p.grad = grads[n].clone()
        sizes.clear()
        dist.all_reduce = recording
        if label == "old":
            _old_sum_shared_kv(shard)
        else:
            parallel.SHARED_KV_BUCKET_BYTES = (16 << 20) if label == "one bucket" else 3000
            shard._sum_shared_kv()
        dist.all_reduce = all_reduce
        found[label] = {"grads": {n: p.grad for n, p in shard.held}, "sizes": list(sizes)}
    torch.save(found, Path(out) / f"rank{rank}.pt")
    full = sum(parallel._numel(shard.full_shapes[n]) for n, _ in shard.held if ".k_proj." in n or ".v_proj." in n)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({"full_bytes": full * shard.held[0][1].element_size()}))
    dist.destroy_process_group()


@pytest.mark.parametrize(("tp", "kv", "dtype"), [(2, 1, "float32"), (4, 2, "bfloat16"), (4, 1, "float32")])
def test_bucketed_kv_sum_equals_the_old_full_copy_bit_for_bit(tmp_path: Path, tp: int, kv: int, dtype: str) -> None:
    """Every rank's every gradient equals the old sum's, with one bucket and with buckets smaller than the model's
    K/V (3000 bytes: one or two parameters each), exactly where at most two ranks share a KV head; no all-reduce
    moves more than its bucket (or one parameter), and together they move the full K/V once."""
    mp.spawn(_worker, args=(free_port(), tp, kv, dtype, str(tmp_path)), nprocs=tp, join=True)
    for rank in range(tp):
        found = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        full_bytes = json.loads((tmp_path / f"rank{rank}.json").read_text())["full_bytes"]
        old = found["old"]["grads"]
        for label in ("one bucket", "small buckets"):
            for name, grad in found[label]["grads"].items():
                if tp // kv <= 2 or label == "one bucket" or (".k_proj." not in name and ".v_proj." not in name):
                    assert torch.equal(grad, old[name]), (rank, label, name)
                else:  # four ranks' terms, associated differently
                    torch.testing.assert_close(grad, old[name], rtol=1e-6, atol=1e-6)
        assert found["old"]["sizes"] == [full_bytes]
        assert found["one bucket"]["sizes"] == [full_bytes]
        small = found["small buckets"]["sizes"]
        assert len(small) > 2 and sum(small) == full_bytes
        largest_parameter = 64 * 16 * (2 if dtype == "bfloat16" else 4)  # k_proj.weight: one KV head's rows, full
        assert max(small) <= max(3000, kv * largest_parameter), small
