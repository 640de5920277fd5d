"""The RL vocabulary: tasks, roles, phases, heads, weight syncs and algorithms, said once.

Every layer reads these names (the workload validates against them, the cost model prices the tasks, the
planner places them, the worker runs them), so they live at the bottom of the layering and import nothing of
the project. An algorithm is one row of `ALGORITHMS`: adding one (DAPO, REINFORCE++, RLOO) means that row plus
its advantage and loss functions in `runtime/algorithms.py` (keyed by the row's `advantage` and `kl` names).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Algorithm = Literal["ppo", "grpo"]
Mode = Literal["sync", "async"]
Role = Literal["actor", "critic", "reference", "reward"]
TaskName = Literal["generation", "reference", "reward", "critic_inference", "actor_train", "critic_train"]

ALL_TASKS: tuple[TaskName, ...] = (
    "generation",
    "reference",
    "reward",
    "critic_inference",
    "actor_train",
    "critic_train",
)
"""Every task an algorithm may run, in dependency order."""

TASK_ROLE: dict[TaskName, Role] = {
    "generation": "actor",
    "reference": "reference",
    "reward": "reward",
    "critic_inference": "critic",
    "actor_train": "actor",
    "critic_train": "critic",
}
"""Whose model a task runs."""

TRAIN_TASKS: frozenset[TaskName] = frozenset({"actor_train", "critic_train"})
"""Tasks that hold gradients and optimizer state (ZeRO sharding acts on them)."""

PHASES: tuple[tuple[TaskName, ...], ...] = (
    ("generation",),
    ("reference", "reward", "critic_inference"),
    ("actor_train", "critic_train"),
)
"""A sync iteration runs these phases in order: generation, then the inference tasks on its rollouts, then the
updates. Inside a phase, tasks of one group add up (they share devices) and groups run side by side."""

PHASE_OF: dict[TaskName, int] = {t: i for i, phase in enumerate(PHASES) for t in phase}
"""The phase index of each task."""

HEAD: dict[TaskName, str] = {
    "generation": "lm",
    "actor_train": "lm",
    "reference": "lm",
    "reward": "value",
    "critic_inference": "value",
    "critic_train": "value",
}
"""Output head per task: the actor and reference predict tokens; critic and reward model output a scalar."""

SYNCED: dict[Role, tuple[TaskName, TaskName]] = {
    "actor": ("actor_train", "generation"),
    "critic": ("critic_train", "critic_inference"),
}
"""Weight syncs by role: (the task that trains the weights, the task that runs inference with a copy)."""

SYNC_WORDS: dict[Role, str] = {"actor": "training → generation", "critic": "critic training → critic inference"}
"""How a sync is named in sentences for people (the bottleneck, `show`)."""


def sync_roles(group_of: dict[str, object]) -> list[tuple[str, bool]]:
    """(role, apart) for each weight sync a plan runs, given each task's group: the actor's always (a local
    reshard when its tasks share a group), the critic's only when critic_inference is in another group than
    critic_train (in one group it runs on the trainer's own weights, as the runtime does)."""
    out = []
    for role, (train, infer) in SYNCED.items():
        if train in group_of and infer in group_of:
            apart = group_of[train] != group_of[infer]
            if apart or role == "actor":
                out.append((role, apart))
    return out


@dataclass(frozen=True)
class AlgorithmSpec:
    """What an RL algorithm is, as far as planning and running it go."""

    name: Algorithm
    tasks: tuple[TaskName, ...]
    """The tasks it runs, in dependency order (a rule-based reward drops `reward` later, not here)."""
    critic: bool
    """Whether it trains a value model (the workload must then name a critic, and must not otherwise)."""
    advantage: str
    """Key of its advantage function in runtime/algorithms.ADVANTAGES."""
    kl: Literal["loss", "reward"]
    """Where the KL to the reference enters: a k3 term of the actor loss, or a k1 per-token reward penalty."""
    min_group: int
    """Responses per prompt it needs (a group-normalised advantage needs at least two)."""


ALGORITHMS: dict[Algorithm, AlgorithmSpec] = {
    "grpo": AlgorithmSpec(
        name="grpo",
        tasks=tuple(t for t in ALL_TASKS if t not in ("critic_inference", "critic_train")),
        critic=False,
        advantage="group",
        kl="loss",
        min_group=2,
    ),
    "ppo": AlgorithmSpec(name="ppo", tasks=ALL_TASKS, critic=True, advantage="gae", kl="reward", min_group=1),
}
"""The algorithms hetrl plans and runs (PAPER.md section 2): one row each."""


def separate_old_logprob_pass(algorithm: Algorithm, epochs: int) -> bool:
    """Whether the actor computes the old log-probs in a forward pass of its own before the update. One update per
    batch (one epoch) with the KL in the loss (GRPO) makes them the current policy's, so the update takes them from
    its own forward (runtime roles.Actor); PPO needs them before training (its KL penalty is in the rewards), and
    a second epoch needs the first's. The cost model charges the pass exactly when the runtime runs it."""
    return not (epochs == 1 and ALGORITHMS[algorithm].kl == "loss")


REWARD_RULE_NAMES: tuple[str, ...] = ("numeric-answer", "toy")
"""The built-in rule-based rewards (their functions: runtime/rewards.REWARD_RULES)."""
USER_REWARD = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
"""A workload's own reward, `package.module:function` (imported only with --allow-user-reward)."""


def check_rule_name(rule: str) -> str:
    """The workload validator: a built-in rule or a well-formed `module:function` (ValueError otherwise)."""
    if rule in REWARD_RULE_NAMES or USER_REWARD.match(rule):
        return rule
    raise ValueError(
        f"reward_rule {rule!r} is neither a built-in rule ({', '.join(REWARD_RULE_NAMES)}) nor 'module:function'"
    )
