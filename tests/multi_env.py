"""A two-agent env for multi-policy training tests: ``sayer_a`` is rewarded for the letter a,
``sayer_b`` for e, each by the share of its letter in its own reply (so each policy's reward
depends only on what it wrote). Two rounds: each agent is rewarded at each of its turns, and sees
what the other wrote. A random tiny model writes random bytes; policy gradient raises both shares
within a few steps. ``slow``: seconds each step of a "Say aaa" episode takes (a long tail).
"""

from __future__ import annotations

import time
from typing import Any

from pettingzoo import ParallelEnv

from agentrl.env import MessagesSpace, ReplySpace
from agentrl.multiagent import MessageList, multiagent_ids, register_multiagent
from agentrl.types import Message

ENV_ID = "tests/SayLetters-v0"
LETTERS = {"sayer_a": "a", "sayer_b": "e"}


class SayLetters(ParallelEnv):
    metadata: dict[str, Any] = {"name": "say_letters_v0"}

    def __init__(self, split: str = "train", rounds: int = 2, slow: float = 0.0):
        self.split, self.rounds, self.slow = split, rounds, slow
        self.possible_agents = list(LETTERS)
        self.agents: list[str] = []
        self._observation = {a: MessagesSpace() for a in LETTERS}
        self._action = {a: ReplySpace() for a in LETTERS}

    def observation_space(self, agent: str) -> MessagesSpace:
        return self._observation[agent]

    def action_space(self, agent: str) -> ReplySpace:
        return self._action[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.agents, self.round = list(LETTERS), 0
        count = self.count = 1 + (seed or 0) % 3
        observations = {a: MessageList([Message("user", f"Say {letter * count}")]) for a, letter in LETTERS.items()}
        return observations, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> Any:
        if self.count == 3:
            time.sleep(self.slow)
        self.round += 1
        texts = {a: getattr(actions[a], "content", actions[a]) for a in self.agents}
        rewards = {a: texts[a].count(LETTERS[a]) / max(len(texts[a]), 1) for a in self.agents}
        done = self.round >= self.rounds
        other = {"sayer_a": "sayer_b", "sayer_b": "sayer_a"}
        observations = {
            a: MessageList([] if done else [Message("user", f"The other said: {texts[other[a]][:20]!r}. Again.")])
            for a in self.agents
        }
        infos = {a: {"success": rewards[a] >= 0.5} for a in self.agents}
        agents = list(self.agents)
        if done:
            self.agents = []
        return observations, rewards, dict.fromkeys(agents, done), dict.fromkeys(agents, False), infos


if ENV_ID not in multiagent_ids():
    register_multiagent(ENV_ID, SayLetters)


def reward_other(episode: dict[str, Any], weight: float = 1.0) -> dict[str, float]:
    """A reward that depends on the other agent (a test of reward_fn): each agent's return is its
    own env return plus ``weight`` times the other's."""
    a, b = episode["sayer_a"].reward, episode["sayer_b"].reward
    return {"sayer_a": a + weight * b, "sayer_b": b + weight * a}


def first_turn_only(episode: dict[str, Any]) -> list[Any]:
    """Training samples cut to each agent's first turn (a test of samples_fn)."""
    from agentrl.agents.trajectory import first_turns

    return [first_turns(t, 1) for t in episode.values()]


def count_report(policy_id: str, samples: list[Any], previous: list[Any], scale: float = 1.0) -> dict[str, float]:
    """A report of each step (a test of metrics_fn): its samples (times ``scale``) and how many
    reports of the policy came before; sayer_b's turn count is no number, so its report fails."""
    if policy_id == "sayer_b" and previous:
        return {"batch/turns": "many"}  # type: ignore[dict-item]
    return {"batch/samples": scale * len(samples), "batch/previous": float(len(previous))}


def flat_for_sayer_a(episode: dict[str, Any]) -> dict[str, float]:
    """sayer_a's every episode scores 1 (its groups carry no signal: a test of the filter
    curriculum); sayer_b keeps the env's rewards."""
    return {"sayer_a": 1.0}


ONE_ROUND_ID = "tests/SayLettersOnce-v0"
"""The same game in one round: the clearest signal, for the tests that ask whether policies learn."""

if ONE_ROUND_ID not in multiagent_ids():
    register_multiagent(ONE_ROUND_ID, SayLetters, {"rounds": 1})
