import gymnasium as gym
import pytest

import agentrl
from agentrl import AgentEnv, Feedback, Message


class Hello(AgentEnv):
    """Say hello back."""

    def __init__(self, greeting: str = "hello", **kwargs):
        super().__init__(**kwargs)
        self.greeting = greeting

    def start(self, options):
        return [Message("user", self.greeting)]

    def respond(self, reply):
        return Feedback([], reward=float(self.greeting in reply.content), terminated=True)


agentrl.register("tests/Hello-v0", entry_point=Hello, kwargs={"greeting": "hi"})
agentrl.register("tests/HelloByString-v0", entry_point=f"{__name__}:Hello")


def test_make_uses_gymnasiums_registry_without_wrappers():
    env = agentrl.make("tests/Hello-v0")
    assert type(env) is Hello  # no TimeLimit / OrderEnforcing / checker wrappers hiding astep
    assert env.greeting == "hi" and env.spec.id == "tests/Hello-v0"
    assert gym.spec("tests/Hello-v0") is agentrl.spec("tests/Hello-v0")
    assert agentrl.make("tests/Hello-v0", greeting="hey", max_turns=3).greeting == "hey"
    assert type(agentrl.make("tests/HelloByString-v0")) is Hello


def test_listing_shows_message_envs_only():
    ids = agentrl.registered_ids()
    assert {"tests/Hello-v0", "tests/HelloByString-v0"} <= set(ids)
    assert "CartPole-v1" not in ids and "CartPole-v1" in agentrl.registered_ids(message_envs_only=False)
    builtins = agentrl.registered_ids("agentrl")
    assert builtins and all(i.startswith("agentrl/") for i in builtins)
    assert agentrl.describe("tests/Hello-v0") == "Say hello back."


@pytest.mark.parametrize(
    "typo, suggestion",
    [
        ("tests/Helo-v0", "tests/Hello-v0"),
        ("tests/hello-v0", "tests/Hello-v0"),
        ("agentrl/Calculater-v0", "agentrl/Calculator-v0"),
    ],
)
def test_unknown_ids_suggest_close_ones(typo, suggestion):
    with pytest.raises(agentrl.UnknownEnvError, match=f"Unknown env '{typo}'. Did you mean .*'{suggestion}'"):
        agentrl.make(typo)


def test_nothing_close_points_to_the_listing():
    with pytest.raises(agentrl.UnknownEnvError, match="Run `agentrl envs`"):
        agentrl.spec("zzz/Qqqqqq-v9")


def test_max_episode_steps_is_refused_with_the_alternative():
    with pytest.raises(ValueError, match="max_turns"):
        agentrl.register("tests/Bad-v0", entry_point=Hello, max_episode_steps=5)


def test_a_multi_agent_id_given_to_make_points_to_make_multiagent():
    with pytest.raises(agentrl.UnknownEnvError, match="make it with agentrl.make_multiagent"):
        agentrl.make("agentrl/Negotiation-v0")
    assert "agentrl/Negotiation-v0" in agentrl.multiagent_ids()
