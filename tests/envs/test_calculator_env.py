"""Calculator-v0: the tool works through the env, right answers win, wrong and missing ones do not."""

import re

import pytest

from agentrl.envs._arithmetic import format_number
from agentrl.envs.calculator import TEMPLATES, CalculatorEnv, calculate, parse_answer
from agentrl.tool_calls import format_tool_calls
from agentrl.types import ToolCall


def call(expression: str) -> str:
    return format_tool_calls([ToolCall("calculate", {"expression": expression})])


def test_tool_schema_is_documented() -> None:
    parameters = calculate.schema["function"]["parameters"]
    assert parameters["required"] == ["expression"]
    assert parameters["properties"]["expression"]["type"] == "string"
    assert parameters["properties"]["expression"]["description"]
    assert calculate.description.startswith("Evaluate an arithmetic expression")


def test_scripted_solution_wins() -> None:
    env = CalculatorEnv()
    for seed in range(10):
        obs, _ = env.reset(seed=seed)
        assert [m.role for m in obs] == ["system", "user"]
        result = env.step(call("(3 + 4) * 6"))
        assert [(m.role, m.content) for m in result.observation] == [("tool", "42")]
        assert result.observation[0].tool_call_id == "call_0"
        assert (result.reward, result.terminated, result.truncated) == (0.0, False, False)
        result = env.step(f"The tool says so.\nAnswer: {format_number(env.answer)}")
        assert (result.reward, result.terminated, result.info["success"]) == (1.0, True, True)


def test_every_template_gives_a_whole_non_negative_answer_in_the_question_numbers() -> None:
    env = CalculatorEnv()
    seen = set()
    for seed in range(300):
        env.reset(seed=seed)
        seen.add(env.task_key.split(":")[1])
        assert env.answer >= 0 and env.answer == int(env.answer), env.question
        key_numbers = env.task_key.split(":")[2].split(",")
        assert all(re.search(rf"\b{n}\b", env.question) for n in key_numbers), env.question
    assert seen == set(TEMPLATES)


def test_several_tool_calls_in_one_reply() -> None:
    env = CalculatorEnv()
    env.reset(seed=0)
    calls = [ToolCall("calculate", {"expression": "1 + 1"}), ToolCall("calculate", {"expression": "1/0"})]
    result = env.step(format_tool_calls(calls))
    assert [m.content for m in result.observation] == ["2", "Error: division by zero"]
    assert not result.terminated


def test_attack_through_the_tool_is_an_error_observation() -> None:
    env = CalculatorEnv()
    env.reset(seed=0)
    result = env.step(call("__import__('os').system('echo pwned')"))
    assert result.observation[0].content.startswith("Error: ")
    assert not result.terminated


def test_wrong_answer_scores_zero_and_ends() -> None:
    env = CalculatorEnv()
    env.reset(seed=3)
    result = env.step(f"Answer: {env.answer + 1:g}")
    assert (result.reward, result.terminated, result.info["success"]) == (0.0, True, False)
    assert "Incorrect" in result.observation[0].content


def test_missing_answer_is_explained() -> None:
    env = CalculatorEnv()
    env.reset(seed=3)
    result = env.step("I think it is about forty.")
    assert (result.reward, result.terminated, result.info["success"]) == (0.0, True, False)
    assert "I could not find 'Answer: <number>'" in result.observation[0].content


def test_running_out_of_turns_truncates_with_success_false() -> None:
    env = CalculatorEnv(max_turns=3)
    env.reset(seed=0)
    results = [env.step(call("1 + 1")) for _ in range(3)]
    assert [r.truncated for r in results] == [False, False, True]
    assert results[-1].info["success"] is False and results[-1].reward == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Answer: 42", 42.0),
        ("answer: -3.5", -3.5),
        ("**Answer:** $1,234", 1234.0),
        ("Answer: 12.\n", 12.0),
        ("Answer: 1\nwait, no.\nAnswer: 2", 2.0),
        ("The answer is 42", None),
        ("Answer: forty", None),
        ("", None),
    ],
)
def test_parse_answer(text: str, expected: float | None) -> None:
    assert parse_answer(text) == expected


def test_answer_tolerance() -> None:
    env = CalculatorEnv()
    env.reset(seed=1)
    assert env.step(f"Answer: {env.answer:.1f}").reward == 1.0
