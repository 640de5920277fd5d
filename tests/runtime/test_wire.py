"""runtime/wire.py: rollouts and experience between ranks as tensors in bounded buckets (issue 21, item 5).

Real gloo groups: the tensor exchange gives exactly what the pickled `all_gather_object` exchange gave (uneven
counts, a member with nothing, TP peers holding the same rows, buckets far smaller than the data); and a real
2-rank `hetrl run` passes only small metadata through object collectives (counted by a sitecustomize in the
workers), none of it growing with the batch.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.runtime.local import free_port
from hetrl_cli.runtime.roles import Rollout, pad_rows

from .plans import D0, D1, hand_plan, on, tiny_workload

OBJECT_COLLECTIVES = ("all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list",
                      "send_object_list", "recv_object_list")  # fmt: skip


def _rollouts(rank: int, world: int) -> list[Rollout]:
    """Rank r holds 3r sequences (rank 0 none) of varied lengths, large token ids, indices interleaved."""
    g = torch.Generator().manual_seed(rank)
    out = []
    for i in range(3 * rank):
        prompt = torch.randint(0, 151_936, (1 + (i * 7) % 11,), generator=g).tolist()
        response = torch.randint(0, 151_936, ((i * 5) % 9,), generator=g).tolist()  # an empty response too
        out.append(Rollout(i * world + rank, tuple(prompt), tuple(response)))
    return out


def _experience(rank: int) -> dict[str, dict[int, object]]:
    """Per-token rows as the roles give them (fp32 values as Python floats), scores as Python floats (float64),
    and sequences 0..3 held by every rank (TP peers): the last in group order must win."""
    g = torch.Generator().manual_seed(10 + rank)
    rows = {i: torch.randn(1 + i % 6, generator=g).tolist() for i in range(4 * rank, 4 * rank + 5)}
    rows.update({i: torch.randn(3, generator=g).tolist() for i in range(4)})
    scores = {i: float(torch.rand((), dtype=torch.float64, generator=g)) / 3 for i in rows}
    return {"ref_logp": rows, "score": scores, "values": {i: [2 * v for v in row] for i, row in rows.items()}}


def _count_objects(counts: dict[str, int]) -> None:
    """Wrap torch.distributed's object collectives so each call adds its pickled size to `counts`."""
    import torch.distributed as dist

    for name in OBJECT_COLLECTIVES:
        real = getattr(dist, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            counts[_name] = counts.get(_name, 0) + len(pickle.dumps(args[:2]))
            return _real(*args, **kwargs)

        setattr(dist, name, counted)


def _exchange_worker(rank: int, port: int, world: int, out: str) -> None:
    import torch.distributed as dist

    from hetrl_cli.runtime import wire

    from .test_distributed import _init

    _init(rank, port, world)
    group = dist.group.WORLD
    mine, exp = _rollouts(rank, world), _experience(rank)
    pickled: list = [None] * world
    dist.all_gather_object(pickled, (mine, exp), group=group)  # the old exchange, as the reference
    old_rollouts = sorted((r for part, _ in pickled for r in part), key=lambda r: r.index)
    old_merged: dict = {}
    for _, part in pickled:
        for field, values in part.items():
            old_merged.setdefault(field, {}).update(values)
    count = max(i for values in old_merged.values() for i in values) + 1
    counts: dict[str, int] = {}
    _count_objects(counts)
    wire.WIRE_BUCKET_BYTES = 40  # ten floats a bucket: many buckets
    new_rollouts = wire.all_gather_rollouts(mine, group, world)
    new = wire.all_gather_experience(exp, group, world, count)
    assert new_rollouts == old_rollouts and counts == {}
    assert set(new) == set(old_merged)
    for field, values in old_merged.items():
        old_rows = [values[i] for i in range(count)]
        if field == "score":
            assert new[field] == [float(torch.tensor(v, dtype=torch.float32)) for v in old_rows]
        else:
            steps = max(len(r) for r in old_rows)
            assert torch.equal(pad_rows(new[field], steps), pad_rows(old_rows, steps)), field
            assert all(r.dtype == torch.float32 for r in new[field])
    Path(out, f"ok{rank}").write_text(json.dumps(len(new_rollouts)))
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_tensor_exchange_equals_the_pickled_one(tmp_path: Path, world: int) -> None:
    mp.spawn(_exchange_worker, args=(free_port(), world, str(tmp_path)), nprocs=world, join=True)
    expected = sum(3 * r for r in range(world))
    assert [json.loads((tmp_path / f"ok{r}").read_text()) for r in range(world)] == [expected] * world


def test_packed_rollouts_are_int32_and_round_trip() -> None:
    from hetrl_cli.runtime.wire import pack_rollouts, unpack_rollouts

    rollouts = _rollouts(2, 2)
    table, tokens = pack_rollouts(rollouts)
    assert table.dtype == tokens.dtype == torch.int32 and table.shape == (6, 3)
    assert tokens.numel() == sum(len(r.prompt_ids) + len(r.response_ids) for r in rollouts)
    assert unpack_rollouts(table, tokens) == rollouts
    assert unpack_rollouts(*pack_rollouts([])) == []


SITE = """
\"\"\"Counts the pickled bytes of every torch.distributed object collective of a worker (RANK set), by the calling
file:function, and writes them to $HETRL_OBJECT_LOG/rank-N.json at exit.\"\"\"
import atexit, json, os, pickle, sys
if os.environ.get("RANK") is not None and os.environ.get("HETRL_OBJECT_LOG"):
    import torch.distributed as dist
    counts = {}
    def wrap(name):
        real = getattr(dist, name)
        def counted(*args, **kwargs):
            caller = sys._getframe(1).f_code
            sent = args[1] if name == "all_gather_object" else args[0]
            key = f"{os.path.basename(caller.co_filename)}:{caller.co_name}:{name}"
            entry = counts.setdefault(key, [0, 0, 0])
            size = len(pickle.dumps(sent))
            entry[0] += 1
            entry[1] += size
            entry[2] = max(entry[2], size)
            return real(*args, **kwargs)
        setattr(dist, name, counted)
    for name in NAMES:
        wrap(name)
    def dump():
        with open(os.path.join(os.environ["HETRL_OBJECT_LOG"], "rank-" + os.environ["RANK"] + ".json"), "w") as f:
            json.dump(counts, f)
    atexit.register(dump)
""".replace("NAMES", repr(OBJECT_COLLECTIVES))
STEP_DATA = ("all_gather_objects", "share_rollouts", "experience")
"""Where the rollouts and experience went through object collectives before (comm.all_gather_objects)."""


@pytest.mark.slow
def test_a_two_rank_run_moves_only_metadata_through_object_collectives(hetrl, tmp_path: Path) -> None:
    """PPO over 2 gloo ranks with rollouts crossing ranks, experience gathered over both, a critic and an actor
    weight sync, no checkpoint: the rollouts and experience pass no object collective (they did, pickled), and
    what does (reports, sync specs) is metadata of at most 16 KiB a call."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    log = tmp_path / "objects"
    log.mkdir()
    wl = tiny_workload(algorithm="ppo", prompts_per_step=8, responses_per_prompt=4)
    placement = on(D0, ["generation", "reward", "critic_inference"]) | on(D1, ["reference", "critic_train"])
    placement["actor_train"] = [(D0, 0.3), (D1, 0.7)]
    save_artifact(hand_plan(wl, placement, name="ppo"), tmp_path / "ppo.json")
    steps = 2
    args = ["--run-dir", tmp_path / "run", "--engine", "hf", "--steps", str(steps), "--checkpoint-every", "0"]
    # no checkpoint: its index is an exchange of its own (issue 22's format), not the step's data
    result = hetrl("run", tmp_path / "ppo.json", *args, cwd=tmp_path, PYTHONPATH=str(site), HETRL_OBJECT_LOG=str(log))
    assert result.returncode == 0, result.stderr[-3000:]
    counts = {r: json.loads((log / f"rank-{r}.json").read_text()) for r in (0, 1)}
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    tokens = sum(m["response_tokens"] for m in lines)
    for rank, found in counts.items():
        assert not [key for key in found if key.split(":")[1] in STEP_DATA], (rank, found)
        assert "comm.py:gather_to_zero:gather_object" in found  # the counting sees the workers' collectives
        for key, (_, _, largest) in found.items():  # metadata only: reports, sync specs
            assert largest <= 16384, (rank, key, largest)
    print({"objects": counts, "response_tokens": tokens})
