"""Advantage estimators against hand-computed values (the arithmetic is written next to each)."""

from __future__ import annotations

import doctest

import pytest
import torch

import agentrl.trainers.advantages
from agentrl.trainers.advantages import (
    ADVANTAGE_ESTIMATORS,
    discounted_returns,
    estimate_advantages,
    expand_to_tokens,
    gae,
    group_advantages,
    masked_whiten,
    reinforce_pp_advantages,
    rloo_advantages,
)
from agentrl.trainers.batch import collate
from agentrl.types import Trajectory

torch.set_num_threads(1)

# Group 0 = [1, 0, 4] (mean 5/3), group 1 = [3, 3], group 2 = [5] alone; listed interleaved.
REWARDS = torch.tensor([1.0, 3.0, 0.0, 5.0, 3.0, 4.0])
GROUPS = torch.tensor([0, 1, 0, 2, 1, 0])


def close(actual: torch.Tensor, expected: list, atol: float = 1e-5) -> bool:
    return torch.allclose(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol)


def test_grpo_scales_by_the_unbiased_group_std():
    # Group 0: deviations -2/3, -5/3, 7/3; unbiased var (4 + 25 + 49) / 9 / 2 = 13/3, std 2.0816660.
    # Group 1 has std 0 and deviations 0; the lone group 2 gets 0.
    expected = [-0.3202562, 0.0, -0.8006404, 0.0, 0.0, 1.1208965]
    assert close(group_advantages(REWARDS, GROUPS), expected)


def test_grpo_batch_scale_uses_the_std_of_all_rewards():
    # All six rewards: mean 16/6, squared deviations sum to 104/6, unbiased var 104/30, std 1.8618987.
    expected = [-0.3580572, 0.0, -0.8951431, 0.0, 0.0, 1.2532004]
    assert close(group_advantages(REWARDS, GROUPS, scale="batch"), expected)


def test_dr_grpo_does_not_scale():
    assert close(group_advantages(REWARDS, GROUPS, scale="none"), [-2 / 3, 0.0, -5 / 3, 0.0, 0.0, 7 / 3])


def test_grpo_eps_keeps_a_zero_std_group_finite_and_rejects_unknown_scales():
    # Two equal rewards: deviation 0, std 0 -> 0 / eps = 0, not NaN.
    assert group_advantages(torch.tensor([2.0, 2.0]), torch.tensor([0, 0])).tolist() == [0.0, 0.0]
    # Deviations -1, +1, unbiased std sqrt(2); eps 2 - sqrt(2) makes the divisor 2: -0.5, +0.5.
    assert close(group_advantages(torch.tensor([0.0, 2.0]), torch.tensor([0, 0]), eps=0.5857864), [-0.5, 0.5])
    with pytest.raises(ValueError, match="scale must be one of"):
        group_advantages(REWARDS, GROUPS, scale="std")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"must both be \[N\]"):
        group_advantages(REWARDS, GROUPS[:-1])


def test_rloo_subtracts_the_mean_of_the_others():
    # Group 0 [1, 0, 4]: 1 - (0 + 4)/2 = -1, 0 - (1 + 4)/2 = -2.5, 4 - (1 + 0)/2 = 3.5.
    # Group 1 [3, 3]: 0 each. The lone group 2: 0 (no baseline to compare with).
    assert close(rloo_advantages(REWARDS, GROUPS), [-1.0, 0.0, -2.5, 0.0, 0.0, 3.5])


def test_expand_to_tokens_puts_the_advantage_on_generated_tokens_only():
    mask = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 0]])
    assert expand_to_tokens(torch.tensor([2.0, -1.0]), mask).tolist() == [[0.0, 2.0, 2.0, 0.0], [-1.0, 0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match=r"advantages \[B\] and mask \[B, T\]"):
        expand_to_tokens(torch.tensor([1.0]), mask)


# Row 0: prompt, two generated, two observation, two generated, pad. Turn rewards 0.5 at 2 and 1.0
# at 6; the 7.0 on observation token 3 must be ignored. Row 1: one turn of two tokens, reward -1 at 2.
MASK = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 0], [0, 1, 1, 0, 0, 0, 0, 0]])
TOKEN_REWARDS = torch.tensor([[0.0, 0.0, 0.5, 7.0, 0.0, 0.0, 1.0, 0.0], [0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0]])


def test_discounted_returns_skip_observation_tokens():
    # gamma 0.9, row 0: G6 = 1, G5 = 0.9 * 1 = 0.9, G2 = 0.5 + 0.9 * 0.9 = 1.31, G1 = 0.9 * 1.31 = 1.179.
    # Row 1: G2 = -1, G1 = -0.9.
    expected = [
        [0.0, 1.179, 1.31, 0.0, 0.0, 0.9, 1.0, 0.0],
        [0.0, -0.9, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    ]
    assert close(discounted_returns(TOKEN_REWARDS, MASK, gamma=0.9), expected)


def test_reinforce_pp_whitens_the_returns_over_all_generated_tokens():
    # The six returns above: mean 0.4148333, population var 0.9489368; (G - mean) / sqrt(var).
    expected = [
        [0.0, 0.7844575, 0.9189360, 0.0, 0.0, 0.4980493, 0.6007046, 0.0],
        [0.0, -1.3497460, -1.4524013, 0.0, 0.0, 0.0, 0.0, 0.0],
    ]
    assert close(reinforce_pp_advantages(TOKEN_REWARDS, MASK, gamma=0.9), expected)


def test_masked_whiten_of_constant_values_is_zero_not_nan():
    assert masked_whiten(torch.full((2, 3), 4.0), torch.ones(2, 3)).tolist() == [[0.0] * 3] * 2
    assert masked_whiten(torch.ones(1, 2), torch.zeros(1, 2)).tolist() == [[0.0, 0.0]]


# Values at generated positions: row 0 V1 .2, V2 .4, V5 .6, V6 .8; row 1 V1 .5, V2 -.5. The 9.0 on
# other positions must never be read.
VALUES = torch.tensor([[9.0, 0.2, 0.4, 9.0, 9.0, 0.6, 0.8, 9.0], [9.0, 0.5, -0.5, 9.0, 9.0, 9.0, 9.0, 9.0]])


def test_gae_runs_over_generated_tokens_with_a_zero_value_after_the_last():
    # gamma 0.9, lam 0.5 (gamma * lam = 0.45). Row 0 deltas:
    #   t6: 1.0 + 0.9 * 0   - 0.8 = 0.2     A6 = 0.2
    #   t5: 0   + 0.9 * 0.8 - 0.6 = 0.12    A5 = 0.12 + 0.45 * 0.2    = 0.21
    #   t2: 0.5 + 0.9 * 0.6 - 0.4 = 0.64    A2 = 0.64 + 0.45 * 0.21   = 0.7345
    #   t1: 0   + 0.9 * 0.4 - 0.2 = 0.16    A1 = 0.16 + 0.45 * 0.7345 = 0.490525
    # Row 1: t2: -1 - (-0.5) = -0.5; t1: 0.9 * -0.5 - 0.5 = -0.95, A1 = -0.95 + 0.45 * -0.5 = -1.175.
    advantages, returns = gae(TOKEN_REWARDS, VALUES, MASK, gamma=0.9, lam=0.5)
    assert close(
        advantages,
        [[0.0, 0.490525, 0.7345, 0.0, 0.0, 0.21, 0.2, 0.0], [0.0, -1.175, -0.5, 0.0, 0.0, 0.0, 0.0, 0.0]],
    )
    # returns = A + V
    assert close(
        returns,
        [[0.0, 0.690525, 1.1345, 0.0, 0.0, 0.81, 1.0, 0.0], [0.0, -0.675, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0]],
    )


def test_gae_with_lambda_one_returns_the_discounted_returns_and_does_not_backprop_into_values():
    values = VALUES.clone().requires_grad_(True)
    result = gae(TOKEN_REWARDS, values, MASK, gamma=0.9, lam=1.0)
    assert torch.allclose(result.returns, discounted_returns(TOKEN_REWARDS, MASK, gamma=0.9), atol=1e-6)
    assert not result.advantages.requires_grad and not result.returns.requires_grad


def test_gae_defaults_are_gamma_one_lambda_095():
    # One turn [V=0.5, V=0.0], reward 1 at the end: d1 = 1 - 0 = 1, d0 = 0 + 0 - 0.5 = -0.5,
    # A0 = -0.5 + 0.95 * 1 = 0.45.
    advantages, _ = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.0]]), torch.ones(1, 2))
    assert close(advantages, [[0.45, 1.0]])


def test_token_estimators_ignore_how_many_observation_tokens_lie_between_turns():
    # The same two turns with 0 and with 50 observation tokens between them.
    short_mask = torch.tensor([[1, 1, 1]])
    long_mask = torch.tensor([[1] + [0] * 50 + [1, 1]])
    short_rewards = torch.tensor([[0.3, 0.0, 1.0]])
    long_rewards = torch.zeros(1, 53)
    long_rewards[0, 0], long_rewards[0, 52] = 0.3, 1.0
    short_values = torch.tensor([[0.1, 0.2, 0.3]])
    long_values = torch.full((1, 53), 5.0)
    long_values[0, 0], long_values[0, 51], long_values[0, 52] = 0.1, 0.2, 0.3
    generated = long_mask[0] > 0
    short = gae(short_rewards, short_values, short_mask, gamma=0.9, lam=0.8).advantages
    long = gae(long_rewards, long_values, long_mask, gamma=0.9, lam=0.8).advantages
    assert torch.allclose(long[0, generated], short[0], atol=1e-6)
    short = discounted_returns(short_rewards, short_mask, gamma=0.9)
    long = discounted_returns(long_rewards, long_mask, gamma=0.9)
    assert torch.allclose(long[0, generated], short[0], atol=1e-6)


def trajectory(group: str, reward: float) -> Trajectory:
    return Trajectory(
        token_ids=[1, 2, 3, 4],
        loss_mask=[0, 1, 0, 1],
        logprobs=[0.0, -1.0, 0.0, -1.0],
        versions=[-1, 0, -1, 0],
        prompt_length=1,
        turn_ends=[1, 3],
        turn_rewards=[0.0, reward],
        reward=reward,
        group_id=group,
    )


BATCH = collate([trajectory("a", 1.0), trajectory("a", 0.0), trajectory("b", 2.0), trajectory("b", 2.0)], 0)


def test_estimate_advantages_names_every_estimator():
    assert set(ADVANTAGE_ESTIMATORS) == {"grpo", "dr_grpo", "rloo", "reinforce_pp", "gae", "gigpo", "jepo"}
    # Group a [1, 0]: deviations +-0.5, unbiased std sqrt(0.5) = 0.7071068 -> +-0.7071068.
    grpo = estimate_advantages("grpo", BATCH).advantages
    assert close(grpo[:, 1], [0.7071061, -0.7071061, 0.0, 0.0]) and torch.equal(grpo[:, 1], grpo[:, 3])
    assert grpo[:, 0].abs().sum() == 0 and grpo[:, 2].abs().sum() == 0
    assert close(estimate_advantages("dr_grpo", BATCH).advantages[:, 3], [0.5, -0.5, 0.0, 0.0])
    assert close(estimate_advantages("grpo", BATCH, scale="none").advantages[:, 3], [0.5, -0.5, 0.0, 0.0])
    # RLOO: 1 - 0 = 1 and 0 - 1 = -1.
    assert close(estimate_advantages("rloo", BATCH).advantages[:, 3], [1.0, -1.0, 0.0, 0.0])
    # REINFORCE++ gamma 1: returns 1, 1, 0, 0, 2, 2, 2, 2 on the 8 generated tokens (mean 1.25,
    # population var 0.6875): (1 - 1.25) / 0.8291562 = -0.3015113, ...
    reinforce = estimate_advantages("reinforce_pp", BATCH).advantages
    assert close(reinforce[:, 1], [-0.3015113, -1.5075567, 0.9045340, 0.9045340])
    assert torch.equal(reinforce[:, 1], reinforce[:, 3])


def test_only_the_critic_based_estimator_returns_returns():
    assert all(estimate_advantages(name, BATCH).returns is None for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp"))
    # Values 0.5 on generated tokens, gamma 1, lambda 1: the returns are the rewards to go (1, 1 in
    # row 0; 0, 0 in row 1; 2, 2 in rows 2 and 3) whatever the values, and 0 off generated tokens.
    values = torch.full((4, 4), 0.5) * BATCH.loss_mask
    returns = estimate_advantages("gae", BATCH, values, lam=1.0).returns
    assert returns is not None
    assert returns.tolist() == [[0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 2.0], [0.0, 2.0, 0.0, 2.0]]


def test_estimate_advantages_gae_whitens_by_default_and_reads_overridden_rewards():
    values = torch.zeros(4, 4)
    raw = estimate_advantages("gae", BATCH, values, lam=1.0, whiten=False)
    # Zero values, gamma 1, lambda 1: advantages are the returns to go, and so are the returns.
    assert raw.advantages[:, 1].tolist() == [1.0, 0.0, 2.0, 2.0]
    assert raw.returns is not None and torch.equal(raw.returns, raw.advantages)
    whitened = estimate_advantages("gae", BATCH, values, lam=1.0)
    assert close(whitened.advantages[:, 1], [-0.3015113, -1.5075567, 0.9045340, 0.9045340])
    assert torch.equal(whitened.returns, raw.returns)  # the critic's targets are never whitened
    doubled = estimate_advantages("gae", BATCH, values, lam=1.0, whiten=False, token_rewards=2 * BATCH.token_rewards)
    assert doubled.advantages[:, 1].tolist() == [2.0, 0.0, 4.0, 4.0]


def test_estimate_advantages_errors_say_what_to_do():
    with pytest.raises(ValueError, match="Did you mean 'rloo'"):
        estimate_advantages("rlo", BATCH)
    with pytest.raises(ValueError, match="needs the critic's values"):
        estimate_advantages("gae", BATCH)
    with pytest.raises(ValueError, match="dr_grpo is GRPO without std scaling"):
        estimate_advantages("dr_grpo", BATCH, scale="group")


def test_module_doctests_pass():
    assert doctest.testmod(agentrl.trainers.advantages).failed == 0
