"""full_weights() of a TP 2 x PP 2 replica on 4 gloo ranks: the tensor gather (runtime/gather.py) against the
pickled one it replaced (issue 21, item 5). Alternating repeats; prints the leader's median seconds and the
bytes each path passed through object collectives (all ranks), as one JSON line.

    python bench/gather_bench.py [--repeats 7] [--hidden 256] [--vocab 32000]
"""

from __future__ import annotations

import argparse
import datetime
import json
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _pickled_full_weights(shard: Any) -> list[tuple[str, Any]] | None:
    """The previous Shard.full_weights: gather_object of every member's CPU pieces, then _assemble."""
    import torch
    import torch.distributed as dist

    pieces = [(n, shard.par.pos.tp_rank, p.detach().cpu()) for n, p in shard.held if shard.owned(n)]
    leader = shard.par.mp_ranks[0]
    parts = [None] * shard.par.mp_size if dist.get_rank() == leader else None
    dist.gather_object(pieces, parts, dst=leader, group=shard.par.mp_group)
    if parts is None:
        return None
    full: dict[str, Any] = {}
    for part in parts:
        for name, tp_rank, tensor in part:
            sl = shard.slices.get(tp_rank, {}).get(name)
            if sl is None:
                full[name] = tensor
                continue
            target = full.setdefault(name, torch.zeros(shard.full_shapes[name], dtype=tensor.dtype))
            target.narrow(sl[0], sl[1], sl[2] - sl[1]).copy_(tensor)
    return [(n, full[n]) for n in shard.full_shapes if n in full]


def _worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch
    import torch.distributed as dist
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hetrl_cli.runtime import comm
    from hetrl_cli.runtime.layout import ReplicaLayout, TaskLayout
    from hetrl_cli.runtime.parallel import Parallel, Shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4,
                            timeout=datetime.timedelta(seconds=300))  # fmt: skip
    task = TaskLayout("actor_train", (ReplicaLayout(((0, 1), (2, 3)), (2, 2), (0, 8)),))
    groups = comm.make_groups(task.group_specs(), 300)
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                         tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    shard = Shard.build(Qwen2ForCausalLM(config).to(getattr(torch, args.dtype)), Parallel.of(task, rank, groups))
    pickled = [0]
    for collective, position in (("gather_object", 0), ("all_gather_object", 1), ("broadcast_object_list", 0)):
        real = getattr(dist, collective)

        def counted(*call: Any, _real: Any = real, _at: int = position, **kwargs: Any) -> Any:
            pickled[0] += len(pickle.dumps(call[_at]))  # this rank's object (list) as pickled
            return _real(*call, **kwargs)

        setattr(dist, collective, counted)
    times: dict[str, list[float]] = {"pickled": [], "tensors": []}
    sizes: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, call in (("pickled", lambda: _pickled_full_weights(shard)), ("tensors", shard.full_weights)):
            dist.barrier()
            before, start = pickled[0], time.perf_counter()
            call()
            dist.barrier()
            times[name].append(time.perf_counter() - start)
            sizes[name] = pickled[0] - before
    Path(out, f"rank{rank}.json").write_text(json.dumps({"times": times, "pickled": sizes}))
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    from hetrl_cli.runtime.local import free_port

    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_worker, args=(free_port(), args, out), nprocs=4, join=True)
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(4)]
    result = {
        "dtype": args.dtype,
        "median_s": {k: statistics.median(v) for k, v in ranks[0]["times"].items()},
        "range_s": {k: (min(v), max(v)) for k, v in ranks[0]["times"].items()},
        "pickled_bytes_all_ranks": {k: sum(r["pickled"][k] for r in ranks) for k in ("pickled", "tensors")},
    }
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
