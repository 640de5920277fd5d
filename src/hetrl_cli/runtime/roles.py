"""One class per RL role: Generator, Actor, Reference, Critic, RuleReward, RewardModel.

Each role owns its model and does one thing on the sequences it is given; the worker decides which ranks
hold which roles and moves data between them. Models never see parallelism: the only distributed call in
here is the gradient all-reduce the worker's DP group is handed in.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    """Per-sequence float lists -> [n, steps], zero-padded."""
    import torch

    out = torch.zeros((len(rows), steps), dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _response_logits(model, batch: SeqBatch) -> Tensor:
    """Logits at the positions that predict each response token: [n, T, V]."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    index = batch.positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    return logits.gather(1, index)


def make_optimizer(params, kind: str, lr: float, weight_decay: float):
    import torch

    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)


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
    """The frozen initial policy: per-token log-probs of responses (for the KL term)."""

    def __init__(self, model_dir: str | Path, pad_id: int, micro_batch: int, device: str = "cpu") -> None:
        from hetrl_cli.runtime.tinymodel import load_causal_lm

        self.model = load_causal_lm(model_dir).to(device).requires_grad_(False)
        self.pad_id, self.micro_batch, self.device = pad_id, micro_batch, device

    def logprobs(self, rollouts: list[Rollout]) -> list[list[float]]:
        return _logprobs_lists(self.model, rollouts, self.pad_id, self.micro_batch, self.device)


def _logprobs_lists(model, rollouts: list[Rollout], pad_id: int, micro_batch: int, device: str) -> list[list[float]]:
    import torch

    out: list[list[float]] = []
    with torch.no_grad():
        for chunk in _chunks(rollouts, micro_batch):
            batch = collate(chunk, pad_id, device)
            logp = alg.gather_logprobs(_response_logits(model, batch), batch.response).cpu()
            out.extend(logp[i, : len(r.response_ids)].tolist() for i, r in enumerate(chunk))
    return out


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
    ) -> None:
        from hetrl_cli.runtime.tinymodel import load_causal_lm

        self.model = load_causal_lm(model_dir).to(device)
        self.optimizer = make_optimizer(self.model.parameters(), optimizer, rl.lr, rl.weight_decay)
        self.rl, self.algorithm, self.epochs = rl, algorithm, epochs
        self.pad_id, self.micro_batch, self.device = pad_id, micro_batch, device

    def logprobs(self, rollouts: list[Rollout]) -> list[list[float]]:
        return _logprobs_lists(self.model, rollouts, self.pad_id, self.micro_batch, self.device)

    def train_step(
        self,
        rollouts: list[Rollout],
        advantages: Tensor,
        old_logp: Tensor,
        ref_logp: Tensor,
        total_tokens: float,
        dp: tuple[Any, int],
    ) -> dict[str, float]:
        """One update per epoch on this replica's `rollouts` (tensors [n, T] aligned with them).

        Losses are token sums over `total_tokens`, the token count of the *whole* step, so summing
        gradients over the DP group gives the full-batch gradient (comm.allreduce_gradients).
        Returns sums (pg_loss, kl, clipped, tokens) for the caller to combine across replicas.
        """
        import torch

        from hetrl_cli.runtime.comm import allreduce_gradients

        sums = {"pg_loss_sum": 0.0, "kl_sum": 0.0, "clipped_sum": 0.0, "tokens": 0.0, "grad_norm": 0.0}
        for _ in range(self.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for lo in range(0, len(rollouts), self.micro_batch):
                hi = lo + self.micro_batch
                part = self._micro_loss(rollouts[lo:hi], advantages[lo:hi], old_logp[lo:hi], ref_logp[lo:hi])
                (part["loss_sum"] / total_tokens).backward()
                for key in ("pg_loss_sum", "kl_sum", "clipped_sum", "tokens"):
                    sums[key] += float(part[key])
            allreduce_gradients(self.model, *dp)
            sums["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.rl.grad_clip))
            self.optimizer.step()
        return sums

    def _micro_loss(self, rollouts, advantages, old_logp, ref_logp) -> dict[str, Any]:
        batch = collate(rollouts, self.pad_id, self.device)
        steps = batch.mask.shape[1]
        adv, old, ref = (x[:, :steps].to(self.device) for x in (advantages, old_logp, ref_logp))
        logp = alg.gather_logprobs(_response_logits(self.model, batch), batch.response)
        pg, clipped = alg.policy_loss(logp, old, adv, self.rl.clip_eps)
        kl = alg.kl_k3(logp, ref)
        loss = pg + self.rl.kl_coef * kl if self.algorithm == "grpo" else pg
        mask = batch.mask
        return {
            "loss_sum": alg.masked_sum(loss, mask),
            "pg_loss_sum": alg.masked_sum(pg, mask).detach(),
            "kl_sum": alg.masked_sum(kl, mask).detach(),
            "clipped_sum": alg.masked_sum(clipped, mask),
            "tokens": mask.sum(),
        }

    def named_weights(self) -> list[tuple[str, Tensor]]:
        return [(n, p.detach()) for n, p in self.model.named_parameters()]

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


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
    ) -> None:
        import torch
        from transformers import AutoModelForTokenClassification

        torch.manual_seed(seed)  # the value head is freshly initialised: identical on every critic rank
        self.model = AutoModelForTokenClassification.from_pretrained(str(model_dir), num_labels=1).to(device)
        self.optimizer = make_optimizer(self.model.parameters(), optimizer, rl.critic_lr, rl.weight_decay)
        self.rl, self.epochs, self.pad_id, self.micro_batch, self.device = rl, epochs, pad_id, micro_batch, device

    def _values(self, batch: SeqBatch) -> Tensor:
        out = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[..., 0]
        return out.gather(1, batch.positions)

    def values(self, rollouts: list[Rollout]) -> list[list[float]]:
        """V(s_t) for each response token t (the state that emits it)."""
        import torch

        out: list[list[float]] = []
        with torch.no_grad():
            for chunk in _chunks(rollouts, self.micro_batch):
                values = self._values(collate(chunk, self.pad_id, self.device)).cpu()
                out.extend(values[i, : len(r.response_ids)].tolist() for i, r in enumerate(chunk))
        return out

    def train_step(
        self, rollouts: list[Rollout], returns: Tensor, old_values: Tensor, total_tokens: float, dp: tuple[Any, int]
    ) -> dict[str, float]:
        """Clipped value loss, token sum over the step's `total_tokens` (exact over uneven DP shares)."""
        import torch

        from hetrl_cli.runtime.comm import allreduce_gradients

        sums = {"vf_loss_sum": 0.0, "vf_tokens": 0.0}
        for _ in range(self.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for lo in range(0, len(rollouts), self.micro_batch):
                batch = collate(rollouts[lo : lo + self.micro_batch], self.pad_id, self.device)
                steps = batch.mask.shape[1]
                ret = returns[lo : lo + self.micro_batch, :steps].to(self.device)
                old = old_values[lo : lo + self.micro_batch, :steps].to(self.device)
                loss = alg.masked_sum(alg.value_loss(self._values(batch), old, ret, self.rl.value_clip), batch.mask)
                (loss / total_tokens).backward()
                sums["vf_loss_sum"] += float(loss.detach())
                sums["vf_tokens"] += float(batch.mask.sum())
            allreduce_gradients(self.model, *dp)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.rl.grad_clip)
            self.optimizer.step()
        return sums

    def named_weights(self) -> list[tuple[str, Tensor]]:
        return [(n, p.detach()) for n, p in self.model.named_parameters()]

    def load_weights(self, named: list[tuple[str, Tensor]]) -> None:
        import torch

        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in named:
                params[name].copy_(tensor)

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


class RuleReward:
    """A rule-based reward (rewards.py) on the decoded response against the record's answer."""

    def __init__(self, rule: str, tokenizer) -> None:
        from hetrl_cli.runtime.rewards import reward_rule

        self.fn = reward_rule(rule)
        self.tokenizer = tokenizer

    def scores(self, rollouts: list[Rollout], records: list[Record]) -> list[float]:
        texts = self.tokenizer.batch_decode([list(r.response_ids) for r in rollouts], skip_special_tokens=True)
        return [self.fn(text, rec.answer) for text, rec in zip(texts, records, strict=True)]


class RewardModel:
    """A learned reward: a sequence-classification model's score on prompt + response."""

    def __init__(self, model_dir: str | Path, pad_id: int, micro_batch: int, seed: int, device: str = "cpu") -> None:
        import torch
        from transformers import AutoModelForSequenceClassification

        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_pretrained(str(model_dir), num_labels=1)
        model.config.pad_token_id = pad_id
        self.model = model.to(device).eval().requires_grad_(False)
        self.pad_id, self.micro_batch, self.device = pad_id, micro_batch, device

    def scores(self, rollouts: list[Rollout], records: list[Record]) -> list[float]:
        import torch

        out: list[float] = []
        with torch.no_grad():
            for chunk in _chunks(rollouts, self.micro_batch):
                batch = collate(chunk, self.pad_id, self.device)
                logits = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                out.extend(logits[:, 0].float().cpu().tolist())
        return out
