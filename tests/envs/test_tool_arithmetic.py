"""ToolArithmetic-v0: the two calls win, every other path loses cleanly, and the env keeps the
promises of a built-in (determinism, disjoint splits, garbage-proof, async parity, check_env)."""

import asyncio
import json
from typing import Any

import pytest

import agentrl
from agentrl.envs._arithmetic import evaluate
from agentrl.envs._split import split_of
from agentrl.envs.tool_arithmetic import SHAPES, ToolArithmeticEnv, answer, calculate, call_text
from agentrl.tool_calls import parse_reply
from agentrl.types import Message

ENV_ID = "agentrl/ToolArithmetic-v0"


def calc(expression: str) -> str:
    return call_text("calculate", {"expression": expression})


def submit(number: Any) -> str:
    return call_text("answer", {"number": number})


def dump(messages: list[Message]) -> str:
    return json.dumps([m.to_dict() for m in messages], sort_keys=True)


def test_registered_with_three_turns() -> None:
    env = agentrl.make(ENV_ID, split="test")
    assert isinstance(env.unwrapped, ToolArithmeticEnv)
    assert env.unwrapped.max_turns == 3
    assert env.unwrapped.split == "test"
    assert 20 < len(agentrl.describe(ENV_ID)) < 120


def test_tool_schemas_are_documented() -> None:
    for tool_, parameter, kind in ((calculate, "expression", "string"), (answer, "number", "number")):
        parameters = tool_.schema["function"]["parameters"]
        assert parameters["required"] == [parameter]
        assert parameters["properties"][parameter]["type"] == kind
        assert parameters["properties"][parameter]["description"]
        assert tool_.description


def test_prompt_shows_the_exact_call_and_it_parses_to_that_call() -> None:
    env = ToolArithmeticEnv()
    for seed in range(20):
        (message,), _ = env.reset(seed=seed)
        assert message.role == "user"
        assert message.content.startswith(f"Call the calculator on {env.expression}.")
        shown = message.content.splitlines()[-1]
        assert shown == calc(env.expression)
        (call,) = parse_reply(shown).tool_calls
        assert (call.name, call.arguments, call.error) == ("calculate", {"expression": env.expression}, None)


def test_scripted_solution_wins_in_two_turns() -> None:
    env = ToolArithmeticEnv()
    for seed in range(10):
        env.reset(seed=seed)
        result = env.step(calc(env.expression))
        (tool_message,) = result.observation
        assert tool_message.role == "tool" and tool_message.name == "calculate"
        assert tool_message.content == f"{env.answer}\nNow reply with only this JSON: {submit(env.answer)}"
        assert (result.reward, result.terminated, result.truncated) == (0.0, False, False)
        assert result.info["calculated"] and not result.info["success"]
        # The model's copy of the shown line is exactly the winning reply.
        result = env.step(tool_message.content.split("JSON: ", 1)[1])
        assert (result.reward, result.terminated, result.truncated) == (1.0, True, False)
        assert result.info == {"turn": 2, "success": True, "answer": env.answer, "calculated": True}
        assert result.observation == [Message("user", "Correct!")]


def test_every_shape_appears_with_a_whole_value_beyond_mental_arithmetic() -> None:
    env = ToolArithmeticEnv()
    seen = set()
    for seed in range(200):
        env.reset(seed=seed)
        assert env.answer == evaluate(env.expression)
        assert env.answer >= 100, env.expression  # every shape multiplies two numbers of 2+ digits
        seen.add(env.shape)
    assert seen == set(SHAPES)


def test_answering_without_calculating_wins_too_the_check_is_the_number() -> None:
    env = ToolArithmeticEnv()
    env.reset(seed=1)
    result = env.step(submit(env.answer))
    assert (result.reward, result.terminated, result.info["success"], result.info["calculated"]) == (
        1.0,
        True,
        True,
        False,
    )


def test_wrong_number_scores_zero_and_ends() -> None:
    env = ToolArithmeticEnv()
    env.reset(seed=2)
    result = env.step(submit(env.answer + 1))
    assert (result.reward, result.terminated, result.info["success"]) == (0.0, True, False)
    assert result.observation[0].content == f"Incorrect: you answered {env.answer + 1}, the answer was {env.answer}."


def test_wrong_expression_gives_its_own_value_and_copying_it_loses() -> None:
    env = ToolArithmeticEnv()
    env.reset(seed=3)
    result = env.step(calc(f"{env.expression} + 1"))
    assert result.observation[0].content.startswith(f"{env.answer + 1}\n")
    assert not result.info["calculated"]
    result = env.step(submit(env.answer + 1))
    assert (result.reward, result.info["success"]) == (0.0, False)


def test_reply_without_a_call_ends_unsolved_and_says_why() -> None:
    env = ToolArithmeticEnv()
    env.reset(seed=4)
    result = env.step(f"{env.expression} = 12")
    assert (result.reward, result.terminated, result.info["success"]) == (0.0, True, False)
    text = result.observation[0].content
    assert "no tool call" in text and calc(env.expression) in text and str(env.answer) in text


@pytest.mark.parametrize(
    "reply, error",
    [
        ('{"name": "answer", "arguments": {"number": "42"}}', "expected a number"),
        ('{"name": "answer", "arguments": {"answer": 42}}', "unknown argument"),
        ('{"name": "calculate", "arguments": {"expression": "1/0"}}', "division by zero"),
        ('{"name": "solve", "arguments": {"x": 1}}', "solve"),
    ],
)
def test_malformed_calls_get_an_error_and_the_episode_goes_on(reply: str, error: str) -> None:
    env = ToolArithmeticEnv()
    env.reset(seed=5)
    result = env.step(reply)
    (message,) = result.observation
    assert message.role == "tool" and message.content.startswith("Error:") and error in message.content
    assert "Now reply" not in message.content
    assert (result.reward, result.terminated, result.truncated) == (0.0, False, False)


def test_an_answer_in_the_same_reply_as_a_calculation_is_graded() -> None:
    env = ToolArithmeticEnv()
    env.reset(seed=6)
    result = env.step(f"<tool_call>\n{calc('1 + 1')}\n</tool_call>\n<tool_call>\n{submit(env.answer)}\n</tool_call>")
    assert (result.reward, result.terminated, result.info["success"]) == (1.0, True, True)


def test_replies_run_out_after_max_turns() -> None:
    env = ToolArithmeticEnv()
    env.reset(seed=7)
    results = [env.step(calc(env.expression)) for _ in range(3)]
    assert [(r.terminated, r.truncated) for r in results] == [(False, False), (False, False), (False, True)]
    assert results[-1].info["success"] is False and results[-1].reward == 0.0


def test_call_reward_is_paid_once_and_a_success_still_totals_one() -> None:
    env = ToolArithmeticEnv(call_reward=0.25)
    env.reset(seed=8)
    rewards = [env.step(calc(env.expression)).reward, env.step(calc(env.expression)).reward]
    rewards.append(env.step(submit(env.answer)).reward)
    assert rewards == [0.25, 0.0, 0.75]
    env.reset(seed=8)
    wrong = env.step(calc(f"{env.expression} - 1"))
    assert wrong.reward == 0.0
    assert env.step(submit(env.answer)).reward == 1.0  # no call reward was paid, so the full 1.0


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2.0])
def test_call_reward_outside_zero_one_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match=r"call_reward must be in \[0, 1\)"):
        ToolArithmeticEnv(call_reward=bad)


def test_same_seed_same_task_and_different_seeds_differ() -> None:
    a, b = ToolArithmeticEnv(), ToolArithmeticEnv()
    expressions = set()
    for seed in range(30):
        assert dump(a.reset(seed=seed)[0]) == dump(b.reset(seed=seed)[0])
        assert a.step(calc("2 * 3"))[:4] == b.step(calc("2 * 3"))[:4]
        expressions.add(a.expression)
    assert len(expressions) > 25


def test_train_and_test_splits_are_disjoint() -> None:
    keys: dict[str, set[str]] = {}
    for split in ("train", "test"):
        env = ToolArithmeticEnv(split=split)
        keys[split] = set()
        for seed in range(400):
            env.reset(seed=seed)
            assert split_of(f"tool_arithmetic:{env.expression}") == split
            keys[split].add(env.expression)
        assert len(keys[split]) > 380  # tens of thousands of tasks: repeats are rare
    assert not keys["train"] & keys["test"]


def test_unknown_split_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="Unknown split 'validation'"):
        agentrl.make(ENV_ID, split="validation")


GARBAGE: list[str | Message] = [
    "",
    "hello",
    "Answer: 42",
    "x" * 100_000,
    "<tool_call>{not json</tool_call>",
    '{"name": "answer"}',
    '{"name": "answer", "arguments": {"number": 1e400}}',
    '{"name": "answer", "arguments": {"number": null}}',
    '{"name": "calculate", "arguments": {"expression": "9 ** 9 ** 9"}}',
    '{"name": "calculate", "arguments": {"expression": "__import__(\'os\')"}}',
    '{"name": ',
    "[1, 2, 3]",
    "\x00\x01",
    Message("assistant", "42"),
]


@pytest.mark.parametrize("action", GARBAGE)
def test_garbage_never_raises_and_never_pays(action: str | Message) -> None:
    env = ToolArithmeticEnv(call_reward=0.5)
    env.reset(seed=9)
    done = False
    while not done:
        result = env.step(action)
        assert result.reward == 0.0
        done = result.terminated or result.truncated
    assert result.info["success"] is False


def test_random_agent_never_raises() -> None:
    env = ToolArithmeticEnv()
    for seed in range(30):
        env.reset(seed=seed)
        done = False
        while not done:
            result = env.step(env.action_space.sample())
            assert result.reward in (0.0, 1.0)
            done = result.terminated or result.truncated
        assert isinstance(result.info["success"], bool)


def test_async_methods_agree_with_sync_ones() -> None:
    actions = [calc("12 * 3"), "chatter", submit(36)]

    async def play_async(env: ToolArithmeticEnv) -> list[Any]:
        obs, info = await env.areset(seed=11)
        trace: list[Any] = [dump(obs), info]
        for action in actions:
            result = await env.astep(action)
            trace += [dump(result.observation), *result[1:]]
            if result.terminated or result.truncated:
                break
        return trace

    def play_sync(env: ToolArithmeticEnv) -> list[Any]:
        obs, info = env.reset(seed=11)
        trace: list[Any] = [dump(obs), info]
        for action in actions:
            result = env.step(action)
            trace += [dump(result.observation), *result[1:]]
            if result.terminated or result.truncated:
                break
        return trace

    assert asyncio.run(play_async(ToolArithmeticEnv())) == play_sync(ToolArithmeticEnv())


def test_check_env() -> None:
    agentrl.check_env(agentrl.make(ENV_ID))
    agentrl.check_env(agentrl.make(ENV_ID, split="test", call_reward=0.2))
