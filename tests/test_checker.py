"""check_env passes on every registered env and catches each kind of breach."""

import gymnasium as gym
import pytest

import agentrl
from agentrl import AgentEnv, EnvCheckError, Feedback, Message, StepResult


@pytest.mark.parametrize(
    "env_id", [pytest.param(i, marks=pytest.mark.docker) if "CodeSandbox" in i else i for i in agentrl.registered_ids()]
)
def test_every_registered_env_passes(env_id):
    if env_id == "agentrl/CodeSandbox-v0":
        from agentrl.sandboxes import DEFAULT_IMAGE, docker_available
        from agentrl.sandboxes.local import bubblewrap_problem

        if not docker_available(DEFAULT_IMAGE) and bubblewrap_problem():
            pytest.skip(f"CodeSandbox-v0 needs a sandbox: no Docker image {DEFAULT_IMAGE} and {bubblewrap_problem()}")
    for split in ("train", "test") if env_id.startswith("agentrl/") else ("train",):
        kwargs = {"split": split} if env_id.startswith("agentrl/") else {}
        agentrl.check_env(agentrl.make(env_id, **kwargs))


class Good(AgentEnv):
    """A well-behaved env."""

    def start(self, options):
        self.n = int(self.np_random.integers(1000))
        return [Message("user", f"Say {self.n}.")]

    def respond(self, reply):
        return Feedback([Message("user", "ok")], reward=float(reply.content == str(self.n)), terminated=True)


class Unseeded(Good):
    count = 0

    def start(self, options):
        Unseeded.count += 1
        return [Message("user", f"Say {Unseeded.count}.")]


class RaisesOnGarbage(Good):
    def respond(self, reply):
        return Feedback([], reward=float(int(reply.content)), terminated=True)


class ReturnsStrings(Good):
    def step(self, action):
        return StepResult(["not a message"], 0.0, True, False, {})


class IntFlags(Good):
    def step(self, action):
        result = super().step(action)
        return result._replace(terminated=1)


class AsyncDisagrees(Good):
    async def astep(self, action):
        result = self.step(action)
        return result._replace(reward=result.reward + 1)


class SpeaksAsAssistant(Good):
    def start(self, options):
        return [Message("assistant", "I am the agent.")]


class EmptyReset(Good):
    def start(self, options):
        return []


@pytest.mark.parametrize(
    "env_class, message",
    [
        (Unseeded, r"reset\(seed=0\) to give the same observation twice"),
        (RaisesOnGarbage, "to answer a bad reply with an observation, but it raised ValueError"),
        (ReturnsStrings, "to return only agentrl.Message objects; got 'not a message'"),
        (IntFlags, "to return a bool terminated; got 1"),
        (AsyncDisagrees, "areset/astep to agree with reset/step"),
        (SpeaksAsAssistant, "not to speak as the assistant"),
        (EmptyReset, "at least one message"),
    ],
)
def test_checker_catches_breaches(env_class, message):
    agentrl.check_env(Good())
    with pytest.raises(EnvCheckError, match=message):
        agentrl.check_env(env_class())


class PlainSay(gym.Env):
    """Good, as a plain gymnasium.Env: the action comes as an assistant Message."""

    observation_space = agentrl.MessagesSpace()
    action_space = agentrl.ReplySpace()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = int(self.np_random.integers(1000))
        return [Message("user", f"Say {self.n}.")], {}

    def step(self, action):
        return [Message("user", "ok")], float(action.content == str(self.n)), True, False, {}


class PlainUnseeded(PlainSay):
    def reset(self, *, seed=None, options=None):
        Unseeded.count += 1
        return [Message("user", f"Say {Unseeded.count}.")], {}


class PlainExpectsText(PlainSay):
    def step(self, action):
        return [Message("user", "ok")], float(action.strip() == str(self.n)), True, False, {}


class GymWayGood(AgentEnv):
    """Good, written the gymnasium way on AgentEnv."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = int(self.np_random.integers(1000))
        return [Message("user", f"Say {self.n}.")], {}

    def step(self, action):
        return [Message("user", "ok")], float(self.parse_reply(action).content == str(self.n)), True, False, {}


class SkipsInit(Good):
    def __init__(self):
        pass


@pytest.mark.parametrize("make", [PlainSay, GymWayGood, lambda: gym.wrappers.OrderEnforcing(PlainSay())])
def test_checker_passes_envs_written_the_gymnasium_way(make):
    agentrl.check_env(make())


@pytest.mark.parametrize(
    "env, message",
    [
        (PlainUnseeded(), r"PlainUnseeded.reset\(seed=0\) to give the same observation twice"),
        (
            PlainExpectsText(),
            r"raised AttributeError.*gets the reply as an assistant agentrl.Message; its text is .content",
        ),
        (SkipsInit(), r"SkipsInit.__init__ to call super\(\).__init__\(\)"),
        (object(), r"Expected an agentrl.AgentEnv, or a gymnasium.Env .*; got a builtins.object"),
        (Good, r"got the class .*Good: pass an instance, Good\(...\)"),
    ],
)
def test_checker_catches_breaches_of_gymnasium_style_envs(env, message):
    with pytest.raises(EnvCheckError, match=message):
        agentrl.check_env(env)


def test_checker_refuses_gymnasium_envs_that_do_not_speak_messages():
    expected = r"Expected CartPoleEnv, a gymnasium.Env, to speak messages.*got the observation array"
    with pytest.raises(EnvCheckError, match=expected):
        agentrl.check_env(gym.make("CartPole-v1"))
