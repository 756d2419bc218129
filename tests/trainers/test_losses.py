"""Losses against hand-computed values (the arithmetic is written next to each)."""

from __future__ import annotations

import doctest
import math

import pytest
import torch

import agentrl.trainers.losses
from agentrl.trainers.losses import (
    aggregate,
    kl_estimate,
    kl_penalty_rewards,
    masked_mean,
    policy_loss,
    value_loss,
)

torch.set_num_threads(1)


def close(actual: torch.Tensor, expected: list | float, atol: float = 1e-5) -> bool:
    return torch.allclose(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol)


def test_kl_estimators():
    # x = logprobs - ref = [1, -1]. k1 = x; k2 = x^2 / 2; k3 = exp(-x) - 1 + x = [e^-1, e - 2].
    logprobs, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -1.0])
    assert close(kl_estimate(logprobs, ref, "k1"), [1.0, -1.0])
    assert close(kl_estimate(logprobs, ref, "k2"), [0.5, 0.5])
    assert close(kl_estimate(logprobs, ref, "k3"), [0.3678794, 0.7182818])
    assert close(kl_estimate(logprobs, ref), [0.3678794, 0.7182818])  # k3 is the default (GRPO)
    with pytest.raises(ValueError, match="kind must be one of"):
        kl_estimate(logprobs, ref, "k4")  # type: ignore[arg-type]


def test_kl_penalty_rewards():
    rewards, kl = torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.2]])
    # 0 - 0.1 * 0.5 = -0.05; 1 - 0.1 * 0.2 = 0.98.
    assert close(kl_penalty_rewards(rewards, kl, 0.1), [[-0.05, 0.98]])
    assert close(kl_penalty_rewards(rewards, kl, 0.1, mask=torch.tensor([[0, 1]])), [[0.0, 0.98]])


# Row 0 has three tokens 1, 2, 3 (and an inf on a padding position that must not leak); row 1 one
# token 4; row 2 none.
VALUES = torch.tensor([[1.0, 2.0, 3.0, math.inf], [4.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


def test_aggregate_modes():
    assert close(aggregate(VALUES, MASK, "token-mean"), 2.5)  # (1 + 2 + 3 + 4) / 4
    assert close(aggregate(VALUES, MASK, "seq-mean-token-mean"), 3.0)  # (6/3 + 4/1) / 2 sequences
    assert close(aggregate(VALUES, MASK, "seq-mean-token-sum-norm"), 1.25)  # (6/4 + 4/4) / 2, T = 4
    assert close(aggregate(VALUES, MASK, "seq-mean-token-sum-norm", norm_length=2), 2.5)  # (3 + 2) / 2


def test_aggregate_divides_by_the_counts_it_is_given():
    assert close(aggregate(VALUES, MASK, "token-mean", num_tokens=8), 1.25)  # 10 / 8
    assert close(aggregate(VALUES, MASK, "seq-mean-token-mean", num_seqs=4), 1.5)  # 6 / 4
    assert close(aggregate(VALUES, MASK, "seq-mean-token-sum-norm", num_seqs=5), 0.5)  # 2.5 / 5


def test_aggregate_of_an_empty_mask_is_zero_and_errors_are_clear():
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert aggregate(VALUES, torch.zeros_like(MASK), mode).item() == 0.0
    with pytest.raises(ValueError, match="mode must be one of"):
        aggregate(VALUES, MASK, "sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"must both be \[B, T\]"):
        aggregate(VALUES[0], MASK[0])
    with pytest.raises(ValueError, match="norm_length must be positive"):
        aggregate(VALUES, MASK, "seq-mean-token-sum-norm", norm_length=0)
    assert close(masked_mean(VALUES, MASK), 2.5)


# Five generated tokens and one padding position. Ratios r = 1.5, 0.5, 1.5, 0.5, 5.0 with
# advantages +1, +1, -1, -1, -2.
RATIOS = torch.tensor([[1.5, 0.5, 1.5, 0.5, 5.0, 7.0]])
ADVANTAGES = torch.tensor([[1.0, 1.0, -1.0, -1.0, -2.0, 3.0]])
PPO_MASK = torch.tensor([[1, 1, 1, 1, 1, 0]])
OLD = torch.tensor([[-1.0, -2.0, -0.5, -1.5, -3.0, -1.0]])


def ppo(**kwargs):
    logprobs = (OLD + RATIOS.log()).requires_grad_(True)
    loss, stats = policy_loss(logprobs, OLD, ADVANTAGES, PPO_MASK, **kwargs)
    loss.sum().backward()
    return loss, stats, logprobs.grad


def test_ppo_clipped_surrogate():
    # max(-A r, -A clip(r, 0.8, 1.2)):
    #   r 1.5, A +1: max(-1.5, -1.2) = -1.2 (clipped)   r 0.5, A +1: max(-0.5, -0.8) = -0.5
    #   r 1.5, A -1: max(1.5, 1.2) = 1.5                 r 0.5, A -1: max(0.5, 0.8) = 0.8 (clipped)
    #   r 5.0, A -2: max(10, 2.4) = 10
    loss, stats, grad = ppo()
    assert close(loss, [[-1.2, -0.5, 1.5, 0.8, 10.0, 0.0]])
    # d/dlogprob of -A r is -A r where unclipped, 0 where clipped (and on padding).
    assert close(grad, [[0.0, -0.5, 1.5, 0.0, 10.0, 0.0]])
    assert close(stats.clip_fraction, 0.4)  # 2 of 5
    assert close(stats.dual_clip_fraction, 0.0)
    assert close(stats.ratio_mean, 1.8)  # (1.5 + 0.5 + 1.5 + 0.5 + 5) / 5
    assert close(stats.ratio_max, 5.0)  # the padding's 7 is not counted
    # (r - 1) - ln r: 0.0945349, 0.1931472, 0.0945349, 0.1931472, 2.3905621 -> mean 0.5931853
    assert close(stats.approx_kl, 0.5931853)
    assert close(stats.is_weight_mean, 1.0) and close(stats.is_capped_fraction, 0.0)
    assert all(s.ndim == 0 and not s.requires_grad for s in stats)


def test_clip_higher_and_asymmetric_clipping():
    # clip_high 0.28: r 1.5, A +1 -> max(-1.5, -1.28) = -1.28; the A < 0 tokens are unchanged.
    loss, _, _ = ppo(clip_high=0.28)
    assert close(loss, [[-1.28, -0.5, 1.5, 0.8, 10.0, 0.0]])
    # clip_low 0.4: r 0.5, A -1 -> max(0.5, 0.6) = 0.6; r 0.5, A +1 -> max(-0.5, -0.6) = -0.5.
    loss, _, _ = ppo(clip_low=0.4)
    assert close(loss, [[-1.2, -0.5, 1.5, 0.6, 10.0, 0.0]])


def test_dual_clip_bounds_the_loss_of_negative_advantages():
    # c = 3: the r 5, A -2 token's 10 is bounded by 3 * 2 = 6 and stops carrying a gradient; the
    # r 1.5, A -1 token's 1.5 is below 3 * 1 and unchanged.
    loss, stats, grad = ppo(dual_clip=3.0)
    assert close(loss, [[-1.2, -0.5, 1.5, 0.8, 6.0, 0.0]])
    assert close(grad, [[0.0, -0.5, 1.5, 0.0, 0.0, 0.0]])
    assert close(stats.dual_clip_fraction, 0.2)
    with pytest.raises(ValueError, match="dual_clip must be greater than 1"):
        ppo(dual_clip=1.0)


# old - behaviour = ln 0.5, ln 4, 0, 0, 0 on the generated tokens: weights 0.5, 4, 1, 1, 1.
BEHAVIOUR = OLD - torch.tensor([[math.log(0.5), math.log(4.0), 0.0, 0.0, 0.0, 5.0]])


def test_truncated_importance_sampling_clamps_the_behaviour_weight():
    # Weights min(w, 2) = 0.5, 2, 1, 1, 1 times the PPO losses -1.2, -0.5, 1.5, 0.8, 10.
    loss, stats, grad = ppo(behaviour_logprobs=BEHAVIOUR, correction="tis")
    assert close(loss, [[-0.6, -1.0, 1.5, 0.8, 10.0, 0.0]])
    assert close(grad, [[0.0, -1.0, 1.5, 0.0, 10.0, 0.0]])
    assert close(stats.is_weight_mean, 1.1)  # (0.5 + 2 + 1 + 1 + 1) / 5
    assert close(stats.is_capped_fraction, 0.2)


def test_decoupled_ppo_drops_tokens_over_the_cap():
    # AReaL: the weight-4 token exceeds the cap 2 and is dropped (weight 0).
    loss, stats, _ = ppo(behaviour_logprobs=BEHAVIOUR, correction="decoupled")
    assert close(loss, [[-0.6, 0.0, 1.5, 0.8, 10.0, 0.0]])
    assert close(stats.is_weight_mean, 0.7)  # (0.5 + 0 + 1 + 1 + 1) / 5
    assert close(stats.is_capped_fraction, 0.2)
    loss, _, _ = ppo(behaviour_logprobs=BEHAVIOUR, correction="decoupled", is_cap=None)
    assert close(loss, [[-0.6, -2.0, 1.5, 0.8, 10.0, 0.0]])


def test_policy_loss_errors_say_what_to_do():
    with pytest.raises(ValueError, match="needs behaviour_logprobs"):
        ppo(correction="tis")
    with pytest.raises(ValueError, match="correction must be one of"):
        ppo(behaviour_logprobs=BEHAVIOUR, correction="is")
    with pytest.raises(ValueError, match="share one"):
        policy_loss(OLD, OLD, ADVANTAGES[:, :3], PPO_MASK)


def test_clipped_value_loss():
    values = torch.tensor([[1.0, 0.6, -1.0, 5.0]])
    old_values = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    returns = torch.tensor([[1.0, 0.0, -2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # t0: max((1 - 1)^2, (0.5 + 0.2 - 1)^2 = 0.09) / 2 = 0.045
    # t1: change 0.1 is inside the clip: 0.6^2 / 2 = 0.18
    # t2: max((-1 + 2)^2 = 1, (-0.2 + 2)^2 = 3.24) / 2 = 1.62; t3 is masked out.
    assert close(value_loss(values, old_values, returns, mask), [[0.045, 0.18, 1.62, 0.0]])
    assert close(value_loss(values, old_values, returns, mask, clip=None), [[0.0, 0.18, 0.5, 0.0]])
    with pytest.raises(ValueError, match="clip must be positive"):
        value_loss(values, old_values, returns, mask, clip=0.0)


def test_module_doctests_pass():
    assert doctest.testmod(agentrl.trainers.losses).failed == 0
