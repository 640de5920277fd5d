"""Bytes per parameter of model states, and what stays resident when tasks share devices.

Model states per parameter (Rajbhandari et al. 2020, "ZeRO", §3.1: mixed-precision Adam is 2 + 2 + 12 = 16
bytes per parameter):
  weights  = precision bytes (bf16/fp16: 2, fp32: 4)
  grads    = precision bytes
  optimizer= Adam/AdamW: fp32 master + m + v = 12 (fp32 training: m + v = 8);
             SGD (no momentum, torch's default): fp32 master = 4 (fp32 training: 0)
ZeRO sharding over the dp replicas: zero1 shards the optimizer, zero2 also the grads, zero3 also the weights.

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
"""

from __future__ import annotations

from hetrl_cli.artifacts.rl import TRAIN_TASKS, TaskName
from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel.architectures import DTYPE_BYTES


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
