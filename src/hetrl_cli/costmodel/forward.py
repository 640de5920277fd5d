"""Forward tasks (inference and training): the micro-batched 1F1B pipeline time of one replica, and the
layer split that balances its stages.

time = m · max_p t_p + (Σ_p t_p − max_p t_p), t_p = compute + memory traffic (or the host's dispatch floor)
+ TP all-reduces + the send to the next stage (Narayanan et al. 2021, §2.2; docs/costmodel.md). Everything
that does not depend on the replica's batch share is computed once per (task, device classes, split) in
`static`; the expressions keep the reference evaluation order (bit-for-bit the recorded predictions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from hetrl_cli.artifacts.rl import HEAD, TRAIN_TASKS, TaskName, separate_old_logprob_pass
from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel.architectures import DTYPE_BYTES, ArchSpec
from hetrl_cli.costmodel.comm import LinkInfo, allreduce_s, p2p_s
from hetrl_cli.costmodel.devices import Cluster, Stage
from hetrl_cli.costmodel.memo import Memo
from hetrl_cli.costmodel.memory import forward_memory, stage_memory
from hetrl_cli.costmodel.step import Step, train_multiple
from hetrl_cli.costmodel.types import ReplicaTimes

_new = tuple.__new__
"""Builds a row named tuple from a tuple of its fields without the Python-level __new__: tens of thousands of
rows per search (StageRow, StageTime)."""


def forward_only_passes(mult: float, allreduces_per_layer: int, sends_per_stage: int) -> tuple[float, float, float]:
    """One forward-only pass of a training task's batch (actor_train's old log-probs) in units of one of its training
    passes, as (compute and bubble, TP all-reduces, stage sends): a forward is 1 of a training pass's `mult`
    forward-equivalents, 2 of its `allreduces_per_layer` and 1 of its `sends_per_stage`. Forward.consts charges it
    where the runtime runs it; bench/published.py adds it for the RL frameworks that always do."""
    return 1 / mult, 2 / allreduces_per_layer, 1 / sends_per_stage


class FwdConsts(NamedTuple):
    """What every stage's timing row of a forward task shares (Forward.consts)."""

    arch: ArchSpec
    head: str
    context: float
    """Keys a token attends to on average (half the mean sequence: causal)."""
    mult: float
    """Forward passes per pass: 1 inference, 3 training, 4 with recompute."""
    matmul_efficiency: float
    allreduces_per_layer: int
    """Megatron TP all-reduces per layer and pass."""
    sends_per_stage: int
    passes: tuple[float, float, float]
    """Passes of (compute and bubble, TP all-reduces, stage sends) in units of one task pass."""
    dispatch_s_per_layer: float
    accumulate_bytes_per_param: int
    """Gradient accumulation per parameter and training micro-batch pass (0 for inference)."""
    vocab_collectives: tuple[float, float, float]
    """Per micro-batch over all the task's passes, the vocabulary-parallel all-reduces under TP (VocabCollectives)."""


class StageRow(NamedTuple):
    """One pipeline stage's timing inputs (Forward.row): they depend on its position and layers only."""

    flops_per_token: float
    compute_Fps: float
    """The stage's FLOP/s at the task's matmul efficiency."""
    allreduces: int
    """TP all-reduces per micro-batch pass."""
    tp: int
    tp_link: LinkInfo
    sends: int
    """Sends to the next stage per micro-batch pass."""
    hop: LinkInfo | None
    """The link to the next stage (None on the last)."""
    memory_s_per_token: float
    """Memory-bound traffic seconds per token and pass."""
    memory_fixed_s: float
    """Per micro-batch pass: the gradient accumulation over the stage's parameters (training)."""
    host_floor_s: float
    """The host's eager dispatch time per pass (0 where the device does not wait for launches)."""
    vocab: VocabCollectives | None
    """The stage's vocabulary-parallel all-reduces (first and last stage at tp > 1), else None."""


class VocabCollectives(NamedTuple):
    """The all-reduces of the vocabulary-parallel embedding and LM head (runtime/parallel.py, logprobs.py) one
    stage runs per micro-batch over all its passes, over its TP group:
    - `embeddings` x [tokens, hidden] in the activations' dtype: parallel.VocabParallelEmbedding sums the ranks'
      partial lookups once per forward (the first stage; recomputation reruns the decoder layers only, and its
      backward passes the gradient through without a collective);
    - `head_grads` x [response tokens, hidden]: VocabParallelHead.enter sums the head input's gradient once per
      backward (the last stage of a causal LM);
    - `chunk_rounds` x, per chunk of `chunk` response tokens (logprobs.chunk_tokens of the widest rank's rows),
      3 all-reduces of 4, 4 and 8 bytes a token (logprobs._VocabParallelLogProb: max, target logit, fp64 sum of
      exponentials): once per forward pass, twice per training pass (the chunk's checkpoint recomputes it)."""

    embeddings: float
    head_grads: float
    chunk_rounds: float
    chunk: int
    response_share: float
    """Response tokens per token of a micro-batch (the head runs on the response positions only)."""


def vocab_tp_s(v: VocabCollectives, mb_tok: float, msg: float, tp: int, link: LinkInfo) -> float:
    """Seconds of one stage's vocabulary-parallel all-reduces for a micro-batch of `mb_tok` tokens (`msg`: its
    [tokens, hidden] activation bytes)."""
    seconds = v.embeddings * allreduce_s(msg, tp, link) if v.embeddings else 0.0
    if v.head_grads or v.chunk_rounds:
        response = mb_tok * v.response_share
        seconds += v.head_grads * allreduce_s(msg * v.response_share, tp, link)
        chunks = math.ceil(response / v.chunk - 1e-9) if response > 0 else 0
        if chunks:
            per_chunk = response / chunks  # the chunks' mean size: the last one is short
            small = 2 * allreduce_s(4 * per_chunk, tp, link) + allreduce_s(8 * per_chunk, tp, link)
            seconds += v.chunk_rounds * chunks * small
    return seconds


class StageTime(NamedTuple):
    """Seconds of one micro-batch on one stage over all its passes (stage_times)."""

    busy: float
    """compute + memory + host wait."""
    tp_comm: float
    send: float
    compute: float
    memory: float
    host_wait: float


class FwdStatic(NamedTuple):
    """The batch-independent timing inputs of a replica (Forward.static)."""

    rows: list[StageRow]
    tp_labels: list[str]
    pp_label: str | None
    passes: tuple[float, float, float]
    mult: float
    micro_batch: int
    hidden: int


def stage_times(
    rows: Sequence[StageRow], mb_tok: float, mult: float, msg: float, passes: tuple[float, float, float]
) -> list[StageTime]:
    """Each stage's seconds of one micro-batch over all its passes (FwdConsts.passes): the replica's stage
    times, also what Forward.refine_split balances. busy = max(compute + memory, host dispatch floor) =
    compute + memory + host wait: the matmuls and the memory-bound ops run one after another on the device,
    which cannot run ahead of the host that launches them."""
    p_compute, p_tp, p_p2p = passes
    out = []
    for fpt, c_den, ar_mult, tp, ar_link, p2p_mult, hop, mem_tok_s, mem_fixed_s, floor_s, vocab in rows:
        c = mb_tok * mult * fpt / c_den
        mem = mb_tok * mult * mem_tok_s + mem_fixed_s
        wait = floor_s - (c + mem) if floor_s > c + mem else 0.0
        tpc = ar_mult * allreduce_s(msg, tp, ar_link)
        hop_s = 0.0 if hop is None else p2p_mult * p2p_s(msg, hop)
        tp_s = p_tp * tpc if vocab is None else p_tp * tpc + vocab_tp_s(vocab, mb_tok, msg, tp, ar_link)
        out.append(_new(StageTime, (p_compute * (c + mem + wait), tp_s, p_p2p * hop_s, p_compute * c,
                                    p_compute * mem, p_compute * wait)))  # fmt: skip
    return out


class Forward:
    """Inference and training passes of the non-generation tasks, per replica."""

    def __init__(self, step: Step, cluster: Cluster) -> None:
        self.step = step
        self.cluster = cluster
        self.consts: Memo[FwdConsts] = Memo(self._make_consts)
        """consts(task) → what its stage rows share."""
        self._static: Memo[FwdStatic] = Memo(self._make_static)
        self._memory: Memo[tuple[list[float], list[str], float]] = Memo(self._make_memory)
        self._splits: Memo[tuple[int, ...]] = Memo(self.balanced_split)

    # ---- one replica ------------------------------------------------------------------------------------
    def replica(
        self,
        task: TaskName,
        classes: tuple[tuple[int, ...], ...],
        stages: tuple[Stage, ...],
        split: tuple[int, ...],
        n_seq: float,
        offload: bool,
        names: frozenset[str],
        dp: int,
    ) -> ReplicaTimes:
        """Micro-batched 1F1B time of `n_seq` sequences on one replica, and its stages' peak memory."""
        key = (task, classes, split)
        static = self._static.get(key) or self._static.keyed(key, task, stages, split)
        rows, labels, pp_label, passes, mult, micro_batch, h = static
        m = max(1, math.ceil(n_seq / micro_batch - 1e-9))
        mb_tok = n_seq * self.step.seq_mean / m
        msg = mb_tok * h * self.step.act_bytes
        parts_t = stage_times(rows, mb_tok, mult, msg, passes)
        times = [busy + tpc + hop_s for busy, tpc, hop_s, *_ in parts_t]
        pp = len(rows)
        crit = max(range(pp), key=times.__getitem__) if pp > 1 else 0
        _busy, tpc, hop_s, c, mem, wait = parts_t[crit]
        terms = {
            "compute": m * c,
            "memory": m * mem,
            "host": m * wait,
            "tp_comm": m * tpc,
            "pp_p2p": m * hop_s,
            "bubble": sum(times) - times[crit],
        }
        links = {"tp_comm": labels[crit]}
        if pp_label is not None:
            links["pp_p2p"] = pp_label
        if task in TRAIN_TASKS:  # memory depends on the micro-batch count only through min(m, pp)
            mkey = (task, classes, split, names, offload, dp, min(m, pp))
        else:
            mkey = (task, classes, split, names, offload)
        memory = self._memory.get(mkey) or self._memory.keyed(mkey, task, stages, split, m, offload, names, dp)
        stage_bytes, parts, load_s = memory
        if load_s:
            terms["offload"] = load_s
        return ReplicaTimes(sum(terms.values()), terms, stage_bytes, parts, links)

    def _make_memory(self, task, stages, split, m, offload, names, dp) -> tuple[list[float], list[str], float]:
        return forward_memory(self.step, task, stages, split, m, offload, names, dp)

    def _make_static(self, task: TaskName, stages: tuple[Stage, ...], split: tuple[int, ...]) -> FwdStatic:
        consts = self.consts(task)
        rows = [self.row(stages, p, split[p], consts) for p in range(len(stages))]
        labels = [st.link.label for st in stages]
        pp_label = self.cluster.stage_link(stages[0], stages[1]).label if len(stages) > 1 else None
        return FwdStatic(
            rows, labels, pp_label, consts.passes, consts.mult, self.step.workload.micro_batch,
            self.step.arch[task].hidden_size,
        )  # fmt: skip

    def _make_consts(self, task: TaskName) -> FwdConsts:
        arch = self.step.arch[task]
        w = self.step.workload
        train = task in TRAIN_TASKS
        ctx = self.step.seq_mean / 2  # causal: a token attends to half the sequence on average
        epochs = w.ppo_epochs if train else 1
        if train:
            mult = train_multiple(w.recompute)
            mfu = C.TRAIN_MATMUL_EFFICIENCY
            dispatch = C.EAGER_DISPATCH_S_PER_LAYER_TRAIN
            accumulate = C.GRAD_ACCUMULATION_PASSES * DTYPE_BYTES[w.precision]  # no autocast casts
            n_ar = 4 + (2 if w.recompute else 0)  # Megatron TP: 2 all-reduces fwd, 2 bwd (+2 recomputed fwd)
            n_p2p = 2  # activation forward, its gradient backward
        else:
            mult, mfu, n_ar, n_p2p = 1.0, C.INFERENCE_MATMUL_EFFICIENCY, 2, 1
            dispatch, accumulate = C.EAGER_DISPATCH_S_PER_LAYER_FORWARD, 0
        # passes of (compute and bubble, TP all-reduces, stage sends), in units of one training (inference) pass;
        # actor_train first runs one forward of its batch on the training layout for the old log-probs, unless the
        # update's own forward gives them (artifacts.rl.separate_old_logprob_pass: GRPO with one epoch)
        passes = (epochs, epochs, epochs)
        if task == "actor_train" and separate_old_logprob_pass(w.algorithm, w.ppo_epochs):
            compute, tp_comm, sends = forward_only_passes(mult, n_ar, n_p2p)
            passes = (epochs + compute, epochs + tp_comm, epochs + sends)
        lm = HEAD[task] == "lm"
        forward_only = 1 if task == "actor_train" and separate_old_logprob_pass(w.algorithm, w.ppo_epochs) else 0
        if train:  # VocabCollectives: embedding per forward, head per backward, chunks twice per training pass
            vocab = (epochs + forward_only, epochs if lm else 0, 2 * epochs + forward_only if lm else 0)
        else:
            vocab = (1, 0, 1 if lm else 0)
        return FwdConsts(arch, HEAD[task], ctx, mult, mfu, n_ar, n_p2p, passes, dispatch, accumulate, vocab)

    def row(self, stages: Sequence[Stage], p: int, layers: int, consts: FwdConsts) -> StageRow:
        """Stage p's timing inputs with `layers` layers: they depend on nothing else of the split."""
        arch, head, ctx, _mult, mfu, n_ar, n_p2p, _passes, dispatch, accumulate, vocab_counts = consts
        st = stages[p]
        last = p == len(stages) - 1
        act = self.step.act_bytes
        traffic = layers * arch.layer_traffic_bytes_per_token(act, st.tp)
        params = layers * arch.layer_params
        if last and head == "lm":
            response_share = self.step.resp_mean / self.step.seq_mean
            traffic += arch.vocab_size / st.tp * (act + response_share * C.LOGITS_TRAFFIC_BYTES_PER_RESPONSE_ENTRY)
        if last:
            params += arch.head_matmul_params(head)
        mem_Bps = st.mem_Bps * C.ELEMENTWISE_HBM_EFFICIENCY
        fields = (
            self.step.stage_flops_per_token(arch, head, layers, last, ctx),
            st.compute_Fps * mfu,
            n_ar * layers,
            st.tp,
            st.link,
            n_p2p,
            None if last else self.cluster.stage_link(st, stages[p + 1]),
            traffic / mem_Bps,
            params / st.tp * accumulate / mem_Bps,
            layers * dispatch if st.launches else 0.0,
            self._vocab_collectives(vocab_counts, arch, head, st.tp, p == 0, last),
        )
        return _new(StageRow, fields)

    def _vocab_collectives(
        self, counts: tuple[float, float, float], arch: ArchSpec, head: str, tp: int, first: bool, last: bool
    ) -> VocabCollectives | None:
        """A stage's VocabCollectives: the embedding's on the first stage, a causal LM head's on the last, at tp > 1."""
        embeddings, head_grads, chunk_rounds = counts
        lm_last = last and head == "lm"
        if tp <= 1 or not (first or lm_last):
            return None
        chunk = max(1, C.LOGPROB_CHUNK_BYTES // (4 * math.ceil(arch.vocab_size / tp)))  # logprobs.chunk_tokens
        response_share = self.step.resp_mean / self.step.seq_mean
        return VocabCollectives(embeddings if first else 0, head_grads if lm_last else 0,
                                chunk_rounds if lm_last else 0, chunk, response_share)  # fmt: skip

    # ---- layer splits -----------------------------------------------------------------------------------
    def split_of(self, task: TaskName, classes: tuple[tuple[int, ...], ...], stages: tuple[Stage, ...]):
        """balanced_split, cached by the replica's device classes (what the stages are made of)."""
        key = (task, classes)
        hit = self._splits.get(key)
        return self._splits.keyed(key, task, stages) if hit is None else hit

    def balanced_split(self, task: TaskName, stages: tuple[Stage, ...]) -> tuple[int, ...]:
        """Integer layers per stage ∝ stage speed (≥ 1 each, summing to num_layers); the output head counts
        on the last stage. Generation balances memory bandwidth (decode reads weights), the rest FLOP/s."""
        arch = self.step.arch[task]
        pp = len(stages)
        L = arch.num_layers
        if pp == 1:
            return (L,)
        if task == "generation":
            speed = [s.mem_Bps * s.tp for s in stages]
            layer_cost = float(arch.layer_params)
            head_cost = float(arch.hidden_size * arch.vocab_size)
        else:  # the FLOPs per token `replica` charges (attention included), so the split minimises its max
            speed = [s.compute_Fps for s in stages]
            layer_cost = arch.layer_flops_per_token(self.step.seq_mean / 2)
            head_cost = 2.0 * arch.head_matmul_params(HEAD[task])
        extra = [0.0] * pp
        extra[-1] = head_cost
        layers = _proportional_split(L, speed, layer_cost, extra)
        if task != "generation":
            layers = self.refine_split(task, stages, layers)
        return tuple(layers)

    def refine_split(self, task: TaskName, stages: tuple[Stage, ...], layers: list[int]) -> list[int]:
        """Move single layers off the slowest stage while the 1F1B time of the whole step's batch on this
        replica drops, with `replica`'s own stage times (compute, TP all-reduces and the send to the next
        stage, which the FLOP proxy leaves out); a move must not put the receiving stage over its usable
        memory (the task alone, no sharding: conservative), so the proxy's split stays where nothing else fits.
        Without it a 3 % faster first stage could take a layer and become the straggler of its send."""
        micro_batch = self.step.workload.micro_batch
        m = max(1, math.ceil(self.step.n_samples / micro_batch))
        mb_tok = micro_batch * self.step.seq_mean
        msg = mb_tok * self.step.arch[task].hidden_size * self.step.act_bytes
        alone = frozenset({task})
        usable = [st.memory_bytes * C.USABLE_MEMORY_FRACTION for st in stages]

        consts = self.consts(task)
        mult, passes = consts.mult, consts.passes
        seconds: dict[tuple[int, int], float] = {}  # a stage's time depends on its position and layers only
        fitting: dict[tuple[int, int], bool] = {}  # and so does its memory

        def stage_s(p: int, layers_p: int) -> float:
            if (p, layers_p) not in seconds:
                row = self.row(stages, p, layers_p, consts)
                busy, tpc, hop_s = stage_times([row], mb_tok, mult, msg, passes)[0][:3]
                seconds[(p, layers_p)] = busy + tpc + hop_s
            return seconds[(p, layers_p)]

        def times(ls: list[int]) -> list[float]:
            return [stage_s(p, n) for p, n in enumerate(ls)]

        def total(t: list[float]) -> float:
            return m * max(t) + sum(t) - max(t)

        def fits(ls: list[int], stage: int) -> bool:
            if (stage, ls[stage]) not in fitting:
                stage_bytes = stage_memory(self.step, task, stages, tuple(ls), stage, m, False, alone, 1)[0]
                fitting[(stage, ls[stage])] = stage_bytes <= usable[stage]
            return fitting[(stage, ls[stage])]

        current = times(layers)
        for _ in range(self.step.arch[task].num_layers):
            hi = max(range(len(layers)), key=current.__getitem__)
            if layers[hi] <= 1:
                break
            best = None
            for j in range(len(layers)):
                if j == hi:
                    continue
                trial = list(layers)
                trial[hi] -= 1
                trial[j] += 1
                t = times(trial)
                better = total(t) < total(current) * (1 - 1e-12) and (best is None or total(t) < total(best[1]))
                if better and fits(trial, j):
                    best = (trial, t)
            if best is None:
                break
            layers, current = best
        return layers


def _proportional_split(L: int, speed: list[float], layer_cost: float, extra: list[float]) -> list[int]:
    """L layers over stages ∝ speed (each ≥ 1), `extra` seconds-equivalents already on a stage (the head),
    then one layer at a time off the slowest stage while the slowest stage gets faster."""
    pp = len(speed)
    target = (L * layer_cost + extra[-1]) / sum(speed)
    want = [max(1.0, (target * s - e) / layer_cost) for s, e in zip(speed, extra, strict=True)]
    scale = L / sum(want)
    want = [w * scale for w in want]
    layers = [max(1, int(w)) for w in want]
    while sum(layers) > L:
        i = max((i for i in range(pp) if layers[i] > 1), key=lambda i: layers[i] - want[i])
        layers[i] -= 1
    while sum(layers) < L:
        i = max(range(pp), key=lambda i: want[i] - layers[i])
        layers[i] += 1

    def times(ls: list[int]) -> list[float]:
        return [(ls[i] * layer_cost + extra[i]) / speed[i] for i in range(pp)]

    for _ in range(L):  # local improvement: move one layer off the slowest stage while it helps
        t = times(layers)
        hi = max(range(pp), key=t.__getitem__)
        if layers[hi] <= 1:
            break
        lo = min(range(pp), key=t.__getitem__)
        trial = list(layers)
        trial[hi] -= 1
        trial[lo] += 1
        if max(times(trial)) < max(t) - 1e-12:
            layers = trial
        else:
            break
    return layers
