"""ZeRO sharding, activation recomputation and offload (runtime/sharding.py, runtime/zero3.py) over real gloo
process groups.

Sharded updates (zero1, zero2, zero3; DP with uneven shares, also with TP 2 and PP 2) must equal one process's
unsharded update on the full batch, the consolidated checkpoint must equal the unsharded optimizer state and
restore the partitions exactly; zero3 ranks hold only their chunks between uses; recompute must give the same
gradients while running each layer twice; offload must run and change nothing. `hetrl run` trains a sharded,
recomputed, offloaded plan, resumes it from a sharded checkpoint, and matches the unsharded run (zero2, zero3).
"""

from __future__ import annotations

import copy
import datetime
import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.artifacts.workload import ModelSpec, RLSpec
from hetrl_cli.runtime.layout import ReplicaLayout, TaskLayout, apportion, supported
from hetrl_cli.runtime.local import free_port
from hetrl_cli.runtime.roles import Actor, Critic, Rollout, pad_rows

from .plans import D0, GRPO_TASKS, colocated, hand_plan, replica, tiny_workload
from .test_distributed import _batch

CLIPPED = RLSpec(lr=1e-2, grad_clip=0.5, kl_coef=0.05, weight_decay=0.01)
"""Clipping active (the norm is ~1) and weight decay on: both must act on the full gradient / every parameter."""


def _update(actor: Actor, rollouts: list[Rollout], adv: torch.Tensor, lo: int, hi: int, dp) -> dict[str, float]:
    """One train_step on sequences [lo, hi) (old log-probs of the whole batch; a shifted reference)."""
    steps = max(len(r.response_ids) for r in rollouts)
    mask = pad_rows([[1.0] * len(r.response_ids) for r in rollouts], steps)
    with torch.no_grad():  # old log-probs without the pipeline (every rank needs them): the unsharded model
        old = pad_rows(_reference_logp(actor, rollouts), steps)
    ref = old - 0.1 * mask
    return actor.train_step(rollouts[lo:hi], (adv * mask)[lo:hi], old[lo:hi], ref[lo:hi], float(mask.sum()), dp)


_OLD: dict[str, list[list[float]]] = {}


def _reference_logp(actor: Actor, rollouts: list[Rollout]) -> list[list[float]]:
    """Fixed 'old' log-probs for the batch: any fixed values work, the same on every rank and in one process."""
    if "x" not in _OLD:
        g = torch.Generator().manual_seed(1)
        _OLD["x"] = [(-1.0 - torch.rand(len(r.response_ids), generator=g)).tolist() for r in rollouts]
    return _OLD["x"]


SHAPES = {
    "dp2": [(((0,),), (2,), 0.25), (((1,),), (2,), 0.75)],
    "dp2xtp2": [(((0, 1),), (2,), 0.25), (((2, 3),), (2,), 0.75)],
    "dp2xpp2": [(((0,), (1,)), (1, 1), 0.25), (((2,), (3,)), (1, 1), 0.75)],
}


def _layout(shape: str) -> TaskLayout:
    grids = SHAPES[shape]
    counts = apportion([share for _, _, share in grids], 8)
    starts = [sum(counts[:i]) for i in range(len(counts))]
    replicas = tuple(
        ReplicaLayout(grid, split, (lo, lo + n)) for (grid, split, _), lo, n in zip(grids, starts, counts, strict=True)
    )
    return TaskLayout("actor_train", replicas)


def _sharded_worker(rank: int, port: int, shape: str, kind: str, recompute: bool, model_dir: str, out: str) -> None:
    """Two Adam updates (2 epochs each) with ZeRO, a checkpoint between them restored into a fresh actor."""
    import torch.distributed as dist

    from hetrl_cli.runtime import comm
    from hetrl_cli.runtime.parallel import Parallel, dp_group
    from hetrl_cli.runtime.sharding import local_params, zero_for

    task = _layout(shape)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=len(task.ranks),
                            timeout=datetime.timedelta(seconds=90))  # fmt: skip
    groups = comm.make_groups(task.group_specs(zero=True), 90)
    par = Parallel.of(task, rank, groups)
    zero = zero_for(task, rank, groups, kind)
    dp = dp_group(task, rank, groups)
    lo, hi = task.range_of(rank)
    rollouts, adv = _batch()

    def actor(sharded: bool = True) -> Actor:
        return Actor(model_dir, CLIPPED, "grpo", "adamw", 2, pad_id=1, micro_batch=3, parallel=par,
                     zero=zero if sharded else None, recompute=recompute)  # fmt: skip

    plain = actor(sharded=False)  # the same layout unsharded: the same sums in the same order
    _update(plain, rollouts, adv, lo, hi, dp)
    plain_state = copy.deepcopy(plain.state())
    _update(plain, rollouts, adv, lo, hi, dp)

    first = actor()
    result: dict = {"zero_size": zero.size, "sums": _update(first, rollouts, adv, lo, hi, dp)}
    result["local"] = len(local_params(first.optimizer))
    result["held"] = len(first.shard.held)
    result["grads_freed"] = sum(p.grad is None for _, p in first.shard.held)
    result["weights1"] = _copy(first.named_weights())
    state = copy.deepcopy(first.state())  # every rank: the consolidation is collective over the ZeRO group
    result["state"] = state
    box = [state]
    dist.broadcast_object_list(box, src=task.leader)
    fresh = actor()
    fresh.load_state(copy.deepcopy(box[0]))  # on CPU the optimizer would adopt (and later mutate) these tensors
    for a in (first, fresh):
        _update(a, rollouts, adv, lo, hi, dp)
    result["weights2"] = first.named_weights()
    result["weights2_fresh"] = fresh.named_weights()
    result["weights2_plain"] = plain.named_weights()
    result["plain_state"] = plain_state
    torch.save(result, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def _copy(named):
    """Detached copies: named_weights() may return the live parameters."""
    return None if named is None else [(n, t.detach().clone()) for n, t in named]


def _single(model_dir: Path) -> dict:
    """The same two updates in one process, unsharded, full batch (and the optimizer state in between)."""
    rollouts, adv = _batch()
    actor = Actor(model_dir, CLIPPED, "grpo", "adamw", 2, pad_id=1, micro_batch=3)
    out: dict = {"sums": _update(actor, rollouts, adv, 0, len(rollouts), (None, 1))}
    out["weights1"] = dict(_copy(actor.named_weights()))
    out["state"] = copy.deepcopy(actor.state())
    _update(actor, rollouts, adv, 0, len(rollouts), (None, 1))
    out["weights2"] = dict(actor.named_weights())
    return out


def _close_weights(named, single: dict, atol: float = 1e-7) -> None:
    assert named is not None
    assert sorted(n for n, _ in named) == sorted(single)
    for name, tensor in named:
        torch.testing.assert_close(tensor, single[name], atol=atol, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("shape", "kind", "recompute"),
    [("dp2", "zero1", False), ("dp2", "zero2", True), ("dp2xtp2", "zero2", True), ("dp2xpp2", "zero1", False)],
)
def test_sharded_updates_equal_the_unsharded_one(
    tiny_dir: Path, tmp_path: Path, shape: str, kind: str, recompute: bool
) -> None:
    task = _layout(shape)
    mp.spawn(_sharded_worker, args=(free_port(), shape, kind, recompute, str(tiny_dir), str(tmp_path)),
             nprocs=len(task.ranks), join=True)  # fmt: skip
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(len(task.ranks))]
    single = _single(tiny_dir)
    assert any(not torch.equal(w, single["weights2"][n]) for n, w in single["weights1"].items())
    for r, result in enumerate(ranks):
        assert result["zero_size"] == 2
        assert 0 < result["local"] < result["held"], "each rank steps only its partition"
        torch.testing.assert_close(result["sums"]["grad_norm"], single["sums"]["grad_norm"], atol=2e-5, rtol=1e-4)
        if kind == "zero2":  # the other rank's gradients are freed before the step
            assert result["grads_freed"] == result["held"] - result["local"]
        else:
            assert result["grads_freed"] == 0
        if r == task.leader:
            assert result["state"] is not None
        elif task.position(r).replica != 0:
            assert result["state"] is None
    for rep in task.replicas:  # every replica holds the unsharded update, before and after the restore
        leader = ranks[rep.ranks[0]]
        plain = dict(leader["weights2_plain"])
        _close_weights(leader["weights2"], plain)  # = unsharded DP on the same layout
        _close_weights(leader["weights2_fresh"], plain)  # the sharded checkpoint restored every partition
        # = one process on the full batch, up to summation order (Adam scales tiny gradient differences up)
        _close_weights(leader["weights1"], single["weights1"], atol=5e-4)
        _close_weights(leader["weights2"], single["weights2"], atol=5e-4)
    state, expected = ranks[task.leader]["state"]["optimizer"], ranks[task.leader]["plain_state"]["optimizer"]
    assert sorted(state["state"]) == sorted(expected["state"])
    for name, slots in expected["state"].items():  # consolidated = the unsharded optimizer's moments (same layout)
        assert set(state["state"][name]) == set(slots)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(
                state["state"][name][key],
                slots[key],
                atol=1e-6,
                rtol=1e-3,
                msg=lambda m, n=name, k=key: f"{n} {k}: {m}",
            )


# --- recompute ------------------------------------------------------------------------------------


def _count_layer_calls(model) -> list[int]:
    """Wrap each decoder layer's (possibly checkpointed) inner forward with a call counter."""
    calls = [0]
    for layer in model.model.layers:
        inner = layer.self_attn.forward

        def counted(*args, _inner=inner, **kwargs):
            calls[0] += 1
            return _inner(*args, **kwargs)

        layer.self_attn.forward = counted
    return calls


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_recompute_gives_the_same_gradients_and_runs_the_layers_again(tiny_dir: Path, role: str) -> None:
    rollouts, adv = _batch()
    steps = max(len(r.response_ids) for r in rollouts)
    mask = pad_rows([[1.0] * len(r.response_ids) for r in rollouts], steps)
    results = {}
    for recompute in (False, True):
        if role == "actor":
            model = Actor(tiny_dir, CLIPPED, "grpo", "sgd", 1, pad_id=1, micro_batch=3, recompute=recompute)
            calls = _count_layer_calls(model.model)
            old = pad_rows(_reference_logp(model, rollouts), steps)
            sums = model.train_step(rollouts, adv * mask, old, old - 0.1 * mask, float(mask.sum()), (None, 1))
            loss = sums["pg_loss_sum"]
        else:
            model = Critic(tiny_dir, CLIPPED, "sgd", 1, 1, 3, seed=0, recompute=recompute)
            calls = _count_layer_calls(model.model)
            values = pad_rows(model.values(rollouts), steps)
            calls[0] = 0
            sums = model.train_step(rollouts, values + adv * mask, values, float(mask.sum()), (None, 1))
            loss = sums["vf_loss_sum"]
        grads = {n: p.grad.clone() for n, p in model.shard.held}
        results[recompute] = (loss, grads, calls[0], dict(model.named_weights()))
    (loss0, grads0, calls0, w0), (loss1, grads1, calls1, w1) = results[False], results[True]
    assert calls1 == 2 * calls0 > 0, "with recompute every layer runs again in the backward"
    assert loss1 == pytest.approx(loss0, rel=1e-6)
    assert any(float(g.abs().sum()) > 0 for g in grads0.values())
    for name, grad in grads0.items():
        torch.testing.assert_close(grads1[name], grad, atol=1e-7, rtol=1e-5, msg=name)
    for name, weight in w0.items():
        torch.testing.assert_close(w1[name], weight, atol=1e-7, rtol=1e-6, msg=name)


# --- offload --------------------------------------------------------------------------------------


def test_offload_moves_state_and_changes_nothing(tiny_dir: Path) -> None:
    from hetrl_cli.runtime.sharding import Offload

    rollouts, adv = _batch()
    steps = max(len(r.response_ids) for r in rollouts)
    mask = pad_rows([[1.0] * len(r.response_ids) for r in rollouts], steps)
    old = pad_rows(_reference_logp(None, rollouts), steps)  # type: ignore[arg-type]
    weights = {}
    for offload in (False, True):
        actor = Actor(tiny_dir, CLIPPED, "grpo", "adam", 1, pad_id=1, micro_batch=4)
        off = Offload("actor_train", "cpu", (actor.model,), (actor.optimizer,))
        for _ in range(2):
            if offload:
                off.to_device()
            actor.train_step(rollouts, adv * mask, old, old - 0.1 * mask, float(mask.sum()), (None, 1))
            if offload:
                off.to_host()
                off.to_host()  # idempotent: already on the host
                assert not off.on_device
        weights[offload] = dict(actor.named_weights())
        assert off.moves == (3 if offload else 0)  # host, device, host (the first to_device: already there)
    for name, weight in weights[False].items():
        assert torch.equal(weights[True][name], weight), name


# --- what runs, what is refused ---------------------------------------------------------------------


def test_supported_runs_zero1_zero2_zero3_and_refuses_uneven_zero_pp() -> None:
    for kind in ("none", "zero1", "zero2", "zero3"):
        assert supported(colocated(tiny_workload(sharding=kind, recompute=True))) == []
    one_replica = hand_plan(tiny_workload(sharding="zero3"), {t: [(D0, 1.0)] for t in GRPO_TASKS})
    assert supported(one_replica) == []  # dp = 1: nothing to shard, as in the cost model
    wl = tiny_workload(sharding="zero1", actor=ModelSpec(arch="tiny", path="/models/four-layer"))
    devices = [f"localhost/{i}" for i in range(4)]
    uneven = hand_plan(wl, {"actor_train": [replica([[devices[0]], [devices[1]]], 0.5, [1, 3]),
                                            replica([[devices[2]], [devices[3]]], 0.5, [3, 1])],
                            **{t: [(devices[0], 1.0)] for t in ("generation", "reference", "reward")}})  # fmt: skip
    assert supported(uneven) == [
        "task actor_train: sharding zero1 with pp=2 needs the same layer split in every replica (got [1, 3], [3, 1])"
    ]
    uneven.workload.sharding = "zero3"  # zero3's chunks too: a ZeRO group holds the same layers in every replica
    assert supported(uneven) == [
        "task actor_train: sharding zero3 with pp=2 needs the same layer split in every replica (got [1, 3], [3, 1])"
    ]


def test_offloaded_generation_needs_the_hf_engine() -> None:
    plan = colocated(tiny_workload())
    for task in plan.tasks:
        task.offload = True
    assert supported(plan, "hf") == []
    assert supported(plan, "vllm") == [
        "task generation: offload with the vllm engine (pass --engine hf to offload generation)"
    ]


# --- end to end -----------------------------------------------------------------------------------


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_hetrl_run_sharded_offloaded_recomputed_resumes_and_matches_unsharded(hetrl, tmp_path: Path) -> None:
    """Colocated DP 2 (shares 0.25/0.75) with zero2 + recompute + offload of every task: 2 steps, then --resume
    to 3 from the sharded checkpoint; every step matches the plain run of the same plan (3 steps)."""
    plain = colocated(tiny_workload())
    sharded = colocated(tiny_workload(sharding="zero2", recompute=True))
    for task in sharded.tasks:
        task.offload = True
    save_artifact(plain, tmp_path / "plain.json")
    save_artifact(sharded, tmp_path / "sharded.json")
    base = hetrl("run", tmp_path / "plain.json", "--run-dir", tmp_path / "plain", "--engine", "hf", "--steps", "3",
                 cwd=tmp_path)  # fmt: skip
    assert base.returncode == 0, base.stderr[-3000:]
    run_dir = tmp_path / "sharded"
    args = ["run", tmp_path / "sharded.json", "--engine", "hf", "--verify-weights"]
    first = hetrl(*args, "--run-dir", run_dir, "--steps", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "offload: actor_train, generation, reference, reward state kept in host memory" in first.stderr
    resumed = hetrl(*args, "--steps", "3", "--resume", run_dir, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming after step 2" in resumed.stderr
    lines, expected = _metrics(run_dir), _metrics(tmp_path / "plain")
    assert [m["step"] for m in lines] == [1, 2, 3]
    for mine, theirs in zip(lines, expected, strict=True):
        assert mine["engine_checksums"] == [mine["actor_checksum"]]
        for key in ("reward_mean", "pg_loss", "kl", "grad_norm", "response_tokens"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), (mine["step"], key)
    from hetrl_cli.runtime.checkpoint import read_full_state

    state = read_full_state(run_dir / "checkpoints" / "step-000003", "actor")
    assert len(state["optimizer"]["state"]) == len(state["model"])  # both partitions consolidated


# --- zero3 ------------------------------------------------------------------------------------------

ZERO3_SHAPES = {**SHAPES, "dp2-empty": [(((0,),), (2,), 0.05), (((1,),), (2,), 0.95)]}
"""dp2-empty: replica 0 gets none of the 8 sequences (apportion gives 0 and 8), so it only pads the passes."""


def _zero3_layout(shape: str) -> TaskLayout:
    SHAPES.setdefault(shape, ZERO3_SHAPES[shape])
    return _layout(shape)


def _assemble(parts: list[list]) -> dict[tuple[str, str | None], torch.Tensor]:
    """Full tensors from every rank's Zero3Shard.checkpoint_pieces; each element of a tensor written exactly once."""
    full: dict[tuple[str, str | None], torch.Tensor] = {}
    seen: dict[tuple[str, str | None], torch.Tensor] = {}
    for part in parts:
        for name, key, tensor, offsets, shape in part:
            if not shape:  # a step counter: once, with the tensor's first element
                assert (name, key) not in full, f"{name} {key} written twice"
                full[(name, key)] = tensor
                continue
            target = full.setdefault((name, key), torch.zeros(shape, dtype=tensor.dtype))
            count = seen.setdefault((name, key), torch.zeros(shape, dtype=torch.int64))
            box = tuple(slice(o, o + s) for o, s in zip(offsets, tensor.shape, strict=True))
            target[box] = tensor
            count[box] += 1
    for (name, key), count in seen.items():
        assert bool((count == 1).all()), f"{name} {key}: pieces do not tile the tensor once"
    return full


def _zero3_worker(rank: int, port: int, shape: str, recompute: bool, precision: str, model_dir: str, out: str) -> None:
    """Two Adam updates (2 epochs each) with zero3, a checkpoint between them restored into a fresh actor."""
    import torch.distributed as dist

    from hetrl_cli.runtime import comm
    from hetrl_cli.runtime.parallel import Parallel, dp_group
    from hetrl_cli.runtime.sharding import zero_for

    task = _zero3_layout(shape)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=len(task.ranks),
                            timeout=datetime.timedelta(seconds=90))  # fmt: skip
    groups = comm.make_groups(task.group_specs(zero=True), 90)
    par = Parallel.of(task, rank, groups)
    zero = zero_for(task, rank, groups, "zero3")
    dp = dp_group(task, rank, groups)
    lo, hi = task.range_of(rank)
    rollouts, adv = _batch()

    def actor(sharded: bool = True) -> Actor:
        return Actor(model_dir, CLIPPED, "grpo", "adamw", 2, pad_id=1, micro_batch=3, parallel=par,
                     zero=zero if sharded else None, recompute=recompute, precision=precision)  # fmt: skip

    plain = actor(sharded=False)  # the same layout unsharded
    _update(plain, rollouts, adv, lo, hi, dp)
    plain_state = copy.deepcopy(plain.state())
    first = actor()
    result: dict = {"kind": type(first.shard).__name__, "sums": _update(first, rollouts, adv, lo, hi, dp)}
    result["grads"] = _copy(first.shard.full_weights(grads=True))  # the last epoch's, clipped
    result["plain_grads"] = _copy(plain.shard.full_weights(grads=True))
    # between uses a rank holds its chunks only: every module parameter's storage is empty
    result["module_bytes"] = sum(p.untyped_storage().nbytes() for _, p in first.shard.held)
    result["chunk_numel"] = sum(p.numel() for p in first.shard.local_params())
    result["held_numel"] = sum(p.numel() for _, p in first.shard.held)
    result["weights1"] = _copy(first.named_weights())
    state = copy.deepcopy(first.state())  # every rank: its gathers are collective over the replicas
    result["state"] = state
    result["pieces"] = [(n, k, t.detach().clone(), o, first.shard.full_shapes[n] if t.dim() else ())
                        for n, k, t, o in first.shard.checkpoint_pieces(first.optimizer)]  # fmt: skip
    box = [state]
    dist.broadcast_object_list(box, src=task.leader)
    fresh = actor()
    fresh.load_state(copy.deepcopy(box[0]))
    result["gathered_layers"] = _most_gathered_layers(first, lambda: _update(first, rollouts, adv, lo, hi, dp))
    _update(fresh, rollouts, adv, lo, hi, dp)
    result["weights2"] = first.named_weights()
    result["weights2_fresh"] = fresh.named_weights()
    result["plain_state"] = plain_state
    torch.save(result, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def _most_gathered_layers(actor: Actor, run) -> int:
    """The most decoder layers gathered at once while `run()` trains (costmodel.memory's ZERO3_GATHERED_LAYERS)."""
    shard, most = actor.shard, [0]
    plain = shard._acquire

    def counted(unit) -> None:
        plain(unit)
        most[0] = max(most[0], sum(u.users > 0 for u in shard.units if u.layer))

    shard._acquire = counted
    try:
        run()
    finally:
        shard._acquire = plain
    return most[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("shape", "recompute", "precision"),
    [("dp2", False, "fp32"), ("dp2-empty", False, "fp32"), ("dp2xtp2", True, "fp32"), ("dp2xpp2", False, "fp32"),
     ("dp2", True, "bf16")],
)  # fmt: skip
def test_zero3_updates_equal_one_process(tiny_dir: Path, tmp_path: Path, shape: str, recompute: bool,
                                         precision: str) -> None:  # fmt: skip
    """zero3 over 2 replicas with uneven shares (also one replica without sequences, TP 2 with replicated KV heads,
    PP 2 with the tied head on both stages): the update is one process's on the full batch, each rank holds only
    its chunks between uses, the checkpoint (every replica takes part) equals the unsharded optimizer state and
    restores every chunk, and the chunk pieces tile every tensor once."""
    task = _zero3_layout(shape)
    mp.spawn(_zero3_worker, args=(free_port(), shape, recompute, precision, str(tiny_dir), str(tmp_path)),
             nprocs=len(task.ranks), join=True)  # fmt: skip
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(len(task.ranks))]
    single = _single(tiny_dir) if precision == "fp32" else None
    for r, result in enumerate(ranks):
        assert result["kind"] == "Zero3Shard"
        assert result["module_bytes"] == 0, "module parameters are freed between uses"
        assert result["gathered_layers"] == 1, "one decoder layer gathered at a time, forward and backward"
        assert result["held_numel"] / 2 <= result["chunk_numel"] <= result["held_numel"] / 2 + 3
        if single is not None:
            torch.testing.assert_close(result["sums"]["grad_norm"], single["sums"]["grad_norm"], atol=2e-5, rtol=1e-4)
        assert (result["state"] is not None) == (r == task.leader)
    for rep in task.replicas:
        leader = ranks[rep.ranks[0]]
        _close_weights(leader["weights2_fresh"], dict(leader["weights2"]), atol=0)  # restored exactly
        if single is not None:
            _close_weights(leader["weights1"], single["weights1"], atol=5e-4)
            _close_weights(leader["weights2"], single["weights2"], atol=5e-4)
    state, expected = ranks[task.leader]["state"]["optimizer"], ranks[task.leader]["plain_state"]["optimizer"]
    assert sorted(state["state"]) == sorted(expected["state"])
    for name, slots in expected["state"].items():  # the same moments (and masters) as unsharded, same layout
        assert set(state["state"][name]) == set(slots)
        for key, value in slots.items():
            assert state["state"][name][key].dtype == value.dtype, (name, key)
            if precision == "fp32":
                torch.testing.assert_close(state["state"][name][key], value, atol=1e-6, rtol=1e-3, msg=f"{name} {key}")
    leader = ranks[task.leader]
    plain_grads = dict(leader["plain_grads"])
    # the second epoch's gradients against unsharded DP: in bf16 the sums run in another order (a reduce-scatter
    # per micro-batch), so the first epoch's agree to bf16 rounding (under 1 % of each tensor's largest) and
    # Adam's sign steps on near-zero gradients (2 x lr) move the second epoch's a little further (5.8 % of up_proj's
    # largest with the rotary inv_freq kept fp32 as transformers keeps it, 3.9 % with it cast to bf16: the bound
    # is rounding, 8 %)
    for name, grad in leader["grads"]:
        scale = float(plain_grads[name].float().abs().max())
        tolerance = (1e-4 if precision == "fp32" else 0.08) * scale
        assert float((grad.float() - plain_grads[name].float()).abs().max()) <= tolerance, name
    pieces = _assemble([result["pieces"] for result in ranks])
    for name, weight in ranks[task.leader]["weights1"]:
        assert torch.equal(pieces[(name, None)], weight), name
        for key, value in state["state"][name].items():
            assert torch.equal(pieces[(name, key)], value), (name, key)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_hetrl_run_zero3_matches_unsharded(hetrl, tmp_path: Path, algorithm: str) -> None:
    """Colocated DP 2 (shares 0.25/0.75) with zero3 (+ recompute and offload for GRPO; PPO's critic inference runs
    on the zero3 critic): 2 steps, a checkpoint of every rank's chunks, --resume to 3; every step matches the
    plain run of the same plan, and the engines hold the trainer's weights after every sync (the gathers of every
    replica feed the weight sync)."""
    plain = colocated(tiny_workload(algorithm=algorithm))
    sharded = colocated(tiny_workload(algorithm=algorithm, sharding="zero3", recompute=algorithm == "grpo"))
    for task in sharded.tasks:
        task.offload = algorithm == "grpo"
    save_artifact(plain, tmp_path / "plain.json")
    save_artifact(sharded, tmp_path / "sharded.json")
    common = ["--engine", "hf", "--verify-weights"]
    base = hetrl("run", tmp_path / "plain.json", "--run-dir", tmp_path / "plain", "--steps", "3", *common,
                 cwd=tmp_path)  # fmt: skip
    assert base.returncode == 0, base.stderr[-3000:]
    run_dir = tmp_path / "sharded"
    run = hetrl("run", tmp_path / "sharded.json", "--run-dir", run_dir, "--steps", "2", *common, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    # resumed from the checkpoint every rank wrote its chunks into (runtime/zero3.py checkpoint_pieces)
    resumed = hetrl("run", tmp_path / "sharded.json", "--steps", "3", "--resume", run_dir, *common, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming after step 2" in resumed.stderr
    lines, expected = _metrics(run_dir), _metrics(tmp_path / "plain")
    assert [m["step"] for m in lines] == [1, 2, 3]
    keys = ["reward_mean", "pg_loss", "kl", "grad_norm", "response_tokens"] + ["vf_loss"] * (algorithm == "ppo")
    for mine, theirs in zip(lines, expected, strict=True):
        assert mine["engine_checksums"] == [mine["actor_checksum"]]
        for key in keys:
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), (mine["step"], key)


def test_zero3_chunk_boxes_tile_a_flat_range_in_order() -> None:
    """A chunk cuts a parameter anywhere: its part of the flat parameter becomes boxes of the tensor (what a
    checkpoint stores), each a contiguous run, in order, covering exactly the range."""
    from hetrl_cli.runtime.zero3 import _boxes

    for shape in [(7,), (5, 6), (3, 4, 5), (2, 3, 4, 5)]:
        numbers = torch.arange(torch.Size(shape).numel()).view(shape)
        total = numbers.numel()
        for lo in range(0, total, 3):
            for hi in range(lo, total + 1, 5):
                covered = []
                boxes = _boxes(shape, lo, hi)
                assert len(boxes) <= 2 * len(shape) - 1
                for offsets, sizes in boxes:
                    covered += (
                        numbers[tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=True))].flatten().tolist()
                    )
                assert covered == list(range(lo, hi)), (shape, lo, hi)
