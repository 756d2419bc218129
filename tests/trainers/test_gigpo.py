"""GiGPO (Feng et al. 2025): step returns, step groups over anchor states, the combined advantage,
each against values computed by hand; the anchor states a rollout records; a training step with it."""

from __future__ import annotations

import math

import pytest
import torch

import agentrl
from agentrl import AgentEnv, Feedback, Message, Trajectory
from agentrl.agents import ChatAgent, TrajectoryBuilder
from agentrl.agents.trajectory import observation_key
from agentrl.config import load_config
from agentrl.testing import ScriptedPolicy
from agentrl.train import TrainConfig, train
from agentrl.trainers.advantages import (
    discounted_turn_returns,
    estimate_advantages,
    gigpo_advantages,
    step_group_advantages,
)
from agentrl.trainers.batch import collate


def test_step_returns_are_discounted_per_turn_and_zero_past_the_end():
    rewards = torch.tensor([[0.0, 1.0, 2.0], [3.0, 9.0, 9.0]])
    returns = discounted_turn_returns(rewards, torch.tensor([3, 1]), gamma=0.5)
    # row 0: G2 = 2, G1 = 1 + 0.5 * 2 = 2, G0 = 0 + 0.5 * 2 = 1; row 1 has one turn: G0 = 3, the rest 0
    assert returns.tolist() == [[1.0, 2.0, 2.0], [3.0, 0.0, 0.0]]


def test_step_groups_are_the_turns_of_one_group_that_answered_the_same_state():
    # Group 0: three episodes; state 7 is seen by A (turn 0), B (turn 0) and C (turn 1); state 8 by A
    # (turn 1) and B (turn 1); state 9 only by C (turn 0). Group 1 also sees state 7, separately.
    returns = torch.tensor([[1.0, 2.0], [0.0, 4.0], [5.0, 3.0], [10.0, 0.0]])
    states = torch.tensor([[7, 8], [7, 8], [9, 7], [7, -1]])
    group = torch.tensor([0, 0, 0, 1])
    unscaled = step_group_advantages(returns, states, group, scale="none")
    # state 7 in group 0: returns 1, 0, 3 -> mean 4/3; state 8: 2, 4 -> mean 3; state 9 and group 1's
    # state 7 are alone in their step groups: 0; state -1: 0.
    expected = [[1 - 4 / 3, 2 - 3], [0 - 4 / 3, 4 - 3], [0.0, 3 - 4 / 3], [0.0, 0.0]]
    assert torch.allclose(unscaled, torch.tensor(expected))
    scaled = step_group_advantages(returns, states, group, scale="group")
    std7 = math.sqrt(((1 - 4 / 3) ** 2 + (4 / 3) ** 2 + (3 - 4 / 3) ** 2) / 2)  # unbiased, as group_advantages
    std8 = math.sqrt(((2 - 3) ** 2 + (4 - 3) ** 2) / 1)
    assert scaled[0, 0].item() == pytest.approx((1 - 4 / 3) / (std7 + 1e-6), rel=1e-5)
    assert scaled[1, 1].item() == pytest.approx(1 / (std8 + 1e-6), rel=1e-5)
    assert scaled[2, 0].item() == 0.0 and scaled[3, 0].item() == 0.0


def test_the_advantage_is_the_episode_ones_plus_the_weighted_step_ones():
    episode = torch.tensor([1.0, 0.0])
    step = torch.tensor([[1.0, 1.0], [0.0, 0.5]])
    states = torch.tensor([[0, 1], [0, 1]])
    combined = gigpo_advantages(episode, step, states, torch.tensor([2, 1]), torch.tensor([0, 0]),
                                step_weight=0.5, scale="none")  # fmt: skip
    # episode level: +0.5 / -0.5; step level at state 0: 1 vs 0 -> +0.5 / -0.5; at state 1 only row 0
    # has a turn (row 1 has one turn): 0. Row 1's turn 1 does not exist: 0.
    assert combined.tolist() == [[0.5 + 0.5 * 0.5, 0.5], [-0.5 - 0.5 * 0.5, 0.0]]


def trajectory(group: str, turns: list[tuple[str, float]]) -> Trajectory:
    """A trajectory of one prompt token, then per turn two generated tokens and one observation token."""
    t = Trajectory(token_ids=[1], loss_mask=[0], logprobs=[0.0], versions=[-1], prompt_length=1, group_id=group)
    for state, reward in turns:
        t.token_ids += [2, 3, 4]
        t.loss_mask += [1, 1, 0]
        t.logprobs += [-1.0, -1.0, 0.0]
        t.versions += [0, 0, -1]
        t.turn_ends.append(len(t.token_ids) - 2)
        t.turn_rewards.append(reward)
        t.turn_states.append(state)
    t.reward = sum(r for _, r in turns)
    t.turns = len(turns)
    return t


def test_the_estimator_gives_each_turns_tokens_its_advantage():
    batch = collate([trajectory("g", [("s0", 0.0), ("s1", 1.0)]), trajectory("g", [("s0", 0.0), ("s2", 0.0)])], 0)
    advantages = estimate_advantages("gigpo", batch, scale="none", step_weight=1.0).advantages
    # episode returns 1 and 0: +-0.5. Step: state s0 shared, returns to go 1 and 0: +-0.5; s1, s2 alone: 0.
    assert advantages[0].tolist() == [0.0, 1.0, 1.0, 0.0, 0.5, 0.5, 0.0]
    assert advantages[1].tolist() == [0.0, -1.0, -1.0, 0.0, -0.5, -0.5, 0.0]
    recorded = collate(
        [trajectory("g", [("s0", 1.0)]), Trajectory(**{**trajectory("g", [("x", 0.0)]).__dict__, "turn_states": []})], 0
    )
    assert recorded.turn_states.tolist() == [[0], [-1]]  # a trajectory without states: no step group


def test_a_rollout_records_each_turns_state_from_the_env_or_the_observation(tiny_tokenizer):
    builder = TrajectoryBuilder(ChatAgent(tiny_tokenizer))
    builder.start([Message("user", "where am I?")])
    builder.add_turn([5, tiny_tokenizer.eos_token_id], [-1.0, -1.0], 0)
    builder.add_observation([Message("user", "a room")], state_key="room-1")
    builder.add_turn([6, tiny_tokenizer.eos_token_id], [-1.0, -1.0], 0)
    builder.add_final_observation([])
    t = builder.finish()
    assert t.turn_states == [observation_key([Message("user", "where am I?")]), "room-1"]
    assert (
        observation_key([Message("user", "a")])
        == observation_key([Message("user", "a")])
        != observation_key([Message("user", "b")])
    )


class Corridor(AgentEnv):
    """Walk to the end of a corridor of three rooms: say 'forward' to move, anything else stays."""

    def __init__(self, split: str = "train"):
        super().__init__(max_turns=4)

    def start(self, options):
        self.room = 0
        return [Message("user", "You are in room 0. Say forward.")]

    def respond(self, reply):
        self.room += "forward" in reply.content
        done = self.room == 2
        return Feedback([Message("user", f"You are in room {self.room}.")], reward=float(done), terminated=done,
                        info={"state_key": f"room-{self.room}"})  # fmt: skip


def test_a_training_step_with_gigpo_uses_the_rooms_as_anchor_states(tiny_model_dir, tiny_tokenizer, tmp_path):
    if "tests/Corridor-v0" not in agentrl.registered_ids():
        agentrl.register("tests/Corridor-v0", Corridor)
    calls = iter(range(10_000))
    policy = ScriptedPolicy(tiny_tokenizer, lambda prompt: "forward" if next(calls) % 3 else "wait")
    config = load_config(TrainConfig, None, [
        "rollout.env_id=tests/Corridor-v0", f"rollout.model={tiny_model_dir}", "rollout.backend=hf",
        "rollout.group_size=4", "rollout.max_tokens=4", "rollout.max_turns=4", "trainer.algorithm=gigpo",
        "trainer.gamma=0.9", "trainer.step_weight=1.0", "trainer.micro_batch_size=4", "groups_per_step=1",
        "steps=2", "eval_episodes=0", "checkpoint_every=0", "export=false", "torch_threads=1",
        f"run_dir={tmp_path / 'run'}",
    ])  # fmt: skip
    result = train(config, policy=policy)
    assert result.steps == 2
    samples = [
        json for json in agentrl.dashboard.read_trajectories(tmp_path / "run" / "samples" / "train-000001.jsonl")
    ]
    assert all(set(s["turn_states"][1:]) <= {"room-0", "room-1", "room-2"} for s in samples)
    assert any(a != 0 for s in samples for a in s["advantages"])
