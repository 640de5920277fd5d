"""The cost model against published GPU measurements (issue 24, item 1).

Each `Figure` below is one number a framework or a benchmark author published from a real run, with where it
was read (URL, table, date) and the run's setting (model, GPUs, parallel layout, batch, lengths, precision).
`predict` builds that setting with hetrl's own pieces — the profile from the datasheet catalog
(profiling/catalog.py), a `Workload`, and a placement that matches the published layout — and scores it with
`CostModel.task()` / `CostModel.evaluate()`, exactly as the planner would.

The figures are split into a fit set and a check set, chosen before any fitting (`Figure.split` and its
`why`). `fit_constants` asks which values of the fitted constants (`PRIORS`) the fit set implies and what the
check set's error is with them; costmodel/constants.py holds the result, rounded (tests/costmodel/
test_published.py checks it). This script never writes constants.py: it patches the constants in memory for one
prediction at a time and restores them. "today" in its output is constants.py as it is.

    .venv/bin/python bench/published.py                 # table + fit, writes bench/results/published.json
    .venv/bin/python bench/published.py --no-fit --out -   # today's predictions only, JSON on stdout
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.artifacts.rl import separate_old_logprob_pass
from hetrl_cli.artifacts.workload import LengthDistribution, ModelSpec, Workload
from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel.forward import forward_only_passes
from hetrl_cli.costmodel.memory import grad_bytes_per_param, weight_bytes_per_param
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.costmodel.types import GroupPlacement, TaskPlacement
from hetrl_cli.profiling.catalog import profile_from_cluster

RESULTS = Path(__file__).resolve().parent / "results" / "published.json"

HF_CONFIGS: dict[str, dict[str, Any]] = {
    # Llama 2 shapes (meta-llama/Llama-2-{7b,13b}-hf config.json; the same values appear in the public code
    # that copies them, which is where they were read): MHA (kv heads = heads), 32k vocabulary, untied head.
    "llama-2-7b": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
                   "model_type": "llama"},
    "llama-2-13b": {"hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 40,
                    "num_attention_heads": 40, "num_key_value_heads": 40, "vocab_size": 32000,
                    "model_type": "llama"},
    # meta-llama/Llama-2-70b-hf config.json: GQA with 8 KV heads (the 7B and 13B are MHA)
    "llama-2-70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                    "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 32000,
                    "model_type": "llama"},
    # mistralai/Mistral-7B-Instruct-v0.3 config.json: GQA with 8 KV heads, 32,768 vocabulary, untied head
    "mistral-7b-v0.3": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32768,
                        "model_type": "mistral"},
    # Qwen/Qwen2.5-Math-7B (DeepSeek-R1-Distill-Qwen-7B's base) config.json: 4 KV heads, untied head, qkv bias
    "qwen2.5-7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                   "model_type": "qwen2"},
    # Qwen/Qwen2.5-3B-Instruct config.json: 2 KV heads, tied embeddings, qkv bias
    "qwen2.5-3b": {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                   "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936,
                   "tie_word_embeddings": True, "model_type": "qwen2"},
    # Megatron-LM's GPT-2 1.2B (Shoeybi et al. 2019, Table 1): MHA, vocabulary 50,257 padded to 50,304, tied
    # embeddings; the 4h GELU MLP as a SwiGLU of 8h/3 (same weights and FLOPs)
    "gpt2-1.2b-megatron": {"hidden_size": 1536, "intermediate_size": 4096, "num_hidden_layers": 40,
                           "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 50304,
                           "tie_word_embeddings": True, "model_type": "llama"},
}  # fmt: skip

GPU_GENERATION = {"A100 80GB": "ampere", "A100 40GB": "ampere", "A10G": "ampere", "H100 SXM": "hopper",
                  "RTX 4090": "ada", "V100": "volta"}  # fmt: skip
"""A figure's GPU generation, which the per-generation summaries group by. Its datasheet fractions are
devices.gpu_generation's: the same key, except Volta and Turing, which take Ampere's (no constant of their own;
tests/costmodel/test_published_generations.py holds the two consistent)."""


sys.path.insert(0, str(Path(__file__).resolve().parent))
from published_figures import (  # noqa: E402
    FIGURES,
    PHASE_BREAKDOWNS,
    Figure,
    PhaseBreakdown,
    Setting,
)

# ---------------------------------------------------------------------------------------------------------
# Building a setting with hetrl's pieces


def cluster_profile(s: Setting) -> ClusterProfile:
    """The setting's GPUs from the datasheet catalog, its nodes linked by `inter_node`."""
    spec = {
        "name": "published",
        "node_groups": [{"gpu": s.gpu, "gpus_per_node": s.gpus_per_node, "nodes": s.nodes}],
        "network": {"intra_region": {"bandwidth": s.inter_node, "latency": "5us"}},
    }
    profile = profile_from_cluster(spec, created_at="2026-01-01T00:00:00Z")
    if not s.device:
        return profile
    fig = dict(s.device)
    devices = []
    for d in profile.devices:
        update: dict[str, Any] = {}
        if "peak_tflops" in fig:
            update["peak_tflops"] = d.peak_tflops | {"bf16": fig["peak_tflops"], "fp16": fig["peak_tflops"]}
        if "memory_gbps" in fig:  # still a datasheet figure: peak_memory_gbps equal to it
            update["memory_gbps"] = update["peak_memory_gbps"] = fig["memory_gbps"]
        if "memory_gib" in fig:
            update["memory_bytes"] = int(fig["memory_gib"] * 2**30)
        devices.append(d.model_copy(update=update))
    return profile.model_copy(update={"devices": devices})


def model_spec(name: str, config_dir: Path) -> ModelSpec:
    """A built-in architecture, or an HF config.json written from HF_CONFIGS."""
    if name not in HF_CONFIGS:
        return ModelSpec(arch=name)
    path = config_dir / f"{name}.json"
    if not path.exists():
        path.write_text(json.dumps(HF_CONFIGS[name]), encoding="utf-8")
    return ModelSpec(arch="hf", config_path=str(path))


def workload(s: Setting, config_dir: Path) -> Workload:
    """GRPO for RL steps and training; PPO (which allows one response a prompt) for engine-only figures."""
    actor = model_spec(s.model, config_dir)
    engine_only = s.kind in ("decode", "serve")
    prompts, responses = (s.concurrency if s.kind == "decode" else s.prompts), s.responses
    if s.kind == "train":  # a global batch of `prompts` sequences as GRPO groups of two
        prompts, responses = s.prompts // 2, 2
    return Workload(
        name="published",
        algorithm="ppo" if engine_only else "grpo",
        actor=actor,
        critic=actor if engine_only else None,
        prompts_per_step=prompts,
        responses_per_prompt=1 if engine_only else responses,
        max_prompt_tokens=s.prompt_tokens,
        max_response_tokens=s.response_tokens,
        response_length=LengthDistribution(mean_fraction=s.mean_fraction, p99_fraction=s.p99_fraction),
        micro_batch=s.micro_batch,
        precision=s.precision,
        sharding=s.sharding,
        recompute=s.recompute,
    )


def layout(task: str, devices: list[str], tp: int, pp: int, offload: bool = False) -> TaskPlacement:
    """Replicas of `pp` stages of `tp` consecutive devices (TP inside a node, stages next to each other)."""
    size = tp * pp
    replicas = tuple(
        tuple(tuple(devices[r * size + p * tp : r * size + (p + 1) * tp]) for p in range(pp))
        for r in range(len(devices) // size)
    )
    return TaskPlacement(task=task, replicas=replicas, offload=offload)  # type: ignore[arg-type]


def training_only_terms(model: CostModel, terms: dict[str, float]) -> dict[str, float]:
    """actor_train's terms without the old-log-prob forward the cost model charges it (forward.py `passes`): a
    pretraining step is forward + backward + optimizer only."""
    epochs = model.workload.ppo_epochs
    p_compute, p_tp, p_p2p = model.forward.consts("actor_train").passes
    scale = {k: epochs / p_compute for k in ("compute", "memory", "host", "bubble")}
    scale |= {"tp_comm": epochs / p_tp, "pp_p2p": epochs / p_p2p}
    return {k: v * scale.get(k, 1.0) for k, v in terms.items()}


def framework_old_logprob_s(model: CostModel, terms: dict[str, float]) -> float:
    """The old-log-prob forward the published RL frameworks run before every update (verl's compute_log_prob,
    NeMo-RL's prev_logprobs) where hetrl's runtime takes them from the update's own forward (GRPO with one epoch,
    artifacts.rl.separate_old_logprob_pass) and its cost model therefore charges none: actor_train's terms scaled
    to the pass forward.py charges when the runtime runs it (0 where the model already charges it)."""
    w = model.workload
    if separate_old_logprob_pass(w.algorithm, w.ppo_epochs):
        return 0.0
    c = model.forward.consts("actor_train")
    compute, tp_comm, sends = forward_only_passes(c.mult, c.allreduces_per_layer, c.sends_per_stage)
    extra = {"compute": compute, "memory": compute, "host": compute, "bubble": compute}
    extra |= {"tp_comm": tp_comm, "pp_p2p": sends}
    return sum(v * extra.get(k, 0.0) / w.ppo_epochs for k, v in terms.items())


def selective_share(model: CostModel) -> float:
    """Of one forward's FLOPs, the share torchtitan's op-level selective AC recomputes: every second matmul of
    a layer in call order (wq wk wv · wo · w1 w3 w2 → wk, wo, w3; torchtrain/parallelisms/parallelize_llama.py,
    2024-04: "Saves output of all compute ops, except every second mm"); attention and the head are saved."""
    arch = model.step.arch["actor_train"]
    h = arch.hidden_size
    recomputed = 2.0 * (h * arch.kv_dim + arch.q_dim * h + h * arch.intermediate_size) * arch.num_layers
    return recomputed / model.step.stage_flops_per_token(arch, "lm", arch.num_layers, True, model.step.seq_mean / 2)


def _train_terms(s: Setting, profile: ClusterProfile, w: Workload, calibration: dict | None):
    devices = [d.id for d in profile.devices]
    model = CostModel(profile, w, calibration)
    est = model.task(layout("actor_train", devices, s.tp, s.pp), ())
    return model, training_only_terms(model, dict(est.terms)), est.violation


def train_step_s(s: Setting, profile: ClusterProfile, w: Workload, calibration: dict | None):
    """Seconds of one pretraining step, its terms and violation; selective AC priced between recompute off and
    on: "layer" halfway, "op" its matmul share of the recomputed forward's compute and all of its
    memory-bound ops (the non-matmul ops are recomputed)."""
    model, terms, violation = _train_terms(s, profile, w, calibration)
    if s.selective_ac:
        _, full, _ = _train_terms(s, profile, w.model_copy(update={"recompute": True}), calibration)
        if s.selective_ac == "layer":
            terms = {k: (v + full.get(k, 0.0)) / 2 for k, v in terms.items()}
        else:
            share = selective_share(model)
            terms = terms | {
                "compute": terms["compute"] + share * (full["compute"] - terms["compute"]),
                "memory": full["memory"],
                "tp_comm": full.get("tp_comm", 0.0),
            }
    return model, sum(terms.values()), terms, violation


# ---------------------------------------------------------------------------------------------------------
# Predicting one figure


@dataclass
class Prediction:
    key: str
    predicted: float
    published: float
    terms: dict[str, float] = field(default_factory=dict)
    """Seconds per task (RL steps) or per term of the scored task."""
    violations: list[str] = field(default_factory=list)

    @property
    def log_ratio(self) -> float:
        return math.log(self.predicted / self.published)


def _gen_time(model: CostModel, devices: list[str], tp: int) -> tuple[float, dict[str, float], str | None]:
    est = model.task(layout("generation", devices[:tp], tp, 1))
    return est.cost.total_s, dict(est.terms), est.violation


def rl_step_estimate(model: CostModel, s: Setting, devices: list[str]):
    """A colocated GRPO step as the planner scores it (one group, the published layouts) and the old-log-prob
    forward the published frameworks add (framework_old_logprob_s)."""
    groups = [GroupPlacement("all", tuple(model.required_tasks), tuple(devices))]
    places = [
        layout(t, devices, s.gen_tp, 1)
        if t == "generation"
        else layout(t, devices, s.tp, s.pp, s.train_offload and t == "actor_train")
        for t in model.required_tasks
    ]
    est = model.evaluate(groups, places)
    return est, framework_old_logprob_s(model, dict(est.tasks["actor_train"].terms))


NEMO_RL_WORKER = "https://github.com/NVIDIA-NeMo/RL/blob/v0.5.0/nemo_rl/models/policy/workers/megatron_policy_worker.py"
NEMO_RL_VLLM = "https://github.com/NVIDIA-NeMo/RL/blob/v0.5.0/nemo_rl/models/generation/vllm/vllm_worker.py"


def framework_s(model: CostModel, s: Setting, est) -> dict[str, float]:
    """Seconds a step of `s.framework` spends, by phase, on work hetrl's runtime does not do (so the cost model,
    which prices hetrl's runtime, charges none of it). "nemo-rl-megatron", read in NeMo-RL's source at v0.5.0
    (same calls at v0.3.0):
    - training: `s.optimizer_steps` updates a step (train_global_batch_size 512 of a 2,048-sample rollout), each
      with its DP gradient reduce, optimizer step and pipeline flush; hetrl's runtime takes one an epoch, which
      the cost model prices: the other steps - 1 are the framework's (actor_train's dp_allreduce, optimizer and
      bubble terms once more each);
    - host copies, per GPU at HOST_DEVICE_Bps (every GPU copies over its own PCIe link at once), of state hetrl's
      runtime leaves where it is (its engine sleeps at level 2, freeing without a copy; its reference stays
      resident; its trainer keeps weights and frees gradients; only the optimizer state goes to host, which the
      cost model prices in actor_train's `offload`):
      refit: the DDP gradient buffers to host (offload_before_refit), vLLM's weights back from host on wake_up
      (it slept at level 1: vllm_worker.sleep -> llm.sleep(level=1)), the trainer's weights to host
      (offload_after_refit); generation: vLLM's sleep(level=1) copying its weights to host; logprobs: the
      reference swap (use_reference_model: the policy's state dict to host, the reference's from host, the
      policy's back: 3 copies); other (logprob_inference_prep, training_prep): the trainer's weights and gradient
      buffers back to the device. Weights and gradients in the workload's dtype (bf16: Megatron's default
      grad_reduce_in_fp32 false), a training GPU holding 1/(tp·pp) of them and an engine GPU 1/gen_tp."""
    if s.framework != "nemo-rl-megatron":
        return {}
    w = model.workload
    arch = model.step.arch["actor_train"]
    params = arch.param_count()
    train_dev = params * weight_bytes_per_param(w) / (s.tp * s.pp)
    grads_dev = params * grad_bytes_per_param(w) / (s.tp * s.pp)
    engine_dev = params * weight_bytes_per_param(w) / s.gen_tp
    bps = C.HOST_DEVICE_Bps
    terms = est.tasks["actor_train"].terms
    per_update = sum(terms.get(k, 0.0) for k in ("dp_allreduce", "optimizer", "bubble")) / w.ppo_epochs
    return {
        "training": (s.optimizer_steps - 1) * per_update,
        "refit": (grads_dev + engine_dev + train_dev) / bps,
        "generation": engine_dev / bps,
        "logprobs": 3 * train_dev / bps,
        "other": (train_dev + grads_dev) / bps,
    }


def step_phases(est, old_logprob: float) -> dict[str, float]:
    """The cost model's seconds of a colocated GRPO step in NeMo-RL's phases (PhaseBreakdown.phases):
    logprobs = reference + the old-log-prob pass; training = actor_train without its optimizer's offload copies,
    which NeMo-RL makes in the refit (to host: offload_before_refit) and before training (back: training_prep,
    outside the four published phases); refit = the weight sync + the copy to host; other = what the iteration
    holds besides (the copy back, transfers, rewards)."""
    train = est.tasks["actor_train"]
    offload = train.terms.get("offload", 0.0)
    phases = {
        "generation": est.tasks["generation"].cost.total_s,
        "logprobs": est.tasks["reference"].cost.total_s + old_logprob,
        "training": train.cost.total_s - offload,
        "refit": est.weight_sync_s + offload / 2,
    }
    phases["total"] = est.iteration_s + old_logprob
    phases["other"] = phases["total"] - sum(v for k, v in phases.items() if k != "total")
    return phases


def predict_phases(bd: PhaseBreakdown, config_dir: Path) -> dict[str, Any]:
    """The cost model's phases of `bd`'s step next to the published ones, and actor_train's terms."""
    s = bd.setting
    profile = cluster_profile(s)
    model = CostModel(profile, workload(s, config_dir))
    est, old_logprob = rl_step_estimate(model, s, [d.id for d in profile.devices])
    extra = framework_s(model, s, est)
    phases = step_phases(est, old_logprob)
    for k, v in extra.items():
        phases[k] += v
    phases["total"] += sum(extra.values())
    return {
        "key": bd.key,
        "published": dict(bd.phases),
        "predicted": phases,
        "framework": extra,
        "actor_train_terms": dict(est.tasks["actor_train"].terms),
        "generation_terms": dict(est.tasks["generation"].terms),
        "violations": list(est.violations),
    }


def phase_table(rows: list[dict[str, Any]]) -> str:
    """Published vs predicted seconds per phase, markdown."""
    names = ("total", "generation", "logprobs", "training", "refit", "other")
    lines = ["| step | " + " | ".join(f"{n} pub / pred" for n in names) + " |", "|---|" + "---:|" * len(names)]
    for r in rows:
        cells = []
        for n in names:
            pub = r["published"].get(n)
            if pub is None and n == "other" and len(r["published"]) == 5:  # the four phases and the total
                pub = r["published"]["total"] - sum(v for k, v in r["published"].items() if k != "total")
            cells.append(f"{'—' if pub is None else f'{pub:.1f}'} / {r['predicted'][n]:.1f}")
        lines.append(f"| {r['key']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def predict(fig: Figure, config_dir: Path, calibration: dict | None = None) -> Prediction:
    """hetrl's prediction of `fig`'s quantity in its setting."""
    s = fig.setting
    profile = cluster_profile(s)
    devices = [d.id for d in profile.devices]
    w = workload(s, config_dir)
    model = CostModel(profile, w, calibration)
    if s.kind == "rl_step":
        est, old_logprob = rl_step_estimate(model, s, devices)
        terms = {t: e.cost.total_s for t, e in est.tasks.items()} | {"weight_sync": est.weight_sync_s}
        terms["actor_train"] += old_logprob
        extra = framework_s(model, s, est)
        terms |= {f"framework:{k}": v for k, v in extra.items()}
        total = est.iteration_s + old_logprob + sum(extra.values())
        return Prediction(fig.key, total, fig.published, terms, list(est.violations))
    if s.kind == "train":
        model, train_s, terms, violation = train_step_s(s, profile, w, calibration)
        tokens = model.step.n_samples * model.step.seq_mean
        viol = [violation] if violation else []
        value = train_s if fig.quantity == "iteration_s" else tokens / train_s / len(devices)
        return Prediction(fig.key, value, fig.published, terms, viol)
    total, terms, violation = _gen_time(model, devices, s.gen_tp)
    viol = [violation] if violation else []
    if s.kind == "serve":  # tokens_per_s counts prompt and output tokens, output_tokens_per_s the output only
        per_seq = model.step.resp_mean if fig.quantity == "output_tokens_per_s" else model.step.seq_mean
        tokens = model.step.n_samples * (1.0 if fig.quantity == "requests_per_s" else per_seq)
        return Prediction(fig.key, tokens / total, fig.published, terms, viol)
    if fig.quantity == "throughput_gain":  # tokens/s of `concurrency` sequences in lockstep over one sequence's
        one = workload(s, config_dir).model_copy(update={"prompts_per_step": 1})
        single, _, _ = _gen_time(CostModel(profile, one, calibration), devices, s.gen_tp)
        return Prediction(fig.key, s.concurrency * single / total, fig.published, terms, viol)
    # decode: the time per output token is the slope of the engine's time in the response length
    one = workload(s, config_dir).model_copy(update={"max_response_tokens": 1})
    first, _, _ = _gen_time(CostModel(profile, one, calibration), devices, s.gen_tp)
    tpot = (total - first) / (s.response_tokens - 1)
    value = tpot if fig.quantity == "tpot_s" else 1.0 / tpot
    return Prediction(fig.key, value, fig.published, terms, viol)


# ---------------------------------------------------------------------------------------------------------
# The constants the fit sets (costmodel/constants.py holds the result; here they are patched in memory for one
# prediction at a time and restored)

PRIORS: dict[str, float] = {
    "HBM_EFFICIENCY": 0.80,
    "DATASHEET_HBM_FRACTION_AMPERE": 0.864,
    "DATASHEET_MATMUL_FRACTION_AMPERE": 1.0,
    "DATASHEET_MATMUL_FRACTION_HOPPER": 0.666,
    "DATASHEET_MATMUL_FRACTION_ADA": 1.0,
    "DATASHEET_HBM_FRACTION_ADA": 0.82,
}
"""The values before the fit: the efficiencies as they were (no datasheet fraction on Ampere), no per-sequence
decode cost, the Hopper fraction hetrl's probe measured on an H200 (658.9 of 989.5 TFLOP/s), and Ada at the
Ampere fractions it took before it had figures of its own (1.0, 0.82)."""
H200_PROBE_TFLOPS = 658.9
"""hetrl's own GEMM probe on an H200 (bench/results/gpu_check_h200; the H100 SXM's GH100 die and datasheet bf16
peak, 989.5): a rate a Hopper GPU was measured to reach, so the fit's lower bound for the Hopper fraction
(tests/costmodel/test_datasheet.py holds the applied value to it)."""
BOUNDS: dict[str, tuple[float, float]] = {
    "HBM_EFFICIENCY": (0.3, 1.2),
    "DATASHEET_HBM_FRACTION_AMPERE": (0.5, 1.0),
    "DATASHEET_MATMUL_FRACTION_AMPERE": (0.3, 1.0),
    "DATASHEET_MATMUL_FRACTION_HOPPER": (H200_PROBE_TFLOPS / 989.5, 1.0),
    "DATASHEET_MATMUL_FRACTION_ADA": (0.3, 1.0),
    "DATASHEET_HBM_FRACTION_ADA": (0.5, 1.0),
}
LINEAR: frozenset[str] = frozenset()
"""Constants searched on a linear scale (none now: every one is a positive fraction)."""


def applied() -> dict[str, float]:
    """The values costmodel/constants.py holds now, in the fit's names."""
    return {
        "HBM_EFFICIENCY": C.HBM_EFFICIENCY,
        "DATASHEET_HBM_FRACTION_AMPERE": C.DATASHEET_HBM_FRACTION["ampere"],
        "DATASHEET_MATMUL_FRACTION_AMPERE": C.DATASHEET_MATMUL_FRACTION["ampere"],
        "DATASHEET_MATMUL_FRACTION_HOPPER": C.DATASHEET_MATMUL_FRACTION["hopper"],
        "DATASHEET_MATMUL_FRACTION_ADA": C.DATASHEET_MATMUL_FRACTION["ada"],
        "DATASHEET_HBM_FRACTION_ADA": C.DATASHEET_HBM_FRACTION["ada"],
    }


@contextlib.contextmanager
def patched(values: dict[str, float]) -> Iterator[None]:
    """The cost-model constants set to `values` for the duration of the block."""
    saved = {k: getattr(C, k) for k in ("HBM_EFFICIENCY", "DATASHEET_HBM_FRACTION",
                                        "DATASHEET_MATMUL_FRACTION")}  # fmt: skip
    try:
        C.HBM_EFFICIENCY = values["HBM_EFFICIENCY"]
        C.DATASHEET_HBM_FRACTION = C.DATASHEET_HBM_FRACTION | {
            "ampere": values["DATASHEET_HBM_FRACTION_AMPERE"],
            "ada": values["DATASHEET_HBM_FRACTION_ADA"],
        }
        C.DATASHEET_MATMUL_FRACTION = {
            "ampere": values["DATASHEET_MATMUL_FRACTION_AMPERE"],
            "hopper": values["DATASHEET_MATMUL_FRACTION_HOPPER"],
            "ada": values["DATASHEET_MATMUL_FRACTION_ADA"],
        }
        yield
    finally:
        for k, v in saved.items():
            setattr(C, k, v)


def predict_all(figures: tuple[Figure, ...], values: dict[str, float], config_dir: Path) -> list[Prediction]:
    out = []
    for fig in figures:
        with patched(values):
            out.append(predict(fig, config_dir))
    return out


def _loss(preds: list[Prediction], values: dict[str, float], prior_weight: float) -> float:
    """Σ ln(pred/pub)² plus a weak pull of the constants towards their priors (they have a physical meaning:
    a fit that the data does not pin should not wander)."""
    data = sum(p.log_ratio**2 for p in preds)
    pull = sum(math.log(values[k] / PRIORS[k]) ** 2 for k in values if k not in LINEAR)
    return data + prior_weight * pull


def in_loss(fig: Figure) -> bool:
    """Whether a figure sets the constants: the fit set's kernel-level figures (training tokens/s, decode).
    A whole RL step of the fit set is predicted and reported but not fitted: its time holds terms none of these
    rates sets (the refit and the engine's sleep/wake, which issue 24's refit part changes in weightsync.py,
    scheduling between tasks); fitted with it, the four rates moved against their own kernel-level figures
    (Hopper matmul 0.61 and H100 decode 1.14× too slow, docs/benchmarks.md)."""
    return fig.split == "fit" and fig.term != "rl_step"


def fit_constants(
    figures: tuple[Figure, ...], config_dir: Path, sweeps: int = 4, prior_weight: float = 0.01
) -> dict[str, float]:
    """Least squares on log ratios over the constants in PRIORS, on the fit set's figures that `in_loss`
    admits: coordinate descent, a golden-section search per constant within BOUNDS (log-spaced for the
    multiplicative ones), `sweeps` passes."""
    values = dict(PRIORS)
    fit = tuple(f for f in figures if in_loss(f))

    def loss_at(name: str, x: float) -> float:
        trial = values | {name: x}
        return _loss(predict_all(fit, trial, config_dir), trial, prior_weight)

    for _ in range(sweeps):
        for name, (lo, hi) in BOUNDS.items():
            values[name] = _golden(lambda x, n=name: loss_at(n, x), lo, hi, log=name not in LINEAR)
    return values


def _golden(f, lo: float, hi: float, log: bool, iters: int = 24) -> float:
    """Minimise a one-dimensional function on [lo, hi] (in log space when `log`)."""
    to = (lambda v: math.log(v)) if log else (lambda v: v)
    back = (lambda v: math.exp(v)) if log else (lambda v: v)
    a, b = to(lo), to(hi)
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(back(c)), f(back(d))
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(back(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(back(d))
    return back((a + b) / 2)


# ---------------------------------------------------------------------------------------------------------
# Reporting


def summary(figures: tuple[Figure, ...], preds: list[Prediction]) -> dict[str, Any]:
    """Median and max |ln(pred/pub)| per set and per term."""
    out: dict[str, Any] = {}
    by = {p.key: p for p in preds}
    for label, pick in (("fit", lambda f: f.split == "fit"), ("check", lambda f: f.split == "check")):
        errs = [abs(by[f.key].log_ratio) for f in figures if pick(f)]
        out[label] = {"n": len(errs), "median_abs_ln": statistics.median(errs), "max_abs_ln": max(errs)}
    for term in sorted({f.term for f in figures}):
        errs = [abs(by[f.key].log_ratio) for f in figures if f.term == term]
        out[f"term:{term}"] = {"n": len(errs), "median_abs_ln": statistics.median(errs), "max_abs_ln": max(errs)}
    for gen in sorted(set(GPU_GENERATION.values())):  # the check set per GPU generation
        errs = [abs(by[f.key].log_ratio) for f in figures
                if f.split == "check" and GPU_GENERATION[f.setting.gpu] == gen]  # fmt: skip
        if errs:
            out[f"check:{gen}"] = {"n": len(errs), "median_abs_ln": statistics.median(errs), "max_abs_ln": max(errs)}
    return out


def table(figures: tuple[Figure, ...], preds: list[Prediction], title: str) -> str:
    """A markdown table of one set of predictions."""
    by = {p.key: p for p in preds}
    lines = [f"**{title}**", "", "| figure | set | term | published | predicted | pred/pub | abs ln |",
             "|---|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for f in figures:
        p = by[f.key]
        lines.append(
            f"| {f.key} | {f.split} | {f.term} | {_fmt(f.published, f.quantity)} | {_fmt(p.predicted, f.quantity)} "
            f"| {p.predicted / p.published:.2f} | {abs(p.log_ratio):.3f} |"
        )
    return "\n".join(lines)


def _fmt(value: float, quantity: str) -> str:
    if quantity == "tpot_s":
        return f"{value * 1e3:.2f} ms/token"
    if quantity == "step_s":
        return f"{value:.1f} s/step"
    if quantity == "throughput_gain":
        return f"{value:.2f}× tok/s"
    if quantity == "requests_per_s":
        return f"{value:.2f} req/s"
    if quantity == "iteration_s":
        return f"{value:.3f} s/iteration"
    unit = {
        "tokens_per_s_per_gpu": "tok/s/GPU",
        "tokens_per_s": "tok/s",
        "decode_tokens_per_s": "tok/s",
        "output_tokens_per_s": "output tok/s",
    }[quantity]
    return f"{value:,.0f} {unit}"


def run(fit: bool) -> dict[str, Any]:
    """Every figure predicted with the constants costmodel/constants.py holds ("today": what the planner
    prices) and with the priors; with `fit`, the constants the fit set implies and their predictions."""
    with tempfile.TemporaryDirectory(prefix="hetrl-published-") as tmp:
        config_dir = Path(tmp)
        blocks = {
            "today": predict_all(FIGURES, applied(), config_dir),
            "prior": predict_all(FIGURES, PRIORS, config_dir),
        }
        result: dict[str, Any] = {"figures": [asdict(f) for f in FIGURES], "constants": applied()}
        result["phases"] = all_phases(config_dir)
        for name, preds in blocks.items():
            result[name] = {"predictions": [_pred_json(p) for p in preds], "summary": summary(FIGURES, preds)}
        if fit:
            values = fit_constants(FIGURES, config_dir)
            fitted = predict_all(FIGURES, values, config_dir)
            result["proposal"] = {
                "constants": values,
                "priors": PRIORS,
                "predictions": [_pred_json(p) for p in fitted],
                "summary": summary(FIGURES, fitted),
            }
    return result


def all_phases(config_dir: Path) -> list[dict[str, Any]]:
    """predict_phases of every PhaseBreakdown and of the whole-step figures (published total only)."""
    steps = [PhaseBreakdown(f.key, f.source, f.citation, f.setting, (("total", f.published),), f.why)
             for f in FIGURES if f.setting.kind == "rl_step"]  # fmt: skip
    return [predict_phases(bd, config_dir) for bd in (*PHASE_BREAKDOWNS, *steps)]


def _pred_json(p: Prediction) -> dict[str, Any]:
    return {"key": p.key, "predicted": p.predicted, "published": p.published, "ratio": p.predicted / p.published,
            "abs_ln": abs(p.log_ratio), "terms": p.terms, "violations": p.violations}  # fmt: skip


def report(result: dict[str, Any]) -> str:
    """The tables and the proposal as markdown (what docs/benchmarks.md carries)."""

    def preds(block: dict) -> list[Prediction]:
        return [Prediction(d["key"], d["predicted"], d["published"]) for d in block["predictions"]]

    parts = [table(FIGURES, preds(result["today"]), "costmodel/constants.py (what the planner prices)"), "",
             _summary_md(result["today"]), "", table(FIGURES, preds(result["prior"]), "The priors (before the fit)"),
             "", _summary_md(result["prior"]), "", "**Whole GRPO steps by phase (seconds)**", "",
             phase_table(result["phases"])]  # fmt: skip
    if "proposal" in result:
        prop = result["proposal"]
        parts += ["", table(FIGURES, preds(prop), "With the fitted constants"), "", _summary_md(prop), "",
                  "| constant | prior | fit | constants.py |", "|---|---:|---:|---:|"]  # fmt: skip
        parts += [f"| {k} | {prop['priors'][k]:.4g} | {v:.4g} | {result['constants'][k]:.4g} |"
                  for k, v in prop["constants"].items()]  # fmt: skip
    return "\n".join(parts)


def _summary_md(block: dict) -> str:
    rows = [f"- {k}: n={v['n']}, median |ln| {v['median_abs_ln']:.3f}, max {v['max_abs_ln']:.3f}"
            for k, v in block["summary"].items()]  # fmt: skip
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-fit", action="store_true", help="today's predictions only")
    parser.add_argument("--out", default=str(RESULTS), help="JSON results path ('-' for stdout)")
    args = parser.parse_args(argv)
    result = run(fit=not args.no_fit)
    text = json.dumps(result, indent=1, sort_keys=True)
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
        print(report(result))
        print(f"\nwrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
