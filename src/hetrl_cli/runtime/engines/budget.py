"""An engine's memory budget from the plan, so a plan that fits in the cost model fits in the engine.

The plan's generation figure for a device (`TaskPlan.memory_bytes`) is what the device holds while generation
runs: the engine's own share (weights + work space + KV cache: costmodel/generation.py) plus what the rank's
other tasks keep resident there (costmodel/memory.py: a trainer's weights and optimizer, an inference model's
weights). The engine gets its share, and of that the KV cache gets what the weights and work space leave, with
the cost model's own figures, so the runtime's budget and the model's agree by construction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetrl_cli.artifacts.plan import Plan


def engine_budget(plan: Plan, device_id: str) -> tuple[int | None, int | None]:
    """(the engine's share of `device_id`, its KV-cache bytes) by the plan; (None, None) where the plan gives no
    figure for the device (hand-written plans): the engine's defaults then."""
    from hetrl_cli.artifacts.rl import HEAD
    from hetrl_cli.costmodel import constants as C
    from hetrl_cli.costmodel.memory import resident_bytes_per_param, weight_bytes_per_param
    from hetrl_cli.costmodel.step import Step

    gen = next((t for t in plan.tasks if t.task == "generation"), None)
    if gen is None or not gen.memory_bytes.get(device_id):
        return None, None
    wl = plan.workload
    step = Step(wl)
    group = next((g for g in plan.groups if g.name == gen.group), None)
    names = frozenset(group.tasks if group is not None else [gen.task])
    others = 0.0
    for task in plan.tasks:
        arch = step.arch.get(task.task)
        if task is gen or arch is None or device_id not in task.devices:
            continue
        per_param = resident_bytes_per_param(task.task, names, task.offload, wl, len(task.replicas))
        others += per_param * arch.param_count(HEAD[task.task]) / (task.tp * task.pp)
    own = gen.memory_bytes[device_id] - others
    arch = step.arch["generation"]
    shards = gen.tp * gen.pp
    weights = arch.param_count("lm") * weight_bytes_per_param(wl) / shards
    per_token = 2.0 * (arch.hidden_size + arch.q_dim + 2 * arch.kv_dim) + 4.0 * arch.intermediate_size
    work = (
        C.MAX_NUM_BATCHED_TOKENS * per_token * step.act_bytes / gen.tp + C.MAX_NUM_SEQS * arch.vocab_size * 4 / gen.tp
    )
    kv = own - weights - work
    return (int(own) if own > 0 else None), (int(kv) if kv > 0 else None)
