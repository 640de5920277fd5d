"""One RL step of the workload as the cost model prices it: the model each task runs, the step's token
counts and bytes, and the per-stage parameters and FLOPs of those models.

Every physics module (generation, forward, memory, weight sync) reads these figures; they depend on the
workload only, so they are computed once per CostModel.
"""

from __future__ import annotations

from collections.abc import Sequence

from hetrl_cli.artifacts.rl import TASK_ROLE, TaskName
from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel.architectures import DTYPE_BYTES, TRAIN_FORWARD_MULTIPLE, ArchSpec, resolve
from hetrl_cli.costmodel.memo import Memo


class Step:
    """The workload's step: models per task, token counts, activation bytes; per-stage layer figures."""

    def __init__(self, workload: Workload) -> None:
        w = workload
        self.workload = w
        self.arch: dict[str, ArchSpec] = {}
        """The model each task runs (tasks without one, e.g. a rule-based reward, are absent)."""
        for task in w.tasks:
            spec = w.model_for(TASK_ROLE[task])
            if spec is not None:
                self.arch[task] = resolve(spec)
        self.rule_reward = w.reward is None
        self.n_samples = float(w.samples_per_step)
        self.prompt_tokens = float(w.max_prompt_tokens)
        self.resp_mean = w.response_length.mean_fraction * w.max_response_tokens
        self.resp_tail = max(self.resp_mean, w.response_length.p99_fraction * w.max_response_tokens)
        self.seq_mean = self.prompt_tokens + self.resp_mean
        self.seq_max = float(w.max_prompt_tokens + w.max_response_tokens)
        self.act_bytes = DTYPE_BYTES[w.precision]
        self.required_tasks: tuple[TaskName, ...] = tuple(
            t for t in w.tasks if not (t == "reward" and self.rule_reward)
        )
        """The tasks a placement must place (a rule-based reward runs on the driver)."""
        self._params: Memo[float] = Memo(stage_params)
        self._flops: Memo[float] = Memo(_stage_flops_per_token)

    def stage_params(self, arch: ArchSpec, head: str, split: Sequence[int], p: int) -> float:
        """Parameters on stage p of a layer split (stage_params), cached by what they depend on."""
        key = (arch.name, head, split[p], p == 0, p == len(split) - 1, len(split) > 1)
        hit = self._params.get(key)
        return self._params.keyed(key, arch, head, split, p) if hit is None else hit

    def stage_flops_per_token(self, arch: ArchSpec, head: str, layers: int, last: bool, context: float) -> float:
        """Forward FLOPs per token of a stage's layers (+ the output projection on the last stage)."""
        key = (arch.name, head, layers, last, context)
        hit = self._flops.get(key)
        return self._flops.keyed(key, arch, head, layers, last, context) if hit is None else hit


def stage_params(arch: ArchSpec, head: str, split: Sequence[int], p: int) -> float:
    """Parameters on stage p: its layers, the embedding on the first stage, final norm + head on the last
    (a tied embedding is duplicated on the last stage when pp > 1, as Megatron does)."""
    n = split[p] * arch.layer_params
    last = p == len(split) - 1
    if p == 0:
        n += arch.embedding_params
    if last:
        n += arch.hidden_size + arch.head_params(head)
        if head == "lm" and arch.tie_embeddings and len(split) > 1:
            n += arch.embedding_params
    return float(n)


def _stage_flops_per_token(arch: ArchSpec, head: str, layers: int, last: bool, context: float) -> float:
    flops = layers * arch.layer_flops_per_token(context)
    if last:
        flops += 2.0 * arch.head_matmul_params(head)
    return flops


def train_multiple(recompute: bool) -> float:
    """Training FLOPs per forward FLOP: 3 (fwd + bwd), 4 with full recomputation (ArchSpec.train_flops_per_token)."""
    return TRAIN_FORWARD_MULTIPLE + (1.0 if recompute else 0.0)
