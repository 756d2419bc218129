"""collate and Batch: right padding, token alignment, rewards at turn ends, group indices, errors."""

from __future__ import annotations

import doctest

import pytest
import torch

import agentrl.trainers.batch
from agentrl.trainers.batch import Batch, collate
from agentrl.types import Trajectory

PAD = 99


def two_turns() -> Trajectory:
    """Prompt [10, 11]; turn 0 generates [20, 21]; observation [30]; turn 1 generates [22]."""
    return Trajectory(
        token_ids=[10, 11, 20, 21, 30, 22],
        loss_mask=[0, 0, 1, 1, 0, 1],
        logprobs=[0.0, 0.0, -0.1, -0.2, 0.0, -0.3],
        versions=[-1, -1, 0, 0, -1, 1],
        prompt_length=2,
        turn_ends=[3, 5],
        turn_rewards=[0.5, 1.0],
        reward=1.5,
        group_id="g0",
    )


def one_turn(group_id: str = "g1", reward: float = -1.0) -> Trajectory:
    return Trajectory(
        token_ids=[10, 40],
        loss_mask=[0, 1],
        logprobs=[0.0, -0.7],
        versions=[-1, 2],
        prompt_length=1,
        turn_ends=[1],
        turn_rewards=[reward],
        reward=reward,
        group_id=group_id,
    )


def test_collate_pads_right_and_keeps_every_tensor_aligned_with_the_tokens():
    batch = collate([two_turns(), one_turn()], pad_token_id=PAD)
    assert batch.input_ids.tolist() == [[10, 11, 20, 21, 30, 22], [10, 40, PAD, PAD, PAD, PAD]]
    assert batch.input_ids.dtype == torch.long
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1, 0, 1], [0, 1, 0, 0, 0, 0]]
    assert batch.loss_mask.dtype == torch.float32
    assert torch.allclose(
        batch.behaviour_logprobs,
        torch.tensor([[0.0, 0.0, -0.1, -0.2, 0.0, -0.3], [0.0, -0.7, 0.0, 0.0, 0.0, 0.0]]),
    )
    assert batch.versions.tolist() == [[-1, -1, 0, 0, -1, 1], [-1, 2, -1, -1, -1, -1]]
    assert batch.lengths.tolist() == [6, 2]
    assert batch.num_tokens == 4
    assert batch.num_seqs == 2
    assert len(batch) == 2


def test_turn_rewards_sit_on_the_last_generated_token_of_each_turn():
    batch = collate([two_turns(), one_turn()], pad_token_id=PAD)
    assert batch.token_rewards.tolist() == [[0.0, 0.0, 0.0, 0.5, 0.0, 1.0], [0.0, -1.0, 0.0, 0.0, 0.0, 0.0]]
    assert batch.rewards.tolist() == [1.5, -1.0]


def test_group_index_numbers_groups_in_order_of_first_appearance():
    trajectories = [one_turn("b"), one_turn("a"), one_turn("b"), two_turns(), one_turn("a")]
    batch = collate(trajectories, pad_token_id=PAD)
    assert batch.group_index.tolist() == [0, 1, 0, 2, 1]
    assert batch.group_ids == ("b", "a", "g0")


def test_pad_to_multiple_of_rounds_the_length_up():
    assert collate([two_turns()], PAD, pad_to_multiple_of=4).input_ids.shape == (1, 8)
    assert collate([two_turns()], PAD, pad_to_multiple_of=3).input_ids.shape == (1, 6)
    assert collate([one_turn()], PAD, pad_to_multiple_of=1).input_ids.shape == (1, 2)


def test_collate_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match="no trajectories"):
        collate([], PAD)
    bad = two_turns()
    bad.logprobs = bad.logprobs[:-1]
    with pytest.raises(ValueError, match=r"Trajectory 1 \(group_id 'g0'\) is malformed: .*logprobs has 5"):
        collate([one_turn(), bad], PAD)
    off_end = two_turns()
    off_end.turn_ends = [3, 6]
    with pytest.raises(ValueError, match=r"turn_ends\[1\] = 6 is outside its 6 tokens"):
        collate([off_end], PAD)
    on_observation = two_turns()
    on_observation.turn_ends = [3, 4]
    with pytest.raises(ValueError, match=r"turn_ends\[1\] = 4 points at a token with loss_mask 0"):
        collate([on_observation], PAD)
    with pytest.raises(ValueError, match="no tokens"):
        collate([Trajectory()], PAD)
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        collate([one_turn()], PAD, pad_to_multiple_of=0)


def test_select_and_split_keep_length_group_numbering_and_the_trainers_fields():
    batch = collate([one_turn("a", 1.0), two_turns(), one_turn("a", 0.0)], PAD)
    batch.advantages = torch.arange(18, dtype=torch.float32).reshape(3, 6)

    picked = batch.select([2, 0])
    assert isinstance(picked, Batch)
    assert picked.rewards.tolist() == [0.0, 1.0]
    assert picked.group_index.tolist() == [0, 0]
    assert picked.group_ids == ("a", "g0")
    assert picked.input_ids.shape == (2, 6)
    assert picked.advantages is not None and picked.advantages[:, 0].tolist() == [12.0, 0.0]
    assert picked.returns is None  # a field the trainer did not set stays unset
    assert batch.advantages.shape == (3, 6)  # the source batch is untouched

    parts = batch.split(2)
    assert [len(p) for p in parts] == [2, 1]
    assert parts[1].group_index.tolist() == [0]
    assert parts[1].advantages is not None and parts[1].advantages[0, 0].item() == 12.0
    assert sum(p.num_tokens for p in parts) == batch.num_tokens
    assert torch.equal(torch.cat([p.input_ids for p in parts]), batch.input_ids)

    with pytest.raises(ValueError, match="micro_batch_size"):
        batch.split(0)
    with pytest.raises(IndexError, match="batch of 3"):
        batch.select([3])


def test_to_moves_every_tensor_and_keeps_the_values():
    batch = collate([two_turns()], PAD)
    batch.values = torch.ones(1, 6)
    moved = batch.to("meta")
    assert moved.input_ids.device.type == "meta"
    assert moved.values is not None and moved.values.device.type == "meta"
    assert moved.group_ids == batch.group_ids
    assert torch.equal(batch.to("cpu").input_ids, batch.input_ids)


def test_num_seqs_skips_trajectories_without_generated_tokens():
    silent = Trajectory(token_ids=[1, 2], loss_mask=[0, 0], logprobs=[0.0, 0.0], versions=[-1, -1], group_id="s")
    batch = collate([silent, one_turn()], PAD)
    assert batch.num_seqs == 1
    assert batch.num_tokens == 1


def test_module_doctests_pass():
    assert doctest.testmod(agentrl.trainers.batch).failed == 0
