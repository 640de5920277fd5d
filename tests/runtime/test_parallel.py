"""Tensor and pipeline parallelism over real gloo process groups: every sharded layout computes what one process
computes (log-probs, values, rewards, loss sums, gradients, the updated weights, greedy generations), and
`hetrl run` trains a TP plan and an uneven PP plan across two hosts behind a real sshd.

Ranks are laid out by the runtime's own code (layout.TaskLayout -> comm.make_groups -> parallel.Parallel.of).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.artifacts.workload import ModelSpec
from hetrl_cli.runtime.layout import ReplicaLayout, TaskLayout, apportion
from hetrl_cli.runtime.local import free_port
from hetrl_cli.runtime.roles import Actor, Critic, Reference, RewardModel, Rollout, pad_rows

from .plans import hand_plan, replica, tiny_workload
from .test_distributed import NO_CLIP, _batch
from .test_multihost import pgrep, run_args

TOL = {"atol": 2e-5, "rtol": 1e-4}


@pytest.fixture(scope="session")
def four_layer_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with 4 decoder layers (so a PP=2 split can be uneven: [1, 3]); same tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hetrl_cli.runtime.tinymodel import load_tokenizer

    tokenizer = load_tokenizer(tiny_dir)
    config = Qwen2Config.from_pretrained(str(tiny_dir))
    config.num_hidden_layers = 4
    config.layer_types = ["full_attention"] * 4
    torch.manual_seed(1)
    target = tmp_path_factory.mktemp("four") / "model"
    Qwen2ForCausalLM(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def _update(actor: Actor, rollouts: list[Rollout], adv: torch.Tensor, lo: int, hi: int, dp) -> dict[str, float]:
    """One training step on sequences [lo, hi) of the batch (old log-probs of the whole batch, a shifted reference)."""
    steps = max(len(r.response_ids) for r in rollouts)
    mask = pad_rows([[1.0] * len(r.response_ids) for r in rollouts], steps)
    old = pad_rows(actor.logprobs(rollouts) or [[0.0]] * len(rollouts), steps)  # pipeline stages but the last: none
    ref = old - 0.1 * mask
    return actor.train_step(rollouts[lo:hi], (adv * mask)[lo:hi], old[lo:hi], ref[lo:hi], float(mask.sum()), dp)


def _layout(shape: str) -> TaskLayout:
    """The named layouts of one task on `world` ranks: tp2 | pp2 (split [1, 3]) | dp2xpp2 | tp2xpp2."""
    grids = {
        "tp2": [(((0, 1),), (4,), 1.0)],
        "pp2": [(((0,), (1,)), (1, 3), 1.0)],
        "dp2xpp2": [(((0,), (1,)), (1, 3), 0.25), (((2,), (3,)), (3, 1), 0.75)],
        "tp2xpp2": [(((0, 1), (2, 3)), (3, 1), 1.0)],
    }[shape]
    counts = apportion([share for _, _, share in grids], 8)
    starts = [sum(counts[:i]) for i in range(len(counts))]
    replicas = tuple(
        ReplicaLayout(grid, split, (lo, lo + n)) for (grid, split, _), lo, n in zip(grids, starts, counts, strict=True)
    )
    return TaskLayout("actor_train", replicas)


def _world(shape: str) -> int:
    return len(_layout(shape).ranks)


def _init(rank: int, port: int, world: int) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=90))  # fmt: skip


def _parallel_worker(rank: int, port: int, shape: str, model_dir: str, out: str) -> None:
    """Every role on `shape`: forward-only results, one SGD update, a checkpoint round trip, a TP engine."""
    import torch.distributed as dist

    from hetrl_cli.runtime import comm
    from hetrl_cli.runtime.parallel import Parallel, dp_group

    task = _layout(shape)
    _init(rank, port, len(task.ranks))
    groups = comm.make_groups(task.group_specs(), 90)
    par = Parallel.of(task, rank, groups)
    lo, hi = task.range_of(rank)
    rollouts, adv = _batch()
    result: dict = {"position": par.pos}
    actor = Actor(model_dir, NO_CLIP, "grpo", "sgd", 1, pad_id=1, micro_batch=3, parallel=par)
    result["logp"] = actor.logprobs(rollouts)
    result["ref_logp"] = Reference(model_dir, 1, 3, parallel=par).logprobs(rollouts)
    critic = Critic(model_dir, NO_CLIP, "sgd", 1, 1, 3, seed=0, parallel=par)
    result["values"] = critic.values(rollouts)
    result["scores"] = RewardModel(model_dir, 1, 3, seed=0, parallel=par).scores(rollouts, [None] * len(rollouts))
    result["sums"] = _update(actor, rollouts, adv, lo, hi, dp_group(task, rank, groups))
    result["grads"] = actor.shard.full_weights(grads=True)
    result["weights"] = actor.named_weights()
    dp = dp_group(task, rank, groups)
    result["restored"] = _checkpoint_round_trip(model_dir, par, rollouts, adv, lo, hi, dp)
    if par.pos.stages == 1:
        result.update(_engine_check(model_dir, par, result["weights"], rank))
    torch.save(result, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def _checkpoint_round_trip(model_dir: str, par, rollouts, adv, lo: int, hi: int, dp) -> bool:
    """After an Adam step, the checkpoint gathered to the replica leader restores every rank's shard exactly."""
    import torch.distributed as dist

    adam = Actor(model_dir, NO_CLIP, "grpo", "adam", 1, pad_id=1, micro_batch=3, parallel=par)
    _update(adam, rollouts, adv, lo, hi, dp)
    box = [adam.state()]  # full tensors on the leader, None on the other ranks of the replica
    if par.mp_size > 1:
        dist.broadcast_object_list(box, src=par.mp_ranks[0], group=par.mp_group)
    fresh = Actor(model_dir, NO_CLIP, "grpo", "adam", 1, pad_id=1, micro_batch=3, parallel=par)
    fresh.load_state(box[0])
    same = all(torch.equal(a, b) for (_, a), (_, b) in zip(fresh.shard.held, adam.shard.held, strict=True))
    mine, theirs = adam.optimizer.state_dict()["state"], fresh.optimizer.state_dict()["state"]
    moments = all(torch.equal(mine[i]["exp_avg_sq"], theirs[i]["exp_avg_sq"]) for i in mine)
    return same and moments and len(mine) == len(theirs) == len(adam.shard.held)


def _engine_check(model_dir: str, par, weights, rank: int) -> dict:
    """A TP engine takes the trainer's full weights and generates what a whole-model engine generates."""
    import torch.distributed as dist

    from hetrl_cli.runtime.engines import Sampling
    from hetrl_cli.runtime.engines.hf import HFEngine

    box = [weights]
    dist.broadcast_object_list(box, src=0)
    engine = HFEngine(model_dir, parallel=par)
    engine.update_weights(box[0])
    greedy = Sampling(max_new_tokens=8, temperature=0.0, seeds=(0, 0), eos_token_id=3, pad_token_id=1)
    sampled = Sampling(max_new_tokens=8, temperature=1.0, seeds=(7, 8), eos_token_id=3, pad_token_id=1)
    prompts = [[5, 6, 7], [40, 41]]
    return {"checksum": engine.weights_checksum(), "greedy": engine.generate(prompts, greedy),
            "sampled": engine.generate(prompts, sampled)}  # fmt: skip


def _single(model_dir: Path) -> dict:
    """The same computations in this process, whole model, full batch."""
    rollouts, adv = _batch()
    actor = Actor(model_dir, NO_CLIP, "grpo", "sgd", 1, pad_id=1, micro_batch=3)
    out: dict = {"logp": actor.logprobs(rollouts), "ref_logp": Reference(model_dir, 1, 3).logprobs(rollouts)}
    out["values"] = Critic(model_dir, NO_CLIP, "sgd", 1, 1, 3, seed=0).values(rollouts)
    out["scores"] = RewardModel(model_dir, 1, 3, seed=0).scores(rollouts, [None] * len(rollouts))
    out["sums"] = _update(actor, rollouts, adv, 0, len(rollouts), (None, 1))
    out["grads"] = {n: p.grad for n, p in actor.model.named_parameters()}
    out["weights"] = dict(actor.named_weights())
    return out


def _whole_engine(model_dir: Path, weights: list) -> dict:
    """A whole-model engine on the given weights: what a TP engine must match."""
    from hetrl_cli.runtime.engines import Sampling, checksum_named
    from hetrl_cli.runtime.engines.hf import HFEngine

    engine = HFEngine(model_dir)
    engine.update_weights(weights)
    prompts = [[5, 6, 7], [40, 41]]
    return {"checksum": checksum_named(weights), "greedy": engine.generate(prompts, Sampling(8, 0.0, (0, 0), 3, 1)),
            "sampled": engine.generate(prompts, Sampling(8, 1.0, (7, 8), 3, 1))}  # fmt: skip


def _run(shape: str, model_dir: Path, tmp_path: Path) -> tuple[list[dict], dict]:
    world = _world(shape)
    mp.spawn(_parallel_worker, args=(free_port(), shape, str(model_dir), str(tmp_path)), nprocs=world, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)], _single(model_dir)


def _close(a, b) -> None:
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), **TOL)


def _check_equivalence(ranks: list[dict], single: dict, shape: str) -> None:
    task = _layout(shape)
    for rep in task.replicas:
        out = ranks[rep.output_rank]
        for field in ("logp", "ref_logp", "values"):
            for mine, full in zip(out[field], single[field], strict=True):  # forward-only: the whole batch
                _close(mine, full)
        _close(out["scores"], single["scores"])
        for r in rep.ranks:  # results live on the last stage only
            if not ranks[r]["position"].last:
                assert ranks[r]["logp"] == ranks[r]["values"] == ranks[r]["scores"] == []
    replica_sums = [ranks[rep.output_rank]["sums"] for rep in task.replicas]
    for key in ("pg_loss_sum", "kl_sum", "tokens"):
        _close(sum(s[key] for s in replica_sums), single["sums"][key])
    for result in ranks:  # every rank saw the same global gradient norm
        _close(result["sums"]["grad_norm"], single["sums"]["grad_norm"])
        assert result["restored"]
    for rep in task.replicas:
        leader = ranks[rep.ranks[0]]
        assert leader["grads"] is not None and leader["weights"] is not None
        assert sorted(dict(leader["grads"])) == sorted(single["grads"])
        for name, grad in leader["grads"]:
            torch.testing.assert_close(grad, single["grads"][name], atol=1e-6, rtol=1e-4)
        for name, weight in leader["weights"]:
            torch.testing.assert_close(weight, single["weights"][name], atol=1e-6, rtol=1e-5)
    assert any(float(g.abs().sum()) > 0 for g in single["grads"].values())


@pytest.mark.slow
def test_tp2_equals_one_process(tiny_dir: Path, tmp_path: Path) -> None:
    """TP 2 on the tiny model (2 heads, 1 KV head: the KV head is replicated on both ranks)."""
    ranks, single = _run("tp2", tiny_dir, tmp_path)
    assert [r["position"].tp_rank for r in ranks] == [0, 1]
    _check_equivalence(ranks, single, "tp2")
    whole = _whole_engine(tiny_dir, ranks[0]["weights"])
    for result in ranks:  # generation: the sharded engines hold the trainer's weights and sample the same tokens
        assert result["checksum"] == whole["checksum"]
        assert result["greedy"] == whole["greedy"] and result["sampled"] == whole["sampled"]
    assert whole["greedy"] != whole["sampled"]


@pytest.mark.slow
def test_uneven_pp2_equals_one_process(four_layer_dir: Path, tmp_path: Path) -> None:
    """PP 2 with layers [1, 3] of a 4-layer model (tied embedding on stage 0, its head on stage 1)."""
    ranks, single = _run("pp2", four_layer_dir, tmp_path)
    assert [r["position"].stage for r in ranks] == [0, 1]
    _check_equivalence(ranks, single, "pp2")


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["dp2xpp2", "tp2xpp2"])
def test_four_rank_layouts_equal_one_process(four_layer_dir: Path, tmp_path: Path, shape: str) -> None:
    """dp2xpp2: two replicas with different splits ([1, 3], [3, 1]) and uneven shares; tp2xpp2: both at once."""
    ranks, single = _run(shape, four_layer_dir, tmp_path)
    _check_equivalence(ranks, single, shape)


def test_a_tp_degree_that_does_not_divide_the_heads_is_refused(tiny_dir: Path) -> None:
    from hetrl_cli.runtime.layout import Position
    from hetrl_cli.runtime.parallel import Parallel

    bad = Parallel(Position(replica=0, stage=0, tp_rank=0, tp=4, split=()))
    with pytest.raises(ValueError, match=r"^tp=4 does not divide the model: 2 attention heads, 1 KV heads"):
        Reference(tiny_dir, 1, 3, parallel=bad)
    split = Parallel(Position(replica=0, stage=0, tp_rank=0, tp=1, split=(1, 2)))
    with pytest.raises(ValueError, match=r"^layer split \[1, 2\] covers 3 layers; the model has 2"):
        Reference(tiny_dir, 1, 3, parallel=split)


def test_rollout_batch_has_varied_lengths() -> None:
    """The equivalence tests rely on padding inside micro-batches: the batch mixes lengths."""
    rollouts, _ = _batch()
    assert len({len(r.response_ids) for r in rollouts}) > 2 and isinstance(rollouts[0], Rollout)


# --- end to end across two hosts --------------------------------------------------------------------------


@pytest.fixture
def hosts_with_two_devices(sshd_hosts, tmp_path: Path):
    """(hosts.txt, known_hosts, [a/0, a/1], [b/0, b/1]) for hosts 127.0.0.2 and 127.0.0.3."""
    a, b = sshd_hosts.addresses[:2]
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(sshd_hosts.hosts_line(a) + sshd_hosts.hosts_line(b))
    devs = [[f"{h}:{sshd_hosts.port}/{i}" for i in range(2)] for h in (a, b)]
    return hosts, sshd_hosts.known_hosts, devs[0], devs[1]


def _run_e2e(plan, hosts: Path, known: Path, tmp_path: Path, steps: int, *extra: str) -> tuple[Path, list[dict], str]:
    plan_file, run_dir = tmp_path / "plan.json", tmp_path / "run"
    save_artifact(plan, plan_file)
    started = time.monotonic()
    result = subprocess.run(run_args(plan_file, hosts, known, run_dir, "--steps", str(steps), "--verify-weights",
                                     *extra), capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    print(f"{plan.name}: {time.monotonic() - started:.1f}s")
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(1, steps + 1))
    for m in lines:
        assert m["response_tokens"] > 0 and 0.0 <= m["reward_mean"] <= 1.0
        assert m["engine_checksums"] == [m["actor_checksum"]]  # every (sharded) engine holds the trained weights
        assert m["grad_norm"] > 0 and m["seconds"]["actor_train"] > 0
    assert len({m["actor_checksum"] for m in lines}) == steps  # the weights changed every step
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert pgrep(run_dir) == []
    return run_dir, lines, result.stderr


@pytest.mark.slow
def test_tp2_training_across_two_hosts(hosts_with_two_devices, tmp_path: Path) -> None:
    """Generation on host .2; reference and actor_train TP 2 on host .3's two devices; then --resume."""
    hosts, known, (a0, _), (b0, b1) = hosts_with_two_devices
    tp = [replica([[b0, b1]])]
    plan = hand_plan(tiny_workload(), {"generation": [(a0, 1.0)], "reference": tp, "actor_train": tp}, name="tp2")
    run_dir, lines, _ = _run_e2e(plan, hosts, known, tmp_path, 2)
    assert json.loads((run_dir / "launch.json").read_text())["devices"] == [a0, b0, b1]
    args = run_args(tmp_path / "plan.json", hosts, known, run_dir, "--steps", "3", "--verify-weights")
    at = args.index("--run-dir")
    args[at : at + 2] = ["--resume", str(run_dir)]
    resumed = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    after = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in after] == [1, 2, 3] and after[:2] == lines
    assert after[2]["engine_checksums"] == [after[2]["actor_checksum"]] != [lines[1]["actor_checksum"]]


@pytest.mark.slow
def test_uneven_pp2_training_across_two_hosts(four_layer_dir: Path, hosts_with_two_devices, tmp_path: Path) -> None:
    """actor_train and reference PP 2 over the hosts with layers [1, 3]; generation TP 2 on host .2."""
    hosts, known, (a0, a1), (b0, _) = hosts_with_two_devices
    wl = tiny_workload(actor=ModelSpec(arch="tiny", path=str(four_layer_dir)))
    pp = [replica([[a0], [b0]], split=[1, 3])]
    plan = hand_plan(wl, {"generation": [replica([[a0, a1]])], "reference": pp, "actor_train": pp}, name="pp2")
    run_dir, _, stderr = _run_e2e(plan, hosts, known, tmp_path, 2)
    assert json.loads((run_dir / "launch.json").read_text())["devices"] == [a0, a1, b0]
    assert "step 2/2 reward" in stderr
