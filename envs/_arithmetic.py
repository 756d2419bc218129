"""A safe evaluator for arithmetic expressions, shared by the Calculator and Countdown envs.

Model output is untrusted, so nothing here calls ``eval`` or ``exec``: the text is parsed with
``ast.parse(mode="eval")`` and only numbers, the binary operators ``+ - * / // % **``, unary ``+``
and ``-`` and parentheses are walked. Everything else (names, calls, attributes, lambdas,
subscripts, strings, comparisons) is refused with an :class:`ExpressionError` that says what is
allowed. Size is bounded so no input can make evaluation slow or huge: the expression length, every
intermediate magnitude and the exponent of ``**`` are capped.

Arithmetic is exact where it can be: integers stay integers and ``/`` gives a
:class:`fractions.Fraction`, so ``1/3*3 == 1`` and Countdown answers are checked without rounding.
Only a fractional power (``2 ** 0.5``) or a decimal literal with many digits falls back to ``float``.

>>> evaluate("(3 + 5) * 7 / 2")
28
>>> calculate("1/0")
'Error: division by zero'
"""

from __future__ import annotations

import ast
import math
from collections.abc import Collection
from fractions import Fraction

Number = int | Fraction | float

MAX_EXPRESSION_LENGTH = 500
MAX_MAGNITUDE = 10**18
MAX_EXPONENT = 1000
# A Fraction whose denominator outgrows this turns into a float, so repeated division or negative
# powers cannot build ever larger integers.
MAX_DENOMINATOR = 10**18

_BINARY: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}
_UNARY: dict[type[ast.unaryop], str] = {ast.UAdd: "+", ast.USub: "-"}

ALL_OPERATORS: frozenset[str] = frozenset({*_BINARY.values(), "unary -", "unary +"})
"""Every operator the evaluator knows; unary ones are named ``"unary -"`` and ``"unary +"``."""
BASIC_OPERATORS: frozenset[str] = frozenset({"+", "-", "*", "/"})
"""The four operations of the Countdown game."""


class ExpressionError(ValueError):
    """The expression is not allowed, not valid arithmetic, or its value is out of bounds."""


def parse(expression: str, operators: Collection[str] = ALL_OPERATORS) -> ast.expr:
    """Parse ``expression`` and check that it holds only numbers and the given operators.

    Raises :class:`ExpressionError` with a message meant for the model otherwise.
    """
    if not isinstance(expression, str):
        raise ExpressionError(f"the expression must be text, got {type(expression).__name__}")
    text = expression.strip()
    if not text:
        raise ExpressionError("the expression is empty")
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise ExpressionError(f"the expression is {len(text)} characters long; the limit is {MAX_EXPRESSION_LENGTH}")
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as e:
        raise ExpressionError(f"not a valid arithmetic expression ({e.msg})") from None
    except (ValueError, RecursionError, MemoryError) as e:  # e.g. null bytes, absurd nesting
        raise ExpressionError(f"not a valid arithmetic expression ({type(e).__name__})") from None
    _check(tree, frozenset(operators))
    return tree


def evaluate(expression: str, operators: Collection[str] = ALL_OPERATORS) -> Number:
    """The exact value of ``expression``: an ``int`` when whole, else a ``Fraction`` (or a ``float``).

    Raises :class:`ExpressionError` for anything not allowed or out of bounds, including division
    by zero.
    """
    tree = parse(expression, operators)
    try:
        return _whole(_eval(tree))
    except ExpressionError:
        raise
    except ZeroDivisionError:
        raise ExpressionError("division by zero") from None
    except (OverflowError, MemoryError):
        raise ExpressionError(f"a number exceeds the limit of {MAX_MAGNITUDE:.0e}") from None
    except RecursionError:
        raise ExpressionError("the expression is nested too deeply") from None


def integer_literals(expression: str) -> list[int]:
    """The integer literals of ``expression`` in the order they are written (``-3`` counts as 3).

    Raises :class:`ExpressionError` if the expression is not arithmetic over whole-number literals
    (a literal such as ``2.5`` is refused, so callers can check exactly which numbers were used).

    >>> integer_literals("(25 - 3) * 4 + 3")
    [25, 3, 4, 3]
    """
    tree = parse(expression)
    found: list[tuple[int, int, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            if not isinstance(node.value, int):
                raise ExpressionError(f"{node.value!r} is not a whole number; use whole numbers only")
            found.append((node.lineno, node.col_offset, node.value))
    return [value for _, _, value in sorted(found)]


def format_number(value: Number) -> str:
    """A short decimal form: whole values without a point, others to 12 significant digits."""
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Fraction) and value.denominator == 1:
        return str(value.numerator)
    as_float = float(value)
    if as_float.is_integer():
        return str(int(as_float))
    return format(as_float, ".12g")


def calculate(expression: str) -> str:
    """Evaluate ``expression`` and return the result as text, or ``"Error: ..."``; never raises."""
    try:
        return format_number(evaluate(expression))
    except ExpressionError as e:
        return f"Error: {e}"


def _check(tree: ast.expr, operators: frozenset[str]) -> None:
    allowed = " ".join(sorted(op for op in operators if not op.startswith("unary"))) + " and ( )"
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            symbol = _BINARY.get(type(node.op))
            if symbol is None or symbol not in operators:
                shown = symbol or type(node.op).__name__
                raise ExpressionError(f"the operator {shown} is not allowed; use numbers, {allowed}")
        elif isinstance(node, ast.UnaryOp):
            symbol = _UNARY.get(type(node.op))
            if symbol is None or f"unary {symbol}" not in operators:
                shown = f"unary {symbol}" if symbol else type(node.op).__name__
                raise ExpressionError(f"{shown} is not allowed; use numbers, {allowed}")
        elif isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ExpressionError(f"{value!r:.40} is not a number; only numbers are allowed")
        elif isinstance(node, ast.Name):
            raise ExpressionError(f"names such as {node.id!r:.40} are not allowed; use numbers, {allowed}")
        elif isinstance(node, ast.Call):
            raise ExpressionError(f"function calls are not allowed; use numbers, {allowed}")
        elif isinstance(node, ast.Attribute):
            raise ExpressionError("attribute access is not allowed; only numbers and operators")
        elif not isinstance(node, (ast.operator, ast.unaryop)):
            raise ExpressionError(
                f"{type(node).__name__} is not allowed in an arithmetic expression; use numbers, {allowed}"
            )


def _eval(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        return _bounded(_literal(node.value))
    if isinstance(node, ast.UnaryOp):
        operand = _eval(node.operand)
        return -operand if isinstance(node.op, ast.USub) else +operand
    assert isinstance(node, ast.BinOp)  # _check has refused everything else
    left, right = _eval(node.left), _eval(node.right)
    op = node.op
    if isinstance(op, ast.Add):
        result: Number = left + right
    elif isinstance(op, ast.Sub):
        result = left - right
    elif isinstance(op, ast.Mult):
        result = left * right
    elif isinstance(op, ast.Div):
        if right == 0:
            raise ZeroDivisionError
        result = left / right if isinstance(left, float) or isinstance(right, float) else Fraction(left) / right
    elif isinstance(op, ast.FloorDiv):
        result = left // right
    elif isinstance(op, ast.Mod):
        result = left % right
    else:
        result = _power(left, right)
    return _bounded(result)


def _literal(value: object) -> Number:
    if isinstance(value, int):
        return value
    assert isinstance(value, float)  # _check has refused every other constant
    if not math.isfinite(value):
        raise ExpressionError(f"a number exceeds the limit of {MAX_MAGNITUDE:.0e}")
    # Through the shortest decimal form, so "0.1" is exactly 1/10 rather than the nearest double.
    return Fraction(repr(value))


def _power(base: Number, exponent: Number) -> Number:
    if not isinstance(exponent, float) and Fraction(exponent).denominator == 1:
        whole = int(exponent)
        if abs(whole) > MAX_EXPONENT:
            raise ExpressionError(f"the exponent {whole} is too large; the limit is {MAX_EXPONENT}")
        if base == 0:
            if whole < 0:
                raise ZeroDivisionError
            return 1 if whole == 0 else 0
        # Refuse before computing: the size of the result is known from logarithms.
        if whole * math.log10(abs(float(base))) > math.log10(MAX_MAGNITUDE):
            raise ExpressionError(f"the result of ** exceeds the limit of {MAX_MAGNITUDE:.0e}")
        if isinstance(base, float):
            return base**whole
        return base**whole if whole >= 0 else Fraction(base) ** whole
    b, e = float(base), float(exponent)
    if b < 0:
        raise ExpressionError("a negative number to a fractional power is not a real number")
    if b == 0 and e < 0:
        raise ZeroDivisionError
    if b > 0 and e * math.log10(b) > math.log10(MAX_MAGNITUDE):
        raise ExpressionError(f"the result of ** exceeds the limit of {MAX_MAGNITUDE:.0e}")
    return b**e


def _bounded(value: Number) -> Number:
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
            raise ExpressionError(f"a number exceeds the limit of {MAX_MAGNITUDE:.0e}")
        return value
    if not -MAX_MAGNITUDE <= value <= MAX_MAGNITUDE:
        raise ExpressionError(f"a number exceeds the limit of {MAX_MAGNITUDE:.0e}")
    if isinstance(value, Fraction) and value.denominator > MAX_DENOMINATOR:
        return float(value)
    return value


def _whole(value: Number) -> Number:
    if isinstance(value, Fraction) and value.denominator == 1:
        return value.numerator
    return value
