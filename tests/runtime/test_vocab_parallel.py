"""Vocabulary-parallel embedding and LM head under tensor parallelism (issue 21, item 7), over real gloo groups.

Qwen3 (tied embedding) and Llama (untied head) HF-format models with a 389-token vocabulary (prime: TP 2 and TP 3
split it unevenly) are saved in code; at TP 2 and TP 3 every role computes what one process computes (actor and
reference log-probs, critic values, loss sums, gradients of every parameter, the updated weights, an Adam
checkpoint round trip, greedy and sampled generations of the hf engine), each rank holds only its vocabulary rows,
and the per-rank bytes are the cost model's. `hetrl run` of a TP 2 plan matches the one-process run step by step.
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
from hetrl_cli.runtime.roles import Actor, Critic, Reference

from .test_distributed import NO_CLIP, _batch
from .test_parallel import _checkpoint_round_trip, _close, _engine_check, _single, _update, _whole_engine

VOCAB = 389
"""Prime: no TP degree divides it (TP 2: 195 + 194 rows, TP 3: 130 + 130 + 129)."""


def _hf_model(tiny_dir: Path, target: Path, family: str, tied: bool) -> Path:
    """A random-initialised HF model of `family` saved with save_pretrained, with the tiny tokenizer (its 384
    tokens; the last 5 rows of the vocabulary are never looked up, as in real models padded to a round size)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from hetrl_cli.runtime.tinymodel import load_tokenizer

    config_cls, model_cls = {"qwen3": (Qwen3Config, Qwen3ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[family]
    tokenizer = load_tokenizer(tiny_dir)
    kv = 6 if family == "qwen3" else 1  # split over TP 2 and 3 / replicated on every rank
    fields = {"vocab_size": VOCAB, "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 6, "num_key_value_heads": kv, "head_dim": 8, "max_position_embeddings": 512,
              "tie_word_embeddings": tied, "pad_token_id": tokenizer.pad_token_id,
              "eos_token_id": tokenizer.eos_token_id, "bos_token_id": tokenizer.bos_token_id}  # fmt: skip
    torch.manual_seed(0)
    model_cls(config_cls(**fields)).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


@pytest.fixture(scope="module")
def vocab_dirs(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("vocab")
    return {
        "qwen3-tied": str(_hf_model(tiny_dir, root / "qwen3", "qwen3", tied=True)),
        "llama-untied": str(_hf_model(tiny_dir, root / "llama", "llama", tied=False)),
    }


def _tp_task(tp: int) -> TaskLayout:
    return TaskLayout("actor_train", (ReplicaLayout((tuple(range(tp)),), (2,), (0, 8)),))


def _worker(rank: int, port: int, tp: int, dirs: dict[str, str], out: str) -> None:
    """Every role of each model at TP `tp`: what _single computes in one process, plus the rows each rank holds."""
    import torch.distributed as dist

    from hetrl_cli.runtime import comm
    from hetrl_cli.runtime.parallel import Parallel, dp_group

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp,
                            timeout=datetime.timedelta(seconds=90))  # fmt: skip
    task = _tp_task(tp)
    groups = comm.make_groups(task.group_specs(), 90)
    par, dp = Parallel.of(task, rank, groups), dp_group(task, rank, groups)
    rollouts, adv = _batch()
    found = {}
    for key, model_dir in dirs.items():
        result: dict = {}
        actor = Actor(model_dir, NO_CLIP, "grpo", "sgd", 1, pad_id=1, micro_batch=3, parallel=par)
        result["shapes"] = {n: tuple(p.shape) for n, p in actor.shard.held}
        result["logp"] = actor.logprobs(rollouts)
        result["ref_logp"] = Reference(model_dir, 1, 3, parallel=par).logprobs(rollouts)
        result["values"] = Critic(model_dir, NO_CLIP, "sgd", 1, 1, 3, seed=0, parallel=par).values(rollouts)
        result["sums"] = _update(actor, rollouts, adv, 0, len(rollouts), dp)
        result["grads"] = actor.shard.full_weights(grads=True)
        result["weights"] = actor.named_weights()
        result["restored"] = _checkpoint_round_trip(model_dir, par, rollouts, adv, 0, len(rollouts), dp)
        result.update(_engine_check(model_dir, par, result["weights"], rank))
        found[key] = result
    torch.save(found, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("tp", [2, 3])
def test_vocab_parallel_tp_equals_one_process(vocab_dirs: dict[str, str], tmp_path: Path, tp: int) -> None:
    """TP 2 / TP 3 with a vocabulary neither divides, tied (Qwen3) and untied (Llama): log-probs, loss sums,
    every gradient and updated weight equal one process; each rank holds its vocabulary rows of the embedding
    and the head only; checkpoints restore; the sharded hf engine generates the whole-model engine's tokens."""
    from hetrl_cli.runtime.parallel import vocab_range

    mp.spawn(_worker, args=(free_port(), tp, vocab_dirs, str(tmp_path)), nprocs=tp, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(tp)]
    for key, model_dir in vocab_dirs.items():
        single = _single(Path(model_dir))
        mine = [r[key] for r in ranks]
        heads = ["model.embed_tokens.weight"] + (["lm_head.weight"] if "untied" in key else [])
        assert ("lm_head.weight" in mine[0]["shapes"]) == ("untied" in key)
        for r, result in enumerate(mine):
            lo, hi = vocab_range(VOCAB, r, tp)
            for name in heads:
                assert result["shapes"][name] == (hi - lo, 48), (key, r, name)
            for field in ("logp", "ref_logp", "values"):
                for got, want in zip(result[field], single[field], strict=True):
                    _close(got, want)
            for field in ("pg_loss_sum", "kl_sum", "tokens", "grad_norm"):
                _close(result["sums"][field], single["sums"][field])
            assert result["restored"], (key, r)
        leader = mine[0]
        assert sorted(dict(leader["grads"])) == sorted(single["grads"])
        for name, grad in leader["grads"]:
            torch.testing.assert_close(grad, single["grads"][name], atol=1e-6, rtol=1e-4, msg=f"{key} {name}")
        for name, weight in leader["weights"]:
            torch.testing.assert_close(weight, single["weights"][name], atol=1e-6, rtol=1e-5, msg=f"{key} {name}")
        embed_grad = single["grads"]["model.embed_tokens.weight"]
        for r in range(tp):  # every rank's rows were looked up (or, tied, predicted): real gradients on each
            lo, hi = vocab_range(VOCAB, r, tp)
            assert float(embed_grad[lo:hi].abs().sum()) > 0
        whole = _whole_engine(Path(model_dir), leader["weights"])
        for result in mine:
            assert result["checksum"] == whole["checksum"]
            assert result["greedy"] == whole["greedy"] and result["sampled"] == whole["sampled"], key


# --- per-rank bytes at TP 2 ----------------------------------------------------------------------------------


def _bytes_worker(rank: int, port: int, dirs: dict[str, str], out: str) -> None:
    """Each family x precision at TP 2: one AdamW update, then the bytes this rank holds (test_precision's count)."""
    import torch.distributed as dist

    from hetrl_cli.artifacts.workload import RLSpec
    from hetrl_cli.runtime import comm
    from hetrl_cli.runtime.parallel import Parallel, dp_group
    from hetrl_cli.runtime.roles import pad_rows

    from .test_precision import _held_bytes

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=90))  # fmt: skip
    task = TaskLayout("actor_train", (ReplicaLayout(((0, 1),), (6,), (0, 8)),))
    groups = comm.make_groups(task.group_specs(), 90)
    par, dp = Parallel.of(task, rank, groups), dp_group(task, rank, groups)
    rollouts, adv = _batch()
    mask = pad_rows([[1.0] * len(r.response_ids) for r in rollouts], max(len(r.response_ids) for r in rollouts))
    found = []
    for family, model_dir in dirs.items():
        for precision in ("fp32", "bf16"):
            actor = Actor(model_dir, RLSpec(lr=1e-3), "grpo", "adamw", 1, 1, 4, parallel=par, precision=precision)
            actor.train_step(rollouts, adv * mask, None, -2.0 * mask, float(mask.sum()), dp)
            found.append({"family": family, "precision": precision} | _held_bytes(actor))
    torch.save(found, Path(out) / f"bytes{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow
def test_measured_tp2_bytes_per_rank_equal_the_cost_models(tiny_dir: Path, tmp_path: Path) -> None:
    """Qwen3 and Llama (untied, 389-token vocabulary, 6 layers), fp32/bf16 at TP 2: each rank holds the cost
    model's parameters per device (stage_params / tp: the embedding and the head split too, only the norms whole)
    and its weights, gradients and optimizer state are train_state_bytes of them, within 5 %. With the embedding
    and the head whole on each rank (the runtime before vocabulary parallelism) a rank held 16 % more."""
    from hetrl_cli.artifacts.workload import Workload
    from hetrl_cli.costmodel.architectures import from_hf_config
    from hetrl_cli.costmodel.memory import train_state_bytes
    from hetrl_cli.costmodel.step import stage_params

    from .test_precision import _hf_model as precision_model

    dirs = {family: str(precision_model(tiny_dir, tmp_path / family, family, vocab_size=VOCAB))
            for family in ("qwen3", "llama")}  # fmt: skip
    mp.spawn(_bytes_worker, args=(free_port(), dirs, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"bytes{r}.pt") for r in (0, 1)]
    assert len(ranks[0]) == 4
    for mine, other in zip(*ranks, strict=True):
        arch = from_hf_config(Path(dirs[mine["family"]]) / "config.json")
        params = stage_params(arch, "lm", (arch.num_layers,), 0) / 2
        workload = Workload(actor={"arch": "qwen3-0.6b"}, precision=mine["precision"], optimizer="adamw")
        expected = dict(zip(("weights", "grads", "optimizer"), train_state_bytes(workload, params, 1), strict=True))
        where = f"{mine['family']} {mine['precision']} tp2"
        print(where, {k: (mine[k], other[k], round(v)) for k, v in expected.items()})
        for rank in (mine, other):
            assert abs(rank["params"] - params) <= 0.05 * params, f"{where} params: {rank['params']} vs {params:.0f}"
            for key, value in expected.items():
                assert abs(rank[key] - value) <= 0.05 * value, f"{where} {key}: {rank[key]} vs {value:.0f}"


# --- a whole run at TP 2 ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_hetrl_run_tp2_with_an_uneven_vocabulary_matches_one_process(hetrl, tiny_dir: Path, tmp_path: Path) -> None:
    """`hetrl run` of the tiny model with a 389-token vocabulary: generation, reference and actor_train TP 2 on two
    devices against all of it on one device, 3 steps: rewards, losses, KL and gradient norms equal step by step, and
    the sharded engines hold the trainer's weights after every sync."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from hetrl_cli.artifacts.io import save_artifact
    from hetrl_cli.artifacts.workload import ModelSpec
    from hetrl_cli.runtime.tinymodel import load_tokenizer

    from .plans import D0, D1, GRPO_TASKS, hand_plan, on, replica, tiny_workload

    config = AutoConfig.from_pretrained(str(tiny_dir))
    config.vocab_size = VOCAB
    torch.manual_seed(0)
    model_dir = tmp_path / "model"
    AutoModelForCausalLM.from_config(config).save_pretrained(model_dir)
    load_tokenizer(tiny_dir).save_pretrained(model_dir)
    workload = tiny_workload(actor=ModelSpec(arch="tiny", path=str(model_dir)))
    tp = {task: [replica([[D0, D1]])] for task in ("generation", "reference", "actor_train")}
    plans = {"single": hand_plan(workload, on(D0, GRPO_TASKS), name="single"),
             "tp2": hand_plan(workload, on(D0, ["reward"]) | tp, name="tp2")}  # fmt: skip
    lines = {}
    for name, plan in plans.items():
        save_artifact(plan, tmp_path / f"{name}.json")
        run_dir = tmp_path / name
        result = hetrl("run", tmp_path / f"{name}.json", "--run-dir", run_dir, "--steps", "3", "--engine", "hf",
                       "--verify-weights", cwd=tmp_path)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        lines[name] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines["tp2"]] == [1, 2, 3]
    for mine, theirs in zip(lines["tp2"], lines["single"], strict=True):
        assert mine["engine_checksums"] == [mine["actor_checksum"]]
        for key in ("reward_mean", "pg_loss", "kl", "grad_norm", "response_tokens"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), (mine["step"], key)


ZERO3_TP_PP = [(((0, 1), (2, 3)), (1, 1), 0.25), (((4, 5), (6, 7)), (1, 1), 0.75)]
"""dp2xtp2xpp2: 2 replicas of TP 2 x PP 2 on 8 ranks, uneven shares."""


def _zero3_tp_pp_worker(*args: object) -> None:
    """test_sharding's zero3 worker, with the dp2xtp2xpp2 shape registered in the spawned process too."""
    from . import test_sharding

    test_sharding.ZERO3_SHAPES["dp2xtp2xpp2"] = ZERO3_TP_PP
    test_sharding._zero3_worker(*args)


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["dp2xtp2xpp2", "dp2xtp2-qwen3"])
def test_zero3_with_vocabulary_slices_equals_unsharded(tiny_dir: Path, tmp_path: Path, shape: str) -> None:
    """zero3 over 2 replicas with TP 2, test_sharding's zero3 worker. dp2xtp2xpp2 (8 ranks, the tiny model): the
    tied embedding/head is a vocabulary slice held by the first and the last stage, its chunk summed between them
    (runtime/zero3.py `_sum_tied` sizes it by the slice, not the full tensor). dp2xtp2-qwen3 (4 ranks, Qwen3 with
    its KV heads split): the per-head q/k norms' gradients are summed over TP as unsharded TP sums them.
    Gradients and optimizer state equal the same layout unsharded, the first update's gradient norm and the
    embedding equal one process, each rank holds only its chunks, a restored checkpoint continues exactly, the
    chunk pieces tile every tensor."""
    from . import test_sharding

    model_dir = tiny_dir
    if shape.endswith("qwen3"):
        model_dir = _hf_model(tiny_dir, tmp_path / "qwen3", "qwen3", tied=True)
    grids = ZERO3_TP_PP if shape == "dp2xtp2xpp2" else test_sharding.SHAPES["dp2xtp2"]
    world = sum(len(stage) for grid, _, _ in grids for stage in grid)
    spans = ((0, 2), (2, 8))  # apportion(0.25, 0.75) of the 8 sequences
    task = TaskLayout("actor_train", tuple(
        ReplicaLayout(grid, split, span) for (grid, split, _), span in zip(grids, spans, strict=True)
    ))  # fmt: skip
    mp.spawn(_zero3_tp_pp_worker, args=(free_port(), shape.removesuffix("-qwen3"), False, "fp32", str(model_dir),
                                        str(tmp_path)), nprocs=world, join=True)  # fmt: skip
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]
    single = test_sharding._single(model_dir)
    for result in ranks:
        assert result["kind"] == "Zero3Shard" and result["module_bytes"] == 0
        assert result["held_numel"] / 2 <= result["chunk_numel"] <= result["held_numel"] / 2 + 6
        _close(result["sums"]["grad_norm"], single["sums"]["grad_norm"])
    for rep in task.replicas:
        leader = ranks[rep.ranks[0]]
        test_sharding._close_weights(leader["weights2_fresh"], dict(leader["weights2"]), atol=0)
        tied = dict(leader["weights1"])["model.embed_tokens.weight"]
        torch.testing.assert_close(tied, single["weights1"]["model.embed_tokens.weight"], atol=5e-4, rtol=1e-5)
    leader = ranks[0]
    plain_grads = dict(leader["plain_grads"])
    for name, grad in leader["grads"]:
        assert float((grad - plain_grads[name]).abs().max()) <= 1e-4 * float(plain_grads[name].abs().max()), name
    state, expected = leader["state"]["optimizer"]["state"], leader["plain_state"]["optimizer"]["state"]
    assert sorted(state) == sorted(expected)
    for name, slots in expected.items():
        for key, value in slots.items():
            torch.testing.assert_close(state[name][key], value, atol=1e-6, rtol=1e-3, msg=f"{name} {key}")
    pieces = test_sharding._assemble([result["pieces"] for result in ranks])
    for name, weight in leader["weights1"]:
        assert torch.equal(pieces[(name, None)], weight), name
