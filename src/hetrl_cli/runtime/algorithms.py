"""RL math as pure tensor functions: advantages (GRPO, PPO/GAE), losses, KL estimators, log-prob gathering.

Shape legend: N = sequences in the batch, T = response tokens (right-padded), V = vocabulary size,
G = responses per prompt. `mask` is the response mask [N, T] (1.0 on real response tokens, 0.0 on padding).

Per-token functions return [N, T] tensors and leave the reduction to `masked_sum`, so data-parallel replicas can
sum their tokens and divide by the *global* token count: the average of uneven shards then equals the
full-batch mean exactly (see roles.Actor.train_step).

Where we depart from the papers (and why):
- Loss aggregation is a token mean over the whole batch (DAPO-style), not a mean of per-sequence means: it is
  the reduction that splits exactly over uneven DP shares.
- GRPO: KL to the reference is a loss term with the k3 estimator (as DeepSeekMath); PPO: KL is a per-token
  reward penalty with the k1 estimator (as InstructGPT/verl), folded into GAE.
- GRPO's std is the unbiased sample std over the group (torch.std), as verl does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


def gather_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """log p(tokens) under `logits`: logits [N, T, V] (already aligned to predict `tokens`), tokens [N, T] -> [N, T].

    >>> import torch
    >>> gather_logprobs(torch.zeros(1, 1, 4), torch.tensor([[2]])).exp()
    tensor([[0.2500]])
    """
    import torch

    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def masked_sum(values: Tensor, mask: Tensor) -> Tensor:
    """Sum of `values` over masked positions (a scalar); any shape, mask broadcastable to it."""
    return (values * mask).sum()


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean over masked positions (0 when the mask is empty).

    >>> import torch
    >>> masked_mean(torch.tensor([[1.0, 3.0, 9.0]]), torch.tensor([[1.0, 1.0, 0.0]]))
    tensor(2.)
    """
    return masked_sum(values, mask) / mask.sum().clamp(min=1.0)


def grpo_advantages(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """Group-normalised advantages: rewards [N] with N = prompts * G, each prompt's G responses contiguous -> [N].

    A_i = (r_i - mean(group)) / (std(group) + eps); a group whose rewards are all equal gets 0.

    >>> import torch
    >>> grpo_advantages(torch.tensor([1.0, 0.0, 2.0, 2.0]), group_size=2)
    tensor([ 0.7071, -0.7071,  0.0000,  0.0000])
    """
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    groups = rewards.float().view(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True) if group_size > 1 else groups.new_zeros(groups.shape[0], 1)
    return ((groups - mean) / (std + eps)).view(-1)


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 estimator of KL(pi || pi_ref) per token: log pi - log pi_ref ([N, T]); unbiased, can be negative."""
    return logp - ref_logp


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator per token: exp(r) - r - 1 with r = log pi_ref - log pi ([N, T]); unbiased and >= 0.

    >>> import torch
    >>> kl_k3(torch.tensor([0.0]), torch.tensor([0.0]))
    tensor([0.])
    """
    import torch

    log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)
    return torch.exp(log_ratio) - log_ratio - 1.0


def token_rewards(scores: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, kl_coef: float) -> Tensor:
    """PPO per-token rewards [N, T]: -kl_coef * k1 on every response token, plus the sequence score [N] on its last.

    >>> import torch
    >>> logp, ref = torch.tensor([[0.5, 0.0, 0.0]]), torch.zeros(1, 3)
    >>> token_rewards(torch.tensor([1.0]), logp, ref, torch.tensor([[1.0, 1.0, 0.0]]), 0.1)
    tensor([[-0.0500,  1.0000,  0.0000]])
    """
    import torch

    rewards = torch.where(mask > 0, -kl_coef * kl_k1(logp, ref_logp), torch.zeros_like(logp))
    last = (mask.sum(dim=1).long() - 1).clamp(min=0)
    rows = [i for i in range(mask.shape[0]) if mask[i].sum() > 0]
    rewards[rows, last[rows]] += scores[rows].to(rewards.dtype)
    return rewards


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over response tokens: rewards, values, mask [N, T] -> (advantages, returns).

    delta_t = r_t + gamma * V_{t+1} - V_t (V past the last response token is 0),
    A_t = delta_t + gamma * lam * A_{t+1}; returns = A + V. Padding positions get 0.

    >>> import torch
    >>> adv, ret = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.5]]), torch.ones(1, 2), 1.0, 1.0)
    >>> adv, ret
    (tensor([[0.5000, 0.5000]]), tensor([[1., 1.]]))
    """
    import torch

    values = values * mask
    rewards = rewards * mask
    steps = rewards.shape[1]
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(steps)):
        next_value = values[:, t + 1] if t + 1 < steps else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * running) * mask[:, t]
        advantages[:, t] = running
    return advantages, (advantages + values) * mask


def whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x - mean) / std over masked positions; padding stays 0. Used on PPO advantages.

    >>> import torch
    >>> whiten(torch.tensor([[1.0, 3.0, 7.0]]), torch.tensor([[1.0, 1.0, 0.0]]))
    tensor([[-1.,  1.,  0.]])
    """
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    return (values - mean) * (var + eps).rsqrt() * mask


def policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, clip_eps: float) -> tuple[Tensor, Tensor]:
    """PPO clipped surrogate per token: logp, old_logp [N, T], advantages [N, T] (or [N, 1]) -> (loss, clipped).

    loss = max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps)), ratio = exp(logp - old_logp);
    `clipped` is 1.0 where the clipped branch was taken (for the clip fraction metric).

    >>> import torch
    >>> loss, clipped = policy_loss(torch.log(torch.tensor([[1.5]])), torch.zeros(1, 1), torch.ones(1, 1), 0.2)
    >>> loss, clipped
    (tensor([[-1.2000]]), tensor([[1.]]))
    """
    import torch

    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).float()


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip: float) -> Tensor:
    """Clipped value loss per token: 0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2), all [N, T].

    >>> import torch
    >>> value_loss(torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([0.0]), clip=0.5)
    tensor([2.])
    """
    import torch

    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)


def group_advantages(scores: Tensor, old_logp, ref_logp, values, mask: Tensor, workload) -> tuple[Tensor, None]:
    """GRPO's advantage: each sequence's score normalised in its prompt's group, on every response token; no
    returns (no critic)."""
    return grpo_advantages(scores, workload.responses_per_prompt).unsqueeze(1) * mask, None


def gae_advantages(scores: Tensor, old_logp, ref_logp, values, mask: Tensor, workload) -> tuple[Tensor, Tensor]:
    """PPO's advantage: GAE over per-token rewards (the score at the last token, a k1 KL penalty on each),
    whitened; the returns are the critic's targets."""
    rewards = token_rewards(scores, old_logp, ref_logp, mask, workload.rl.kl_coef)
    advantages, returns = gae(rewards, values, mask, workload.rl.gamma, workload.rl.lam)
    return whiten(advantages, mask), returns


ADVANTAGES = {"group": group_advantages, "gae": gae_advantages}
"""Advantage functions by artifacts/rl.AlgorithmSpec.advantage: (scores [n], old and reference log-probs
[n, T], values [n, T] or None, mask [n, T], workload) -> (advantages [n, T], returns [n, T] or None)."""
