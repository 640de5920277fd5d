"""Transformer shapes and the arithmetic that follows from them: parameters, FLOPs, KV-cache and activation bytes.

Everything here is exact from the shapes (no fitted constants). Sources:
- forward FLOPs = 2 × matmul parameters per token + attention scores/context (Kaplan et al. 2020, "Scaling
  Laws", §2.1; PaLM, Chowdhery et al. 2022, appendix B, the formula nanoGPT's `estimate_mfu` uses);
- training = 3 × forward (backward ≈ 2 × forward), + 1 forward with full activation recomputation
  (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §5);
- activation bytes: stored-tensor counting as in Korthikanti et al. 2022 §4.1, adapted to GQA, a gated
  (SwiGLU) MLP, flash attention (no s² score matrix stored) and no dropout;
- non-matmul memory traffic: the bytes each eager PyTorch op of a Hugging Face Llama/Qwen decoder layer reads
  and writes (counted op by op; on an H200 these ops took 60-70 % of a 0.6B model's forward, see
  docs/costmodel.md "Non-matmul traffic").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from hetrl_cli.artifacts.workload import ModelSpec, Workload
from hetrl_cli.errors import BadInput

DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}


def rmsnorm_traffic_bytes(act: int) -> int:
    """HBM bytes per element of an eager RMSNorm (Hugging Face's): upcast to fp32, x², mean, x·rsqrt(var),
    downcast, ·weight; the two casts are no-ops in fp32. 36 in bf16, 28 in fp32."""
    casts = (act + 4) + (4 + act) if act < 4 else 0
    return casts + 8 + 4 + 8 + 2 * act


@dataclass(frozen=True)
class ArchSpec:
    """A decoder-only transformer (Llama/Qwen family: RMSNorm, GQA attention, SwiGLU MLP).

    Derived sizes are cached properties (the cost model reads them in its inner loops)."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_embeddings: bool
    qkv_bias: bool = False
    """Qwen2 has biases on q/k/v; Qwen3 and Llama do not."""
    qk_norm: bool = False
    """Qwen3 normalises q and k per head (two head_dim-sized RMSNorm weights per layer)."""

    # ---- parameters -------------------------------------------------------------------------------------
    @cached_property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @cached_property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @cached_property
    def attention_params(self) -> int:
        """q, k, v, o projections of one layer (GQA: k and v have kv_dim outputs)."""
        h = self.hidden_size
        weights = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        return weights + bias

    @cached_property
    def mlp_params(self) -> int:
        """gate, up and down projections of one layer (SwiGLU)."""
        return 3 * self.hidden_size * self.intermediate_size

    @cached_property
    def layer_params(self) -> int:
        """One transformer layer: attention + MLP + two RMSNorms (+ q/k norms)."""
        norms = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        return self.attention_params + self.mlp_params + norms

    @cached_property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def head_params(self, head: str = "lm") -> int:
        """Output head: lm_head (0 when tied to the embeddings) or a scalar value head (critic, reward model)."""
        if head == "value":
            return self.hidden_size + 1
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    def param_count(self, head: str = "lm") -> int:
        """Exact parameter count: embeddings + layers + final norm + output head."""
        return self.embedding_params + self.num_layers * self.layer_params + self.hidden_size + self.head_params(head)

    def tensor_count(self, head: str = "lm") -> int:
        """Number of parameter tensors (what a per-tensor weight sync pays a fixed cost for)."""
        per_layer = 7 + 2 + (3 if self.qkv_bias else 0) + (2 if self.qk_norm else 0)
        head_tensors = 2 if head == "value" else (0 if self.tie_embeddings else 1)
        return 1 + self.num_layers * per_layer + 1 + head_tensors

    # ---- FLOPs --------------------------------------------------------------------------------------------
    def layer_matmul_params(self) -> int:
        """Matmul weights of one layer (biases and norms are not matmuls)."""
        return self._layer_matmul

    @cached_property
    def _layer_matmul(self) -> int:
        h = self.hidden_size
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + self.mlp_params

    def head_matmul_params(self, head: str = "lm") -> int:
        """The output projection is a matmul even when tied to the embedding (the lookup is not)."""
        return self.hidden_size if head == "value" else self.vocab_size * self.hidden_size

    def layer_attention_flops(self, context: float) -> float:
        """Scores (q·kᵀ) and context (p·v) of one token against `context` keys: 2 matmuls × 2 FLOPs × q_dim."""
        return 4.0 * self.q_dim * context

    def layer_flops_per_token(self, context: float) -> float:
        """Forward FLOPs of one layer for one token attending to `context` tokens."""
        return 2.0 * self.layer_matmul_params() + self.layer_attention_flops(context)

    def forward_flops_per_token(self, context: float, head: str = "lm") -> float:
        """Forward FLOPs per token: 2 × matmul params + attention (context = keys attended; seq/2 for causal)."""
        return self.num_layers * self.layer_flops_per_token(context) + 2.0 * self.head_matmul_params(head)

    def train_flops_per_token(self, context: float, recompute: bool = False, head: str = "lm") -> float:
        """Forward + backward (backward = 2 × forward), + one more forward with full recomputation."""
        return (TRAIN_FORWARD_MULTIPLE + (1.0 if recompute else 0.0)) * self.forward_flops_per_token(context, head)

    def layer_traffic_bytes_per_token(self, act: int, tp: int = 1) -> float:
        """HBM bytes one token moves through one layer's non-matmul ops in an eager forward, per device of a
        TP group (`act` = activation bytes). The matmuls are charged as FLOPs; these ops are memory bound:
          two RMSNorms and two residual adds on the hidden state (replicated across TP);
          rotary embedding on q and k (·cos, rotate_half's negate and concatenate, ·sin, add: 10 × act);
          q/k RMSNorms (Qwen3); flash attention reading q, k, v and writing its output; the head-major copies of
          q, k, v and the output (transpose then contiguous); SiLU(gate) · up (5 × act per MLP element)."""
        norm = rmsnorm_traffic_bytes(act)
        h, q, kv = self.hidden_size, self.q_dim, self.kv_dim
        replicated = 2 * norm * h + 2 * 3 * act * h
        qk = q + kv
        attention = 10 * act * qk + (norm * qk if self.qk_norm else 0) + 3 * act * (2 * q + 2 * kv)
        mlp = 5 * act * self.intermediate_size
        return replicated + (attention + mlp) / tp

    # ---- memory -------------------------------------------------------------------------------------------
    def kv_bytes_per_token(self, dtype: str = "bf16", layers: int | None = None) -> int:
        """KV cache per token: 2 (k and v) × layers × kv_heads × head_dim × dtype bytes."""
        n = self.num_layers if layers is None else layers
        return 2 * n * self.num_kv_heads * self.head_dim * DTYPE_BYTES[dtype]

    def activation_bytes_per_token_layer(self, tp: int = 1, recompute: bool = False) -> float:
        """Training activations stored per token per layer (16-bit), for backward.

        Without recompute (Korthikanti et al. 2022 §4.1 counting, flash attention, no dropout, no sequence
        parallelism, so the norm inputs are replicated across the TP group and the rest is split by `tp`):
          attention: 2h (norm input) + 2h (qkv input) + 2(q + 2kv) (q, k, v for flash-attn backward)
                     + 2q (o_proj input)
          MLP:       2h (norm input) + 2h (gate/up input) + 8I (gate out, up out, silu out, down input)
        With full recomputation only the layer input (2h) is kept (Korthikanti eq. for full recompute: 2sbh).
        """
        h = self.hidden_size
        if recompute:
            return 2.0 * h
        replicated = 4.0 * h
        attention = 2.0 * h + 2.0 * (self.q_dim + 2 * self.kv_dim) + 2.0 * self.q_dim
        mlp = 2.0 * h + 8.0 * self.intermediate_size
        split = attention + mlp
        return replicated + split / tp


TRAIN_FORWARD_MULTIPLE = 3.0
"""Forward + backward = 3 forwards (backward computes input and weight gradients: 2 × forward; Kaplan 2020)."""


BUILTIN: dict[str, ArchSpec] = {
    a.name: a
    for a in (
        # Values from each model's config.json on the Hugging Face hub.
        ArchSpec("qwen3-0.6b", 1024, 3072, 28, 16, 8, 128, 151936, True, qk_norm=True),
        ArchSpec("qwen3-1.7b", 2048, 6144, 28, 16, 8, 128, 151936, True, qk_norm=True),
        ArchSpec("qwen3-4b", 2560, 9728, 36, 32, 8, 128, 151936, True, qk_norm=True),
        ArchSpec("qwen3-8b", 4096, 12288, 36, 32, 8, 128, 151936, False, qk_norm=True),
        ArchSpec("qwen3-14b", 5120, 17408, 40, 40, 8, 128, 151936, False, qk_norm=True),
        ArchSpec("qwen3-32b", 5120, 25600, 64, 64, 8, 128, 151936, False, qk_norm=True),
        ArchSpec("llama-3.1-8b", 4096, 14336, 32, 32, 8, 128, 128256, False),
        ArchSpec("llama-3.1-70b", 8192, 28672, 80, 64, 8, 128, 128256, False),
        # The runtime's demo model: Qwen2Config(vocab_size=384, hidden_size=128, intermediate_size=256,
        # num_hidden_layers=2, num_attention_heads=2, head_dim=64, num_key_value_heads=1, tie_word_embeddings=True).
        ArchSpec("tiny", 128, 256, 2, 2, 1, 64, 384, True, qkv_bias=True),
    )
}


RUNTIME_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
"""HF `model_type`s the runtime executes (runtime/parallel.py: Llama-style decoders with separate q/k/v and
gate/up/down projections): the shapes ArchSpec describes. Others are refused at `hetrl plan`."""


def _read_config(path: str | Path) -> dict:
    """An HF config.json as a dict; BadInput naming the file and the fix."""
    where = str(path)
    try:
        cfg = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadInput(f"{where}: cannot read the HF config ({exc.strerror}); check config_path or path") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadInput(f"{where}: not valid JSON; config_path must name an HF config.json") from None
    if not isinstance(cfg, dict):
        raise BadInput(f"{where}: not a JSON object; config_path must name an HF config.json")
    return cfg


def from_hf_config(path: str | Path) -> ArchSpec:
    """Read an HF config.json (Llama, Qwen2, Qwen3, Mistral style keys)."""
    where = str(path)
    cfg = _read_config(path)
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        model_type = str(cfg.get("model_type", ""))
        return ArchSpec(
            name=str(cfg.get("_name_or_path") or Path(path).parent.name or "hf"),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            vocab_size=int(cfg["vocab_size"]),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type.startswith("qwen3"),
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise BadInput(f"{where}: HF config lacks or mangles {exc}; need hidden_size, intermediate_size, ...") from None


def config_file(spec: ModelSpec) -> Path | None:
    """The config.json an `hf` spec reads: `config_path`, else `path`/config.json; None for a built-in."""
    if spec.arch.lower() != "hf":
        return None
    if spec.config_path:
        return Path(spec.config_path).expanduser()
    if spec.path:
        return Path(spec.path).expanduser() / "config.json"
    raise BadInput(
        "model arch 'hf' needs config_path (an HF config.json) or path (an HF model directory with config.json); "
        "or name a built-in arch (qwen3-8b, ..., tiny)"
    )


def resolve(spec: ModelSpec) -> ArchSpec:
    """The architecture a ModelSpec names: a built-in, or the HF config.json `config_file` finds (arch `hf`)."""
    config = config_file(spec)
    if config is not None:
        return from_hf_config(config)
    try:
        return BUILTIN[spec.arch.lower()]
    except KeyError:
        known = ", ".join(sorted(BUILTIN))
        raise BadInput(
            f"unknown model architecture {spec.arch!r}; known: {known}, or 'hf' with path or config_path"
        ) from None


def executable_problem(spec: ModelSpec) -> str | None:
    """Why the runtime could not execute the model `spec` names (None when it can): every built-in is a
    Llama/Qwen decoder; an HF config must have a `model_type` of RUNTIME_MODEL_TYPES."""
    config = config_file(spec)
    if config is None:
        resolve(spec)  # an unknown built-in name is its own one-line error
        return None
    model_type = _read_config(config).get("model_type")
    if model_type in RUNTIME_MODEL_TYPES:
        return None
    what = f"model_type {model_type!r}" if isinstance(model_type, str) else "no model_type"
    return (
        f"{config}: {what}, which the runtime cannot execute (it runs {', '.join(RUNTIME_MODEL_TYPES)} decoders); "
        "use a model of one of those families"
    )


def check_executable(workload: Workload) -> None:
    """BadInput (one line, naming the role) when a model of `workload` is one the runtime cannot execute:
    `hetrl plan` refuses it instead of planning a job no run could start."""
    for role in ("actor", "critic", "reference", "reward"):
        spec = workload.model_for(role)  # type: ignore[arg-type]
        problem = executable_problem(spec) if spec is not None else None
        if problem:
            raise BadInput(f"{role}: {problem}")
