"""Every constant the cost model uses, with its source or the reason for its value.

Efficiencies are fractions of a device's achievable figures: the profile's probed `measured_tflops` and
`memory_gbps`, or its datasheet figures × the generation's DATASHEET_*_FRACTION (devices.compute_tflops,
devices.memory_Bps); calibration (issue 5) multiplies them per device class and link kind, so these are priors,
not truths. The fitted ones cite the published figures of bench/published.py they were fitted on.
Units are in the names: _s seconds, _Bps bytes/s, _bytes bytes, _FLOPs floating-point operations.
"""

from __future__ import annotations

# ---- datasheet figures → what a kernel reaches (per GPU generation) -----------------------------------------
DATASHEET_MATMUL_FRACTION: dict[str, float] = {"hopper": 0.711, "ampere": 1.0, "ada": 1.0}
"""The GEMM rate a GPU reaches as a fraction of its datasheet dense peak, by generation (devices.gpu_generation:
"hopper" from compute capability 9.0 on, "ada" at 8.9, "ampere" for every other earlier one; Turing and Volta
take the Ampere value: no Turing figure was found, and the one Volta figure is a check, below). Applied only
where the profile's FLOP/s is the datasheet's (a catalog profile); a probed `measured_tflops` is used as it is.
The efficiencies below are fractions of this rate. Fitted on the fit set of bench/published.py
(docs/benchmarks.md, "The cost model against published GPU measurements"), with selective activation
checkpointing priced as torchtitan runs it:
- Hopper 0.711 (the fit's lower bound is 0.666, hetrl's H200 probe: 658.9 of 989.5 TFLOP/s on one probe
  shape, bench/results/gpu_check_h200): torchtitan's Llama 3.1 8B, FSDP on 8 H100 (Grand
  Teton: 96 GB HBM2e, 500 W, a peak between SXM and NVL), 5,762 tok/s/GPU (benchmarks/llama3_h100_202412_
  torchtitan.md, 2024-12), predicted 0.96×, and vLLM 0.6.0's offline batch of 5,000 ShareGPT prompts on one
  H100 (Llama 3.1 8B, 256 sequences a step, 8,088 output tok/s; LambdaLabsML/vllm-benchmark benchmark_v0.md,
  2024-09), predicted 1.03×, whose decode steps are compute bound; the 128-H100 run (a check) 0.96×, Llama 3.1
  70B at TP4 on 4 H100 (two checks) 1.09× and 1.04×. (0.674 before decode's KV reads followed each live
  sequence's own context, 0.666 before decode was priced over the batch's decline, 0.77 before the large-batch
  figures joined the fit; 0.83 before the no-autocast refit.)
- Ampere 1.0 (the bound: the datasheet's 312 TFLOP/s, so TRAIN_MATMUL_EFFICIENCY's 0.9 alone): torchtitan's
  Llama 3 8B and Llama 2 70B, FSDP on 64 A100 80GB, 2,973 and 353 tok/s/GPU (docs/performance.md at 157a12c,
  2024-04-24): predicted 0.99× both; Llama 2 13B and Llama 3 70B (checks) 0.96× and 1.01×. (Refitted after
  the cost model stopped charging autocast casts the runtime does not make: Hopper 0.83 -> 0.77.)
- Ada 1.0 (the bound, as Ampere; the datasheet's dense fp16/bf16 peak with FP32 accumulation, 165.2 TFLOP/s on
  an RTX 4090, 362 on an L40S): Database Mart's vLLM offline batch of 300 DeepSeek-R1-Distill-Llama-8B requests
  (100 in / 600 out) on one RTX 4090, 3.96 req/s (databasemart.com/blog/vllm-gpu-benchmark-rtx4090, read
  2026-12-05), predicted 1.02x; its checks R1-Distill-Qwen-7B 1.19x and Qwen2.5-3B 1.47x (docs/benchmarks.md,
  "Other GPU generations")."""
DATASHEET_HBM_FRACTION: dict[str, float] = {"hopper": 0.864, "ampere": 0.82, "ada": 0.85}
"""The memory bandwidth a streaming kernel reaches as a fraction of the datasheet figure, by generation, applied
only where the profile's `memory_gbps` is the datasheet's (`peak_memory_gbps` equal to it: a catalog profile).
Hopper 0.864: hetrl's probe on an H200 measured 4,148 of 4,800 GB/s (bench/results/gpu_check_h200, run1
profile; the elementwise, optimizer and decode efficiencies below were measured against that probed figure).
Ampere 0.82 (0.817 before the large-batch figures joined the fit, 0.855 before the no-autocast refit): fitted
with HBM_EFFICIENCY on single-sequence decode
(vLLM 0.23, Llama-3.1-8B on an A100 40GB, 75 tok/s, johnmusgrave.com, read 2026-12-05) and the A100
training figures above.
Ada 0.85 (GDDR6/GDDR6X; until 2026-12-05 it took Ampere's 0.82): fitted with the constants above on the fit set,
Mistral-7B-v0.3 at concurrency 4 through vLLM on one RTX 4090, 210 output tok/s (M. Rahman, mushfiqrahman.dev,
read 2026-12-05), predicted 0.97x, and the Ada offline batch above; checks at concurrency 8 and 16 1.00x and
1.02x. With Ada pooled into "ampere" the fit moved Ampere's fraction 0.82 -> 0.845 on the RTX 4090 figures'
account (every A100 and A10G prediction with it), so Ada has its own and Ampere's stays where its own figures
put it (0.821). Turing and Volta (T4, V100) take Ampere's. No Turing figure was found; the one Volta figure, a
check (Megatron-LM v1.0's GPT-2 1.2B on a DGX-2H V100, 1,288 ms an iteration, nv-adlr.github.io/MegatronLMV1),
is predicted 1.34x too slow in its non-matmul memory traffic as hetrl's eager runtime moves it: it does not
isolate Volta's fractions, so none is fitted on it."""

# ---- achievable fractions of peak ---------------------------------------------------------------------------
TRAIN_MATMUL_EFFICIENCY = 0.90
"""Rate of the matmuls of fwd+bwd as a fraction of the profile's matmul rate (`Device.tflops`). Only the
matmuls: the non-matmul ops are charged as memory traffic (ELEMENTWISE_HBM_EFFICIENCY) and host dispatch
(EAGER_DISPATCH_S_PER_LAYER_*). On an H200 the forward matmuls of Qwen3-0.6B/1.7B ran at 1.04–1.18 × the
probe's rate (bench/results/gpu_check_h200, run3's kernel tables); backward's transposed layouts a little
slower. Whole-model figures such as Megatron's 40–56 % MFU (Narayanan et al. 2021) include the rest."""
INFERENCE_MATMUL_EFFICIENCY = 1.0
"""As TRAIN_MATMUL_EFFICIENCY for forward-only passes (reference, reward, critic values)."""
ELEMENTWISE_HBM_EFFICIENCY = 0.60
"""Fraction of the profile's memory bandwidth the eager non-matmul ops of a forward or backward reach
(ArchSpec.layer_traffic_bytes_per_token): on an H200 the non-matmul kernels of Qwen3-0.6B and 1.7B took
70 and 88 ms for 177 and 230 GB counted, 0.61–0.63 of the probe's 4.15 TB/s (bench/results/gpu_check_h200)."""
EAGER_DISPATCH_S_PER_LAYER_FORWARD = 1.0e-3
"""Host time to dispatch one decoder layer's eager forward (Python modules + kernel launches) on a GPU: the
device cannot finish a micro-batch's layer sooner, so small models at small micro-batches are host bound.
Measured on the H200 machine (torch 2.11, transformers 5.17, a 12 µs kernel launch): 0.95–1.10 ms per Qwen3
layer forward of 2 tokens, where the GPU work is negligible. A CPU does dispatch and work in one thread, so
the per-task overhead that calibration fits carries it there; this floor applies to GPU devices only."""
EAGER_DISPATCH_S_PER_LAYER_TRAIN = 4.5e-3
"""As EAGER_DISPATCH_S_PER_LAYER_FORWARD for a training micro-batch's forward + backward under autocast
(4.4–5.8 ms per layer measured there); actor_train's old-log-prob forward, where the runtime runs it, counts
as a third of it."""
GRAD_ACCUMULATION_PASSES = 3
"""Per parameter and training micro-batch, in units of the gradient's bytes (the workload's precision): autograd
adds each micro-batch's weight gradient into the held one in place (read both, write the sum). The runtime
computes in the workload's dtype (runtime/precision.py: no autocast, so no weight or gradient casts per
micro-batch; the fp32 master copy is in the optimizer step's traffic): bf16 6 B, fp32 12 B per parameter
(charged on every micro-batch, also the first, whose gradient autograd keeps as it is: an over-count of one
micro-batch in m). Was MIXED_PRECISION_BYTES_PER_PARAM 24 B of autocast casts + fp32 accumulation (bf16 only)."""
PREFILL_MFU = 0.50
"""Prompt processing in the rollout engine: one large matmul-bound forward; a whole-pass figure (its
non-matmul work is not charged separately; on the H200 its kernels took 43 ms where this predicts 30)."""
DECODE_MFU = 0.50
"""Compute side of a decode step's GEMMs, which run at max(their FLOPs at this rate, their weight reads); the
attention's KV-cache reads are their own kernels, after the GEMMs of a layer, so they add to that max rather
than hide under it (generation.py). Binding from ~100-200 sequences a step: the large-batch offline figures of
bench/published.py (vLLM 0.6.0, 256 sequences, Llama 3.1 8B on an H100 and an A100 80GB) set it, with the
matmul fractions: predicted 1.07× and 1.04× (1.40× and 1.16× with KV reads overlapped, as before)."""
HBM_EFFICIENCY = 0.99
"""Fraction of the achievable memory bandwidth (DATASHEET_HBM_FRACTION × a datasheet figure, or a probed one)
a decode step reaches reading weights and KV cache: CUDA-graph GEMV and paged-attention kernels stream at the
copy probe's rate. Fitted on single-sequence TPOT: Llama-3.1-8B on an H100 SXM, vLLM 0.21, 6.48 ms (Yobitel
InferenceBench concurrency sweep, 2026-05-16; predicted 6.58) and on an A100 40GB, 75 tok/s (above; predicted
73); at concurrency 4 (a check) 6.63 ms against 6.59. Was 0.80 of the datasheet figure (now 0.99 × 0.864 =
0.86 on Hopper, 0.82 on Ampere; 0.97 before the no-autocast refit moved the Ampere fraction it is fitted with;
0.998 before the large-batch figures joined the fit)."""

# ---- rollout engine (vLLM defaults) -------------------------------------------------------------------------
GEN_MEMORY_UTILIZATION = 0.90
"""vLLM `gpu_memory_utilization` default: the engine claims 90 % of device memory for weights + KV cache."""
MAX_NUM_SEQS = 256
"""vLLM `max_num_seqs` default: at most this many sequences decode together per engine (replica)."""
MAX_NUM_BATCHED_TOKENS = 8192
"""vLLM V1 `max_num_batched_tokens` default for datacenter GPUs: the prefill chunk and the activation
workspace the engine profiles for."""
DECODE_STEP_OVERHEAD_S = 1.0e-3
"""Scheduler, sampling and launch time per decode step with CUDA graphs (vLLM V1 profiles show ~0.5–2 ms);
a prior for calibration."""
DECODE_SEQ_OVERHEAD_S = 0.0
"""Host time per live sequence per decode step, on top of DECODE_STEP_OVERHEAD_S: sampling, the output
processing and detokenization of each sequence's new token and its scheduling bookkeeping, which grow with the
batch while the weight read does not. 0 for a current engine: at concurrency 8 (1,024-token prompts, 128
out) vLLM 0.23 on an A100 gained 6.6× the tokens/s of one sequence (johnmusgrave.com, read 2026-12-05) where the
KV reads alone, with prefill serial to decode, predict 5.6×, which leaves no room for a per-sequence host cost.
Older engines had one: vLLM 0.6.0 ran Llama 3.1 8B at 3,958 tok/s with one scheduler step and 8,088 with ten
(LambdaLabsML/vllm-benchmark benchmark_v0.md, 2024-09), ~30 ms of host work per step of 256 sequences. A
calibration hook; the fit leaves it at 0."""
KV_FOOTPRINT = "prompt + mean response"
"""Tokens a live sequence holds in the KV cache on average when sizing the decode batch: the prompt plus the
mean response (the time-average is prompt + half the response; the extra half covers length variance and
block fragmentation)."""

# ---- the hf rollout engine (runtime/engines/hf.py) ----------------------------------------------------------
HF_NOISE_BYTES = 32 * 2**20
"""The hf engine's sampling noise drawn at once per batch (engines/hf.NOISE_BYTES; tests/costmodel pins them
equal): a window of tokens, one token's worth for a 150k vocabulary and 64 rows, not the whole response."""
HF_NOISE_LIVE_COPIES = 2
"""Windows of noise alive at once: engines/hf._SeededGumbel draws each window into one host buffer and transforms
it in place (since 2233e9e; before, the uniform draw and each op of its clamp and -log(-log) chain made a new
tensor: 4), so one, and two while a smaller last window's buffer replaces the previous one."""
HF_STEP_LOGITS_FP32_COPIES = 2
"""fp32 [batch, vocab] tensors of one decoding step: the decode loop's fp32 copy of the last position's logits
(engines/hfdecode.py) and the sampler's clone, which it scales and adds its noise to in place (since 2233e9e; 3
before), next to the head's output in the workload's dtype."""
HF_DECODE_STEP_FIXED_S = 0.4e-3
"""Host time of one hf-engine decode step besides its layers (the sampler, the cache and the stop check of the
engine's own decode loop, runtime/engines/hfdecode.py), in place of DECODE_STEP_OVERHEAD_S when the cost model
prices the hf engine (CostModel(engine="hf")). bench/hf_step_overhead.py on this project's CPU box (2026-12-05
16:41-16:44 UTC, shared, load 2.5-5.1; 3 passes x 7 repeats, medians): 0.39-0.40 ms of process CPU time a step at
batch 1-8, the intercept of the line over 1-32 layers; through transformers' `generate`, as the engine decoded
before 813d11a, the same run read 0.59-0.60 ms (this constant was 0.6 ms then; docs/benchmarks.md)."""
HF_DECODE_STEP_PER_LAYER_S = 0.25e-3
"""Host time of one decoder layer in an hf-engine decode step on a CPU (transformers' per-module Python dispatch;
the arithmetic of the bench's 64-wide layers is ~50 kFLOP): the slope of the same line, 0.225-0.285 ms of CPU time
a layer at batch 1-8 in the same run, equal through `generate` (0.226-0.287): the loop changes only the fixed part.
It was 0.35 ms, fitted at 12:38 UTC at load ~15 and before the engine ran under inference_mode (553442d): 0.31-0.39.
On a GPU the step cannot be shorter than its dispatch, EAGER_DISPATCH_S_PER_LAYER_FORWARD a layer (the H200's hf
decode step of Qwen3-0.6B, 28 layers, took 27-29 ms of host time against 4.6 ms of kernels: 0.96-1.04 ms a
layer)."""

# ---- memory -------------------------------------------------------------------------------------------------
USABLE_MEMORY_FRACTION = 0.92
"""What training and inference may allocate: the CUDA context (~0.5 GB) and caching-allocator fragmentation
(~5 %) take the rest (PyTorch memory-management notes; observed 4–8 % in FSDP runs)."""
LOGITS_TRAFFIC_BYTES_PER_RESPONSE_ENTRY = 16
"""HBM bytes per vocabulary entry of a response token after the logits are written (act bytes per entry for
every token): the fp32 copy log-softmax takes (write 4), its max/sum passes and output (read 8, write 4)."""
LOGPROB_CHUNK_BYTES = 64 * 2**20
"""The runtime's token log-probs (runtime/logprobs.py, CHUNK_LOGITS_BYTES; tests/costmodel pins them equal): the
LM head runs on the response positions only, max(1, LOGPROB_CHUNK_BYTES // (4 · vocab)) tokens at a time (110 of a
152k vocabulary), on the whole vocabulary on every TP rank (the head is not TP-split: runtime/parallel.py), so a
task holds one chunk's [tokens, vocab] logits, never a micro-batch's."""
LOGPROB_CHUNK_FORWARD_BYTES_PER_ENTRY = 8
"""Without gradients (old log-probs, reference): the chunk's fp32 logits (4; a bf16 head's output is freed once
cast) and their log-softmax (4). Measured on this CPU: 8.0 B per entry, fp32 and bf16 (a [110, 151936] chunk)."""
LOGPROB_CHUNK_TRAIN_BYTES_PER_ENTRY: dict[str, int] = {"fp32": 20, "bf16": 25, "fp16": 25}
"""With gradients: the chunk runs under activation checkpointing, so its backward recomputes the logits and holds
the fp32 log-softmax output, the gradient scattered from the gather, log-softmax's input gradient and the logits
(5 × 4 B), and in bf16/fp16 also the head's output and the gradient cast back to it. Measured on this CPU (RSS
high-water mark over one micro-batch's response_logprobs forward + backward, a [110, 151936] chunk): 19.9 B per
entry in fp32, 24.5 in bf16. Was TRAIN_LOGITS_BYTES_PER_ENTRY 4 + response share × 14 over every token of a
micro-batch (the full logits under autocast), which the runtime does not hold."""
EAGER_ACTIVATION_FACTOR = 1.25
"""The runtime's HF eager decoder layers save more for backward than activation_bytes_per_token_layer's fused-kernel
count: two tensors per RMSNorm (input and normalised output; four norms a layer with Qwen3's q/k norms), the
rotary products and SDPA's outputs. Counted with torch.autograd.graph.saved_tensors_hooks over one training forward
(unique storages, parameters excluded): 14,775 B per token and layer against 11,776 counted (1.255, Qwen3 fp32,
hidden 128) and 11,906 against 9,472 (1.257, Llama bf16, hidden 256)."""
OPTIMIZER_STEP_TEMP_BYTES_PER_PARAM = 4
"""Per parameter the step holds next to the model states, each: in mixed precision the fp32 copies of the gradients
(sharding.with_master_weights converts them all before torch's step), and with Adam/AdamW torch's multi-tensor step's
√v temporaries (`_foreach_sqrt`). Plus one fp32 temporary the size of the largest tensor (a per-tensor op of the
multi-tensor step). Measured on this CPU (70.2M bf16 parameters, AdamW with masters): 9.6 B per parameter, 8 + the
largest tensor's 1.9."""
ZERO3_GATHERED_LAYERS = 1
"""ZeRO-3 as the runtime executes it (runtime/zero3.py) gathers one decoder layer at a time, no prefetch: during
its backward that layer's full weights, its full gradients and their flat copy for the reduce-scatter coexist."""
HOST_DEVICE_Bps = 25.0e9
"""Host↔device copy bandwidth for offloading: PCIe 4.0 ×16 is 31.5 GB/s theoretical; pinned cudaMemcpy
reaches ≈ 25 GB/s (NVIDIA `bandwidthTest`)."""

# ---- communication ------------------------------------------------------------------------------------------
ZERO3_COMM_FACTOR = 1.5
"""ZeRO-3 moves 3Ψ per step vs 2Ψ for a DP all-reduce (Rajbhandari et al. 2020, §7.2.2); ZeRO-1/2 move 2Ψ."""
DEFAULT_INTRA_BANDWIDTH_Bps = 20.0e9
"""Device-to-device inside a host whose profile has no intra_link: PCIe 4.0 peer-to-peer ≈ 20 GB/s."""
DEFAULT_INTRA_LATENCY_S = 10.0e-6
"""NCCL latency over PCIe (nccl-tests small-message all-reduce: ~10 µs)."""
UNKNOWN_LINK_BANDWIDTH_Bps = 0.9e9 / 8
"""Host pair absent from the profile: the slowest inter-site bandwidth the paper measured (0.9 Gbps, §2),
so a missing measurement never makes a plan look better."""
UNKNOWN_LINK_LATENCY_S = 60.0e-3
"""Host pair absent from the profile: the largest inter-site latency the paper reports (60 ms, §2)."""

# ---- weight sync and data movement --------------------------------------------------------------------------
WEIGHT_SYNC_PER_TENSOR_S = 1.0e-4
"""Fixed cost per parameter tensor of a bucketed broadcast into the rollout engine (launch + load_weights).
PEERS.md: one RPC per parameter (~6 ms each) made >120 s syncs; the calibration point (30B parameters in
~7 s at ~8 GB/s on 400 Gb/s IB) is explained by bytes alone, so the per-tensor term must be ≲ 0.1 ms."""
LOCAL_RESHARD_PASSES = 2.0
"""Colocated weight sync: every weight byte is read and written once in HBM (trainer layout → engine)."""
ROLLOUT_BYTES_PER_TOKEN = 9
"""Rollouts shipped after generation: an int64 token id + a bool attention-mask byte per token."""
EXPERIENCE_BYTES_PER_TOKEN = 4
"""One fp32 scalar per response token per inference output (reference log-prob, critic value)."""
REWARD_BYTES_PER_SAMPLE = 4
"""One fp32 reward per response."""
RULE_REWARD_S_PER_SAMPLE = 2.0e-5
"""A rule-based reward (regex answer check) on the driver CPU: ~10–20 µs per response in CPython."""
