"""Shard.full_weights / full_optimizer_state move tensors, not pickles (runtime/gather.py, issue 21 item 5).

Real gloo groups laid out by the runtime's own code (TaskLayout -> comm.make_groups -> Parallel.of) on TP 2, PP 2
and TP 2 x PP 2, fp32 and bf16: the tensor exchange gives exactly what the pickled exchange gave (the previous
`_gather`/`_assemble`, kept here as the reference), with 1000-byte buckets (most pieces cut across buckets) and
with the default ones; and a full_weights() of a TP 2 x PP 2 replica passes no bytes through object collectives
(the pickled path passed the whole model).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from hetrl_cli.runtime.layout import ReplicaLayout, TaskLayout
from hetrl_cli.runtime.local import free_port

from .test_parallel import _init
from .test_wire import _count_objects

LAYOUTS = {  # (rank grid per stage, layer split)
    "tp2": (((0, 1),), (4,)),
    "pp2": (((0,), (1,)), (1, 3)),
    "tp2xpp2": (((0, 1), (2, 3)), (3, 1)),
}


def _model(dtype: torch.dtype, tied: bool) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(dtype)


def _pickled_gather(shard: Any, obj: Any, everyone: bool) -> list[Any] | None:
    """The previous Shard._gather: every member's pieces pickled on the CPU."""
    import torch.distributed as dist

    cpu = [(n, r, t.detach().cpu() if isinstance(t, torch.Tensor) else t) for n, r, t in obj]
    if everyone:
        out: list[Any] = [None] * shard.par.mp_size
        dist.all_gather_object(out, cpu, group=shard.par.mp_group)
        return out
    leader = shard.par.mp_ranks[0]
    gathered = [None] * shard.par.mp_size if dist.get_rank() == leader else None
    dist.gather_object(cpu, gathered, dst=leader, group=shard.par.mp_group)
    return gathered


def _pickled_weights(shard: Any, everyone: bool, grads: bool) -> list[tuple[str, torch.Tensor]] | None:
    """The previous full_weights (_gather + _assemble)."""
    pieces = [(n, shard.par.pos.tp_rank, (p.grad if grads else p).detach()) for n, p in shard.held if shard.owned(n)]
    parts = _pickled_gather(shard, pieces, everyone)
    if parts is None:
        return None
    full: dict[str, torch.Tensor] = {}
    for part in parts:
        for name, tp_rank, tensor in part:
            sl = shard.slices.get(tp_rank, {}).get(name)
            if sl is None:
                full[name] = tensor
                continue
            target = full.setdefault(name, torch.zeros(shard.full_shapes[name], dtype=tensor.dtype))
            target.narrow(sl[0], sl[1], sl[2] - sl[1]).copy_(tensor)
    return [(n, full[n]) for n in shard.full_shapes if n in full]


def _pickled_optimizer_state(shard: Any, optimizer: Any) -> dict[str, Any] | None:
    """The previous full_optimizer_state."""
    sd = optimizer.state_dict()
    pieces = [(name, shard.par.pos.tp_rank, dict(sd["state"][i])) for i, (name, _) in enumerate(shard.held)
              if shard.owned(name) and i in sd["state"]]  # fmt: skip
    parts = _pickled_gather(shard, [(n, r, {k: _cpu(v) for k, v in s.items()}) for n, r, s in pieces], False)
    if parts is None:
        return None
    state: dict[str, dict[str, Any]] = {}
    for part in parts:
        for name, tp_rank, values in part:
            slot = state.setdefault(name, {})
            for key, value in values.items():
                sl = shard.slices.get(tp_rank, {}).get(name)
                if sl is None or not isinstance(value, torch.Tensor) or value.dim() == 0:
                    slot[key] = value
                    continue
                target = slot.setdefault(key, torch.zeros(shard.full_shapes[name], dtype=value.dtype))
                target.narrow(sl[0], sl[1], sl[2] - sl[1]).copy_(value)
    return {"state": state, "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]}


def _cpu(value: Any) -> Any:
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def _same(a: Any, b: Any) -> bool:
    """Equal names, order, dtypes, shapes and bits (tensors), or equal values."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b and type(a) is type(b)


def _shard(layout: str, rank: int, dtype: torch.dtype, tied: bool) -> tuple[Any, Any]:
    """This rank's shard of the 4-layer model, with seeded gradients and one Adam step's state (plus one
    non-tensor state value, which the metadata carries)."""
    from hetrl_cli.runtime import comm
    from hetrl_cli.runtime.parallel import Parallel, Shard

    grid, split = LAYOUTS[layout]
    task = TaskLayout("actor_train", (ReplicaLayout(grid, split, (0, 8)),))
    groups = comm.make_groups(task.group_specs(), 90)
    shard = Shard.build(_model(dtype, tied), Parallel.of(task, rank, groups))
    g = torch.Generator().manual_seed(100 + rank)
    for _, p in shard.held:
        p.grad = torch.randn(p.shape, generator=g).to(dtype)
    optimizer = torch.optim.Adam([p for _, p in shard.held], lr=1e-2)
    optimizer.step()
    optimizer.state[shard.held[-1][1]]["note"] = f"rank {rank}"
    return shard, optimizer


def _equality_worker(rank: int, port: int, layout: str, dtype_name: str, out: str) -> None:
    import torch.distributed as dist

    from hetrl_cli.runtime import gather

    dtype = getattr(torch, dtype_name)
    world = sum(len(stage) for stage in LAYOUTS[layout][0])
    _init(rank, port, world)
    checked = []
    for bucket in (1000, 16 << 20):  # 1000: most pieces cut across buckets
        gather.GATHER_BUCKET_BYTES = bucket
        for tied in (False, True):
            shard, optimizer = _shard(layout, rank, dtype, tied)
            for everyone, grads in ((False, False), (True, False), (False, True), (True, True)):
                new, old = shard.full_weights(everyone, grads), _pickled_weights(shard, everyone, grads)
                assert _same(new, old), (layout, dtype_name, bucket, tied, everyone, grads)
                assert (new is None) == (rank != 0 and not everyone)
                checked.append(new is not None)
            new_state, old_state = shard.full_optimizer_state(optimizer), _pickled_optimizer_state(shard, optimizer)
            assert _same(new_state, old_state), (layout, dtype_name, bucket, tied, "optimizer")
            checked.append(new_state is not None)
    Path(out, f"ok{rank}").write_text(json.dumps(checked))
    dist.destroy_process_group()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_tensor_gather_equals_the_pickled_one(tmp_path: Path, layout: str, dtype_name: str) -> None:
    world = sum(len(stage) for stage in LAYOUTS[layout][0])
    mp.spawn(_equality_worker, args=(free_port(), layout, dtype_name, str(tmp_path)), nprocs=world, join=True)
    leader = json.loads((tmp_path / "ok0").read_text())
    assert leader == [True] * len(leader) and len(leader) == 2 * 2 * 5
    for rank in range(1, world):  # the everyone=True results only
        assert json.loads((tmp_path / f"ok{rank}").read_text()) == [False, True, False, True, False] * 4


def _objects_worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from hetrl_cli.runtime import gather

    _init(rank, port, 4)
    shard, optimizer = _shard("tp2xpp2", rank, torch.bfloat16, False)
    counts: dict[str, int] = {}
    _count_objects(counts)
    gather.GATHER_BUCKET_BYTES = 4096
    sent: list[int] = []
    real_send = dist.send

    def send(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        sent.append(tensor.numel() * tensor.element_size())
        return real_send(tensor, *args, **kwargs)

    dist.send = send
    weights = shard.full_weights()
    dist.send = real_send
    weight_objects = sum(counts.values())
    shard.full_optimizer_state(optimizer)
    state_objects = sum(counts.values()) - weight_objects
    model_bytes = sum(t.numel() * t.element_size() for _, t in weights) if weights else 0
    Path(out, f"rank{rank}").write_text(json.dumps([weight_objects, state_objects, model_bytes, sent]))
    dist.destroy_process_group()


def test_full_weights_of_a_tp2_pp2_replica_pickles_no_tensor(tmp_path: Path) -> None:
    """The object collectives of a full_weights() carry nothing (the pickled path carried every piece: the
    whole model, ~0.1 MB here and 16 GB for an 8B model in bf16); full_optimizer_state's carry only the
    state's key names and non-tensor values, a few hundred bytes a rank. Every send to the leader is one bucket
    of at most GATHER_BUCKET_BYTES, and the leader sends nothing."""
    mp.spawn(_objects_worker, args=(free_port(), str(tmp_path)), nprocs=4, join=True)
    results = [json.loads((tmp_path / f"rank{r}").read_text()) for r in range(4)]
    assert results[0][2] > 50_000  # the leader holds the full model
    assert all(weights == 0 for weights, _, _, _ in results), results
    assert all(0 < state <= 1024 for _, state, _, _ in results), results
    assert results[0][3] == [] and all(max(sent) <= 4096 and len(sent) > 1 for *_, sent in results[1:]), results
    assert 0 < sum(sum(sent) for *_, sent in results[1:]) < results[0][2]  # the leader's own pieces stay put
