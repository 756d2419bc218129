"""OpenEnv interoperability on loopback, both ways, with ``openenv-core``'s own server and client."""

from __future__ import annotations

import asyncio

import pytest

import agentrl
from agentrl.build import build_rollout
from agentrl.policies import Sampling
from agentrl.rollout import EpisodeLimits, RolloutSettings
from agentrl.server import OpenEnvEnv, ServerLimits, ServerThread, add_openenv_routes, make_app
from agentrl.testing import ScriptedPolicy

pytest.importorskip("openenv.core", reason="openenv-core is a dev dependency (pip install -e .[dev])")
from openenv.core.env_server import Action, Environment, Observation, State, create_app  # noqa: E402
from openenv.core.generic_client import GenericEnvClient  # noqa: E402

CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "6*7"}}</tool_call>'


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    prompt: str = ""


class GuessEnv(Environment):
    """An OpenEnv text env: guess a number from 0 to 9 in three tries; the seed picks the number."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id="0", step_count=0)
        self.number = 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.number = (seed or 0) * 7 % 10
        self._state = State(episode_id=episode_id or str(seed), step_count=0)
        return GuessObservation(prompt="Guess my number, 0 to 9.", reward=0.0)

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        right = action.message.strip() == str(self.number)
        done = right or self._state.step_count >= 3
        hint = "Right!" if right else ("higher" if action.message.strip() < str(self.number) else "lower")
        return GuessObservation(prompt=hint, reward=1.0 if right else 0.0, done=done)

    @property
    def state(self):
        return self._state


@pytest.fixture(scope="module")
def openenv_server():
    app = create_app(GuessEnv, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=16)
    with ServerThread(app) as url:
        yield url


def test_an_openenv_server_is_an_agentrl_env_that_passes_check_env(openenv_server):
    env = OpenEnvEnv(openenv_server, action_field="message", observation_field="prompt", system_prompt="Play.")
    agentrl.check_env(env)
    observation, _ = env.reset(seed=3)
    assert [m.role for m in observation] == ["system", "user"] and observation[1].content == "Guess my number, 0 to 9."
    assert env.step("5").observation[0].content == "lower"  # 3 * 7 % 10 = 1
    step = env.step("1")
    assert (step.observation[0].content, step.reward, step.terminated) == ("Right!", 1.0, True)
    env.close()


def test_an_openenv_env_trains_through_the_rollout_engine(openenv_server, tiny_tokenizer):
    if "test/OpenEnvGuess-v0" not in agentrl.registered_ids():
        agentrl.register(
            "test/OpenEnvGuess-v0", OpenEnvEnv, kwargs={"url": openenv_server, "observation_field": "prompt"}
        )
    engine = build_rollout(RolloutSettings("test/OpenEnvGuess-v0", group_size=2, limits=EpisodeLimits(max_turns=3), sampling=Sampling(max_tokens=8)), ScriptedPolicy(tiny_tokenizer, "1"))  # fmt: skip
    trajectories = asyncio.run(engine.collect(num_groups=4))
    engine.close()
    assert len(trajectories) == 8 and all(t.error is None for t in trajectories)
    # The number is seed * 7 % 10: "1" is right for the seeds ending in 3, wrong three times otherwise.
    assert {t.reward for t in trajectories} <= {0.0, 1.0} and all(t.turns in (1, 3) for t in trajectories)


@pytest.fixture(scope="module")
def agentrl_server():
    app = add_openenv_routes(make_app(["agentrl/Calculator-v0"], limits=ServerLimits(max_sessions=2)))
    with ServerThread(app) as url:
        yield url


def test_an_openenv_client_plays_an_agentrl_env(agentrl_server):
    async def play():
        async with GenericEnvClient(base_url=f"{agentrl_server}/openenv/agentrl/Calculator-v0") as client:
            first = await client.reset(seed=0)
            step = await client.step({"message": CALL})
            state = await client.state()
            return first, step, state

    first, step, state = asyncio.run(play())
    local = agentrl.make("agentrl/Calculator-v0").unwrapped
    assert first.observation["messages"] == [m.to_dict() for m in local.reset(seed=0)[0]]
    assert (first.reward, first.done) == (0.0, False)
    (tool,) = step.observation["messages"]
    assert tool["role"] == "tool" and "42" in tool["content"] and step.done is False
    assert state["step_count"] == 1


def test_openenv_clients_get_openenv_errors_and_the_server_limits(agentrl_server):
    from openenv.core.env_client import EnvClient

    async def play():
        base = f"{agentrl_server}/openenv/agentrl/Calculator-v0"
        async with GenericEnvClient(base_url=base) as a, GenericEnvClient(base_url=base) as b:
            await a.reset(seed=0)
            with pytest.raises(RuntimeError, match="message"):
                await a.step({"reply": "wrong field"})
            with pytest.raises(RuntimeError, match="seed must be an integer >= 0, got -1"):  # not the env's error
                await a.reset(seed=-1)
            await b.reset(seed=1)
            third = GenericEnvClient(base_url=base)
            with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
                await third.reset(seed=2)
            await third.close()
        async with GenericEnvClient(base_url=f"{agentrl_server}/openenv/agentrl/Nope-v0") as c:
            with pytest.raises(RuntimeError, match="FACTORY_ERROR"):
                await c.reset()

    assert issubclass(GenericEnvClient, EnvClient)
    asyncio.run(play())
