"""Turn-level returns (``returns="turn"``): per-turn rewards give each turn its own advantage.

Hand-computed values for GRPO (group and no scaling) and RLOO on two groups whose members have 2 or 3
turns; the invariant that terminal-only rewards with equal turn counts per group give exactly the
episode-level advantages; PPO's GAE, token-level already, sending a turn's return only to the tokens
at and before its end; a trainer step on the tiny model; the errors.
"""

from __future__ import annotations

import random

import pytest
import torch

from agentrl.testing import TINY_VOCAB_SIZE
from agentrl.trainers import Trainer, TrainerConfig, load_policy_model
from agentrl.trainers.advantages import (
    estimate_advantages,
    expand_turns_to_tokens,
    turn_group_advantages,
    turn_returns,
    turn_rloo_advantages,
)
from agentrl.trainers.batch import collate
from agentrl.types import Trajectory

torch.set_num_threads(1)

PAD = 0


def multi_turn(group: str, rewards: list[float], generated: list[int] | None = None, seed: int = 0) -> Trajectory:
    """A prompt of 2 tokens, then per turn ``generated[k]`` generated tokens (2 by default) and,
    between turns, an observation of 1 token; turn ``k``'s reward ``rewards[k]``."""
    rng = random.Random(seed)
    generated = generated or [2] * len(rewards)
    ids, mask, ends = [1, 2], [0, 0], []
    for turn, count in enumerate(generated):
        ids += [rng.randrange(3, TINY_VOCAB_SIZE) for _ in range(count)]
        mask += [1] * count
        ends.append(len(ids) - 1)
        if turn < len(generated) - 1:
            ids.append(rng.randrange(3, TINY_VOCAB_SIZE))
            mask.append(0)
    return Trajectory(
        token_ids=ids,
        loss_mask=mask,
        logprobs=[-2.0 if m else 0.0 for m in mask],
        versions=[0 if m else -1 for m in mask],
        prompt_length=2,
        turn_ends=ends,
        turn_rewards=list(rewards),
        reward=sum(rewards),
        group_id=group,
    )


# Two groups, listed interleaved; group a has 3, 2 and 3 turns, group b 2 and 3.
#   a0 rewards [1, 0, 2] -> returns to go [3, 2, 2]
#   b0 rewards [1, 1]    -> [2, 1]
#   a1 rewards [0, 1]    -> [1, 1]
#   b1 rewards [0, 0, 4] -> [4, 4, 4]
#   a2 rewards [0, 0, 0] -> [0, 0, 0]
TRAJECTORIES = [
    multi_turn("a", [1.0, 0.0, 2.0], [2, 1, 3], seed=1),
    multi_turn("b", [1.0, 1.0], [1, 2], seed=2),
    multi_turn("a", [0.0, 1.0], [3, 1], seed=3),
    multi_turn("b", [0.0, 0.0, 4.0], [1, 1, 1], seed=4),
    multi_turn("a", [0.0, 0.0, 0.0], [2, 2, 2], seed=5),
]
BATCH = collate(TRAJECTORIES, PAD)
RETURNS = [[3.0, 2.0, 2.0], [2.0, 1.0, 0.0], [1.0, 1.0, 0.0], [4.0, 4.0, 4.0], [0.0, 0.0, 0.0]]
NUM_TURNS = [3, 2, 2, 3, 3]


def close(actual: torch.Tensor, expected: list, atol: float = 1e-5) -> bool:
    return torch.allclose(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol)


def per_token(advantages: torch.Tensor, row: int) -> list[float]:
    """The advantages of one row's generated tokens, in order."""
    return advantages[row][BATCH.loss_mask[row] > 0].tolist()


def turn_tokens(row: int, values: list[float]) -> list[float]:
    """``values[k]`` repeated for each generated token of turn ``k`` of trajectory ``row``."""
    counts = torch.bincount(BATCH.turn_index[row][BATCH.turn_index[row] >= 0]).tolist()
    return [value for value, count in zip(values, counts, strict=True) for _ in range(count)]


def test_collate_numbers_the_turn_of_each_generated_token():
    # a0: prompt 2, turn 0 (2 tokens), observation, turn 1 (1), observation, turn 2 (3), no padding.
    assert BATCH.turn_index[0].tolist() == [-1, -1, 0, 0, -1, 1, -1, 2, 2, 2]
    # b0: prompt, turn 0 (1), observation, turn 1 (2), then 5 padding positions.
    assert BATCH.turn_index[1].tolist() == [-1, -1, 0, -1, 1, 1, -1, -1, -1, -1]
    assert torch.equal(BATCH.turn_index >= 0, BATCH.loss_mask > 0)
    # micro-batches carry the turn index along
    halves = BATCH.split(3)
    assert torch.equal(torch.cat([h.turn_index for h in halves]), BATCH.turn_index)


def test_collate_rejects_turn_ends_out_of_order():
    backwards = multi_turn("a", [0.0, 1.0])
    backwards.turn_ends.reverse()
    with pytest.raises(ValueError, match="turn_ends .* do not increase"):
        collate([backwards], PAD)


def test_turn_returns_are_the_rewards_to_go_per_turn():
    assert turn_returns(BATCH.token_rewards, BATCH.turn_index).tolist() == RETURNS
    # a reward (or KL penalty) on any token of a turn counts for that turn; off-turn tokens count for none
    rewards = torch.tensor([[9.0, 1.0, 0.5, 9.0, 2.0]])
    assert turn_returns(rewards, torch.tensor([[-1, 0, 0, -1, 1]])).tolist() == [[3.5, 2.0]]


def test_grpo_per_turn_with_group_scaling():
    # Turn 0, group a [3, 1, 0]: mean 4/3, deviations 5/3, -1/3, -4/3, unbiased var 42/18 = 7/3,
    #   std 1.5275252; group b [2, 4]: deviations -1, 1, std sqrt(2).
    # Turn 1, group a [2, 1, 0]: deviations 1, 0, -1, std 1; group b [1, 4]: -1.5, 1.5, std sqrt(4.5).
    # Turn 2, group a (a1 has no turn 2) [2, 0]: deviations 1, -1, std sqrt(2); group b: b1 alone -> 0.
    s = 0.7071068
    expected = [
        [1.0910895, 1.0, s],
        [-s, -s, 0.0],
        [-0.2182179, 0.0, 0.0],
        [s, s, 0.0],
        [-0.8728716, -1.0, -s],
    ]
    turn = turn_group_advantages(torch.tensor(RETURNS), torch.tensor(NUM_TURNS), BATCH.group_index)
    assert close(turn, expected)
    tokens = estimate_advantages("grpo", BATCH, returns="turn").advantages
    for row, values in enumerate(expected):
        assert per_token(tokens, row) == pytest.approx(turn_tokens(row, values[: NUM_TURNS[row]]), abs=1e-5)
    assert tokens[BATCH.loss_mask == 0].abs().sum() == 0


def test_grpo_per_turn_without_scaling_and_dr_grpo():
    expected = [
        [5 / 3, 1.0, 1.0],
        [-1.0, -1.5, 0.0],
        [-1 / 3, 0.0, 0.0],
        [1.0, 1.5, 0.0],
        [-4 / 3, -1.0, -1.0],
    ]
    turn = turn_group_advantages(torch.tensor(RETURNS), torch.tensor(NUM_TURNS), BATCH.group_index, scale="none")
    assert close(turn, expected)
    tokens = estimate_advantages("grpo", BATCH, scale="none", returns="turn").advantages
    assert close(tokens, expand_turns_to_tokens(torch.tensor(expected), BATCH.turn_index).tolist())
    assert torch.equal(estimate_advantages("dr_grpo", BATCH, returns="turn").advantages, tokens)
    assert per_token(tokens, 1) == pytest.approx([-1.0, -1.5, -1.5])  # b0: 1 token of turn 0, 2 of turn 1


def test_rloo_per_turn():
    # Turn 0, a: 3 - (1 + 0)/2 = 2.5, 1 - 3/2 = -0.5, 0 - 4/2 = -2; b: 2 - 4 = -2, 4 - 2 = 2.
    # Turn 1, a: 2 - 1/2 = 1.5, 1 - 1 = 0, 0 - 3/2 = -1.5; b: 1 - 4 = -3, 4 - 1 = 3.
    # Turn 2, a: 2 - 0 = 2, 0 - 2 = -2; b1 alone: 0.
    expected = [
        [2.5, 1.5, 2.0],
        [-2.0, -3.0, 0.0],
        [-0.5, 0.0, 0.0],
        [2.0, 3.0, 0.0],
        [-2.0, -1.5, -2.0],
    ]
    assert close(turn_rloo_advantages(torch.tensor(RETURNS), torch.tensor(NUM_TURNS), BATCH.group_index), expected)
    tokens = estimate_advantages("rloo", BATCH, returns="turn").advantages
    assert close(tokens, expand_turns_to_tokens(torch.tensor(expected), BATCH.turn_index).tolist())
    assert per_token(tokens, 0) == pytest.approx([2.5, 2.5, 1.5, 2.0, 2.0, 2.0])


def test_a_lone_trajectory_gets_zero_per_turn():
    alone = collate([multi_turn("x", [1.0, 2.0])], PAD)
    for name in ("grpo", "dr_grpo", "rloo"):
        assert estimate_advantages(name, alone, returns="turn").advantages.abs().sum() == 0


def terminal_only_batch(seed: int, equal_turns_across_groups: bool = False):
    """4 groups of 3 with random terminal rewards; a group's members share a turn count (1-3)."""
    rng = random.Random(seed)
    trajectories = []
    for group in range(4):
        turns = 3 if equal_turns_across_groups else rng.randint(1, 3)
        for member in range(3):
            rewards = [0.0] * (turns - 1) + [rng.choice([0.0, 0.25, 1.0, -0.5, rng.uniform(-2, 2)])]
            generated = [rng.randint(1, 4) for _ in range(turns)]
            trajectories.append(multi_turn(f"g{group}", rewards, generated, seed=seed * 100 + group * 10 + member))
    rng.shuffle(trajectories)  # groups interleaved
    return collate(trajectories, PAD)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(("name", "scale"), [("grpo", "group"), ("grpo", "none"), ("dr_grpo", None), ("rloo", None)])
def test_terminal_rewards_with_equal_turn_counts_give_the_episode_advantages_exactly(seed, name, scale):
    batch = terminal_only_batch(seed)
    turn = estimate_advantages(name, batch, scale=scale, returns="turn").advantages
    episode = estimate_advantages(name, batch, scale=scale).advantages
    assert torch.equal(turn, episode)
    assert episode.abs().sum() > 0  # the comparison is not between two zeros


def test_terminal_rewards_give_the_episode_advantages_with_batch_scaling_when_all_turn_counts_agree():
    batch = terminal_only_batch(0, equal_turns_across_groups=True)
    turn = estimate_advantages("grpo", batch, scale="batch", returns="turn").advantages
    assert torch.equal(turn, estimate_advantages("grpo", batch, scale="batch").advantages)


def test_turn_returns_differ_from_episode_returns_when_earlier_turns_are_rewarded():
    # Equal episode returns, rewards at different turns: no episode-level signal, a turn-level one.
    batch = collate([multi_turn("a", [1.0, 0.0]), multi_turn("a", [0.0, 1.0])], PAD)
    assert estimate_advantages("grpo", batch).advantages.abs().sum() == 0
    # Returns to go [1, 0] and [1, 1]: turn 0 ties (0), turn 1 is 0 - 0.5 and 1 - 0.5 (scale none).
    turn = estimate_advantages("grpo", batch, scale="none", returns="turn").advantages
    assert turn[:, 0:2].tolist() == [[0.0, 0.0], [0.0, 0.0]]  # the prompt
    assert turn[batch.turn_index == 0].tolist() == [0.0] * 4
    assert turn[0, batch.turn_index[0] == 1].tolist() == [-0.5, -0.5]
    assert turn[1, batch.turn_index[1] == 1].tolist() == [0.5, 0.5]


def test_gae_puts_a_turns_reward_at_its_end_and_its_return_reaches_only_tokens_up_to_there():
    # One trajectory, turns of 2, 1 and 3 tokens; only turn 1 is rewarded (2.0).
    batch = collate([multi_turn("a", [0.0, 2.0, 0.0], [2, 1, 3])], PAD)
    end = 5  # prompt 2, turn 0 at 2-3, observation 4, turn 1 at 5
    assert batch.token_rewards[0].nonzero().flatten().tolist() == [end]
    assert batch.token_rewards[0, end] == 2.0
    # Zero values, gamma 1, lambda 1: each advantage is the reward still to come after the token's state.
    values = torch.zeros_like(batch.token_rewards)
    advantages = estimate_advantages("gae", batch, values, lam=1.0, whiten=False).advantages[0]
    generated = batch.loss_mask[0] > 0
    positions = torch.arange(batch.token_rewards.shape[1])
    assert advantages[generated & (positions <= end)].tolist() == [2.0, 2.0, 2.0]  # turns 0 and 1
    assert advantages[generated & (positions > end)].tolist() == [0.0, 0.0, 0.0]  # turn 2
    # returns="turn" changes nothing for the token-level estimators
    zeros = torch.zeros_like(BATCH.token_rewards)
    gae_turn = estimate_advantages("gae", BATCH, zeros, returns="turn").advantages
    assert torch.equal(gae_turn, estimate_advantages("gae", BATCH, zeros).advantages)
    reinforce_turn = estimate_advantages("reinforce_pp", BATCH, returns="turn").advantages
    assert torch.equal(reinforce_turn, estimate_advantages("reinforce_pp", BATCH).advantages)


def test_errors_say_what_to_do():
    with pytest.raises(ValueError, match="returns must be one of .* Did you mean 'turn'"):
        estimate_advantages("grpo", BATCH, returns="turns")
    with pytest.raises(ValueError, match="returns must be one of .* Did you mean 'episode'"):
        TrainerConfig(returns="episodes")
    # a reward given only as the episode's total would be lost to turn-level returns
    lumped = multi_turn("a", [0.0, 0.0])
    lumped.reward = 1.0
    with pytest.raises(ValueError, match="turn rewards summing to 0 and reward 1"):
        estimate_advantages("grpo", collate([lumped, multi_turn("a", [0.0, 1.0])], PAD), returns="turn")
    # generated tokens after the last turn end would get no advantage
    untracked = multi_turn("a", [1.0, 0.0])
    untracked.turn_ends.pop()
    untracked.turn_rewards.pop()
    with pytest.raises(ValueError, match="generated tokens after its last turn end"):
        estimate_advantages("rloo", collate([untracked, multi_turn("a", [0.0, 1.0])], PAD), returns="turn")
    assert estimate_advantages("rloo", collate([untracked, multi_turn("a", [0.0, 1.0])], PAD)).advantages.ndim == 2


def test_a_trainer_step_with_turn_returns_moves_the_weights(tiny_model_dir):
    # Each group's members earn the same total at different turns: episode returns tie (advantage 0,
    # no update), turn returns do not.
    trajectories = [
        multi_turn("a", [1.0, 0.0, 0.0], seed=1),
        multi_turn("a", [0.0, 0.0, 1.0], seed=2),
        multi_turn("b", [0.5, 0.5], seed=3),
        multi_turn("b", [0.0, 1.0], [3, 1], seed=4),
    ]

    def step(returns: str) -> bool:
        torch.manual_seed(0)
        config = TrainerConfig(lr=1e-3, micro_batch_size=2, returns=returns)
        trainer = Trainer(load_policy_model(tiny_model_dir), config, pad_token_id=PAD)
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        metrics = trainer.step(trajectories)
        assert metrics["train/loss"] == metrics["train/loss"]  # not NaN
        return any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())

    assert step("turn")
    assert not step("episode")
