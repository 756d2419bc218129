"""A trivially learnable env for training tests: reward = the share of the letter ``a`` in the reply.

A random tiny model writes random bytes; policy gradient on this reward must raise the probability
of tokens made of ``a`` within a few steps. Imported by the training tests (and by ``agentrl
train`` subprocesses through ``imports: [learnable_env]`` with this folder on ``PYTHONPATH``).
"""

from __future__ import annotations

from typing import Any

import agentrl
from agentrl.env import AgentEnv, Feedback
from agentrl.types import Message

ENV_ID = "tests/SayA-v0"


class SayA(AgentEnv):
    """Say the letter a, as many times as you can."""

    def __init__(self, split: str = "train", max_turns: int = 1, delay: float = 0.0):
        super().__init__(max_turns=max_turns)
        self.split = split
        self.delay = delay

    def start(self, options: dict[str, Any] | None) -> list[Message]:
        word = ["a", "aa", "aaa"][int(self.np_random.integers(3))]
        return [Message("user", f"Say {word}")]

    def respond(self, reply: Message) -> Feedback:
        if self.delay:
            import time

            time.sleep(float(self.np_random.lognormal(0.0, 1.0)) * self.delay)
        text = reply.content
        share = text.count("a") / max(len(text), 1)
        return Feedback([], reward=share, terminated=True, info={"success": share >= 0.5})


if ENV_ID not in agentrl.registered_ids():
    agentrl.register(ENV_ID, entry_point=f"{__name__}:SayA")
