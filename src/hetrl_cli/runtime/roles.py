"""One class per RL role: Generator, Actor, Reference, Critic, RuleReward, RewardModel.

Each role owns its model and does one thing on the sequences it is given; the worker decides which ranks
hold which roles and moves data between them. Models never see parallelism: a role holds a parallel.Shard
(the whole model when alone, else its stage's TP-sliced layers) and runs every micro-batch through
parallel.pipeline_forward / pipeline_train, which are plain loops on one rank. On a pipeline, results (log-probs,
values, loss sums) exist on the last stage only; elsewhere the lists come back empty.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetrl_cli.artifacts.rl import ALGORITHMS, separate_old_logprob_pass
from hetrl_cli.runtime import algorithms as alg
from hetrl_cli.runtime.engines import RolloutEngine, Sampling

if TYPE_CHECKING:
    from torch import Tensor

    from hetrl_cli.artifacts.workload import RLSpec
    from hetrl_cli.runtime.datasets import Record


@dataclass(frozen=True)
class Rollout:
    """One generated sequence: `index` is its position in the step's batch (prompt i's responses are
    i*G .. i*G+G-1), the unit every task's batch share is cut from."""

    index: int
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]


@dataclass
class SeqBatch:
    """Prompt+response sequences right-padded for a forward pass.

    input_ids, attention_mask: [n, L]; positions[i, t]: index of the logit that predicts response token t
    (prompt length - 1 + t); response, mask: [n, T].
    """

    input_ids: Tensor
    attention_mask: Tensor
    positions: Tensor
    response: Tensor
    mask: Tensor


def collate(rollouts: list[Rollout], pad_id: int, device: str = "cpu") -> SeqBatch:
    import torch

    n = len(rollouts)
    width = max(len(r.prompt_ids) + len(r.response_ids) for r in rollouts)
    steps = max(1, max(len(r.response_ids) for r in rollouts))
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    positions = torch.zeros((n, steps), dtype=torch.long)
    response = torch.full((n, steps), pad_id, dtype=torch.long)
    mask = torch.zeros((n, steps), dtype=torch.float32)
    for i, r in enumerate(rollouts):
        seq = list(r.prompt_ids) + list(r.response_ids)
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        p, m = len(r.prompt_ids), len(r.response_ids)
        positions[i] = (torch.arange(steps) + p - 1).clamp(max=width - 1)
        response[i, :m] = torch.tensor(r.response_ids, dtype=torch.long)
        mask[i, :m] = 1.0
    return SeqBatch(*(t.to(device) for t in (ids, attn, positions, response, mask)))


def pad_rows(rows: list[list[float]], steps: int) -> Tensor:
    """Per-sequence float lists (or 1-D tensors) -> [n, steps], zero-padded."""
    import torch

    out = torch.zeros((len(rows), steps), dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.float32)
    return out


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _per_sequence(shard, rollouts: list[Rollout], pad_id: int, micro_batch: int, device: str, fn) -> list[Any]:
    """`fn(logits, batch)` -> [n, T] per micro-batch, without gradients; one row list per sequence, cut to its
    response length (empty on pipeline stages other than the last)."""
    from hetrl_cli.runtime.zero3 import forward_passes

    chunks = _chunks(rollouts, micro_batch)
    batches = [collate(chunk, pad_id, device) for chunk in chunks]
    outs = forward_passes(shard, batches, lambda logits, i: fn(logits, batches[i]).float().cpu(), pad_id)
    if not outs:  # not the last pipeline stage
        return []
    return [out[i, : len(r.response_ids)].tolist() for chunk, out in zip(chunks, outs, strict=True)
            for i, r in enumerate(chunk)]  # fmt: skip


def make_optimizer(params, kind: str, lr: float, weight_decay: float, zero: Any = None, masters: Any = None):
    """The workload's optimizer; ZeRO-partitioned when `zero` (sharding.Zero) is active; stepping fp32 master
    weights when `masters` (mixed precision)."""
    from hetrl_cli.runtime import sharding

    return sharding.make_optimizer(params, kind, lr, weight_decay, zero, masters)


def _zero3(shard, zero: Any, masters: list[Tensor] | None):
    """(shard, parameters the optimizer steps, their fp32 masters, the Zero the optimizer shards over): under
    zero3 the shard becomes a zero3.Zero3Shard and the optimizer steps its chunks, itself unsharded."""
    if zero is None or zero.kind != "zero3" or not zero.active:
        return shard, [p for _, p in shard.held], masters, zero
    from hetrl_cli.runtime.zero3 import Zero3Shard

    if isinstance(shard, Zero3Shard):  # loaded as chunks (runtime/zero3load.py): `masters` are the chunks' already
        return shard, shard.local_params(), masters, None
    sharded = Zero3Shard.of(shard, zero)
    return sharded, sharded.local_params(), None if masters is None else sharded.local_masters(masters), None


def _trainable(shard, recompute: bool) -> None:
    """Activation recomputation on the shard's decoder layers (workload `recompute`)."""
    if recompute:
        from hetrl_cli.runtime.sharding import enable_recompute

        enable_recompute(shard.model.model.layers)


def _step(shard, optimizer, zero: Any, max_norm: float, dp: tuple[Any, int], scaler: Any) -> float:
    """Sum the gradients over DP, clip by the full model's norm, (zero2) free the other ranks' gradients, step.
    fp16: the gradients carry the loss scale until the master step divides it out (the clipping threshold
    is scaled alike), and no rank steps when the norm is inf/nan (the same decision on every rank)."""
    from hetrl_cli.runtime.sharding import free_foreign_grads, inner_optimizer

    shard.reduce_gradients(*dp)
    norm = shard.clip_grad_norm(max_norm * scaler.scale) / scaler.scale
    if zero is not None and zero.kind == "zero2":
        free_foreign_grads(optimizer)
    if scaler.update(norm):
        inner = inner_optimizer(optimizer)
        if hasattr(inner, "loss_scale"):
            inner.loss_scale = scaler.scale
        optimizer.step()
    return norm


def sequence_seed(seed: int, step: int, index: int) -> int:
    """The sampling seed of one sequence: a function of (run seed, step, index) only, so it does not depend
    on the replica that generates it.

    >>> sequence_seed(0, 1, 2) == sequence_seed(0, 1, 2) != sequence_seed(0, 1, 3)
    True
    """
    return int.from_bytes(hashlib.sha256(f"{seed}:{step}:{index}".encode()).digest()[:4], "little")


class Generator:
    """Actor generation: samples responses for this rank's share of the step's prompts."""

    def __init__(self, engine: RolloutEngine, tokenizer, max_new_tokens: int, temperature: float, seed: int) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.seed = seed

    def generate(self, step: int, requests: list[tuple[int, tuple[int, ...]]]) -> list[Rollout]:
        """`requests`: (sequence index, prompt ids) pairs -> one Rollout each."""
        if not requests:
            return []
        sampling = Sampling(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            seeds=tuple(sequence_seed(self.seed, step, index) for index, _ in requests),
            eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
            suppress_ids=tuple(sorted({t for t in self.tokenizer.all_special_ids if t != self.tokenizer.eos_token_id})),
        )
        responses = self.engine.generate([list(p) for _, p in requests], sampling)
        return [Rollout(i, p, tuple(r)) for (i, p), r in zip(requests, responses, strict=True)]


class Reference:
    """The frozen initial policy: per-token log-probs of responses (for the KL term), weights in `precision`."""

    def __init__(
        self,
        model_dir: str | Path,
        pad_id: int,
        micro_batch: int,
        device: str = "cpu",
        parallel: Any = None,
        precision: str = "fp32",
    ) -> None:
        from hetrl_cli.runtime.loading import load_shard

        self.shard = load_shard(model_dir, parallel, device, precision).shard  # this rank's piece only
        self.shard.head_outside = True
        self.model = self.shard.model
        self.pad_id, self.micro_batch, self.device = pad_id, micro_batch, device

    def logprobs(self, rollouts: list[Rollout]) -> list[list[float]]:
        """Under inference mode: a frozen model's pass needs no version counters or autograd metadata (-7 % CPU of
        the bench model's reference pass, bench/run_vs_loop.py); the same kernels, the same values."""
        import torch

        with torch.inference_mode():
            return _logprobs_lists(self.shard, rollouts, self.pad_id, self.micro_batch, self.device)


def _logprobs_lists(shard, rollouts: list[Rollout], pad_id: int, micro_batch: int, device: str) -> list[list[float]]:
    """Per-token log-probs from a `head_outside` shard, the head applied in chunks (runtime/logprobs.py)."""
    from hetrl_cli.runtime.logprobs import response_logprobs

    def logp(hidden: Tensor, batch: SeqBatch) -> Tensor:
        return response_logprobs(hidden, batch.positions, batch.response, shard.lm_head)

    return _per_sequence(shard, rollouts, pad_id, micro_batch, device, logp)


class Actor:
    """The trained policy: old log-probs before the update, then PPO-clip (+ GRPO's k3 KL) optimizer steps."""

    def __init__(
        self,
        model_dir: str | Path,
        rl: RLSpec,
        algorithm: str,
        optimizer: str,
        epochs: int,
        pad_id: int,
        micro_batch: int,
        device: str = "cpu",
        parallel: Any = None,
        zero: Any = None,
        recompute: bool = False,
        precision: str = "fp32",
    ) -> None:
        """`zero` (sharding.Zero): ZeRO over the task's replicas; `recompute`: activation checkpointing;
        `precision`: weights, gradients and compute in it, fp32 master weights in the optimizer (precision.py)."""
        from hetrl_cli.runtime.precision import LossScaler
        from hetrl_cli.runtime.zero3load import load_trained

        loaded = load_trained(model_dir, parallel, device, precision, zero=zero)  # this rank's piece (zero3: chunks)
        self.shard, masters = loaded.shard, loaded.masters
        self.shard.head_outside = True
        self.model = self.shard.model
        _trainable(self.shard, recompute)
        self.shard, params, masters, sharded = _zero3(self.shard, zero, masters)
        self.zero = zero
        self.optimizer = make_optimizer(params, optimizer, rl.lr, rl.weight_decay, sharded, masters)
        self.rl, self.algorithm, self.epochs = rl, algorithm, epochs
        self.pad_id, self.micro_batch, self.device, self.precision = pad_id, micro_batch, device, precision
        self.scaler = LossScaler(precision == "fp16")

    @property
    def reuses_old_logprobs(self) -> bool:
        """One update per batch (ppo_epochs 1) with the KL in the loss (GRPO): the old log-probs are the current
        policy's, so the update takes them from its own forward (same weights, same ops) instead of a separate
        pass before it. PPO needs them before training: its KL penalty is in the rewards."""
        return not separate_old_logprob_pass(self.algorithm, self.epochs)

    def logprobs(self, rollouts: list[Rollout]) -> list[list[float]]:
        return _logprobs_lists(self.shard, rollouts, self.pad_id, self.micro_batch, self.device)

    def train_step(
        self,
        rollouts: list[Rollout],
        advantages: Tensor,
        old_logp: Tensor | None,
        ref_logp: Tensor,
        total_tokens: float,
        dp: tuple[Any, int],
    ) -> dict[str, float]:
        """One update per epoch on this replica's `rollouts` (tensors [n, T] aligned with them).

        Losses are token sums over `total_tokens`, the token count of the *whole* step, so summing
        gradients over the DP group gives the full-batch gradient (Shard.reduce_gradients). `dp` is the
        (group, size) of this rank's gradient sum. Returns sums (pg_loss, kl, clipped, tokens) for the caller to
        combine across replicas (zero on pipeline stages other than the last) and the global gradient norm.
        `old_logp` None (`reuses_old_logprobs`): the old log-probs are this forward's own, detached.
        """
        from hetrl_cli.runtime.zero3 import train_passes

        sums = {"pg_loss_sum": 0.0, "kl_sum": 0.0, "clipped_sum": 0.0, "tokens": 0.0, "grad_norm": 0.0}
        starts = list(range(0, len(rollouts), self.micro_batch))
        batches = [collate(rollouts[lo : lo + self.micro_batch], self.pad_id, self.device) for lo in starts]

        def loss(logits: Tensor, i: int) -> tuple[Tensor, dict[str, Any]]:
            lo, hi = starts[i], starts[i] + self.micro_batch
            old = None if old_logp is None else old_logp[lo:hi]
            part = self._micro_loss(logits, batches[i], advantages[lo:hi], old, ref_logp[lo:hi])
            return self.scaler.scaled(part["loss_sum"] / total_tokens), part

        for _ in range(self.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for part in train_passes(self.shard, batches, loss, self.pad_id):
                for key in ("pg_loss_sum", "kl_sum", "clipped_sum", "tokens"):
                    sums[key] += float(part[key])
            sums["grad_norm"] = _step(self.shard, self.optimizer, self.zero, self.rl.grad_clip, dp, self.scaler)
        return sums

    def _micro_loss(self, hidden: Tensor, batch: SeqBatch, advantages, old_logp, ref_logp) -> dict[str, Any]:
        """Loss sums of one micro-batch from the last stage's final hidden states (the head runs in chunks)."""
        from hetrl_cli.runtime.logprobs import response_logprobs

        steps = batch.mask.shape[1]
        adv, ref = (x[:, :steps].to(self.device) for x in (advantages, ref_logp))
        logp = response_logprobs(hidden, batch.positions, batch.response, self.shard.lm_head)
        old = logp.detach() if old_logp is None else old_logp[:, :steps].to(self.device)
        pg, clipped = alg.policy_loss(logp, old, adv, self.rl.clip_eps)
        kl = alg.kl_k3(logp, ref)
        loss = pg + self.rl.kl_coef * kl if ALGORITHMS[self.algorithm].kl == "loss" else pg
        mask = batch.mask
        return {
            "loss_sum": alg.masked_sum(loss, mask),
            "pg_loss_sum": alg.masked_sum(pg, mask).detach(),
            "kl_sum": alg.masked_sum(kl, mask).detach(),
            "clipped_sum": alg.masked_sum(clipped, mask),
            "tokens": mask.sum(),
        }

    def named_weights(self) -> list[tuple[str, Tensor]] | None:
        """The full model's weights in HF names on the replica's leader (None on its other ranks; collective)."""
        return self.shard.full_weights()

    def state(self) -> dict[str, Any] | None:
        """Weights and optimizer state, full shapes, canonical names (leader only; collective over the replica,
        and with ZeRO over the ZeRO group too: then every rank of the task calls it)."""
        return _full_state(self.shard, self.optimizer, self.zero)

    def load_state(self, state: dict[str, Any]) -> None:
        _load_full_state(self.shard, self.optimizer, state)


class Critic:
    """PPO's value model: a token-classification head (one output) on the policy architecture."""

    def __init__(
        self,
        model_dir: str | Path,
        rl: RLSpec,
        optimizer: str,
        epochs: int,
        pad_id: int,
        micro_batch: int,
        seed: int,
        device: str = "cpu",
        parallel: Any = None,
        zero: Any = None,
        recompute: bool = False,
        precision: str = "fp32",
        frozen: bool = False,
    ) -> None:
        """Weights in `precision`; trained (not `frozen`, a critic-inference copy): fp32 master weights in the
        optimizer (runtime/precision.py)."""
        from hetrl_cli.runtime.precision import LossScaler
        from hetrl_cli.runtime.zero3load import load_trained

        # this rank's piece only; the value head freshly initialised from `seed`: identical on every critic rank
        loaded = load_trained(model_dir, parallel, device, precision, head="token", seed=seed, zero=zero)
        self.shard, masters = loaded.shard, loaded.masters
        self.model = self.shard.model
        _trainable(self.shard, recompute)
        self.shard, params, masters, sharded = _zero3(self.shard, zero, masters)
        self.zero = zero
        self.scaler = LossScaler(precision == "fp16" and not frozen)
        self.optimizer = make_optimizer(params, optimizer, rl.critic_lr, rl.weight_decay, sharded,
                                        None if frozen else masters)  # fmt: skip
        self.rl, self.epochs, self.pad_id, self.micro_batch, self.device = rl, epochs, pad_id, micro_batch, device

    @staticmethod
    def _values(logits: Tensor, batch: SeqBatch) -> Tensor:
        return logits[..., 0].gather(1, batch.positions)

    def values(self, rollouts: list[Rollout]) -> list[list[float]]:
        """V(s_t) for each response token t (the state that emits it)."""
        return _per_sequence(self.shard, rollouts, self.pad_id, self.micro_batch, self.device, self._values)

    def train_step(
        self, rollouts: list[Rollout], returns: Tensor, old_values: Tensor, total_tokens: float, dp: tuple[Any, int]
    ) -> dict[str, float]:
        """Clipped value loss, token sum over the step's `total_tokens` (exact over uneven DP shares)."""
        from hetrl_cli.runtime.zero3 import train_passes

        sums = {"vf_loss_sum": 0.0, "vf_tokens": 0.0}
        starts = list(range(0, len(rollouts), self.micro_batch))
        batches = [collate(rollouts[lo : lo + self.micro_batch], self.pad_id, self.device) for lo in starts]

        def loss(logits: Tensor, i: int) -> tuple[Tensor, dict[str, float]]:
            batch, lo, steps = batches[i], starts[i], batches[i].mask.shape[1]
            ret = returns[lo : lo + self.micro_batch, :steps].to(self.device)
            old = old_values[lo : lo + self.micro_batch, :steps].to(self.device)
            values = self._values(logits, batch).float()
            total = alg.masked_sum(alg.value_loss(values, old, ret, self.rl.value_clip), batch.mask)
            info = {"vf_loss_sum": float(total.detach()), "vf_tokens": float(batch.mask.sum())}
            return self.scaler.scaled(total / total_tokens), info

        for _ in range(self.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for part in train_passes(self.shard, batches, loss, self.pad_id):
                for key in sums:
                    sums[key] += part[key]
            _step(self.shard, self.optimizer, self.zero, self.rl.grad_clip, dp, self.scaler)
        return sums

    def named_weights(self) -> list[tuple[str, Tensor]] | None:
        """The full critic in HF names on the replica's leader (None on its other ranks; collective)."""
        return self.shard.full_weights()

    def load_weights(self, named: list[tuple[str, Tensor]]) -> None:
        """Full, HF-named tensors -> this rank's pieces, in place."""
        self.shard.load_full(named)

    def state(self) -> dict[str, Any] | None:
        return _full_state(self.shard, self.optimizer, self.zero)

    def load_state(self, state: dict[str, Any]) -> None:
        _load_full_state(self.shard, self.optimizer, state)


def _full_state(shard, optimizer, zero: Any = None) -> dict[str, Any] | None:
    """A checkpoint independent of the layout: full tensors in canonical names (None off the leader).

    With ZeRO the optimizer state is first consolidated on replica 0's rank of each ZeRO group (every rank of
    the task takes part); only replica 0's ranks then gather it to the leader."""
    from hetrl_cli.runtime.sharding import consolidate

    consolidate(optimizer, zero)
    params_sharded = zero is not None and zero.active and zero.kind == "zero3"  # its gathers need every replica
    if zero is not None and zero.active and not params_sharded and shard.par.pos.replica != 0:
        return None  # other replicas took part in the consolidation only
    weights = shard.full_weights()
    optim = shard.full_optimizer_state(optimizer)
    if weights is None or (params_sharded and shard.par.pos.replica != 0):
        return None  # zero3: every replica gathered, replica 0's leader keeps it; unsharded: each replica's leader
    return {"model": dict(weights), "optimizer": optim}


def _load_full_state(shard, optimizer, state: dict[str, Any]) -> None:
    shard.load_full(state["model"].items())
    shard.load_optimizer_state(optimizer, state["optimizer"])


class RuleReward:
    """A rule-based or user reward (rewards.py) on the prompt, the decoded response and the record's answer."""

    def __init__(self, rule: str, tokenizer) -> None:
        from hetrl_cli.runtime.rewards import record_scorer

        self.fn = record_scorer(rule)
        self.tokenizer = tokenizer

    def scores(self, rollouts: list[Rollout], records: list[Record]) -> list[float]:
        texts = self.tokenizer.batch_decode([list(r.response_ids) for r in rollouts], skip_special_tokens=True)
        return [self.fn(rec, text) for text, rec in zip(texts, records, strict=True)]


class RewardModel:
    """A learned reward: a sequence-classification model's score on prompt + response."""

    def __init__(
        self,
        model_dir: str | Path,
        pad_id: int,
        micro_batch: int,
        seed: int,
        device: str = "cpu",
        parallel: Any = None,
        precision: str = "fp32",
    ) -> None:
        from hetrl_cli.runtime.loading import load_shard

        self.shard = load_shard(model_dir, parallel, device, precision, head="sequence", seed=seed).shard
        self.model = self.shard.model
        self.model.config.pad_token_id = pad_id
        self.pad_id, self.micro_batch, self.device = pad_id, micro_batch, device

    def scores(self, rollouts: list[Rollout], records: list[Record]) -> list[float]:
        """One score per sequence (empty on pipeline stages other than the last)."""
        from hetrl_cli.runtime.parallel import pipeline_forward

        batches = [collate(chunk, self.pad_id, self.device) for chunk in _chunks(rollouts, self.micro_batch)]
        outs = pipeline_forward(self.shard, batches, lambda logits, i: logits[:, 0].float().cpu().tolist())
        return [score for out in outs for score in out]
