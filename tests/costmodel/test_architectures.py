import json

import pytest

from hetrl_cli.artifacts.workload import ModelSpec, Workload
from hetrl_cli.costmodel.architectures import BUILTIN, from_hf_config, resolve, rmsnorm_traffic_bytes
from hetrl_cli.costmodel.memory import optimizer_step_traffic_bytes_per_param
from hetrl_cli.errors import BadInput


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("qwen3-0.6b", 0.596),
        ("qwen3-1.7b", 1.721),
        ("qwen3-4b", 4.022),
        ("qwen3-8b", 8.191),
        ("qwen3-14b", 14.768),
        ("qwen3-32b", 32.762),
        ("llama-3.1-8b", 8.030),
        ("llama-3.1-70b", 70.554),
    ],
)
def test_param_counts_match_published_sizes(name: str, billions: float) -> None:
    assert BUILTIN[name].param_count() / 1e9 == pytest.approx(billions, abs=1e-3)


def test_qwen3_8b_param_count_by_hand() -> None:
    h, inter, layers, vocab = 4096, 12288, 36, 151936
    attention = h * 4096 + 2 * h * 1024 + 4096 * h
    mlp = 3 * h * inter
    norms = 2 * h + 2 * 128  # input/post-attention RMSNorm + q/k norms
    expected = vocab * h + layers * (attention + mlp + norms) + h + vocab * h  # untied lm_head
    assert BUILTIN["qwen3-8b"].param_count() == expected


def test_tiny_matches_the_runtime_qwen2_config() -> None:
    tiny = BUILTIN["tiny"]
    h, inter, vocab = 128, 256, 384
    attention = h * 128 + 2 * h * 64 + 128 * h + (128 + 2 * 64)  # q/k/v biases
    per_layer = attention + 3 * h * inter + 2 * h
    assert tiny.param_count() == vocab * h + 2 * per_layer + h  # tied: no lm_head


def test_value_head_replaces_lm_head() -> None:
    a = BUILTIN["qwen3-8b"]
    assert a.param_count("value") == a.param_count() - 151936 * 4096 + 4096 + 1


def test_forward_flops_per_token() -> None:
    a = BUILTIN["qwen3-8b"]
    matmul = 36 * (4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 12288) + 151936 * 4096
    attention = 36 * 4 * 4096 * 1000
    assert a.forward_flops_per_token(1000) == pytest.approx(2 * matmul + attention)
    assert a.train_flops_per_token(1000) == pytest.approx(3 * a.forward_flops_per_token(1000))
    assert a.train_flops_per_token(1000, recompute=True) == pytest.approx(4 * a.forward_flops_per_token(1000))


def test_kv_cache_bytes_per_token() -> None:
    assert BUILTIN["qwen3-8b"].kv_bytes_per_token("bf16") == 2 * 36 * 8 * 128 * 2  # 147 456
    assert BUILTIN["llama-3.1-70b"].kv_bytes_per_token("fp32") == 2 * 80 * 8 * 128 * 4


def test_activation_bytes_per_token_layer() -> None:
    a = BUILTIN["qwen3-8b"]
    h, q, kv, inter = 4096, 4096, 1024, 12288
    split = 2 * h + 2 * (q + 2 * kv) + 2 * q + 2 * h + 8 * inter
    assert a.activation_bytes_per_token_layer() == 4 * h + split
    assert a.activation_bytes_per_token_layer(tp=4) == 4 * h + split / 4
    assert a.activation_bytes_per_token_layer(recompute=True) == 2 * h


def test_layer_traffic_bytes_per_token_by_hand() -> None:
    """Qwen3-0.6B's eager decoder layer, op by op (h 1024, q 2048, kv 1024, I 3072), in bf16 and fp32."""
    a = BUILTIN["qwen3-0.6b"]
    h, q, kv, inter = 1024, 2048, 1024, 3072
    norm_bf16 = (2 + 4) + 4 * 2 + 4 + 4 * 2 + (4 + 2) + 2 * 2  # upcast, x², mean, x·rsqrt, downcast, ·weight
    assert rmsnorm_traffic_bytes(2) == norm_bf16 == 36
    assert rmsnorm_traffic_bytes(4) == 28  # the casts are no-ops in fp32

    def by_hand(act: int, norm: int, tp: int) -> float:
        replicated = 2 * norm * h + 2 * 3 * act * h  # input/post-attention norms, two residual adds
        rotary, qk_norms = 10 * act * (q + kv), norm * (q + kv)
        attention_io = act * (2 * q + 2 * kv) + 2 * act * (2 * q + 2 * kv)  # flash reads/writes + copies
        mlp = 5 * act * inter  # silu(gate) then · up
        return replicated + (rotary + qk_norms + attention_io + mlp) / tp

    assert a.layer_traffic_bytes_per_token(2) == by_hand(2, 36, 1) == 325_632
    assert a.layer_traffic_bytes_per_token(4) == by_hand(4, 28, 1)
    assert a.layer_traffic_bytes_per_token(2, tp=2) == by_hand(2, 36, 2)
    h, q, kv, inter = 4096, 4096, 1024, 14336  # Llama-3.1-8B: no q/k norms
    llama = 2 * 36 * h + 6 * 2 * h + 10 * 2 * (q + kv) + 3 * 2 * (2 * q + 2 * kv) + 5 * 2 * inter
    assert BUILTIN["llama-3.1-8b"].layer_traffic_bytes_per_token(2) == llama


def test_optimizer_step_traffic_counts_the_runtimes_passes() -> None:
    """clip_grad_norm_ + torch's unfused AdamW (+ the master-to-working copy in mixed precision)."""
    bf16 = Workload(actor={"arch": "qwen3-0.6b"})
    fp32 = Workload(actor={"arch": "qwen3-0.6b"}, precision="fp32")
    sgd = Workload(actor={"arch": "qwen3-0.6b"}, precision="fp32", optimizer="sgd")
    assert optimizer_step_traffic_bytes_per_param(bf16) == 3 * 2 + 14 * 4 + 2 * 2 + 2 * 4 + (4 + 2) == 80
    assert optimizer_step_traffic_bytes_per_param(fp32) == 3 * 4 + 14 * 4 + 2 * 4 + 2 * 4 == 84
    assert optimizer_step_traffic_bytes_per_param(sgd) == 3 * 4 + 4 + 2 * 4


def test_resolve_unknown_lists_known_names() -> None:
    with pytest.raises(BadInput, match=r"unknown model architecture 'gpt-5'; known: .*qwen3-8b.*tiny"):
        resolve(ModelSpec(arch="gpt-5"))


def test_from_hf_config(tmp_path) -> None:
    cfg = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    arch = resolve(ModelSpec(arch="hf", config_path=str(path)))
    assert arch.param_count() == BUILTIN["llama-3.1-8b"].param_count()
    assert arch.head_dim == 128


def test_from_hf_config_errors(tmp_path) -> None:
    with pytest.raises(BadInput, match="cannot read the HF config"):
        from_hf_config(tmp_path / "missing.json")
    bad = tmp_path / "c.json"
    bad.write_text("{}")
    with pytest.raises(BadInput, match="HF config lacks"):
        from_hf_config(bad)
    with pytest.raises(BadInput, match="needs config_path"):
        resolve(ModelSpec(arch="hf"))
