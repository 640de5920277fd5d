"""The cost model's memory and time terms state what the runtime does (issue 21, item 7; issue 23, item 4).

- No autocast: a training stage holds its model states (the bytes test_precision measures per rank), 1F1B's
  in-flight activations in the workload's precision and one chunk of log-prob logits, never a micro-batch's
  full-vocabulary logits nor a second copy of the weights; per micro-batch it pays the gradient accumulation
  (3 x the gradient's bytes per parameter), not autocast's casts.
- The log-prob chunk and the hf engine's noise window are the runtime's own figures.
- Pipeline stages hold min(pp - p, m) micro-batches' activations (parallel.pipeline_train runs 1F1B).
"""

from __future__ import annotations

import pytest

from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel.architectures import BUILTIN
from hetrl_cli.costmodel.generation import hf_engine_bytes
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.costmodel.types import TaskPlacement

from .conftest import make_profile


def test_the_runtime_figures_the_cost_model_mirrors() -> None:
    from hetrl_cli.runtime.engines import hf
    from hetrl_cli.runtime.logprobs import CHUNK_LOGITS_BYTES, chunk_tokens

    assert C.LOGPROB_CHUNK_BYTES == CHUNK_LOGITS_BYTES
    assert C.HF_NOISE_BYTES == hf.NOISE_BYTES
    assert max(1, C.LOGPROB_CHUNK_BYTES // (4 * 151_936)) == chunk_tokens(151_936) == 110


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_actor_train_memory_and_accumulation_by_hand(precision: str) -> None:
    """Qwen3-0.6B on one A100: 16 (bf16) or 12 (fp32) B/param of model states + one micro-batch's activations
    in the workload's precision + 110 response tokens of logits at the chunk's bytes per entry; time pays
    3 x the gradient's bytes per parameter and micro-batch pass as memory traffic."""
    profile = make_profile([("a0", "A100", 1, "r")])
    w = Workload(actor={"arch": "qwen3-0.6b"}, prompts_per_step=16, responses_per_prompt=4, max_prompt_tokens=256,
                 max_response_tokens=256, micro_batch=4, precision=precision)  # fmt: skip
    a = BUILTIN["qwen3-0.6b"]
    est = CostModel(profile, w).task(TaskPlacement("actor_train", ((("a0/0",),),)))
    dtype = {"bf16": 2, "fp32": 4}[precision]
    states = a.param_count() * 16  # bf16: 2 + 2 + 12 (fp32 masters + moments); fp32: 4 + 4 + 8
    acts = 4 * 512 * a.num_layers * a.activation_bytes_per_token_layer() * dtype / 2 * C.EAGER_ACTIVATION_FACTOR
    logits = 110 * a.vocab_size * C.LOGPROB_CHUNK_TRAIN_BYTES_PER_ENTRY[precision]
    # the step after the backward: fp32 gradient copies (mixed precision) and Adam's sqrt(v), + the embedding's
    step = a.param_count() * (8 if precision == "bf16" else 4) + 4 * a.vocab_size * a.hidden_size
    assert est.memory_bytes["a0/0"] == pytest.approx(states + max(acts + logits, step), rel=1e-9)
    assert logits < 0.7e9  # a micro-batch's full logits would be 4 x 512 x 152k x 4 B = 1.2 GB for one copy alone


def test_inference_holds_one_forward_chunk_of_logits() -> None:
    profile = make_profile([("a0", "A100", 1, "r")])
    w = Workload(actor={"arch": "qwen3-0.6b"}, prompts_per_step=16, responses_per_prompt=4, max_prompt_tokens=256,
                 max_response_tokens=256, micro_batch=4)  # fmt: skip
    a = BUILTIN["qwen3-0.6b"]
    est = CostModel(profile, w).task(TaskPlacement("reference", ((("a0/0",),),)))
    expected = a.param_count() * 2 + 4 * 512 * a.activation_bytes_per_token_layer()
    expected += 110 * a.vocab_size * C.LOGPROB_CHUNK_FORWARD_BYTES_PER_ENTRY
    assert est.memory_bytes["a0/0"] == pytest.approx(expected, rel=1e-9)


def test_gradient_accumulation_traffic_follows_the_precision() -> None:
    """Per micro-batch, bf16 accumulates 6 B per parameter and fp32 12 (no autocast casts: 24 B before in bf16)."""
    profile = make_profile([("a0", "A100", 1, "r")])
    terms = {}
    for precision in ("bf16", "fp32"):
        w = Workload(actor={"arch": "qwen3-0.6b"}, prompts_per_step=16, responses_per_prompt=4, micro_batch=4,
                     precision=precision)  # fmt: skip
        cm = CostModel(profile, w)
        terms[precision] = cm.forward.consts("actor_train").accumulate_bytes_per_param
    assert terms == {"bf16": 3 * 2, "fp32": 3 * 4}


def test_pipeline_stages_hold_1f1b_in_flight_activations() -> None:
    """Two A100 stages, 16 micro-batches of 8: stage 0 holds 2 micro-batches' activations, stage 1 one (GPipe: 16)."""
    profile = make_profile([("a0", "A100", 2, "r")])
    w = Workload(actor={"arch": "qwen3-0.6b"}, prompts_per_step=32, responses_per_prompt=4, micro_batch=8,
                 max_prompt_tokens=256, max_response_tokens=256)  # fmt: skip
    a = BUILTIN["qwen3-0.6b"]
    est = CostModel(profile, w).task(TaskPlacement("actor_train", ((("a0/0",), ("a0/1",)),), layer_splits=((14, 14),)))
    per_layer = 8 * 512 * a.activation_bytes_per_token_layer() * C.EAGER_ACTIVATION_FACTOR
    params0 = a.embedding_params + 14 * a.layer_params
    acts0 = 2 * 14 * per_layer
    assert acts0 > params0 * 8 + 4 * a.vocab_size * a.hidden_size  # the backward's peak, not the step's
    stage0 = params0 * 16 + acts0
    assert est.memory_bytes["a0/0"] == pytest.approx(stage0, rel=1e-9)


def test_hf_engine_bytes_by_hand() -> None:
    """Qwen3-0.6B (tied), bf16, 16 x (4 + 512) tokens: weights + KV of every layer (+ one) + a step's logits +
    two noise windows (the sampler draws into one buffer in place, 2233e9e: a bf16 head output and 2 fp32 copies
    a step, was 3; 2 windows, was 4)."""
    a = BUILTIN["qwen3-0.6b"]
    kv = 16 * 516 * (a.num_layers + 1) * 2 * a.num_kv_heads * a.head_dim * 2
    logits = 16 * a.vocab_size * (2 + 8)
    noise = 2 * C.HF_NOISE_BYTES
    assert hf_engine_bytes(a, "bf16", 16, 4, 512) == pytest.approx(a.param_count() * 2 + kv + logits + noise)


def test_tp_ranks_hold_their_vocabulary_rows_in_the_memory_figures() -> None:
    """The runtime's embedding and head are vocabulary-parallel (runtime/parallel.py vocab_range: ceil(V / tp)
    rows on the first ranks): the hf engine's weights at tp 2 are the layers' half, those rows and the final norm;
    the optimizer step's fp32 temporary of the largest tensor is those rows, not the whole embedding."""
    import math

    from hetrl_cli.costmodel.memory import optimizer_step_temp_bytes

    a = BUILTIN["qwen3-0.6b"]  # tied: the embedding is the head
    rows = math.ceil(a.vocab_size / 2)
    weights = (a.num_layers * a.layer_params / 2 + rows * a.hidden_size + a.hidden_size) * 2
    whole = hf_engine_bytes(a, "bf16", 16, 4, 512) - a.param_count() * 2
    kv_halved = 16 * 516 * (a.num_layers + 1) * 2 * (a.num_kv_heads // 2) * a.head_dim * 2
    kv = 16 * 516 * (a.num_layers + 1) * 2 * a.num_kv_heads * a.head_dim * 2
    assert hf_engine_bytes(a, "bf16", 16, 4, 512, tp=2) == pytest.approx(weights + whole - kv + kv_halved)
    w = Workload(actor={"arch": "qwen3-0.6b"}, precision="fp32", optimizer="sgd")  # no per-parameter temporaries
    assert optimizer_step_temp_bytes(w, 0.0, a, 0, 2, 2) == 0.0  # fp32 SGD steps in place
    w = Workload(actor={"arch": "qwen3-0.6b"}, optimizer="sgd")  # bf16: fp32 gradient copies + the largest tensor
    per_param = optimizer_step_temp_bytes(w, 4.0 * 1000, a, 0, 2, 2) - 4.0 * rows * a.hidden_size
    assert per_param == pytest.approx(1000 * C.OPTIMIZER_STEP_TEMP_BYTES_PER_PARAM)
    assert optimizer_step_temp_bytes(w, 0.0, a, 1, 3, 2) == pytest.approx(4.0 * a.intermediate_size * a.hidden_size / 2)
