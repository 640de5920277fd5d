"""Workload: what RL job to plan and run (algorithm, models per role, batch and sequence sizes)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from hetrl_cli.artifacts.base import Artifact, Strict
from hetrl_cli.artifacts.rl import ALGORITHMS, Algorithm, Mode, Role, TaskName, check_rule_name
from hetrl_cli.errors import BadInput, one_line

MAX_COUNT = 10_000_000
"""Bound of a workload's counts and token lengths: far above any RL step, below where the cost model's loops and
float arithmetic stop being meaningful (tests/test_bad_inputs_fuzz.py: 10^37 prompts overflowed a float)."""
SIZE_FIELDS = (
    "prompts_per_step",
    "responses_per_prompt",
    "max_prompt_tokens",
    "max_response_tokens",
    "micro_batch",
    "ppo_epochs",
)


def check_plain_text(value: str | None, limit: int) -> str | None:
    """A name or path from a workload: at most `limit` characters, no control characters (a newline in a path
    would forge lines in logs and messages). ValueError otherwise."""
    if value is not None and (len(value) > limit or any(ord(c) < 32 or ord(c) == 127 for c in value)):
        raise ValueError(f"{one_line(repr(value), 60)}: use at most {limit} characters and no control characters")
    return value


class ModelSpec(Strict):
    """A model for one role: a built-in architecture name or an HF model directory's config.json, plus where
    weights live. `{path: DIR}` alone plans and runs DIR's model (its shape from DIR/config.json)."""

    arch: str = "hf"
    """`hf` (the default): the shape from `config_path`, else from `path`/config.json. Or a built-in name
    (`qwen3-8b`, `llama-3.1-8b`, ...; `tiny` for the runtime's random demo model, only when named). `hetrl plan`
    refuses an architecture the runtime cannot execute (Llama, Mistral, Qwen2 and Qwen3 decoders run)."""
    config_path: str | None = None
    """Path to an HF config.json (arch `hf`), when it is not `path`/config.json. A relative path is taken from
    the workload file's folder."""
    path: str | None = None
    """HF model directory (config.json, weights, tokenizer) at this path on every host (for `run`); a relative
    path is taken from the workload file's folder. None only for `arch: tiny` (built and randomly initialised
    by the run) or for planning alone."""

    @field_validator("arch")
    @classmethod
    def _check_arch(cls, value: str) -> str:
        return check_plain_text(value, 200) or value

    @field_validator("config_path", "path")
    @classmethod
    def _check_path(cls, value: str | None) -> str | None:
        return check_plain_text(value, 4096)


class LengthDistribution(Strict):
    """Response lengths as fractions of max_response_tokens, for load balancing and decode time."""

    mean_fraction: float = Field(default=0.5, gt=0, le=1)
    """Mean response length / max_response_tokens."""
    p99_fraction: float = Field(default=1.0, gt=0, le=1)
    """The long tail that bounds a decode batch."""


class DatasetSpec(Strict):
    """Where `hetrl run` takes its prompts from (the planner reads only the token limits)."""

    kind: Literal["toy", "gsm8k-jsonl", "jsonl", "parquet"] = "toy"
    """`toy`: built-in task the tiny model learns on CPU; `gsm8k-jsonl`: lines with string `prompt` and
    `answer`; `jsonl` / `parquet`: rows mapped by column (the prompt from `prompt` or `question`, a string or a
    list of {role, content} messages as in verl's GSM8K/MATH files; the answer from `answer`, `ground_truth`
    or `reward_model.ground_truth`; `data_source` and `extra_info` go to verl-style rewards)."""
    path: str | None = None
    """The dataset file (every kind but `toy`), at this path on every host; a relative path is taken from the
    workload file's folder."""
    prompt_key: str | None = None
    """`jsonl`/`parquet`: the prompt's column (dots go into nested objects); None = `prompt`, else `question`."""
    answer_key: str | None = None
    """`jsonl`/`parquet`: the answer's column (dots go into nested objects); None = `answer`, else
    `ground_truth`, else `reward_model.ground_truth`."""
    chat_template: bool = True
    """Render message-list prompts with the actor tokenizer's chat template, ending in its generation prompt
    (when the tokenizer has one: else the run says so and tokenises their text). false: their contents, one a
    line, tokenised raw. String prompts are always tokenised raw."""

    @field_validator("path", "prompt_key", "answer_key")
    @classmethod
    def _check_text(cls, value: str | None) -> str | None:
        return check_plain_text(value, 4096)


class RLSpec(Strict):
    """Optimisation knobs of the RL step: `hetrl run` reads them, the planner and cost model ignore them."""

    lr: float = Field(default=1e-5, gt=0)
    """Actor learning rate (Adam/AdamW/SGD as `optimizer` says)."""
    critic_lr: float = Field(default=1e-5, gt=0)
    """Critic learning rate (PPO)."""
    kl_coef: float = Field(default=0.001, ge=0)
    """Weight of the KL to the reference: a loss term (k3) in GRPO, a per-token reward penalty (k1) in PPO."""
    clip_eps: float = Field(default=0.2, gt=0)
    """PPO/GRPO ratio clip epsilon."""
    value_clip: float = Field(default=0.2, gt=0)
    """Critic value clip range (PPO)."""
    gamma: float = Field(default=1.0, ge=0, le=1)
    """GAE discount (PPO)."""
    lam: float = Field(default=0.95, ge=0, le=1)
    """GAE lambda (PPO)."""
    temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature of generation."""
    grad_clip: float = Field(default=1.0, gt=0)
    """Max global gradient norm before each optimizer step."""
    weight_decay: float = Field(default=0.0, ge=0)
    """Decoupled weight decay of AdamW (L2 for Adam and SGD); 0 = none."""


class Workload(Artifact):
    """The RL job. Defaults give the built-in workload used when no file is passed."""

    KIND: ClassVar[str] = "workload"
    SCHEMA_VERSION: ClassVar[int] = 1

    kind: Literal["workload"] = "workload"
    """Always `workload` (may be omitted in hand-written YAML)."""
    name: str = "default"
    """A label, shown by `show` and recorded in plans and runs."""
    algorithm: Algorithm = "grpo"
    """`grpo` (group-normalised advantage, no critic) or `ppo` (GAE with a critic). Plan: which tasks exist
    (PPO adds critic inference and critic training); run: the advantage and loss (artifacts/rl.py)."""
    mode: Mode = "sync"
    """`sync` (on-policy, phases in order) or `async` (one-step off-policy: the next step's generation overlaps
    this step's training). Plan: async overlaps only when generation has a group of its own."""
    actor: ModelSpec = Field(default_factory=lambda: ModelSpec(arch="qwen3-8b"))
    """The policy: generation and actor training run it (and the reference, unless `reference` is given)."""
    critic: ModelSpec | None = None
    """Required for PPO; ignored (and must be absent) for GRPO."""
    reference: ModelSpec | None = None
    """None = same architecture as the actor (the usual frozen copy)."""
    reward: ModelSpec | None = None
    """None = a rule-based reward (no model, no devices)."""
    prompts_per_step: int = Field(default=128, gt=0)
    """Prompts a step samples from the dataset. Plan and run: the batch is prompts × responses sequences."""
    responses_per_prompt: int = Field(default=8, gt=0)
    """Responses generated per prompt (GRPO's group size: at least 2)."""
    max_prompt_tokens: int = Field(default=1024, gt=0)
    """Prompt length bound in tokens. Plan: prefill work, KV cache and activation memory; run: longer prompts
    are cut."""
    max_response_tokens: int = Field(default=1024, gt=0)
    """Response length bound in tokens (generation stops there). Plan: decode steps and memory; run: the
    engine's max new tokens."""
    response_length: LengthDistribution = Field(default_factory=LengthDistribution)
    """Expected response lengths as fractions of max_response_tokens (plan only: decode time, load balance)."""
    micro_batch: int = Field(default=8, gt=0)
    """Sequences per forward/backward micro-batch in training and inference tasks."""
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    """Number format of weights and compute. Plan: FLOP/s rate and bytes per parameter."""
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    """Optimizer of the training tasks. Plan: optimizer state bytes (Adam: two moments) and step traffic."""
    sharding: Literal["none", "zero1", "zero2", "zero3"] = "none"
    """Optimizer/gradient/parameter sharding across DP replicas of a training task (zero1: optimizer state, zero2:
    + gradients, zero3: + parameters, gathered a layer at a time; docs/run.md)."""
    recompute: bool = False
    """Activation recomputation in training (less memory, ~1/3 more compute)."""
    ppo_epochs: int = Field(default=1, gt=0)
    """Update passes over each step's batch. Plan: training time scales with it; run: that many optimizer
    steps per RL step."""
    dataset: DatasetSpec = Field(default_factory=DatasetSpec)
    """Prompt source of `hetrl run`."""
    reward_rule: str = "numeric-answer"
    """Rule-based reward used when `reward` is None: `numeric-answer`, `toy`, or your own `module:function`
    called as fn(prompt, response, answer) -> float, or verl's compute_score(data_source, solution_str,
    ground_truth, extra_info) (recognised by its parameter names; run/validate need --allow-user-reward to
    import it)."""
    rl: RLSpec = Field(default_factory=RLSpec)
    """Learning rates, KL, clipping, GAE and sampling settings used by `hetrl run`."""
    seed: int = 0
    """Seed of prompt sampling, initialisation and per-sequence sampling noise (same seed, same run)."""

    @field_validator("reward_rule")
    @classmethod
    def _check_reward_rule(cls, rule: str) -> str:
        return check_rule_name(rule)

    @model_validator(mode="after")
    def _check_roles(self) -> Workload:
        spec = ALGORITHMS[self.algorithm]
        if spec.critic and self.critic is None:
            raise ValueError(f"{self.algorithm.upper()} needs a critic model: add 'critic: {{arch: ...}}'")
        if not spec.critic and self.critic is not None:
            raise ValueError(f"{self.algorithm.upper()} uses no critic: remove 'critic' or use algorithm 'ppo'")
        for field in SIZE_FIELDS:
            if getattr(self, field) > MAX_COUNT:
                raise ValueError(f"{field} {getattr(self, field)} is more than hetrl plans or runs ({MAX_COUNT:,})")
        if self.responses_per_prompt < spec.min_group:
            raise ValueError(
                f"{self.algorithm.upper()} normalises over a group: responses_per_prompt must be at least "
                f"{spec.min_group}"
            )
        return self

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.responses_per_prompt

    @property
    def tasks(self) -> tuple[TaskName, ...]:
        """The tasks this workload runs, in dependency order (its algorithm's row in artifacts/rl.py)."""
        return ALGORITHMS[self.algorithm].tasks

    def model_for(self, role: Role) -> ModelSpec | None:
        """The model of a role, resolving the reference default to the actor's architecture."""
        if role == "reference":
            return self.reference or self.actor
        return {"actor": self.actor, "critic": self.critic, "reward": self.reward}[role]


def load_workload(path: str | Path) -> Workload:
    """Load a workload from YAML or JSON (`kind`/`schema_version` may be omitted in hand-written YAML)."""
    import json

    import yaml

    from hetrl_cli.artifacts.io import read_text, validate_json
    from hetrl_cli.artifacts.yamltext import load_yaml_text

    where = "<stdin>" if str(path) == "-" else str(path)
    text = read_text(path)
    if not text.strip():
        raise BadInput(f"{where}: no input (empty); pass a workload file or pipe one in")
    try:
        data = load_yaml_text(text, where)  # aliases counted expanded: a YAML bomb is refused, not expanded
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark else ""
        raise BadInput(f"{where}: not valid YAML{at}") from None
    except RecursionError:
        raise BadInput(f"{where}: nested too deeply to be a workload") from None
    if not isinstance(data, dict):
        raise BadInput(f"{where}: expected a mapping of workload fields")
    data.setdefault("kind", Workload.KIND)
    data.setdefault("schema_version", Workload.SCHEMA_VERSION)
    if data["kind"] != Workload.KIND:
        raise BadInput(f"{where}: is a '{one_line(str(data['kind']), 60)}' artifact, expected 'workload'")
    if not isinstance(data["schema_version"], int) or data["schema_version"] > Workload.SCHEMA_VERSION:
        raise BadInput(f"{where}: unsupported schema_version {one_line(repr(data['schema_version']), 60)}")
    try:  # through JSON, so YAML gets the strict checks every artifact gets (no true for 1, no .inf)
        text = json.dumps(data, allow_nan=False)
    except ValueError:
        raise BadInput(f"{where}: a number is inf or NaN; write a finite number") from None
    except TypeError as exc:
        raise BadInput(f"{where}: a value is not plain data ({exc}); quote it") from None
    except RecursionError:
        raise BadInput(f"{where}: nested too deeply to be a workload") from None
    return with_paths_from(
        validate_json(text, Workload, where), Path.cwd() if where == "<stdin>" else Path(path).parent
    )


def with_paths_from(workload: Workload, folder: Path) -> Workload:
    """`workload` with its relative model and dataset paths taken from `folder` (the workload file's), so the
    plan made from it holds paths that do not depend on where `plan` or `run` is started. `~` paths stay as
    written: each host expands its own.

    >>> w = Workload(actor={"path": "models/m"}, dataset={"kind": "jsonl", "path": "/data/d.jsonl"})
    >>> fixed = with_paths_from(w, Path("/work/exp"))
    >>> fixed.actor.path, fixed.dataset.path
    ('/work/exp/models/m', '/data/d.jsonl')
    """
    base = Path(os.path.abspath(folder))

    def anchored(value: str | None) -> str | None:
        if value is None or value.startswith("~") or Path(value).is_absolute():
            return value
        return os.path.normpath(base / value)

    update: dict[str, object] = {}
    for role in ("actor", "critic", "reference", "reward"):
        spec = getattr(workload, role)
        if spec is not None:
            update[role] = spec.model_copy(
                update={"path": anchored(spec.path), "config_path": anchored(spec.config_path)}
            )
    update["dataset"] = workload.dataset.model_copy(update={"path": anchored(workload.dataset.path)})
    return workload.model_copy(update=update)


def paper_workload(model: str, algorithm: Algorithm, mode: Mode = "sync", **overrides: object) -> Workload:
    """The HetRL paper's evaluation job (PAPER.md section 6): GSM8K, prompts and responses up to 1024 tokens,
    8 responses per prompt, 1024 samples a step, the same Qwen3 size for every role (reward model included).

    >>> paper_workload("8b", "ppo").critic.arch
    'qwen3-8b'
    """
    spec = ModelSpec(arch=f"qwen3-{model}")
    fields: dict[str, object] = {
        "name": f"gsm8k-qwen3-{model}-{algorithm}-{mode}",
        "algorithm": algorithm,
        "mode": mode,
        "actor": spec,
        "critic": spec if algorithm == "ppo" else None,
        "reward": spec,
        "prompts_per_step": 128,
        "responses_per_prompt": 8,
        "max_prompt_tokens": 1024,
        "max_response_tokens": 1024,
    }
    return Workload(**{**fields, **overrides})
