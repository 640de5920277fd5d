"""What the runtime's vocabulary-parallel and zero3 critic-inference collectives move equals the cost model's figures
(issue 21, item 7: the same terms for time; the pricing is in tests/costmodel/test_unpriced_terms.py).

- TP rank 0 of 2 (the collectives recorded and stood in for, a one-rank view as test_zero3_comm does for the
  gathers): the vocabulary-parallel embedding of a saved Qwen3 model all-reduces its [tokens, hidden] output once per
  forward; the head's distributed log-softmax all-reduces 3 per-token scalars (4, 4, 8 bytes) per chunk, twice per
  training pass (the checkpoint recomputes it) and the head input's gradient once. The seconds these collectives
  take over an α-β link equal costmodel.forward.vocab_tp_s with the cost model's own counts and chunk size.
- A zero3 critic (DP 2 in a one-rank world, gathers recorded) running critic inference on its chunks moves what
  costmodel.training.zero3_step_bytes charges for Zero3Passes.of(m, 0, 1).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hetrl_cli.artifacts.workload import RLSpec, Workload
from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel.architectures import from_hf_config
from hetrl_cli.costmodel.comm import LinkInfo, allreduce_s
from hetrl_cli.costmodel.forward import vocab_tp_s
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.costmodel.training import Zero3Passes, zero3_step_bytes
from hetrl_cli.runtime.logprobs import chunk_tokens, response_logprobs
from hetrl_cli.runtime.parallel import VocabParallelEmbedding, VocabParallelHead, vocab_range
from hetrl_cli.runtime.roles import Critic
from hetrl_cli.runtime.sharding import Zero

from .conftest import count_gathers
from .test_distributed import _batch
from .test_loading import _save

LINK = LinkInfo(10e9, 2e-5, "nvlink", "test link")
BUDGET = 4 * 200 * 5
"""A log-prob chunk budget of 5 tokens of a 400-row vocabulary's widest TP rank (200 rows): several chunks."""


def test_vocabulary_parallel_all_reduces_equal_the_cost_models(tmp_path: Path, monkeypatch) -> None:
    from transformers import AutoModelForCausalLM

    model_dir = _save(tmp_path / "m", "qwen3", True, vocab_size=400)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
    moved: list[int] = []

    def all_reduce(tensor: torch.Tensor, op=None, group=None) -> None:  # this rank's part stands for the sum
        moved.append(tensor.numel() * tensor.element_size())

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    lo, hi = vocab_range(400, 0, 2)
    embedding = VocabParallelEmbedding(model.model.embed_tokens, lo, hi, None)
    head = VocabParallelHead(model.lm_head, lo, hi, None, 0, 2, embedding.weight)
    n, length, steps = 3, 10, 6
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 400, (n, length), generator=g)
    positions = torch.arange(length - steps - 1, length - 1).expand(n, steps).contiguous()
    response = ids[:, length - steps :]

    # the cost model's counts and chunk for this architecture at tp 2 (its chunk budget set to the test's)
    monkeypatch.setattr(C, "LOGPROB_CHUNK_BYTES", BUDGET)
    cm = CostModel(_two_gpus(), Workload(actor={"path": str(model_dir)}, micro_batch=n))
    stages = tuple(cm.cluster.stage(s) for s in cm.cluster.class_layout(((("a0/0", "a0/1"),),))[0])
    arch = from_hf_config(model_dir / "config.json")
    tokens, hidden_bytes = n * length, n * length * arch.hidden_size * 2
    for task, train in (("reference", False), ("actor_train", True)):
        row = cm.forward.row(stages, 0, arch.num_layers, cm.forward.consts(task))
        vocab = row.vocab._replace(response_share=steps / length)
        assert vocab.chunk == chunk_tokens(head.widest, BUDGET) == 5
        moved.clear()
        with torch.set_grad_enabled(train):
            hidden = embedding(ids)
            assert moved == [hidden_bytes]  # the embedding's all-reduce: [tokens, hidden] in bf16
            hidden = hidden.detach().requires_grad_(train)
            logp = response_logprobs(hidden, positions, response, head, BUDGET)
        if train:
            logp.sum().backward()
        runtime_s = sum(allreduce_s(b, 2, LINK) for b in moved)
        chunks = math.ceil(n * steps / 5)
        assert len(moved) == 1 + 3 * chunks * (2 if train else 1) + (1 if train else 0), task
        assert vocab_tp_s(vocab, tokens, hidden_bytes, 2, LINK) == pytest.approx(runtime_s, rel=1e-12), task


def _two_gpus():
    from tests.costmodel.conftest import make_profile

    return make_profile([("a0", "A100", 2, "r")])


def test_zero3_critic_inference_gathers_equal_the_cost_models(tmp_path: Path, monkeypatch, one_rank_world) -> None:
    model_dir = _save(tmp_path / "m", "qwen3", False, vocab_size=400)
    size = 2
    moved = count_gathers(monkeypatch, size)

    rollouts, _ = _batch()
    micro_batch = 3
    critic = Critic(model_dir, RLSpec(), "adamw", 1, 1, micro_batch, 0, precision="bf16",
                    zero=Zero("zero3", one_rank_world, size, 0))  # fmt: skip
    units = critic.shard.units
    moved.clear()
    critic.values(rollouts)
    m = math.ceil(len(rollouts) / micro_batch)
    layer = sum(u.chunk * size * u.local.element_size() for u in units if u.layer)
    root = sum(u.chunk * size * u.local.element_size() for u in units if not u.layer)
    assert sum(moved) == m * layer + root
    arch = from_hf_config(model_dir / "config.json")
    predicted = zero3_step_bytes(arch, "value", 2, Zero3Passes.of(m, 0, 1))
    assert abs(predicted - sum(moved)) <= 1e-3 * sum(moved), f"predicted {predicted}, moved {sum(moved)}"
