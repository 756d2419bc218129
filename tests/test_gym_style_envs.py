"""Envs written the gymnasium way: checked by check_env and played by the rollout.

Two styles besides ``start`` / ``respond``: an :class:`~agentrl.AgentEnv` subclass that overrides
``reset`` / ``step`` (seeding with ``super().reset(seed=seed)``), and a plain ``gymnasium.Env``
whose observations are lists of Message, which :func:`~agentrl.env.as_agent_env` adapts. Each is
made directly, through ``gymnasium.make`` of a plain ``gymnasium.register`` (which adds gymnasium's
checking wrappers) and, for the plain one, through ``agentrl.register`` / ``agentrl.make``.
"""

import asyncio
import threading

import gymnasium as gym
import pytest

import agentrl
from agentrl import AgentEnv, Message, MessagesSpace, ReplySpace
from agentrl.agents import ChatAgent
from agentrl.env import GymnasiumAdapter, as_agent_env
from agentrl.rollout import EpisodeLimits, RolloutSettings, SingleAgentRollout
from agentrl.testing import ScriptedPolicy
from agentrl.tools import as_tool, call_tool

WORDS = ["apple", "pear", "plum", "quince"]


class PlainWord(gym.Env):
    """Say the word you are given; a `spell` tool helps (a plain gymnasium.Env)."""

    observation_space = MessagesSpace()
    action_space = ReplySpace()
    tool_format = "hermes"

    def __init__(self, max_turns: int | None = None):
        self.max_turns = max_turns
        self.closed = False
        self.actions: list[object] = []

    def spell(self, word: str) -> str:
        """Spell a word letter by letter.

        Args:
            word: The word to spell.
        """
        return "spelled: " + " ".join(word)

    tools = (spell,)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        return [Message("user", f"Say {self.word}.")], {}

    def step(self, action):
        self.actions.append(action)
        if action.tool_calls:  # a plain gymnasium env answers its own tool calls
            spell = as_tool(self.spell)
            answers = [call_tool({spell.name: spell}, call).to_message() for call in action.tool_calls]
            return answers, 0.0, False, False, {}
        won = action.content.strip() == self.word
        return [Message("user", "Right." if won else "Wrong.")], float(won), True, False, {"success": won}

    def close(self):
        self.closed = True


class GymWayWord(AgentEnv):
    """The same task on AgentEnv, written the gymnasium way (reset / step overridden)."""

    tool_format = "hermes"

    def spell(self, word: str) -> str:
        """Spell a word letter by letter.

        Args:
            word: The word to spell.
        """
        return "spelled: " + " ".join(word)

    tools = (spell,)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        return [Message("user", f"Say {self.word}.")], {}

    def step(self, action):
        reply = self.parse_reply(action)
        if reply.tool_calls:
            by_name = {t.name: t for t in self.tools}
            return [call_tool(by_name, call).to_message() for call in reply.tool_calls], 0.0, False, False, {}
        won = reply.content.strip() == self.word
        return [Message("user", "Right." if won else "Wrong.")], float(won), True, False, {"success": won}


@pytest.fixture(scope="module")
def registered():
    """The two envs registered the gymnasium way and the agentrl way; removed afterwards."""
    ids = {
        "tests/PlainWordGym-v0": lambda: gym.register("tests/PlainWordGym-v0", PlainWord),
        "tests/PlainWordAgentrl-v0": lambda: agentrl.register("tests/PlainWordAgentrl-v0", PlainWord),
        "tests/GymWayWordGym-v0": lambda: gym.register("tests/GymWayWordGym-v0", GymWayWord),
    }
    for register in ids.values():
        register()
    yield
    for env_id in ids:
        del gym.registry[env_id]


MAKERS = {
    "plain": PlainWord,
    "gym-way": GymWayWord,
    "plain via gymnasium.make": lambda: gym.make("tests/PlainWordGym-v0"),
    "plain via agentrl.make": lambda: agentrl.make("tests/PlainWordAgentrl-v0"),
    "gym-way via gymnasium.make": lambda: gym.make("tests/GymWayWordGym-v0"),
}


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_both_styles_pass_check_env(make, registered):
    agentrl.check_env(make())


def spell_then_say(prompt: str) -> str:
    """Call `spell` on the word first, then say it."""
    word = prompt.split("Say ")[1].split(".")[0]
    if "spelled:" in prompt:
        return word
    return f'<tool_call>{{"name": "spell", "arguments": {{"word": "{word}"}}}}</tool_call>'


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_both_styles_run_in_the_rollout_engine(make, registered, tiny_tokenizer):
    probe = as_agent_env(make())
    agent = ChatAgent.from_env(tiny_tokenizer, probe)
    assert agent.tool_format == "hermes" and [s["function"]["name"] for s in agent.tool_schemas] == ["spell"]
    assert "self" not in agent.tool_schemas[0]["function"]["parameters"]["properties"]
    made = []

    def make_env():
        made.append(as_agent_env(make()))
        return made[-1]

    policy = ScriptedPolicy(tiny_tokenizer, spell_then_say)
    engine = SingleAgentRollout(
        make_env, agent, policy, RolloutSettings(env_id="tests/Word", group_size=2, limits=EpisodeLimits(max_turns=4))
    )
    trajectories = asyncio.run(engine.collect(num_groups=3))
    engine.close()
    assert len(trajectories) == 6
    for t in trajectories:
        t.validate()
        assert (t.error, t.reward, t.turns, t.terminated, t.info["success"]) == (None, 1.0, 2, True, True)
        call, answer = t.messages[1], t.messages[2]
        assert call.tool_calls[0].name == "spell" and answer.role == "tool" and answer.content.startswith("spelled: ")
    assert engine.stats.summary()["rollout/success_rate"] == 1.0
    assert all(isinstance(env, AgentEnv) for env in made)


def test_as_agent_env_keeps_an_agent_env_and_sees_through_gymnasium_checks(registered):
    env = GymWayWord()
    assert as_agent_env(env) is env
    wrapped = gym.make("tests/GymWayWordGym-v0")
    assert isinstance(wrapped, gym.wrappers.OrderEnforcing)  # what plain gymnasium.register gives
    assert as_agent_env(wrapped) is wrapped.unwrapped


def test_as_agent_env_adapts_a_plain_gymnasium_env():
    inner = PlainWord(max_turns=5)
    env = as_agent_env(inner)
    assert isinstance(env, GymnasiumAdapter) and env.env is inner
    assert [t.name for t in env.tools] == ["spell"] and env.tool_format == "hermes" and env.max_turns == 5
    assert env.action_space.tools == env.tools  # random replies call the env's tools

    observation, info = env.reset(seed=3)
    assert (observation, info) == inner.reset(seed=3) and env.np_random is inner.np_random
    result = env.step("pear")
    assert isinstance(result, agentrl.StepResult)
    assert inner.actions[-1] == Message("assistant", "pear")  # always a Message, even from text

    def play():
        async def run():
            first = await env.areset(seed=3)
            return first, await env.astep(f"{inner.word}"), threading.current_thread().name

        return asyncio.run(run())

    steps = []
    original = inner.step
    inner.step = lambda action: steps.append(threading.current_thread().name) or original(action)
    first, last, loop_thread = play()
    assert isinstance(first, agentrl.ResetResult) and first.observation == observation
    assert isinstance(last, agentrl.StepResult) and last.reward == 1.0
    assert steps and loop_thread not in steps  # step ran in ENV_THREADS, not on the loop
    env.close()
    assert inner.closed


def test_as_agent_env_keeps_other_wrappers(registered):
    for wrapped in (
        gym.wrappers.TransformReward(gym.make("tests/PlainWordGym-v0"), lambda r: 10 * r),
        gym.wrappers.TransformReward(GymWayWord(), lambda r: 10 * r),
    ):
        env = as_agent_env(wrapped)
        assert isinstance(env, GymnasiumAdapter) and env.env is wrapped
        assert [t.name for t in env.tools] == ["spell"]  # read through the wrappers
        env.reset(seed=0)
        assert env.step(wrapped.unwrapped.word).reward == 10.0

        async def play(env=env, wrapped=wrapped):
            await env.areset(seed=0)
            return await env.astep(wrapped.unwrapped.word)

        assert asyncio.run(play()).reward == 10.0


class FakeMultiAgentEnv:
    possible_agents = ("a", "b")


@pytest.mark.parametrize(
    "value, message",
    [
        (
            object(),
            r"Expected an agentrl.AgentEnv, or a gymnasium.Env whose observations .*; got a builtins.object: subclass agentrl.AgentEnv",
        ),
        (PlainWord, r"got the class .*PlainWord: pass an instance, PlainWord\(...\)"),
        (FakeMultiAgentEnv(), r"multi-agent \(PettingZoo\) env; make it with agentrl.make_multiagent"),
    ],
)
def test_as_agent_env_says_what_it_expected(value, message):
    with pytest.raises(TypeError, match=message):
        as_agent_env(value)


def test_a_malformed_result_is_named_on_the_async_path():
    class FourTuple(PlainWord):
        def step(self, action):
            return [], 0.0, True, {}  # gymnasium's old four-tuple

    env = as_agent_env(FourTuple())
    env.reset(seed=0)
    assert len(env.step("x")) == 4  # the sync path hands it on for check_env to describe
    with pytest.raises(
        TypeError, match=r"Expected FourTuple.step to return \(observation, reward, terminated, truncated, info\)"
    ):
        asyncio.run(env.astep("x"))
    with pytest.raises(agentrl.EnvCheckError, match="to return \\(observation, reward, terminated, truncated, info\\)"):
        agentrl.check_env(FourTuple())
