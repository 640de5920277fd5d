"""Terms the runtime runs that the cost model did not price (issue 21, item 7; issue 23, item 5):

- the vocabulary-parallel embedding's and LM head's all-reduces under TP (runtime/parallel.py, logprobs.py),
  in forward and training tasks and in generation's decode steps (the logits' all-gather);
- a vocabulary smaller than the TP degree, refused by the cost model, the planner's layouts and the runtime;
- critic inference on a zero3 critic's chunks gathers them (runtime/zero3.py forward_passes);
- an async generation group loads the weights it staged in host memory between rollouts
  (runtime/weightsync.py OverlappedSync.finish).

tests/runtime/test_vocab_zero3_comm.py counts what the runtime's collectives really move against these figures.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel.architectures import BUILTIN
from hetrl_cli.costmodel.comm import allgather_s, allreduce_s
from hetrl_cli.costmodel.forward import VocabCollectives, vocab_tp_s
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.costmodel.training import Zero3Passes, zero3_comm_s
from hetrl_cli.costmodel.types import TaskPlacement

from .conftest import make_profile

TP2 = ((("a0/0", "a0/1"),),)
ONE = ((("a0/0",),),)


def _workload(**kw) -> Workload:
    base = dict(actor={"arch": "qwen3-0.6b"}, prompts_per_step=16, responses_per_prompt=4, max_prompt_tokens=256,
                max_response_tokens=256, micro_batch=4)  # fmt: skip
    return Workload(**{**base, **kw})


@pytest.mark.parametrize(("algorithm", "epochs", "counts"), [("grpo", 1, (1, 1, 2)), ("ppo", 1, (2, 1, 3)),
                                                              ("grpo", 2, (3, 2, 5))])  # fmt: skip
def test_vocabulary_collectives_per_micro_batch_follow_the_passes(algorithm: str, epochs: int, counts) -> None:
    """A training pass runs the embedding's all-reduce once, the head input's gradient once and each chunk's three
    all-reduces twice (forward and the checkpoint's recompute); the old-log-prob forward (where the runtime runs
    it) adds one embedding and one chunk round; inference: one and one (an LM head), one and none (a value head)."""
    critic = {"arch": "qwen3-0.6b"} if algorithm == "ppo" else None
    cm = CostModel(make_profile([("a0", "A100", 2, "r")]), _workload(algorithm=algorithm, ppo_epochs=epochs,
                                                                     critic=critic))  # fmt: skip
    assert cm.forward.consts("actor_train").vocab_collectives == counts
    assert cm.forward.consts("reference").vocab_collectives == (1, 0, 1)
    if critic:
        assert cm.forward.consts("critic_train").vocab_collectives[:2] == (epochs, 0)
        stages = tuple(cm.cluster.stage(s) for s in cm.cluster.class_layout(TP2)[0])
        row = cm.forward.row(stages, 0, 28, cm.forward.consts("critic_inference"))
        assert row.vocab == VocabCollectives(1, 0, 0, row.vocab.chunk, row.vocab.response_share)


def test_tp2_reference_pays_the_vocabulary_all_reduces_by_hand() -> None:
    """Qwen3-0.6B reference at tp 2 on one replica: its tp_comm is the layers' 2 all-reduces each plus the
    embedding's [tokens, hidden] all-reduce and the head's 3 small all-reduces per chunk of response tokens
    (LOGPROB_CHUNK_BYTES of fp32 logits of the widest rank's ceil(V / 2) rows), per micro-batch; at tp 1 none."""
    profile = make_profile([("a0", "A100", 2, "r")])
    cm = CostModel(profile, _workload())
    a = BUILTIN["qwen3-0.6b"]
    est = cm.task(TaskPlacement("reference", TP2))
    link = cm.cluster.stage(cm.cluster.class_layout(TP2)[0][0]).link
    m = 64 // 4
    mb_tok = 64 * cm.step.seq_mean / m
    msg = mb_tok * a.hidden_size * 2
    layers = 2 * a.num_layers * allreduce_s(msg, 2, link)
    response = mb_tok * cm.step.resp_mean / cm.step.seq_mean
    chunk = C.LOGPROB_CHUNK_BYTES // (4 * math.ceil(a.vocab_size / 2))
    chunks = math.ceil(response / chunk)
    small = 2 * allreduce_s(4 * response / chunks, 2, link) + allreduce_s(8 * response / chunks, 2, link)
    vocab = allreduce_s(msg, 2, link) + chunks * small
    assert est.terms["tp_comm"] == pytest.approx(m * (layers + vocab), rel=1e-12)
    assert vocab > 0.01 * layers  # the embedding alone is 1/56 of the layers' all-reduces
    assert cm.task(TaskPlacement("reference", ONE)).terms.get("tp_comm", 0.0) == 0.0


def test_vocab_tp_s_prices_each_collective() -> None:
    from hetrl_cli.costmodel.comm import LinkInfo

    link = LinkInfo(1e9, 1e-5, "nvlink", "test")
    v = VocabCollectives(embeddings=2, head_grads=1, chunk_rounds=3, chunk=100, response_share=0.5)
    # 1000 tokens, 500 of them responses: 5 chunks of 100
    expected = 2 * allreduce_s(8000.0, 2, link) + allreduce_s(4000.0, 2, link)
    expected += 3 * 5 * (2 * allreduce_s(400.0, 2, link) + allreduce_s(800.0, 2, link))
    assert vocab_tp_s(v, 1000.0, 8000.0, 2, link) == pytest.approx(expected, rel=1e-12)


def test_tp2_generation_decode_gathers_the_logits_and_all_reduces_the_embedding() -> None:
    """Each decode step at tp 2: one more all-reduce on the first stage (the embedding) and the last stage's
    all-gather of one position's logits per sequence, each rank's ceil(V / 2) rows (padded to the widest)."""
    profile = make_profile([("a0", "A100", 2, "r")])
    cm = CostModel(profile, _workload())
    a = BUILTIN["qwen3-0.6b"]
    rep = cm.cluster.class_layout(TP2)[0]
    stages = tuple(cm.cluster.stage(s) for s in rep)
    g = cm.generation.static(stages, (a.num_layers,), (0.0,), False, frozenset())
    row = g.stages[0]
    assert row.allreduces == 2 * a.num_layers + 1
    assert row.logits_bytes == math.ceil(a.vocab_size / 2) * 2 * 2
    assert g.prefill.slow_allreduces == 2 * a.num_layers + 1
    one = cm.generation.static(tuple(cm.cluster.stage(s) for s in cm.cluster.class_layout(ONE)[0]),
                               (a.num_layers,), (0.0,), False, frozenset())  # fmt: skip
    assert one.stages[0].allreduces == 2 * a.num_layers and one.stages[0].logits_bytes == 0.0
    est = cm.task(TaskPlacement("generation", TP2))
    gather = allgather_s(16 * row.logits_bytes, 2, row.tp_link)
    assert gather > 0 and est.terms["tp_comm"] > 0


# ---- vocabulary smaller than tp ---------------------------------------------------------------------------------


def _tiny_vocab_model(tmp_path: Path, vocab: int) -> Path:
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": vocab, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "tie_word_embeddings": True, "max_position_embeddings": 512}  # fmt: skip
    path = tmp_path / "m"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_a_vocabulary_smaller_than_tp_is_refused_in_one_line(tmp_path: Path) -> None:
    from hetrl_cli.planner.space import ModelShape
    from hetrl_cli.runtime.parallel import check_tp

    model = _tiny_vocab_model(tmp_path, 3)
    profile = make_profile([("a0", "A100", 4, "r")])
    w = _workload(actor={"path": str(model)}, max_prompt_tokens=16, max_response_tokens=16)
    cm = CostModel(profile, w)
    est = cm.task(TaskPlacement("reference", ((("a0/0", "a0/1", "a0/2", "a0/3"),),)))
    assert est.violation is not None and "\n" not in est.violation
    assert "vocabulary of 3 tokens, fewer than tp=4" in est.violation and "tp <= 3" in est.violation
    assert cm.task(TaskPlacement("reference", ((("a0/0", "a0/1"),),))).violation is None
    assert not ModelShape(4, 2, 2, 3).tp_ok(4) and ModelShape(4, 2, 2, 3).tp_ok(2) and ModelShape(4, 2, 2).tp_ok(4)

    class Config:
        num_attention_heads, num_key_value_heads, intermediate_size, vocab_size = 4, 2, 128, 3

    with pytest.raises(ValueError, match=r"tp=4 exceeds the model's vocabulary of 3 tokens"):
        check_tp(Config(), 4)
    check_tp(Config(), 2)


# ---- zero3 critic inference -------------------------------------------------------------------------------------


def test_zero3_critic_inference_on_the_trainers_chunks_pays_their_gathers() -> None:
    """PPO, zero3, dp 2: critic inference in critic_train's group runs on its chunks and gathers each layer once per
    micro-batch and the root once (Zero3Passes.of(m, 0, 1)); apart from the trainer, or without zero3, nothing."""
    profile = make_profile([("a0", "A100", 2, "r")])
    reps = ((("a0/0",),), (("a0/1",),))
    for sharding in ("zero3", "zero2"):
        w = _workload(algorithm="ppo", critic={"arch": "qwen3-0.6b"}, sharding=sharding)
        cm = CostModel(profile, w)
        shared = cm.task(TaskPlacement("critic_inference", reps), ["critic_train"])
        apart = cm.task(TaskPlacement("critic_inference", reps), ["reference"])
        assert "dp_allreduce" not in apart.terms
        if sharding != "zero3":
            assert "dp_allreduce" not in shared.terms
            continue
        m = math.ceil(32 / 4)  # half of 64 sequences, micro-batches of 4
        rep_key = cm.cluster.class_layout(reps)
        expected = zero3_comm_s(cm.cluster, rep_key, BUILTIN["qwen3-0.6b"], "value", 2, Zero3Passes.of(m, 0, 1))
        assert shared.terms["dp_allreduce"] == pytest.approx(expected, rel=1e-12) and expected > 0
        assert shared.links["dp_allreduce"]


# ---- async weights loaded between rollouts ----------------------------------------------------------------------


def test_async_generation_alone_loads_the_staged_weights_each_step() -> None:
    """Async, generation in a group of its own: each step copies the weights staged in host memory into the engine
    between rollouts (the device's weight bytes at HOST_DEVICE_Bps); sync mode, or generation beside the trainer
    (a colocated refit), does not."""
    profile = make_profile([("a0", "A100", 2, "r")])
    a = BUILTIN["qwen3-0.6b"]
    asyn = CostModel(profile, _workload(mode="async")).task(TaskPlacement("generation", TP2), [])
    sync = CostModel(profile, _workload()).task(TaskPlacement("generation", TP2), [])
    beside = CostModel(profile, _workload(mode="async")).task(TaskPlacement("generation", TP2), ["actor_train"])
    assert "offload" not in sync.terms and "offload" not in beside.terms
    weights = a.param_count("lm") * 2 / 2  # bf16, half on each TP rank
    assert asyn.terms["offload"] == pytest.approx(weights / C.HOST_DEVICE_Bps, rel=1e-9)
    assert asyn.cost.total_s == pytest.approx(sync.cost.total_s + asyn.terms["offload"], rel=1e-9)
