"""Countdown-v0: the generating expression wins; every way of breaking the rules scores 0."""

import pytest

from agentrl.envs._arithmetic import BASIC_OPERATORS, evaluate, integer_literals
from agentrl.envs.countdown import MAX_TARGET, CountdownEnv, parse_answer


def test_solution_is_valid_and_wins() -> None:
    env = CountdownEnv()
    for seed in range(50):
        obs, _ = env.reset(seed=seed)
        assert obs[1].content == f"Numbers: {', '.join(map(str, env.numbers))}\nTarget: {env.target}"
        assert len(env.numbers) in (3, 4) and 1 <= env.target <= MAX_TARGET
        assert evaluate(env.solution, BASIC_OPERATORS) == env.target
        assert sorted(integer_literals(env.solution)) == sorted(env.numbers)
        result = env.step(f"<think>easy</think>\nAnswer: {env.solution}")
        assert (result.reward, result.terminated, result.info["success"]) == (1.0, True, True)


def test_answer_variants_are_accepted() -> None:
    env = CountdownEnv()
    env.reset(seed=1)
    for text in (
        f"**Answer:** `{env.solution}`",
        f"Answer: {env.solution} = {env.target}",
        f"Answer: {env.solution.replace('*', '×')}",
        f"Answer: 1 + 1\nNo wait.\nAnswer: {env.solution}",
    ):
        env.reset(seed=1)
        assert env.step(text).reward == 1.0, text


@pytest.mark.parametrize("num_numbers", [2, 5])
def test_num_numbers(num_numbers: int) -> None:
    env = CountdownEnv(num_numbers=num_numbers)
    env.reset(seed=0)
    assert len(env.numbers) == num_numbers
    assert env.step(f"Answer: {env.solution}").reward == 1.0


def test_bad_num_numbers() -> None:
    with pytest.raises(ValueError, match="num_numbers"):
        CountdownEnv(num_numbers=9)


def rule_breakers(solution: str, numbers: list[int], target: int) -> dict[str, str]:
    """Expressions worth exactly ``target`` that each break one rule, so only the rule can fail them."""
    a = numbers[0]
    return {
        "a number twice": f"{solution} + {a} - {a}",
        "another number": f"({solution}) * 1",
        "the target itself": f"{target}",
        "a decimal": f"({solution}) * 1.0",
        "power": f"({solution}) ** ({a} / {a})",
        "unary minus": f"-(-({solution}))",
        "names": f"({solution}) + x - x",
    }


def test_rule_breakers_score_zero() -> None:
    env = CountdownEnv()
    for seed in range(5):
        env.reset(seed=seed)
        for why, expression in rule_breakers(env.solution, env.numbers, env.target).items():
            if why != "names":
                assert float(evaluate(expression)) == env.target
            env.reset(seed=seed)
            result = env.step(f"Answer: {expression}")
            assert (result.reward, result.terminated, result.info["success"]) == (0.0, True, False), why
            assert env.solution in result.observation[0].content


def test_a_missing_number_scores_zero_even_when_the_value_is_right() -> None:
    env = CountdownEnv()
    env.reset(seed=0)
    env.numbers, env.target = [2, 3, 4], 5
    assert env.step("Answer: 2 + 3").reward == 0.0
    env.reset(seed=0)
    env.numbers, env.target = [2, 3, 4], 5
    assert env.step("Answer: 2 * 4 - 3").reward == 1.0


def test_division_by_zero_scores_zero() -> None:
    env = CountdownEnv()
    env.reset(seed=0)
    a, b, c = env.numbers[:3]
    result = env.step(f"Answer: {a} / ({b} - {b}) + {c}")
    assert result.reward == 0.0 and "division by zero" in result.observation[0].content


def test_wrong_value_scores_zero() -> None:
    env = CountdownEnv()
    for seed in range(20):
        env.reset(seed=seed)
        expression = " + ".join(map(str, env.numbers))
        if evaluate(expression) == env.target:
            continue
        result = env.step(f"Answer: {expression}")
        assert result.reward == 0.0 and f"not {env.target}" in result.observation[0].content


def test_missing_answer_is_explained() -> None:
    env = CountdownEnv()
    env.reset(seed=0)
    result = env.step("I give up")
    assert (result.reward, result.terminated) == (0.0, True)
    assert "I could not find 'Answer: <expression>'" in result.observation[0].content


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Answer: (1 + 2) * 3", "(1 + 2) * 3"),
        ("answer: 4 − 2 = 2.", "4 - 2"),
        ("**Answer:** `(1 + 2) * 3`.", "(1 + 2) * 3"),
        ("Answer: .5 + 1", ".5 + 1"),
        ("Answer: ", None),
        ("nothing", None),
    ],
)
def test_parse_answer(text: str, expected: str | None) -> None:
    assert parse_answer(text) == expected
