"""Bytes per parameter of model states, and what stays resident when tasks share devices.

Model states per parameter (Rajbhandari et al. 2020, "ZeRO", §3.1: mixed-precision Adam is 2 + 2 + 12 = 16
bytes per parameter), as the runtime holds them (runtime/precision.py; tests/runtime/test_precision.py measures
them per rank):
  weights  = precision bytes (bf16/fp16: 2, fp32: 4)
  grads    = precision bytes
  optimizer= Adam/AdamW: fp32 master + m + v = 12 (fp32 training: m + v = 8);
             SGD (no momentum, torch's default): fp32 master = 4 (fp32 training: 0)
ZeRO sharding over the dp replicas: zero1 shards the optimizer, zero2 also the grads, zero3 also the weights
(while a stage computes, zero3 also holds what it gathers: `zero3_gathered_bytes`).

Residency between colocated tasks (what a group's device holds while *another* task of the group runs):
  actor_train / critic_train : weights + optimizer (optimizer not when offload=True: it goes to host memory
                               and comes back for the step). Grads and activations are freed after the step.
  reference / reward         : weights (not when offload=True: reloaded from host each iteration).
  critic_inference           : weights, unless critic_train is in the group (it runs on the trainer's
                               weights) or offload=True.
  generation                 : weights, unless actor_train is in the group (hybrid engine: the engine's
                               copy is freed after rollout and rebuilt from the trainer's weights by the
                               local weight sync) or offload=True. The KV cache is always freed after rollout
                               (vLLM sleep mode), so it never counts against other tasks.

Peak bytes of one pipeline stage of a forward task (`stage_memory`): inference holds weights + one
micro-batch's activations (+ logits on the last stage); training holds model states (ZeRO-sharded) + the 1F1B
activations in flight + logits. Generation's memory (weights + KV cache) is in generation.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hetrl_cli.artifacts.rl import HEAD, TRAIN_TASKS, TaskName
from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel.architectures import DTYPE_BYTES, ArchSpec

if TYPE_CHECKING:
    from hetrl_cli.costmodel.devices import Stage
    from hetrl_cli.costmodel.step import Step


def weight_bytes_per_param(workload: Workload) -> int:
    return DTYPE_BYTES[workload.precision]


def grad_bytes_per_param(workload: Workload) -> int:
    return DTYPE_BYTES[workload.precision]


def optimizer_bytes_per_param(workload: Workload) -> int:
    """fp32 master weights (mixed precision only) + optimizer moments."""
    master = 0 if workload.precision == "fp32" else 4
    moments = 8 if workload.optimizer in ("adam", "adamw") else 0
    return master + moments


def optimizer_step_traffic_bytes_per_param(workload: Workload) -> int:
    """HBM bytes per parameter of the step the runtime takes: clip_grad_norm_ (read the gradient for the norm,
    then scale it: 3 g) and torch's AdamW (multi-tensor, unfused: each line one pass over its tensors):
    m ← lerp(m, g) 2s + g; v ← β₂v 2s; v += (1-β₂)g² 2s + g; d ← √v 2s; d ← d/c₂ 2s; d ← d + ε 2s;
    p ← p − a·m/d 2w + 2s; then the master copy to the working weights (mixed precision: read 4, write w).
    s = 4 (fp32 moments), g = gradient bytes, w = master weight bytes. Mixed-precision AdamW: 80, fp32: 84
    (SGD: g + 2w). The fused minimum (read g, read+write the states) is about a third of this."""
    g = grad_bytes_per_param(workload)
    mixed = workload.precision != "fp32"
    master = 4
    clip = 3 * g
    copy = (4 + weight_bytes_per_param(workload)) if mixed else 0
    if workload.optimizer in ("adam", "adamw"):
        return clip + 14 * 4 + 2 * g + 2 * master + copy
    return clip + g + 2 * master + copy


def weights_resident(task: TaskName, group: frozenset[str], offload: bool) -> bool:
    """Whether a task's weights stay on its devices while other tasks of its group run (module docstring)."""
    if task in TRAIN_TASKS:
        return True
    if offload:
        return False
    if task == "generation":
        return "actor_train" not in group
    if task == "critic_inference":
        return "critic_train" not in group
    return True


def resident_bytes_per_param(
    task: TaskName, group: frozenset[str], offload: bool, workload: Workload, dp: int
) -> float:
    """Resident bytes per parameter of a task's model for one model copy, before dividing by tp·pp.

    ZeRO divides the sharded states by dp (training only)."""
    if not weights_resident(task, group, offload):
        return 0.0
    w = float(weight_bytes_per_param(workload))
    if task not in TRAIN_TASKS:
        return w
    opt = 0.0 if offload else float(optimizer_bytes_per_param(workload))
    if dp > 1 and workload.sharding in ("zero1", "zero2", "zero3"):
        opt /= dp
        if workload.sharding == "zero3":
            w /= dp
    return w + opt


def stage_memory(
    step: Step,
    task: TaskName,
    stages: Sequence[Stage],
    split: Sequence[int],
    p: int,
    m: int,
    offload: bool,
    names: frozenset[str],
    dp: int,
) -> tuple[float, str, float]:
    """Stage p's peak bytes, what they are, and its weight reload seconds (offloaded inference); of the
    split only its length and split[p] matter."""
    arch = step.arch[task]
    head = HEAD[task]
    w = step.workload
    st = stages[p]
    mb_tok_max = w.micro_batch * step.seq_max
    params_dev = step.stage_params(arch, head, split, p) / st.tp
    if task in TRAIN_TASKS:
        b, what = train_stage_bytes(step, arch, head, split, p, st, params_dev, m, mb_tok_max, dp)
        return b, what, 0.0
    wb = weight_bytes_per_param(w)
    shares_trainer = task == "critic_inference" and "critic_train" in names  # runs on the trainer's weights
    load_s = 0.0
    wts = 0.0 if shares_trainer else params_dev * wb
    if not shares_trainer and not weights_resident(task, names, offload):
        load_s = params_dev * wb / C.HOST_DEVICE_Bps
    work = mb_tok_max * arch.activation_bytes_per_token_layer(st.tp, False)
    last = p == len(stages) - 1
    logits = logprob_chunk_bytes(w, arch.vocab_size, train=False) if last and head == "lm" else 0.0
    return wts + work + logits, "activations" if shares_trainer else "weights + activations", load_s


def train_state_bytes(workload: Workload, params: float, dp: int) -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes a training rank holds for `params` parameters of its stage
    and TP slice, ZeRO-sharded over `dp` replicas (zero1: the optimizer state, zero2: + gradients, zero3:
    + weights); what tests/runtime/test_precision.py measures on real ranks."""
    zero = workload.sharding if dp > 1 else "none"
    weights = params * weight_bytes_per_param(workload) / (dp if zero == "zero3" else 1)
    grads = params * grad_bytes_per_param(workload) / (dp if zero in ("zero2", "zero3") else 1)
    opt = params * optimizer_bytes_per_param(workload) / (dp if zero != "none" else 1)
    return weights, grads, opt


def logprob_chunk_bytes(workload: Workload, vocab: int, train: bool) -> float:
    """Peak bytes of the runtime's token log-probs (runtime/logprobs.py): one chunk of at most LOGPROB_CHUNK_BYTES
    of fp32 logits over the whole vocabulary, of a micro-batch's response tokens at most, with what its forward (no
    gradients) or its checkpointed backward holds per entry. At tp > 1 the runtime's head is vocabulary-parallel: a
    chunk is ceil(V / tp) columns of up to tp times the tokens, the same bytes when full, fewer when the
    micro-batch's response tokens do not fill it (charged as one whole-vocabulary chunk: an upper bound)."""
    chunk = max(1, C.LOGPROB_CHUNK_BYTES // (4 * vocab))
    tokens = min(chunk, workload.micro_batch * workload.max_response_tokens)
    per_entry = C.LOGPROB_CHUNK_FORWARD_BYTES_PER_ENTRY
    if train:
        per_entry = C.LOGPROB_CHUNK_TRAIN_BYTES_PER_ENTRY[workload.precision]
    return float(tokens * vocab * per_entry)


def optimizer_step_temp_bytes(workload: Workload, opt_bytes: float, arch: ArchSpec, p: int, pp: int, tp: int) -> float:
    """What the optimizer step holds besides the model states (constants.OPTIMIZER_STEP_TEMP_BYTES_PER_PARAM): per
    parameter it steps (`opt_bytes` / the optimizer's bytes per parameter: ZeRO-sharded as its state), fp32
    gradient copies in mixed precision and Adam's √v temporaries, and one fp32 temporary of the largest tensor a
    rank holds: its ceil(V / tp) rows of the embedding or head on the first and last stage (the runtime's
    vocabulary-parallel slices, runtime/parallel.py vocab_range), else an MLP matrix's 1/tp."""
    per_param = optimizer_bytes_per_param(workload)
    if per_param == 0 and workload.precision == "fp32":
        return 0.0
    kinds = (workload.precision != "fp32") + (workload.optimizer in ("adam", "adamw"))
    stepped = opt_bytes / per_param if per_param else 0.0
    largest = arch.intermediate_size * arch.hidden_size / tp
    if p in (0, pp - 1):
        largest = max(largest, math.ceil(arch.vocab_size / tp) * arch.hidden_size)
    return stepped * kinds * C.OPTIMIZER_STEP_TEMP_BYTES_PER_PARAM + 4.0 * largest


def zero3_gathered_bytes(workload: Workload, arch: ArchSpec, root_params: float, tp: int) -> float:
    """What ZeRO-3 holds in full beyond its chunks while a stage computes (runtime/zero3.py): the stage's
    parameters outside its decoder layers (`root_params`: embedding, final norm, head), gathered for a whole pass
    with their full gradients accumulating over its micro-batches, and one decoder layer at a time, whose backward
    holds its weights, its gradients and their flat copy for the reduce-scatter."""
    w, g = weight_bytes_per_param(workload), grad_bytes_per_param(workload)
    layers = C.ZERO3_GATHERED_LAYERS * arch.layer_params / tp * (w + 2 * g)
    return layers + root_params * (w + g)


def train_stage_bytes(
    step: Step,
    arch: ArchSpec,
    head: str,
    split: Sequence[int],
    p: int,
    st: Stage,
    params_dev: float,
    m: int,
    mb_tok_max: float,
    dp: int,
) -> tuple[float, str]:
    """Peak bytes on a training stage's device: model states (ZeRO-sharded, no autocast copies: the runtime
    computes in the workload's dtype) + 1F1B activations + one chunk of log-prob logits."""
    w = step.workload
    pp = len(split)
    zero = w.sharding if dp > 1 else "none"
    weights, grads, opt = train_state_bytes(w, params_dev, dp)
    in_flight = min(pp - p, m)  # 1F1B (parallel.pipeline_train): stage p holds pp − p micro-batches' activations
    scale = DTYPE_BYTES[w.precision] / 2 * C.EAGER_ACTIVATION_FACTOR  # counted 16-bit; the runtime computes in w
    per_token = arch.activation_bytes_per_token_layer(st.tp, w.recompute) * scale
    acts = in_flight * mb_tok_max * split[p] * per_token
    if w.recompute:  # one layer's full activations while it is recomputed
        acts += mb_tok_max * arch.activation_bytes_per_token_layer(st.tp, False) * scale
    logits = logprob_chunk_bytes(w, arch.vocab_size, train=True) if p == pp - 1 and head == "lm" else 0.0
    gather = 0.0
    if zero == "zero3":
        gather = zero3_gathered_bytes(w, arch, params_dev - split[p] * arch.layer_params / st.tp, st.tp)
    step = optimizer_step_temp_bytes(w, opt, arch, p, pp, st.tp)
    total = weights + grads + opt + max(acts + logits + gather, step)  # the step runs after the backward
    what = "weights+grads+optimizer+activations"
    if opt >= 0.5 * total:
        what = "weights+grads+optimizer (mostly optimizer state)"
    elif acts + logits >= 0.5 * total:
        what = "weights+grads+optimizer+activations (mostly activations)"
    return total, what


def forward_memory(
    step: Step,
    task: TaskName,
    stages: Sequence[Stage],
    split: Sequence[int],
    m: int,
    offload: bool,
    names: frozenset[str],
    dp: int,
) -> tuple[list[float], list[str], float]:
    """Peak bytes per stage, what they are, and the weight reload time of an offloaded inference task."""
    stage_bytes, parts = [], []
    load_s = 0.0
    for p in range(len(stages)):
        b, what, reload_s = stage_memory(step, task, stages, split, p, m, offload, names, dp)
        stage_bytes.append(b)
        parts.append(what)
        load_s = max(load_s, reload_s)
    return stage_bytes, parts, load_s
