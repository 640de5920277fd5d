"""The published figures bench/published.py prices: each one's citation (URL, table, date) and setting.

Moved out of bench/published.py (which imports them) so that the script stays under the file-size limit; the
figures, their fit/check roles and their notes are unchanged by the move.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """What the published run did, in the terms hetrl's workload and placement take."""

    model: str
    """A built-in architecture (costmodel/architectures.py) or a key of HF_CONFIGS."""
    gpu: str
    """Catalog GPU type (hetrl_cli/data/gpus.yaml)."""
    gpus_per_node: int
    nodes: int
    kind: str
    """rl_step: a colocated GRPO step (generation, reference, actor_train, refit); train: pretraining
    throughput (actor_train without its old-log-prob forward); decode: time per output token of
    `concurrency` sequences on one engine (or, for quantity throughput_gain, their tokens/s over one
    sequence's, prefill included); serve: an offline batch through one engine."""
    tp: int = 1
    pp: int = 1
    gen_tp: int = 1
    prompts: int = 1
    responses: int = 1
    prompt_tokens: int = 1
    response_tokens: int = 1
    mean_fraction: float = 1.0
    p99_fraction: float = 1.0
    micro_batch: int = 1
    recompute: bool = False
    sharding: str = "none"
    precision: str = "bf16"
    concurrency: int = 1
    train_offload: bool = False
    """actor_train's optimizer state goes to host memory while the other tasks run (TaskPlacement.offload)."""
    selective_ac: str = ""
    """torchtitan's selective activation checkpointing: "op" saves the outputs of matmuls and attention except
    every second matmul of a layer (wk, wo, w3 recomputed) and recomputes every other op; "layer" recomputes
    every second layer whole. Priced between recompute off and on (`selective_share`)."""
    device: tuple[tuple[str, float], ...] = ()
    """Figures of the run's GPU where it is not the catalog's: peak_tflops (bf16/fp16), memory_gbps, memory_gib."""
    inter_node: str = "3200Gbps"
    """Per host pair and direction: 8 GPUs × 400 Gb/s InfiniBand NDR on a DGX H100-class node."""
    optimizer_steps: int = 1
    """Optimizer steps a published RL step takes (rollout batch / train global batch; NeMo-RL's 2,048 / 512 = 4).
    hetrl's runtime takes one per epoch (roles.Actor.train_step), so the cost model prices one: the others are
    the framework's (framework_s)."""
    framework: str = ""
    """The RL framework whose own per-step work framework_s adds ("nemo-rl-megatron"); "" for none."""
    assumptions: str = ""
    """What the source does not state and this setting assumes."""

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class Figure:
    """One published, measured number and where it was read."""

    key: str
    source: str
    """The independent source (project or author) it comes from."""
    citation: str
    """URL or repository path, the table or figure, and the date of the publication."""
    quantity: str
    """step_s | tokens_per_s_per_gpu | tpot_s | decode_tokens_per_s | tokens_per_s | output_tokens_per_s |
    throughput_gain | requests_per_s | iteration_s"""
    published: float
    setting: Setting
    term: str
    """What the figure measures: rl_step (a whole step), training, decode or generation."""
    split: str
    """fit or check, chosen before any fitting."""
    why: str
    """Why it is in its set."""


# Dates are those of the publication (commit or post) the number was read from.
NEMO_RL = "https://github.com/NVIDIA-NeMo/RL/blob/v0.5.0/docs/about/performance-summary.md"
TORCHTITAN_A100 = "https://github.com/pytorch/torchtitan/blob/157a12c56/docs/performance.md"
TORCHTITAN_H100 = "https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md"
NM_VLLM = "https://github.com/neuralmagic/nm-vllm/commit/c13b5c2db94204380ae246d968d6ace23eb6fcb4"
YOBITEL = "https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/"
MUSGRAVE = "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on"
LAMBDA = "https://github.com/LambdaLabsML/vllm-benchmark/blob/0e8fc5d/benchmark_v0.md"
SGLANG_VLLM060 = "https://github.com/sgl-project/sglang/blob/120affb/benchmark/benchmark_vllm_060/README.md"
_SHAREGPT_NOTE = (
    "ShareGPT through the OpenAI server at request rate inf (every prompt queued at once: an offline batch of up "
    "to max_num_seqs 256, as a rollout); vLLM 0.6.0 with --num-scheduler-steps 10 (one scheduling and output "
    "pass per 10 decode steps) and so without chunked prefill (prefill steps run apart from decode, as priced); "
    "lengths not on the page: 215-token prompts (the ShareGPT sample's mean input), responses of mean 194 "
    "tokens (SGLang's table: output tok/s / req/s = 194.3) under the sampler's 2,048-token cap, p99 ~ 920"
)

_NEMO_NOTE = (
    "OpenMathInstruct-2 prompt length not published: 256 tokens assumed; response mean = G-Average Seq len − 256; "
    "sequence packing of 4,096 tokens a micro-batch ≈ 4 sequences (micro_batch 4); refit, log-probs, reference "
    "and training all on the same 8-GPU DGX H100 nodes (colocated, the recipe's default); Megatron's "
    "distributed optimizer (zero1), offloaded to host memory during generation (grpo_math_1B.yaml: 'colocated "
    "generation will always offload optimizer')"
)
_TITAN_NOTE = (
    "torch.compile off; selective op AC (the config's default option) recomputes every second matmul of a "
    "layer and every non-matmul op (Setting.selective_ac; until 2026-12-05 this was counted as no recomputation)"
)
GRAND_TETON_H100 = (("peak_tflops", 912.0), ("memory_gbps", 2400.0), ("memory_gib", 96.0))
"""The benchmark's H100s: 96 GB HBM2e at 2.4 TB/s, 500 W; 'the actual peak TFLOPs number is between SXM and NVL'
(its footnote 2): the midpoint of 989.5 (SXM) and 835 (NVL, 1,671 with sparsity) dense bf16 TFLOP/s."""
_YOBITEL_NOTE = (
    "the 'chatbot-short' workload's lengths are not on the page: 256-token prompts and 256-token responses "
    "assumed (TPOT barely depends on them at this scale); fp16 as published"
)

RAHMAN_4090 = (
    "https://mushfiqrahman.dev/benchmarking-mistral-7b-on-rtx-4090-vllm-concurrency-latency-and-capacity-planning/"
)
_RAHMAN_NOTE = (
    "mistralai/Mistral-7B-Instruct-v0.3 in vLLM's OpenAI server, vLLM version not on the page; bf16 (the model's "
    "dtype, vLLM's default); fixed 256-token prompts and 128-token responses assumed (the workload as the page "
    "names it); the steady state of `max concurrency` requests is priced as waves of that many sequences in "
    "lockstep, each wave's prefill included (300 prompts: 75, 38 and 19 waves)"
)
MEGATRON_V1 = "https://nv-adlr.github.io/MegatronLMV1"
DBM_4090 = "https://www.databasemart.com/blog/vllm-gpu-benchmark-rtx4090"
_DBM_NOTE = (
    "vLLM offline test, all 300 requests sent at once; version and max_model_len not on the page; 16-bit weights "
    "(bf16, the models' dtype); every response assumed to run to the 600-token output length (reasoning models "
    "rarely stop sooner); GPU vRAM rate 91 % on the page, priced at hetrl's 0.90 memory utilisation"
)

FIGURES: tuple[Figure, ...] = (
    Figure(
        "nemo-rl/llama3.1-8b/16xh100", "NeMo-RL",
        f"{NEMO_RL} — 'NeMo RL v0.5, H100 BF16 Benchmarks' table, row GRPO LLAMA3.1_8B On policy (2026-01-20)",
        "step_s", 92.8,
        Setting("llama-3.1-8b", "H100 SXM", 8, 2, "rl_step", tp=1, pp=2, gen_tp=1, prompts=64, responses=32,
                prompt_tokens=256, response_tokens=3840, mean_fraction=(1019 - 256) / 3840, micro_batch=4,
                recompute=True, sharding="zero1", train_offload=True, optimizer_steps=4, framework="nemo-rl-megatron",
                assumptions=_NEMO_NOTE + "; recipe grpo-llama3.1-8b-instruct-2n8g.yaml: PP2, "
                "activation checkpointing, vLLM TP1"),
        "rl_step", "check", "was the fit set's RL step (the smaller of this source's two); moved to the check set "
        "on 2026-12-05 after a first fit with it: no kernel rate sets a whole step's residual (`in_loss`), and "
        "fitted with it the rates moved against their own figures. Its miss lies in generation (the v0.3 phase "
        "splits); NeMo-RL v0.5.0 also runs vLLM (0.11.2) in process with logprobs=0, whose host work, measured in "
        "vLLM 0.9.0's code for the v0.3 8B split, is 4.9 s of that split's 14.6 s gap (bench/nemo_rl_host_work.py)",
    ),
    Figure(
        "nemo-rl/qwen3-32b/32xh100", "NeMo-RL",
        f"{NEMO_RL} — same table, row GRPO Qwen3-32B On policy (2026-01-20)",
        "step_s", 376.0,
        Setting("qwen3-32b", "H100 SXM", 8, 4, "rl_step", tp=4, pp=4, gen_tp=4, prompts=64, responses=32,
                prompt_tokens=256, response_tokens=3840, mean_fraction=(3251 - 256) / 3840, micro_batch=1,
                sharding="zero1", train_offload=True, optimizer_steps=4, framework="nemo-rl-megatron",
                assumptions=_NEMO_NOTE.replace("≈ 4 sequences (micro_batch 4)", "≈ 1 sequence (micro_batch 1)")
                + "; recipe grpo-qwen3-32b-4n8g.yaml: TP4 PP4 (DP2), vLLM TP4"),
        "rl_step", "check", "a 4× larger model, TP4×PP4 and 4 nodes: the fit never sees this layout",
    ),
    Figure(
        "torchtitan/llama3-8b/64xa100", "torchtitan",
        f"{TORCHTITAN_A100} — 'LLaMa 3 performance numbers' table, 8B, selective op AC: 2973 WPS (2024-04-24)",
        "tokens_per_s_per_gpu", 2973.0,
        Setting("llama-3.1-8b", "A100 80GB", 8, 8, "train", prompts=64, prompt_tokens=1, response_tokens=8191,
                sharding="zero3", inter_node="1600Gbps", selective_ac="op",
                assumptions=_TITAN_NOTE + "; seq_len 8192 and local batch 1 from train_configs/llama3_8b.toml "
                "at that commit; network not stated: 8 × 200 Gb/s HDR per node assumed"),
        "training", "fit", "the A100 training anchor (one model, FSDP only)",
    ),
    Figure(
        "torchtitan/llama3-70b/64xa100", "torchtitan",
        f"{TORCHTITAN_A100} — same table, 70B, full AC: 331 WPS (2024-04-24)",
        "tokens_per_s_per_gpu", 331.0,
        Setting("llama-3.1-70b", "A100 80GB", 8, 8, "train", prompts=64, prompt_tokens=1, response_tokens=8191,
                sharding="zero3", recompute=True, inter_node="1600Gbps",
                assumptions="full AC = full recomputation; network as the 8B row"),
        "training", "check", "another model size and full recomputation on the same GPUs",
    ),
    Figure(
        "torchtitan/llama2-13b/64xa100", "torchtitan",
        f"{TORCHTITAN_A100} — 'LLaMa 2 performance numbers' table, 13B, batch 2, no AC: 2162 WPS (2024-04-24)",
        "tokens_per_s_per_gpu", 2162.0,
        Setting("llama-2-13b", "A100 80GB", 8, 8, "train", prompts=128, prompt_tokens=1, response_tokens=4095,
                micro_batch=2, sharding="zero3", inter_node="1600Gbps",
                assumptions="Llama 2 sequence length 4096 (the page: half of Llama 3's); network as the 8B row"),
        "training", "check", "an MHA model (no GQA) at another sequence length and micro-batch",
    ),
    Figure(
        "torchtitan/llama2-70b/64xa100", "torchtitan",
        f"{TORCHTITAN_A100} — 'LLaMa 2 performance numbers' table, 70B, batch 2, full AC: 353 WPS (2024-04-24)",
        "tokens_per_s_per_gpu", 353.0,
        Setting("llama-2-70b", "A100 80GB", 8, 8, "train", prompts=128, prompt_tokens=1, response_tokens=4095,
                micro_batch=2, sharding="zero3", recompute=True, inter_node="1600Gbps",
                assumptions="full AC = full recomputation; sequence length 4096 as the 13B row; network as the 8B "
                "row"),
        "training", "fit", "added 2026-12-05 before the refit: the other end of the size range on Ampere (hidden "
        "8192), so the Ampere matmul fraction is not set by one model size; the 13B and Llama 3 70B stay checks",
    ),
    Figure(
        "torchtitan/llama3.1-8b/8xh100", "torchtitan",
        f"{TORCHTITAN_H100} — Table 1, FSDP, no compile: 5,762 TPS/GPU (2024-12, file dated 2025-06-13)",
        "tokens_per_s_per_gpu", 5762.0,
        Setting("llama-3.1-8b", "H100 SXM", 8, 1, "train", prompts=16, prompt_tokens=1, response_tokens=8191,
                micro_batch=2, sharding="zero3", selective_ac="op", device=GRAND_TETON_H100,
                assumptions=_TITAN_NOTE + "; Grand Teton H100s are 96 GB HBM2e, 2.4 TB/s, capped at 500 W (the "
                "catalog's H100 SXM is 80 GB HBM3, 3.35 TB/s, 700 W): GRAND_TETON_H100; seq_len 8192"),
        "training", "fit", "the H100 training anchor (one node)",
    ),
    Figure(
        "torchtitan/llama3.1-8b/128xh100", "torchtitan",
        f"{TORCHTITAN_H100} — Table 3, FSDP, no compile: 5,605 TPS/GPU (2024-12, file dated 2025-06-13)",
        "tokens_per_s_per_gpu", 5605.0,
        Setting("llama-3.1-8b", "H100 SXM", 8, 16, "train", prompts=256, prompt_tokens=1, response_tokens=8191,
                micro_batch=2, sharding="zero3", selective_ac="op", device=GRAND_TETON_H100,
                assumptions="as the 8-GPU row; 400 Gb/s RDMA per GPU"),
        "training", "check", "the same model over 16 nodes: the FSDP traffic across hosts is what changes",
    ),
    Figure(
        "nm-vllm/llama2-7b/a10g", "nm-vllm CI",
        f"{NM_VLLM} — github-action-benchmark comment, 'token_throughput', benchmark_throughput input 256, "
        "output 128, 1000 prompts, vLLM 0.2.0, NVIDIA A10G x 1 (2024-03)",
        "tokens_per_s", 1460.28,
        Setting("llama-2-7b", "A10G", 1, 1, "serve", prompts=1000, prompt_tokens=256, response_tokens=128,
                precision="fp16", inter_node="100Gbps",
                assumptions="fp16 (benchmark_throughput's default dtype for Llama 2); token_throughput counts "
                "prompt and output tokens (1460.28 = 3.803 req/s × 384)"),
        "generation", "check", "a GPU the fit never sees (A10G, GDDR6) and an old engine",
    ),
    Figure(
        "yobitel/llama3.1-8b/h100/c1", "Yobitel InferenceBench",
        f"{YOBITEL} — sweep table, conc 1: tpot_p50_ms 6.48 (vLLM 0.21.0, H100-80GB-HBM3, 2026-05-16)",
        "tpot_s", 6.48e-3,
        Setting("llama-3.1-8b", "H100 SXM", 1, 1, "decode", prompt_tokens=256, response_tokens=256,
                precision="fp16", concurrency=1, inter_node="100Gbps", assumptions=_YOBITEL_NOTE),
        "decode", "fit", "the H100 decode anchor: one sequence, pure weight streaming",
    ),
    Figure(
        "yobitel/llama3.1-8b/h100/c4", "Yobitel InferenceBench",
        f"{YOBITEL} — sweep table, conc 4: tpot_p50_ms 6.59 (2026-05-16)",
        "tpot_s", 6.59e-3,
        Setting("llama-3.1-8b", "H100 SXM", 1, 1, "decode", prompt_tokens=256, response_tokens=256,
                precision="fp16", concurrency=4, inter_node="100Gbps", assumptions=_YOBITEL_NOTE),
        "decode", "check", "a batch of 4 on the same engine",
    ),
    Figure(
        "yobitel/llama3.1-8b/h100/c16", "Yobitel InferenceBench",
        f"{YOBITEL} — sweep table, conc 16: tpot_p50_ms 10.94 (2026-05-16)",
        "tpot_s", 10.94e-3,
        Setting("llama-3.1-8b", "H100 SXM", 1, 1, "decode", prompt_tokens=256, response_tokens=256,
                precision="fp16", concurrency=16, inter_node="100Gbps",
                assumptions=_YOBITEL_NOTE + "; at conc 16 requests arrive while others decode, so part of the "
                "TPOT is prefill interleaved with decode steps"),
        "decode", "check", "a batch of 16 (queueing and interleaved prefill included in the published TPOT)",
    ),
    Figure(
        "musgrave/llama3.1-8b/a100-40gb/c1", "J. Musgrave (blog)",
        f"{MUSGRAVE} — summary: 'decode at one request per time runs at about 75 tokens/sec' (vLLM 0.23.0, "
        "A100 40GB, fixed 1024 in / 128 out, ignore-eos; the post shows no date: read 2026-12-05)",
        "decode_tokens_per_s", 75.0,
        Setting("llama-3.1-8b", "A100 40GB", 1, 1, "decode", prompt_tokens=1024, response_tokens=128,
                concurrency=1, inter_node="100Gbps", assumptions="'about 75': the author's rounding"),
        "decode", "fit", "the Ampere decode anchor",
    ),
    Figure(
        "musgrave/llama3.1-8b/a100-40gb/c8", "J. Musgrave (blog)",
        f"{MUSGRAVE} — summary: 'Batching buys throughput almost for free up to a concurrency of 8, a 6.6x gain "
        "with almost no latency cost' (same sweep: vllm bench serve, --max-concurrency 8, 160 prompts; read "
        "2026-12-05)",
        "throughput_gain", 6.6,
        Setting("llama-3.1-8b", "A100 40GB", 1, 1, "decode", prompt_tokens=1024, response_tokens=128,
                concurrency=8, inter_node="100Gbps",
                assumptions="the gain is output tokens/s at concurrency 8 over concurrency 1; fixed lengths with "
                "--ignore-eos keep the 8 requests of a wave in lockstep (priced as one batch of 8, prefill "
                "included)"),
        "decode", "fit", "added 2026-12-05 before the refit: the one batched figure of a current engine (vLLM "
        "0.23, V1) on Ampere: it pins what a decode step costs per sequence (KV reads, per-sequence host work)",
    ),
    Figure(
        "lambda/llama3.1-8b/h100/vllm060-ms10", "Lambda (vllm-benchmark)",
        f"{LAMBDA} — 'vLLM v0.5.4 v.s. v0.6.0', Llama 3.1 8B table, row v0.6.0, chunked prefill False, scheduler "
        "steps 10: output throughput 8088.35 tokens/sec (tp=1, rps=inf, num-prompt=5000, max-num-seq=256, "
        "max-seq-len=2048; H100-80GB-SXM; 2024-09)",
        "output_tokens_per_s", 8088.35,
        Setting("llama-3.1-8b", "H100 SXM", 1, 1, "serve", prompts=5000, prompt_tokens=215, response_tokens=1833,
                mean_fraction=194.0 / 1833, p99_fraction=0.5, inter_node="100Gbps",
                assumptions=_SHAREGPT_NOTE + "; bf16 (Meta-Llama-3.1-8B-Instruct, the script's default dtype)"),
        "generation", "fit", "added 2026-12-05 before pricing it: a large-batch offline decode on Hopper (256 "
        "sequences, 5,000 prompts), the regime of an RL rollout, which no fit figure had (the NeMo-RL phase "
        "splits, which show it, are diagnostics); multi-step scheduling amortises the V0 engine's host pass as "
        "vLLM V1's overlapped scheduler does",
    ),
    Figure(
        "sglang/vllm060/llama3.1-8b/a100-80gb", "SGLang (benchmark_vllm_060)",
        f"{SGLANG_VLLM060} — 'Offline benchmark results', Llama 3.1 8B Instruct 1 x A100 80G, engine vLLM: "
        "request throughput 21.27, output token throughput 4132.37 (RPS inf, 5000 prompts; vLLM 0.6.0 "
        "--num-scheduler-steps 10, --max_model_len 4096; 2024-09)",
        "output_tokens_per_s", 4132.37,
        Setting("llama-3.1-8b", "A100 80GB", 1, 1, "serve", prompts=5000, prompt_tokens=215, response_tokens=1833,
                mean_fraction=194.0 / 1833, p99_fraction=0.5, inter_node="100Gbps", assumptions=_SHAREGPT_NOTE),
        "generation", "fit", "added 2026-12-05 before pricing it: the same regime on Ampere, from another source "
        "(the SGLang team running vLLM), so the large-batch term is not set by one GPU generation or one author",
    ),
    Figure(
        "lambda/llama3.1-70b/4xh100/vllm060-ms10", "Lambda (vllm-benchmark)",
        f"{LAMBDA} — same section, Llama 3.1 70B table, row v0.6.0, scheduler steps 10: output throughput "
        "3542.88 tokens/sec (tp=4, rps=inf, num-prompt=5000, max-num-seq=256, max-seq-len=2048; 2024-09)",
        "output_tokens_per_s", 3542.88,
        Setting("llama-3.1-70b", "H100 SXM", 4, 1, "serve", gen_tp=4, prompts=5000, prompt_tokens=215,
                response_tokens=1833, mean_fraction=194.0 / 1833, p99_fraction=0.5, inter_node="100Gbps",
                assumptions=_SHAREGPT_NOTE + "; bf16, NVLink inside the node"),
        "generation", "check", "added 2026-12-05 before pricing it: a 9× larger model at TP4 (the NeMo-RL 70B "
        "and 32B splits' engine layout), which the fit's single-GPU figures never see",
    ),
    Figure(
        "sglang/vllm060/llama3.1-70b/4xh100", "SGLang (benchmark_vllm_060)",
        f"{SGLANG_VLLM060} — 'Offline benchmark results', Llama 3.1 70B Instruct 4 x H100 80G, engine vLLM: "
        "request throughput 19.04, output token throughput 3700.64 (RPS inf, 5000 prompts, TP 4, "
        "--gpu-memory-utilization 0.88; 2024-09)",
        "output_tokens_per_s", 3700.64,
        Setting("llama-3.1-70b", "H100 SXM", 4, 1, "serve", gen_tp=4, prompts=5000, prompt_tokens=215,
                response_tokens=1833, mean_fraction=194.0 / 1833, p99_fraction=0.5, inter_node="100Gbps",
                assumptions=_SHAREGPT_NOTE + "; bf16, NVLink inside the node; priced at hetrl's 0.90 memory "
                "utilisation (the KV room of 70B at TP4 holds 256 sequences either way)"),
        "generation", "check", "added 2026-12-05 before pricing it: the same TP4 setting from the other source",
    ),
    # Other GPU generations (added 2026-12-05, roles decided before any of them was priced): every figure above
    # is on Ampere or Hopper; these are on an Ada GPU (RTX 4090, compute capability 8.9, GDDR6X).
    Figure(
        "rahman/mistral-7b/rtx4090/c4", "M. Rahman (blog)",
        f"{RAHMAN_4090} — 'Part 1 — Full Concurrency Sweep', workload 256 input → 128 output tokens, 300 prompts "
        "at effectively infinite request rate, row max concurrency 4: output tok/s 210 (req/s 2.09; the post "
        "shows no date: read 2026-12-05)",
        "output_tokens_per_s", 210.0,
        Setting("mistral-7b-v0.3", "RTX 4090", 1, 1, "serve", prompts=4, prompt_tokens=256, response_tokens=128,
                inter_node="100Gbps", assumptions=_RAHMAN_NOTE),
        "generation", "fit", "the Ada decode anchor: 4 sequences a step stream the weights from GDDR6X (memory "
        "bound), so it sets what of the datasheet bandwidth an Ada GPU reaches",
    ),
    Figure(
        "rahman/mistral-7b/rtx4090/c8", "M. Rahman (blog)",
        f"{RAHMAN_4090} — same table, row max concurrency 8: output tok/s 377 (req/s 3.78; read 2026-12-05)",
        "output_tokens_per_s", 377.0,
        Setting("mistral-7b-v0.3", "RTX 4090", 1, 1, "serve", prompts=8, prompt_tokens=256, response_tokens=128,
                inter_node="100Gbps", assumptions=_RAHMAN_NOTE),
        "generation", "check", "a batch of 8 on the same engine",
    ),
    Figure(
        "rahman/mistral-7b/rtx4090/c16", "M. Rahman (blog)",
        f"{RAHMAN_4090} — same table, row max concurrency 16: output tok/s 644 (req/s 6.44; read 2026-12-05)",
        "output_tokens_per_s", 644.0,
        Setting("mistral-7b-v0.3", "RTX 4090", 1, 1, "serve", prompts=16, prompt_tokens=256, response_tokens=128,
                inter_node="100Gbps", assumptions=_RAHMAN_NOTE),
        "generation", "check", "a batch of 16: prefill of the next wave weighs more",
    ),
    Figure(
        "databasemart/r1-distill-llama-8b/rtx4090/offline", "Database Mart (GPU benchmark blog)",
        f"{DBM_4090} — 'RTX4090 Offline Benchmark Results Display', column DeepSeek-R1-Distill-Llama-8B: "
        "Request (req/s) 3.96 (300 requests, input 100 / output 600 tokens, vLLM, 16-bit; read 2026-12-05, the "
        "page shows no date)",
        "requests_per_s", 3.96,
        Setting("llama-3.1-8b", "RTX 4090", 1, 1, "serve", prompts=300, prompt_tokens=100, response_tokens=600,
                inter_node="100Gbps", assumptions=_DBM_NOTE + "; DeepSeek-R1-Distill-Llama-8B is Llama 3.1 8B's "
                "architecture"),
        "generation", "fit", "the Ada large-batch anchor: an offline batch of 300 (as many at once as the KV "
        "room holds), whose decode steps are compute bound, so it sets the Ada matmul fraction; the 8B model "
        "of the Ampere/Hopper fit figures",
    ),
    Figure(
        "databasemart/r1-distill-qwen-7b/rtx4090/offline", "Database Mart (GPU benchmark blog)",
        f"{DBM_4090} — same table, column DeepSeek-R1-Distill-Qwen-7B: Request (req/s) 5.96 (read 2026-12-05)",
        "requests_per_s", 5.96,
        Setting("qwen2.5-7b", "RTX 4090", 1, 1, "serve", prompts=300, prompt_tokens=100, response_tokens=600,
                inter_node="100Gbps", assumptions=_DBM_NOTE + "; DeepSeek-R1-Distill-Qwen-7B is Qwen2.5-Math-7B's "
                "architecture (HF_CONFIGS qwen2.5-7b: 4 KV heads, so more sequences fit the KV room)"),
        "generation", "check", "another architecture (Qwen2, GQA 7:1) on the same engine and GPU. Its 1.19x is "
        "the page's GPU UTL 85 %: the cost model's 42.3 s is 0.99x the run's kernel time (bench/dbm_diagnosis.py)",
    ),
    Figure(
        "databasemart/qwen2.5-3b/rtx4090/offline", "Database Mart (GPU benchmark blog)",
        f"{DBM_4090} — same table, column Qwen2.5-3B-Instruct: Request (req/s) 10.31 (read 2026-12-05)",
        "requests_per_s", 10.31,
        Setting("qwen2.5-3b", "RTX 4090", 1, 1, "serve", prompts=300, prompt_tokens=100, response_tokens=600,
                inter_node="100Gbps", assumptions=_DBM_NOTE + "; an instruct model may stop before 600 tokens: "
                "if it does, the published rate overstates the work priced"),
        "generation", "check", "a smaller model (3B, tied embeddings) in the same batch. Its 1.47x miss measured "
        "(bench/dbm_diagnosis.py, 2026-12-05): the same table's GPU UTL row reads 64 % for this model (85 % for "
        "the 7B, 81-89 % for the 8B), so 10.5 of the run's 29.1 s the GPU ran no kernel; the cost model's 19.8 s "
        "is 1.06x the 18.6 s of kernel time (the 7B's 0.99x, the 8B's 1.10-1.21x). The idle seconds are about "
        "the same for every model of the table (7.6-14.4 s, 42-80 µs a sequence-step): host work of the "
        "benchmarked serving stack that the cost model does not price (DECODE_SEQ_OVERHEAD_S 0: at 50 µs the fit "
        "set's vLLM batch of 256 on an H100 goes to 0.73x) and that weighs most on the model with the shortest "
        "GPU step",
    ),
    # Volta (added 2026-12-05 after the Ada figures were priced; role decided before this one was priced): the one
    # published Volta figure the stored corpora hold whole. A check: no Volta constant is fitted (Volta takes
    # Ampere's fractions), so this tests that assumption.
    Figure(
        "megatron-v1/gpt2-1.2b/v100", "NVIDIA ADLR (Megatron-LM blog)",
        f"{MEGATRON_V1} — 'MegatronLM's Supercharged V1.0', Table 1 (weak model parallel scaling), row 1.2B "
        "parameters, 1 model-parallel GPU: iteration time 1288 ms, batch size 8; 'our baseline model with 1.2 "
        "billion parameters now achieves 62.4 teraFLOPs which is 48% of the theoretical peak FLOPS for a single "
        "GPU in a DGX2-H server' (Megatron-LM v1.0, 2020; the stored page shows no date: read 2026-12-05)",
        "iteration_s", 1.288,
        Setting("gpt2-1.2b-megatron", "V100", 1, 1, "train", prompts=8, prompt_tokens=1, response_tokens=1023,
                micro_batch=8, recompute=True, precision="fp16", device=(("peak_tflops", 130.0),),
                inter_node="100Gbps",
                assumptions="GPT-2 1.2B as in the Megatron-LM paper (hidden 1536, 40 layers, 16 heads, sequence "
                "1024, vocabulary padded to 50,304, tied embeddings); its GELU MLP (two 1536x6144 matrices) priced "
                "as a SwiGLU of intermediate 4096 (the same weights and FLOPs); fp16 mixed precision with Adam; "
                "activation checkpointing on (Megatron's scripts of the time; 62.4 TFLOP/s x 1.288 s = 80 TFLOP a "
                "step, the 4-pass count with recomputation); the DGX-2H's V100 SXM3 at 450 W: peak 130 TFLOP/s "
                "(62.4 / 0.48), memory as the catalog's V100"),
        "training", "check", "the one Volta figure: checks that Volta may take Ampere's fractions (no Volta "
        "constant is fitted on one figure); a GPT-2-style model on one GPU, no data or model parallelism",
    ),
)  # fmt: skip


@dataclass(frozen=True)
class PhaseBreakdown:
    """One published RL step split into its phases (seconds each), to find where a whole step's residual lies.
    Not a Figure: it is neither fitted nor in the check set's median (adding it there would move the median by
    construction); bench/published.py compares it phase by phase with the cost model's terms (`--phases`)."""

    key: str
    source: str
    citation: str
    setting: Setting
    phases: tuple[tuple[str, float], ...]
    """("total", s), ("generation", s), ("logprobs", s), ("training", s), ("refit", s) as the source names them:
    generation = vLLM's rollout; logprobs = the policy's old log-probs and the reference's; training = the policy
    update (all its optimizer steps); refit = offload of the trainer's state + the weight transfer into vLLM.
    NeMo-RL's timers (grpo.py v0.3.0): generation = run_multi_turn_rollout + finish_generation, which holds besides
    the decode vLLM 0.9.0's host work run in process (VLLM_ENABLE_V1_MULTIPROCESSING=0, logprobs=0), NeMo-RL's
    per-token log-prob copy, the math environment's rewards and vLLM's sleep, and ends with the slowest engine;
    refit = prepare_for_generation (bench/nemo_rl_host_work.py measures the host work)."""
    why: str


NEMO_RL_V03 = "https://github.com/NVIDIA-NeMo/RL/discussions/1161"
_NEMO_V03_NOTE = (
    "rollout batch 2,048 (64 prompts × 32), train global batch 512 (four optimizer steps a step), max sequence 4,096, "
    "sequence packing (4,096 tokens a micro-batch: micro_batch ≈ 4,096 / (256 + mean response)); prompt length not "
    "published: 256 assumed; colocated, optimizer offloaded during generation as in the v0.5 rows"
)
PHASE_BREAKDOWNS: tuple[PhaseBreakdown, ...] = (
    PhaseBreakdown(
        "nemo-rl-v0.3/llama3.1-8b/8xh100", "NeMo-RL",
        f"{NEMO_RL_V03} — 'NeMo-RL V0.3: Scalable and Performant Post-training with Nemo-RL via Megatron-Core' "
        "(docs/blogs, 2025-07-21; posted 2025-07-31), step time breakdown table, Llama 3.1-8B Instruct, Megatron, "
        "1 node × 8 GPUs, average over steps 22-29",
        Setting("llama-3.1-8b", "H100 SXM", 8, 1, "rl_step", tp=1, pp=1, gen_tp=1, prompts=64, responses=32,
                prompt_tokens=256, response_tokens=3840, mean_fraction=795 / 3840, micro_batch=4,
                sharding="zero1", train_offload=True, optimizer_steps=4, framework="nemo-rl-megatron",
                assumptions=_NEMO_V03_NOTE + "; 'Llama 3.1-8B was run with only data parallel' (DP8); vLLM TP1 "
                "(grpo_math_8B_megatron.yaml at v0.3.0); 795 generated tokens a sample; no activation checkpointing"),
        (("total", 112.0), ("training", 28.0), ("refit", 5.0), ("generation", 58.0), ("logprobs", 18.0)),
        "the per-phase split of the same framework's whole GRPO steps (the check set's two NeMo-RL steps publish "
        "the total only): diagnostic, decided before pricing it; not fitted, not in the check median. Measured "
        "since (2026-12-05, bench/nemo_rl_host_work.py): its 'generation' holds 4.9 s of host work the cost model "
        "does not price (vLLM 0.9.0's output processing in process 1.7 s, its scheduler's and model runner's "
        "per-sequence parts 1.1 + 0.3 s, NeMo-RL's log-prob copy 0.8 s, math-verify grading 0.5 s, the driver's "
        "decoding 0.5 s): 34 % of the 14.6 s generation gap",
    ),
    PhaseBreakdown(
        "nemo-rl-v0.3/llama3.1-70b/64xh100", "NeMo-RL",
        f"{NEMO_RL_V03} — same table, Llama 3.1-70B Base, Megatron, 8 nodes × 8 GPUs (2025-07-21)",
        Setting("llama-3.1-70b", "H100 SXM", 8, 8, "rl_step", tp=4, pp=4, gen_tp=4, prompts=64, responses=32,
                prompt_tokens=256, response_tokens=3840, mean_fraction=398 / 3840, micro_batch=6,
                sharding="zero1", train_offload=True, optimizer_steps=4, framework="nemo-rl-megatron",
                assumptions=_NEMO_V03_NOTE + "; TP4 PP4 (DP4) as the table's note says; vLLM TP4 (the post's "
                "DTensor command for the same model; the Megatron run's is not stated); 398 generated tokens"),
        (("total", 147.0), ("training", 28.0), ("refit", 14.0), ("generation", 84.0), ("logprobs", 18.0)),
        "as the 8B row: a 9× larger model, the refit's growth with size; diagnostic only",
    ),
    PhaseBreakdown(
        "nemo-rl-v0.3/qwen3-32b/64xh100", "NeMo-RL",
        f"{NEMO_RL_V03} — same table, Qwen3 32B, Megatron, 8 nodes × 8 GPUs (2025-07-21)",
        Setting("qwen3-32b", "H100 SXM", 8, 8, "rl_step", tp=4, pp=2, gen_tp=4, prompts=64, responses=32,
                prompt_tokens=256, response_tokens=3840, mean_fraction=3283 / 3840, micro_batch=1,
                sharding="zero1", train_offload=True, optimizer_steps=4, framework="nemo-rl-megatron",
                assumptions=_NEMO_V03_NOTE + "; TP4 PP2 (DP8) as the table's note says; vLLM TP4 assumed (the v0.5 "
                "recipe grpo-qwen3-32b-4n8g.yaml); 3,283 generated tokens"),
        (("total", 213.0), ("training", 68.0), ("refit", 7.0), ("generation", 96.0), ("logprobs", 40.0)),
        "the model of the check set's 32B step, on twice its GPUs; diagnostic only",
    ),
)  # fmt: skip
"""NeMo-RL's own published per-phase split of whole GRPO steps (v0.3 blog), the phases its step timer names."""
