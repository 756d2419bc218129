"""The safe evaluator shared by Calculator and Countdown: right answers, and refusals that are quick."""

import time
from fractions import Fraction

import pytest

from agentrl.envs._arithmetic import (
    BASIC_OPERATORS,
    MAX_EXPRESSION_LENGTH,
    ExpressionError,
    calculate,
    evaluate,
    integer_literals,
)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("7 / 2", "3.5"),
        ("7 // 2", "3"),
        ("7 % 3", "1"),
        ("-7 // 2", "-4"),
        ("2 ** 10", "1024"),
        ("2 ** -2", "0.25"),
        ("-3 + +4", "1"),
        ("0.1 + 0.2", "0.3"),  # exact: literals go through Fraction, not binary floats
        ("1 / 3 * 3", "1"),
        ("1 / 3", "0.333333333333"),
        ("4 ** 0.5", "2"),
        ("2 ** (1 / 2)", "1.41421356237"),
        ("-4 ** 0.5", "-2"),  # Python precedence: -(4 ** 0.5)
        ("1_000 * 3", "3000"),
        ("1e3 + 1", "1001"),
        ("10 ** 18", "1000000000000000000"),
        ("(1 / 3) ** 1000", "0"),  # the huge denominator falls back to float, which underflows
        ("  12 * (3 + 4)\n", "84"),
    ],
)
def test_calculate_values(expression: str, expected: str) -> None:
    assert calculate(expression) == expected


def test_evaluate_is_exact() -> None:
    assert evaluate("1 / 3 + 1 / 6") == Fraction(1, 2)
    assert evaluate("6 / 3") == 2 and isinstance(evaluate("6 / 3"), int)


ATTACKS = [
    "__import__('os')",
    "__import__('os').system('echo hi')",
    "().__class__",
    "().__class__.__bases__[0].__subclasses__()",
    "9**9**9**9",
    "2 ** 100000",
    "10 ** 18 * 10",
    "99999999999999999999",
    "1e999",
    "1.5e300 * 1",
    "1 / 0",
    "1 // 0",
    "1 % 0",
    "1.0 / 0",
    "0 ** -1",
    "(-8) ** (1 / 3)",
    "a" * 10000,
    "1" * 10000,
    "(" * 240 + "1" + ")" * 240,  # under the length cap, over the parser's nesting limit
    "x",
    "x + 1",
    "abs(-1)",
    "open('/etc/passwd').read()",
    "lambda: 1",
    "(lambda: 1)()",
    "[1, 2]",
    "{1: 2}",
    "'a' * 3",
    "b'a'",
    "1j",
    "True + 1",
    "None",
    "1 < 2",
    "1 if 1 else 2",
    "1 & 3",
    "1 << 100",
    "~1",
    "not 1",
    "[x for x in range(10**9)]",
    "f'{1}'",
    "1; 2",
    "import os",
    "x := 1",
    "1\x00",
    "",
    "   ",
    "1 +",
]


@pytest.mark.parametrize("expression", ATTACKS, ids=lambda e: repr(e)[:40])
def test_attacks_get_an_error_string_quickly(expression: str) -> None:
    started = time.perf_counter()
    result = calculate(expression)
    assert result.startswith("Error: "), result
    assert time.perf_counter() - started < 0.5
    with pytest.raises(ExpressionError):
        evaluate(expression)


def test_error_messages_say_what_went_wrong() -> None:
    assert calculate("1/0") == "Error: division by zero"
    assert "names" in calculate("x + 1")
    assert "function calls" in calculate("abs(1)")
    assert "attribute" in calculate("().__class__") or "Tuple" in calculate("().__class__")
    assert str(MAX_EXPRESSION_LENGTH) in calculate("1" * 10000)
    assert "exponent" in calculate("9**9**9**9")


def test_deep_unary_chain_does_not_raise() -> None:
    assert calculate("-" * 400 + "1") == "1"


def test_non_text_input_is_an_error() -> None:
    assert calculate(123).startswith("Error: ")  # type: ignore[arg-type]


def test_operator_subset() -> None:
    assert evaluate("(25 - 3) * 4 / 2", BASIC_OPERATORS) == 44
    for expression in ("2 ** 3", "7 // 2", "7 % 2", "-3 + 5"):
        with pytest.raises(ExpressionError, match="not allowed"):
            evaluate(expression, BASIC_OPERATORS)


def test_integer_literals() -> None:
    assert integer_literals("(25 - 3) * 4 + 3") == [25, 3, 4, 3]
    assert integer_literals("-7") == [7]
    assert integer_literals("2 * (3 + (4 * 5))") == [2, 3, 4, 5]
    with pytest.raises(ExpressionError, match="whole number"):
        integer_literals("2.5 + 1")
    with pytest.raises(ExpressionError):
        integer_literals("x + 1")
