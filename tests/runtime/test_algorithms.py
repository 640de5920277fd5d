"""The RL math on hand-computed tensors, and every runtime docstring example."""

from __future__ import annotations

import doctest
import importlib
import math

import pytest
import torch

from hetrl_cli.runtime import algorithms as alg


def close(a: torch.Tensor, b) -> bool:
    return torch.allclose(a, torch.as_tensor(b, dtype=a.dtype), atol=1e-5)


def test_grpo_advantages_normalise_each_group_with_unbiased_std() -> None:
    rewards = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])
    # group 1: mean 2, unbiased std 1 -> (-1, 0, 1); group 2: constant -> 0
    assert close(alg.grpo_advantages(rewards, group_size=3), [-1.0, 0.0, 1.0, 0.0, 0.0, 0.0])


def test_grpo_advantages_refuse_a_batch_that_does_not_split_into_groups() -> None:
    with pytest.raises(ValueError, match="groups of 4"):
        alg.grpo_advantages(torch.zeros(6), group_size=4)


def test_gae_matches_a_hand_computation_with_gamma_and_lambda() -> None:
    gamma, lam = 0.9, 0.5
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.2, 0.4, 0.6, 9.0]])  # the last position is padding: its value must be ignored
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    d2 = 1.0 + 0.0 - 0.6
    d1 = 0.0 + gamma * 0.6 - 0.4
    d0 = 0.0 + gamma * 0.4 - 0.2
    a2 = d2
    a1 = d1 + gamma * lam * a2
    a0 = d0 + gamma * lam * a1
    adv, ret = alg.gae(rewards, values, mask, gamma, lam)
    assert close(adv, [[a0, a1, a2, 0.0]])
    assert close(ret, [[a0 + 0.2, a1 + 0.4, a2 + 0.6, 0.0]])


def test_policy_loss_clips_on_both_sides() -> None:
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, -1.0, -2.0]])
    loss, clipped = alg.policy_loss(logp, old, adv, clip_eps=0.2)
    # A>0, ratio 1.5: min(1.5, 1.2) * A -> -1.2 (clipped); A<0, ratio 0.5: max(-(-0.5), -(-0.8)) -> 0.8 (clipped)
    # A<0, ratio 1.1 inside the range: -A * ratio = 2.2 (not clipped)
    assert close(loss, [[-1.2, 0.8, 2.2]])
    assert close(clipped, [[1.0, 1.0, 0.0]])


def test_kl_estimators() -> None:
    logp = torch.log(torch.tensor([0.5, 0.25]))
    ref = torch.log(torch.tensor([0.25, 0.5]))
    assert close(alg.kl_k1(logp, ref), [math.log(2), -math.log(2)])
    r = torch.tensor([math.log(0.5), math.log(2.0)])  # log(ref / pi)
    assert close(alg.kl_k3(logp, ref), torch.exp(r) - r - 1)
    assert bool((alg.kl_k3(logp, ref) >= 0).all())


def test_token_rewards_put_the_score_on_the_last_real_token() -> None:
    logp = torch.tensor([[0.0, -1.0, 0.0], [0.0, 0.0, 0.0]])
    ref = torch.tensor([[0.0, -2.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    out = alg.token_rewards(torch.tensor([2.0, 3.0]), logp, ref, mask, kl_coef=0.5)
    assert close(out, [[0.0, -0.5, 2.0], [3.0, 0.0, 0.0]])


def test_value_loss_takes_the_larger_of_clipped_and_unclipped() -> None:
    values = torch.tensor([1.0, 0.1])
    old = torch.tensor([0.0, 0.0])
    returns = torch.tensor([1.0, 1.0])
    # first: unclipped 0, clipped (0.2 - 1)^2 = 0.64 -> 0.32; second: both 0.81 -> 0.405
    assert close(alg.value_loss(values, old, returns, clip=0.2), [0.32, 0.405])


def test_masked_reductions_and_whitening_ignore_padding() -> None:
    x = torch.tensor([[2.0, 4.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert close(alg.masked_sum(x, mask), 6.0)
    assert close(alg.masked_mean(x, mask), 3.0)
    assert close(alg.whiten(x, mask), [[-1.0, 1.0, 0.0]])


def test_gather_logprobs_picks_the_token_log_softmax() -> None:
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    assert close(alg.gather_logprobs(logits, torch.tensor([[1]])), [[math.log(0.75)]])


@pytest.mark.parametrize(
    "module",
    ["algorithms", "rewards", "datasets", "layout", "engines", "roles", "tinymodel"],
)
def test_docstring_examples(module: str) -> None:
    mod = importlib.import_module(f"hetrl_cli.runtime.{module}")
    result = doctest.testmod(mod)
    assert result.failed == 0
