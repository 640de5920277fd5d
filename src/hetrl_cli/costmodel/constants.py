"""Every constant the cost model uses, with its source or the reason for its value.

Efficiencies are fractions of a device's figure in the profile (`Device.tflops(dtype)`, `memory_gbps`);
calibration (issue 5) multiplies them per device class and link kind, so these are priors, not truths.
Units are in the names: _s seconds, _Bps bytes/s, _bytes bytes, _FLOPs floating-point operations.
"""

from __future__ import annotations

# ---- achievable fractions of peak ---------------------------------------------------------------------------
TRAIN_MFU = 0.40
"""Model-FLOPs utilisation of fwd+bwd. Megatron-LM reaches 40–56 % on A100 at scale (Narayanan et al. 2021,
Table 1; Korthikanti et al. 2022, Table 5); RL trainers on FSDP with variable lengths sit at the low end."""
INFERENCE_MFU = 0.50
"""Forward-only passes (reference, reward, critic values) over packed micro-batches: no backward, no
optimizer, larger effective batches than training (vLLM/HF prefill benchmarks land at 45–60 % of peak)."""
PREFILL_MFU = 0.50
"""Prompt processing in the rollout engine: one large matmul-bound forward (as INFERENCE_MFU)."""
DECODE_MFU = 0.50
"""Compute side of a decode step (rarely binding: decode is memory bound below a few hundred sequences)."""
HBM_EFFICIENCY = 0.80
"""Fraction of HBM bandwidth a decode step achieves reading weights and KV cache (GEMV and paged attention
kernels reach 70–90 % of the datasheet figure; a measured `memory_gbps` is already near-achievable, so
calibration pushes this towards 1 for measured profiles)."""

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
KV_FOOTPRINT = "prompt + mean response"
"""Tokens a live sequence holds in the KV cache on average when sizing the decode batch: the prompt plus the
mean response (the time-average is prompt + half the response; the extra half covers length variance and
block fragmentation)."""

# ---- memory -------------------------------------------------------------------------------------------------
USABLE_MEMORY_FRACTION = 0.92
"""What training and inference may allocate: the CUDA context (~0.5 GB) and caching-allocator fragmentation
(~5 %) take the rest (PyTorch memory-management notes; observed 4–8 % in FSDP runs)."""
LOGITS_BYTES_PER_ENTRY = 6
"""Per vocabulary entry per token on the last stage: bf16 logits (2) + the fp32 log-softmax kept for
backward (4). The largest single activation for 150k-token vocabularies."""
ZERO3_PREFETCH_LAYERS = 2
"""FSDP/ZeRO-3 holds the gathered parameters of the current and the prefetched layer."""
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
