"""Generation: chunked prefill (compute bound) + continuous-batching decode on one replica, each decode step
max(GEMM FLOPs, weight reads) + the attention's KV-cache reads, summed over the live batch as it drains
(docs/costmodel.md, 'Generation').

Everything but the batch-dependent arithmetic is computed once per (device classes, split, resident state)
in `static`; tests/costmodel/test_speed_equivalence.py pins the predictions to the recorded reference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel.architectures import DTYPE_BYTES, ArchSpec
from hetrl_cli.costmodel.comm import LinkInfo, allgather_s, allreduce_s, p2p_s
from hetrl_cli.costmodel.devices import Cluster, Stage
from hetrl_cli.costmodel.memo import Memo
from hetrl_cli.costmodel.memory import weight_bytes_per_param, weights_resident
from hetrl_cli.costmodel.step import Step
from hetrl_cli.costmodel.types import ReplicaTimes


class DecodeStage(NamedTuple):
    """One pipeline stage's decode-step inputs."""

    flops_per_token: float
    """At no context: the GEMMs (and the head on the last stage)."""
    attention_flops_per_context: float
    """Attention FLOPs per token and token of context (scores and values, linear in it): a step's are at its live
    sequences' own mean context, the same one their KV reads cover (drain_contexts)."""
    compute_Fps: float
    """At DECODE_MFU."""
    weight_bytes: float
    """Per device: read once per decode step."""
    kv_bytes_per_token: float
    """Per device and token of context: read once per decode step."""
    mem_Bps: float
    """At HBM_EFFICIENCY."""
    allreduces: int
    """Per decode step: 2 a layer (Megatron TP) + the vocabulary-parallel embedding's on the first stage."""
    tp: int
    tp_link: LinkInfo
    hop: LinkInfo | None
    """The link to the next stage (None on the last)."""
    logits_bytes: float
    """Per sequence and decode step, the logits the last stage all-gathers over TP (0 elsewhere and at tp 1):
    VocabParallelHead's forward (runtime/parallel.py) gathers one position's [V] logits, each rank's rows padded
    to the widest, in the activations' dtype (vLLM gathers its vocabulary-parallel logits likewise)."""


class Prefill(NamedTuple):
    """The prefill's inputs: the slowest stage sets the pace of the chunks."""

    slow_s_per_token: float
    bubble_s_per_token: float
    """The other stages' seconds per token (the pipeline fills and drains once per chunk)."""
    slow_allreduces: int
    """All-reduces per prompt chunk on the slowest stage: 2 a layer + the embedding's if it is the first."""
    slow_tp: int
    slow_link: LinkInfo
    first_hop: LinkInfo | None


class GenStatic(NamedTuple):
    """The batch-independent part of a generation replica (Generation.static)."""

    pp: int
    hidden: int
    cap: float
    """Sequences the KV cache holds at once (the most constrained stage)."""
    stages: list[DecodeStage]
    prefill: Prefill
    offload_s: float | None
    """Weights reloaded from host memory each step (None when they stay resident)."""
    tp_labels: list[str]
    pp_label: str | None
    stage_bytes: list[float]
    parts: list[str]
    mem_violation: tuple[int, float, str] | None


class Generation:
    """Time and memory of the generation task per replica."""

    def __init__(
        self, step: Step, cluster: Cluster, overhead_factor: dict[str, float], engine: str | None = None
    ) -> None:
        self.step = step
        self.cluster = cluster
        self.overhead_factor = overhead_factor
        self.engine = engine
        """The rollout engine priced: None for a vLLM-like engine (DECODE_STEP_OVERHEAD_S a step), "hf" for
        the hf engine's decode loop (decode_host_step_s)."""
        self._static: Memo[GenStatic] = Memo(self.static)
        self._drain = drain_profile(self.step.resp_mean, self.step.resp_tail)
        self._contexts = tuple(
            self.step.prompt_tokens + c for c in drain_contexts(self.step.resp_mean, self.step.resp_tail)
        )
        """Context whose KV cache a live sequence reads: the full batch's, then each drain segment's."""

    def replica(
        self,
        classes: tuple[tuple[int, ...], ...],
        stages: tuple[Stage, ...],
        split: tuple[int, ...],
        n_seq: float,
        others: tuple[float, ...],
        offload: bool,
        names: frozenset[str],
    ) -> ReplicaTimes:
        """Prefill + continuous-batching decode of `n_seq` sequences on one replica."""
        key = (classes, split, others, offload, names)
        g = self._static.get(key) or self._static.keyed(key, stages, split, others, offload, names)
        Rm, Rt = self.step.resp_mean, self.step.resp_tail
        cap = g.cap
        batch = max(1.0, min(math.floor(cap) if cap >= 1 else 1.0, C.MAX_NUM_SEQS, max(n_seq, 1e-9)))
        segments = decode_segments(n_seq, batch, Rm, Rt, self._drain)
        contexts = self._contexts[len(self._contexts) - len(segments) :]  # the full batch's only if it has steps
        steps = sum(s for s, _ in segments)
        c = m_extra = tpc = p2p = 0.0
        crit, crit_s, busies = 0, -1.0, []
        for (seg_steps, seg_batch), ctx in zip(segments, contexts, strict=True):  # the batch's decline, in segments
            busy, c1, m1, tpc1, p2p1, p = self._decode_step(g, seg_batch, ctx)
            k = seg_steps * g.pp
            c, m_extra, tpc, p2p = c + k * c1, m_extra + k * m1, tpc + k * tpc1, p2p + k * p2p1
            busies.append(busy)
            if k * busy > crit_s:
                crit, crit_s = p, k * busy
        scale = self.cluster.layout_slowdown(classes, "generation") * self.overhead_factor.get("generation", 1.0)
        if self.engine == "hf":
            launches = all(st.launches for st in stages)
            serial, layers = decode_host_step_s("hf", self.step.arch["generation"].num_layers, launches)
            floor = sum(sg[0] * max(0.0, layers * scale - b) for sg, b in zip(segments, busies, strict=True))
            per_steps = steps * serial * scale + (floor if launches else steps * layers * scale)
            overhead = per_steps + n_seq * Rm * C.DECODE_SEQ_OVERHEAD_S * scale
        else:
            overhead = (steps * C.DECODE_STEP_OVERHEAD_S + n_seq * Rm * C.DECODE_SEQ_OVERHEAD_S) * scale
        terms = {"compute": c, "memory": m_extra, "tp_comm": tpc, "pp_p2p": p2p, "overhead": overhead}
        self._add_prefill(terms, g, n_seq)
        links = {"tp_comm": g.tp_labels[crit]}
        if g.pp_label is not None:
            links["pp_p2p"] = g.pp_label
        if g.offload_s is not None:  # weights reloaded from host memory each step
            terms["offload"] = g.offload_s
        return ReplicaTimes(sum(terms.values()), terms, g.stage_bytes, g.parts, links, None, g.mem_violation)

    def _decode_step(self, g: GenStatic, batch: float, ctx: float) -> tuple[float, float, float, float, float, int]:
        """One decode step at a live batch of `batch` sequences on the slowest stage: (its seconds, compute, memory
        beyond compute, TP collectives, stage hop, the stage). pp micro-batches in flight (vLLM virtual engines)."""
        mb = batch / g.pp
        msg = mb * g.hidden * self.step.act_bytes
        best = None
        for p, (fpt, attn, c_den, wd, kvd, m_den, ar_mult, tp, ar_link, hop, logits_b) in enumerate(g.stages):
            c = mb * (fpt + attn * ctx) / c_den  # attention at the context whose KV cache it reads
            kv = mb * ctx * kvd / m_den  # attention's KV reads: their own kernels, after the GEMMs'
            m = max(c, wd / m_den) + kv - c  # beyond c: GEMMs at max(FLOPs, weight reads), then KV (DECODE_MFU)
            tpc = ar_mult * allreduce_s(msg, tp, ar_link)
            if logits_b:
                tpc += allgather_s(mb * logits_b, tp, ar_link)
            p2p = 0.0 if hop is None else p2p_s(msg, hop)
            step = c + m + tpc + p2p
            if best is None or step > best[0]:
                best = (step, c, m, tpc, p2p, p)
        assert best is not None
        return best

    def _add_prefill(self, terms: dict[str, float], g: GenStatic, n_seq: float) -> None:
        """Prompt tokens in chunks of MAX_NUM_BATCHED_TOKENS; the slowest stage sets the pace."""
        slow_tok, bubble_tok, slow_ars, slow_tp, slow_link, hop01 = g.prefill
        prompt_tokens = n_seq * self.step.prompt_tokens
        chunk = min(float(C.MAX_NUM_BATCHED_TOKENS), prompt_tokens)
        chunks = prompt_tokens / chunk if chunk > 0 else 0.0
        terms["compute"] += prompt_tokens * slow_tok
        terms["bubble"] = bubble_tok * chunk
        chunk_msg = chunk * g.hidden * self.step.act_bytes
        terms["tp_comm"] += chunks * slow_ars * allreduce_s(chunk_msg, slow_tp, slow_link)
        if hop01 is not None:
            terms["pp_p2p"] += chunks * p2p_s(chunk_msg, hop01)

    def static(
        self,
        stages: tuple[Stage, ...],
        split: tuple[int, ...],
        others: tuple[float, ...],
        offload: bool,
        names: frozenset[str],
    ) -> GenStatic:
        """Memory per stage (weights, KV per token, work space), the KV-bound sequence cap, and per-stage
        speeds, links and FLOPs per token."""
        arch = self.step.arch["generation"]
        pp = len(stages)
        P, Rm = self.step.prompt_tokens, self.step.resp_mean
        footprint = P + Rm  # constants.KV_FOOTPRINT
        weights_dev, kv_dev, work_dev, cap, mem_violation = self._stage_memory(stages, split, others, footprint)
        rows = []
        vocab_embedding = 1 if stages[0].tp > 1 else 0  # parallel.VocabParallelEmbedding: one all-reduce a step
        for p, st in enumerate(stages):
            last = p == pp - 1
            logits_b = math.ceil(arch.vocab_size / st.tp) * st.tp * self.step.act_bytes if last and st.tp > 1 else 0.0
            rows.append(
                DecodeStage(
                    self.step.stage_flops_per_token(arch, "lm", split[p], last, 0.0),
                    split[p] * arch.layer_attention_flops(1.0),
                    st.compute_Fps * C.DECODE_MFU,
                    weights_dev[p],
                    kv_dev[p],
                    st.mem_Bps * C.HBM_EFFICIENCY,
                    2 * split[p] + (vocab_embedding if p == 0 else 0),
                    st.tp,
                    st.link,
                    None if last else self.cluster.stage_link(st, stages[p + 1]),
                    logits_b,
                )
            )
        per_tok = [
            self.step.stage_flops_per_token(arch, "lm", split[p], p == pp - 1, P / 2) / (st.compute_Fps * C.PREFILL_MFU)
            for p, st in enumerate(stages)
        ]
        slow = max(range(pp), key=per_tok.__getitem__)
        prefill = Prefill(
            per_tok[slow],
            sum(per_tok) - per_tok[slow],
            2 * split[slow] + (vocab_embedding if slow == 0 else 0),
            stages[slow].tp,
            stages[slow].link,
            self.cluster.stage_link(stages[0], stages[1]) if pp > 1 else None,
        )
        offload_s = None
        if not weights_resident("generation", names, offload) and "actor_train" not in names:
            offload_s = max(weights_dev) / C.HOST_DEVICE_Bps
        elif self.step.workload.mode == "async" and not names:
            offload_s = staged_load_s(weights_dev)
        labels = [st.link.label for st in stages]  # the critical decode stage's TP link (chosen per batch)
        pp_label = self.cluster.stage_link(stages[0], stages[1]).label if pp > 1 else None
        stage_bytes = [st.memory_bytes * C.GEN_MEMORY_UTILIZATION - others[p] for p, st in enumerate(stages)]
        if mem_violation is not None:
            stage_bytes = [
                max(b, weights_dev[p] + work_dev[p] + kv_dev[p] * footprint) for p, b in enumerate(stage_bytes)
            ]
        parts = ["weights + KV cache" for _ in stages]
        return GenStatic(
            pp, arch.hidden_size, cap, rows, prefill, offload_s, labels, pp_label, stage_bytes, parts, mem_violation
        )

    def _stage_memory(
        self, stages: Sequence[Stage], split: Sequence[int], others: Sequence[float], footprint: float
    ) -> tuple[list[float], list[float], list[float], float, tuple[int, float, str] | None]:
        """Per stage: weight bytes, KV bytes per token, work space per device; the sequences the KV cache
        holds (the least over stages) and the first stage where not even one sequence fits."""
        arch = self.step.arch["generation"]
        w = self.step.workload
        pp = len(stages)
        wb = weight_bytes_per_param(w)
        kv_b = DTYPE_BYTES[w.precision]
        h = arch.hidden_size
        weights_dev, kv_dev, work_dev, cap = [], [], [], math.inf
        mem_violation = None
        for p, st in enumerate(stages):
            last = p == pp - 1
            wd = self.step.stage_params(arch, "lm", split, p) * wb / st.tp
            kv_heads = max(1, math.ceil(arch.num_kv_heads / st.tp))
            kvd = 2 * split[p] * kv_heads * arch.head_dim * kv_b
            per_tok = 2.0 * (h + arch.q_dim + 2 * arch.kv_dim) + 4.0 * arch.intermediate_size
            work = C.MAX_NUM_BATCHED_TOKENS * per_tok * self.step.act_bytes / st.tp
            if last:
                work += C.MAX_NUM_SEQS * arch.vocab_size * 4 / st.tp
            budget = st.memory_bytes * C.GEN_MEMORY_UTILIZATION - others[p] - wd - work
            seqs = budget / (kvd * footprint)
            if seqs < 1 and mem_violation is None:
                need = others[p] + wd + work + kvd * footprint
                mem_violation = (p, need / C.GEN_MEMORY_UTILIZATION, "weights + activations + one sequence's KV cache")
            cap = min(cap, seqs)
            weights_dev.append(wd)
            kv_dev.append(kvd)
            work_dev.append(work)
        return weights_dev, kv_dev, work_dev, cap, mem_violation


DRAIN_SEGMENTS = 4
"""Equal slices of the draining sequences' quantiles (u) over which decode is priced at each slice's mean batch."""


def drain_profile(resp_mean: float, resp_tail: float) -> tuple[tuple[float, float], ...]:
    """The last wave's decline as (fraction of resp_tail's steps, mean live batch / the wave's batch) per segment.

    Response lengths L are taken as L = resp_tail * u**k, u uniform on [0, 1], k = resp_tail / resp_mean - 1: the
    one-parameter family with mean resp_mean whose longest response is resp_tail (the p99 bounds the batch, as the
    cost model always took it; the last 1 % up to max_response_tokens is not priced). k = 0 is the fixed length
    (one segment, the full batch throughout), k = 1 the uniform lengths of the default (mean 0.5, p99 1.0). A
    sequence with quantile u is live while step s < L(u), so after L(u) steps a fraction u of the wave has finished:
    the live batch is (1 - u) x the wave's. Over u in [a, b] there are resp_tail (b**k - a**k) steps carrying
    resp_tail x wave x (G(b) - G(a)) tokens, G(u) = u**k - k/(k+1) u**(k+1): a segment's mean batch is exact, only
    its spread within the segment (DRAIN_SEGMENTS of them) is priced at its mean.

    >>> drain_profile(100.0, 100.0)
    ((1.0, 1.0),)
    >>> [(round(f, 3), round(b, 3)) for f, b in drain_profile(50.0, 100.0)]
    [(0.25, 0.875), (0.25, 0.625), (0.25, 0.375), (0.25, 0.125)]
    """
    k = _drain_exponent(resp_mean, resp_tail)
    out = []
    for i in range(DRAIN_SEGMENTS):
        (s0, t0, _), (s1, t1, _) = _drain_cum(i / DRAIN_SEGMENTS, k), _drain_cum((i + 1) / DRAIN_SEGMENTS, k)
        if s1 - s0 > 0.0:
            out.append((s1 - s0, (t1 - t0) / (s1 - s0)))
    return tuple(out)


def _drain_exponent(resp_mean: float, resp_tail: float) -> float:
    """k of the lengths L = resp_tail * u**k (drain_profile)."""
    return max(0.0, resp_tail / resp_mean - 1.0) if resp_mean > 0 else 0.0


def _drain_cum(u: float, k: float) -> tuple[float, float, float]:
    """Up to quantile u of the last wave: (steps / resp_tail, tokens / (resp_tail x wave), KV tokens read /
    (resp_tail**2 x wave)) = (u**k, G(u), H(u)); 0**0 taken as 0."""
    if u <= 0.0:
        return 0.0, 0.0, 0.0
    g = u**k - k / (k + 1.0) * u ** (k + 1.0)
    return u**k, g, u ** (2 * k) / 2 - k / (2 * k + 1.0) * u ** (2 * k + 1.0)


def drain_contexts(resp_mean: float, resp_tail: float) -> tuple[float, ...]:
    """Generated tokens of context a live sequence's KV reads cover on average: while the batch is full, then in
    each of drain_profile's segments (the same lengths L = resp_tail * u**k).

    A sequence of length L reads its KV cache at L contexts, prompt + 0 .. L - 1: n (prompt E[L] + E[L**2] / 2) KV
    tokens in all, more than n E[L] (prompt + E[L] / 2) wherever lengths vary (the long responses that outlive the
    rest read the longest caches). While the engine refills the batch a step's live sequences are a
    length-weighted sample at uniform ages: E[L**2] / (2 E[L]), E[L**2] = resp_tail**2 / (2k + 1). In the drain
    every live sequence is s steps old at step s; over u in [a, b] the KV tokens are resp_tail**2 x wave x
    (H(b) - H(a)), H(u) = u**(2k) / 2 - k/(2k+1) u**(2k+1), over drain_profile's resp_tail x wave x (G(b) - G(a))
    tokens. Exact at a fixed length (k = 0): resp_mean / 2 throughout, as the average context.

    >>> drain_contexts(100.0, 100.0)
    (50.0, 50.0)
    >>> [round(c, 1) for c in drain_contexts(50.0, 100.0)]
    [33.3, 11.9, 36.7, 61.1, 83.3]
    """
    k = _drain_exponent(resp_mean, resp_tail)
    out = [resp_tail**2 / (2 * (2 * k + 1.0) * resp_mean) if resp_mean > 0 else 0.0]
    for i in range(DRAIN_SEGMENTS):
        (s0, t0, h0), (s1, t1, h1) = _drain_cum(i / DRAIN_SEGMENTS, k), _drain_cum((i + 1) / DRAIN_SEGMENTS, k)
        if s1 - s0 > 0.0:  # drain_profile's segments
            out.append(resp_tail * (h1 - h0) / (t1 - t0) if t1 > t0 else 0.0)
    return tuple(out)


def decode_segments(
    n_seq: float, batch: float, resp_mean: float, resp_tail: float, drain: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    """(steps, live batch) of a continuous-batching decode of `n_seq` sequences at up to `batch` at once.

    While sequences wait the engine refills the batch, so it stays full: (n_seq - batch) x resp_mean / batch steps at
    `batch`. The last wave of min(batch, n_seq) sequences then drains over resp_tail steps as `drain` (drain_profile)
    says. The steps and tokens equal the average-batch pricing's (max(Rt, n Rm / batch + Rt - Rm) steps, n Rm
    tokens); the time differs because a step's time is convex in the batch (docs/costmodel.md, 'Generation')."""
    full = max(0.0, n_seq - batch) * resp_mean / batch
    wave = min(batch, n_seq)
    segments = [(full, batch)] if full > 0.0 else []
    segments += [(resp_tail * f, wave * b) for f, b in drain]
    return segments


def staged_load_s(weights_dev: Sequence[float]) -> float:
    """Seconds per step an async generation group (generation alone: compose.overlaps) spends loading the weights
    it received during the last rollout: runtime/weightsync.py's OverlappedSync receives them on a thread into
    host buffers while sampling and `finish` loads them into the engine between rollouts, where nothing overlaps
    them, so every step copies each device's weights from host memory (HOST_DEVICE_Bps, as an offloaded engine's
    reload). The receive itself overlaps the rollout: compose.py's async lanes price it as the weight sync."""
    return max(weights_dev) / C.HOST_DEVICE_Bps


def decode_host_step_s(engine: str | None, layers: int, launches: bool) -> tuple[float, float]:
    """(serial, layers' dispatch) host seconds of one decode step, before the host's slowdown. A vLLM-like engine
    (None): (DECODE_STEP_OVERHEAD_S, 0): CUDA graphs, one launch a step. The hf engine dispatches every layer's
    modules from Python each step: (HF_DECODE_STEP_FIXED_S, layers x HF_DECODE_STEP_PER_LAYER_S) on a CPU, where
    dispatch and arithmetic share one thread, so both add to the step's work; on a GPU (`launches`) the layers'
    part is layers x EAGER_DISPATCH_S_PER_LAYER_FORWARD, a floor under the step's device time (kernels run while
    later ones are dispatched), and the serial part (sampling after the step's sync) adds.

    >>> [round(s * 1e3, 1) for s in decode_host_step_s("hf", 36, False) + decode_host_step_s("hf", 36, True)]
    [0.4, 9.0, 0.4, 36.0]
    """
    if engine != "hf":
        return C.DECODE_STEP_OVERHEAD_S, 0.0
    per_layer = C.EAGER_DISPATCH_S_PER_LAYER_FORWARD if launches else C.HF_DECODE_STEP_PER_LAYER_S
    return C.HF_DECODE_STEP_FIXED_S, layers * per_layer


def hf_engine_bytes(arch: ArchSpec, precision: str, sequences: int, prompt_tokens: int, new_tokens: int,
                    tp: int = 1) -> float:  # fmt: skip
    """Peak bytes of the hf engine (runtime/engines/hf.py) generating `new_tokens` for `sequences` prompts of
    `prompt_tokens` on one TP rank: its weights in the workload's precision, the KV cache of every sequence at its
    full length (transformers' DynamicCache grows by concatenation, so one layer's cache is briefly held twice),
    one decoding step's logits (the head's output + HF_STEP_LOGITS_FP32_COPIES fp32 copies) and the sampling
    noise's windows (HF_NOISE_LIVE_COPIES 2 × at most HF_NOISE_BYTES, or the whole response when that is less).
    A TP rank holds ceil(V / tp) rows of the embedding and head (runtime/parallel.py's vocabulary-parallel
    slices) and the final norm whole; each step's logits are all-gathered whole (charged whole). Unlike vLLM,
    which claims GEN_MEMORY_UTILIZATION of the device, the hf engine allocates what it uses:
    tests/runtime/test_precision.py measures it (150k vocabulary, 16 sequences, 512 new tokens)."""
    wb = DTYPE_BYTES[precision]
    vocab = arch.embedding_params + arch.head_params("lm")  # embedding and head: vocabulary rows
    rows = math.ceil(arch.vocab_size / tp) / arch.vocab_size
    layers = arch.param_count("lm") - vocab - arch.hidden_size  # the final norm is whole on every rank
    weights = (layers / tp + vocab * rows + arch.hidden_size) * wb
    kv_heads = max(1, math.ceil(arch.num_kv_heads / tp))
    kv_token_layer = 2 * kv_heads * arch.head_dim * wb
    length = prompt_tokens + new_tokens
    kv = sequences * length * kv_token_layer * (arch.num_layers + 1)
    row = sequences * arch.vocab_size
    logits = row * (wb + 4 * C.HF_STEP_LOGITS_FP32_COPIES)
    noise = C.HF_NOISE_LIVE_COPIES * min(max(C.HF_NOISE_BYTES, 4 * row), 4 * row * new_tokens)
    return weights + kv + logits + noise
