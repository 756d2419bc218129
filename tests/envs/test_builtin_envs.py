"""What every built-in env promises: determinism, disjoint splits, robustness, async parity."""

import asyncio
import json
from typing import Any

import pytest

import agentrl
from agentrl.env import AgentEnv, StepResult
from agentrl.envs._split import TEST_FRACTION, split_of
from agentrl.types import Message

ENV_IDS = ["agentrl/Calculator-v0", "agentrl/CodeBreaker-v0", "agentrl/Countdown-v0", "agentrl/Hallway-v0"]


def task_key(env: AgentEnv) -> str:
    """The canonical key of the env's current task, as its generator wrote it."""
    name = type(env).__name__
    if name == "CalculatorEnv":
        return env.task_key  # type: ignore[attr-defined]
    if name == "CodeBreakerEnv":
        return f"codebreaker:{env.code}"  # type: ignore[attr-defined]
    if name == "HallwayEnv":
        return f"hallway:{env.rooms}:{env.room}->{env.exit}"  # type: ignore[attr-defined]
    return f"countdown:{','.join(map(str, sorted(env.numbers)))}->{env.target}"  # type: ignore[attr-defined]


def dump(messages: list[Message]) -> str:
    return json.dumps([m.to_dict() for m in messages], sort_keys=True)


GARBAGE: list[str | Message] = [
    "",
    " ",
    "hello",
    "Answer:",
    "Guess:",
    "Answer: banana",
    "Guess: abcd",
    "Answer: " + "9" * 5000,
    "Guess: " + "1" * 5000,
    "x" * 100_000,
    "<tool_call>",
    "<tool_call>{not json</tool_call>",
    '<tool_call>{"name": "calculate"}</tool_call>',
    '<tool_call>{"name": "calculate", "arguments": {"expression": 7}}</tool_call>',
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "calculate", "arguments": {"expression": "__import__(\'os\')"}}',
    '{"name": "calculate", "arguments": "{bad"}',
    '{"name": ',
    "[1, 2, 3]",
    "\x00\x01\x02",
    "🙂" * 100,
    Message("assistant", "Answer: 3"),
]


def unwrapped(env_id: str, **kwargs: Any) -> AgentEnv:
    env = agentrl.make(env_id, **kwargs)
    return env.unwrapped  # type: ignore[return-value]


def check_step(result: StepResult) -> None:
    assert result.reward in (0.0, 1.0)
    assert all(isinstance(m, Message) for m in result.observation)
    if result.terminated or result.truncated:
        assert isinstance(result.info["success"], bool)
        assert result.info["success"] == (result.reward == 1.0)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_same_seed_same_task_and_messages(env_id: str) -> None:
    a, b = unwrapped(env_id), unwrapped(env_id)
    keys = set()
    for seed in range(20):
        obs_a, _ = a.reset(seed=seed)
        obs_b, _ = b.reset(seed=seed)
        assert dump(obs_a) == dump(obs_b)
        assert task_key(a) == task_key(b)
        keys.add(task_key(a))
        step_a, step_b = a.step("Answer: 1\nGuess: 0123"), b.step("Answer: 1\nGuess: 0123")
        assert dump(step_a.observation) == dump(step_b.observation)
        assert step_a[1:] == step_b[1:]
    assert len(keys) > 15, "different seeds should give different tasks"


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_train_and_test_splits_are_disjoint(env_id: str) -> None:
    keys: dict[str, set[str]] = {}
    for split in ("train", "test"):
        env = unwrapped(env_id, split=split)
        keys[split] = set()
        for seed in range(500):
            env.reset(seed=seed)
            key = task_key(env)
            assert split_of(key) == split
            keys[split].add(key)
        assert len(keys[split]) > 250
    assert not keys["train"] & keys["test"]


def test_split_sizes_are_as_documented() -> None:
    from itertools import permutations

    codes = ["".join(p) for p in permutations("0123456789", 4)]
    share = sum(split_of(f"codebreaker:{c}") == "test" for c in codes) / len(codes)
    assert abs(share - TEST_FRACTION) < 0.03


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_unknown_split_is_a_clear_error(env_id: str) -> None:
    with pytest.raises(ValueError, match="Unknown split 'validation'.*'train', 'test'"):
        agentrl.make(env_id, split="validation")


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_garbage_never_raises(env_id: str) -> None:
    env = unwrapped(env_id)
    for i, action in enumerate(GARBAGE):
        env.reset(seed=i)
        done = False
        while not done:  # play the garbage until the episode ends, however long it allows
            result = env.step(action)
            check_step(result)
            assert result.reward == 0.0
            done = result.terminated or result.truncated


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_random_agent_from_the_action_space_never_raises(env_id: str) -> None:
    env = unwrapped(env_id)
    for seed in range(30):
        env.reset(seed=seed)
        done = False
        while not done:
            result = env.step(env.action_space.sample())
            check_step(result)
            done = result.terminated or result.truncated


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_async_methods_agree_with_sync_ones(env_id: str) -> None:
    actions = [
        '<tool_call>{"name": "calculate", "arguments": {"expression": "2 + 2"}}</tool_call>',
        "Guess: 0123",
        "Guess: 4567\nAnswer: 12",
    ]

    async def play_async(env: AgentEnv) -> list[Any]:
        obs, info = await env.areset(seed=7)
        trace: list[Any] = [dump(obs), info]
        for action in actions:
            result = await env.astep(action)
            trace += [dump(result.observation), *result[1:]]
            if result.terminated or result.truncated:
                break
        return trace

    def play_sync(env: AgentEnv) -> list[Any]:
        obs, info = env.reset(seed=7)
        trace: list[Any] = [dump(obs), info]
        for action in actions:
            result = env.step(action)
            trace += [dump(result.observation), *result[1:]]
            if result.terminated or result.truncated:
                break
        return trace

    assert asyncio.run(play_async(unwrapped(env_id))) == play_sync(unwrapped(env_id))


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_first_docstring_line_describes_the_env(env_id: str) -> None:
    description = agentrl.describe(env_id)
    assert 20 < len(description) < 120


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_system_message_states_the_answer_format(env_id: str) -> None:
    obs, _ = unwrapped(env_id).reset(seed=0)
    assert obs[0].role == "system"
    assert any(form in obs[0].content for form in ("Answer: <", "Guess: 1234", "'left' goes to"))


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_check_env(env_id: str) -> None:
    agentrl.check_env(agentrl.make(env_id))
