"""``agentrl/Countdown-v0``: reach a target number from given numbers; one verifiable answer (RLVR).

Each episode gives 3 or 4 numbers (1-50, repeats possible) and a target. The agent answers with an
arithmetic expression that uses **each given number exactly once**, with ``+ - * /`` and
parentheses. The target is made by combining all the numbers in a random expression (every step a
positive whole number), so every task has a solution.

Rules of an episode:

- It is one step: the reply is graded and the episode is ``terminated``.
- Reward 1.0 if the expression after the reply's last ``Answer:`` uses exactly the given numbers
  (as a multiset) and equals the target exactly (``/`` is exact: fractions may appear along the
  way), else 0.0. A trailing ``= <number>`` after the expression is ignored. A reply without an
  answer, or with an invalid one, scores 0.0 and is told why.

The final step's ``info`` holds ``success`` (bool) and ``solution`` (one expression that works).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from agentrl.env import AgentEnv, Feedback, Observation
from agentrl.envs._arithmetic import BASIC_OPERATORS, ExpressionError, evaluate, format_number, integer_literals
from agentrl.envs._split import Split, check_split, draw
from agentrl.registry import register
from agentrl.types import Message

MAX_NUMBER = 50
MAX_TARGET = 999
_ANSWER = re.compile(r"answer[*\s]*:[*\s]*([^\n]*)", re.IGNORECASE)
# Models trained on prose write these; they mean the ASCII operators.
_UNICODE_OPERATORS = str.maketrans({"×": "*", "÷": "/", "−": "-", "–": "-"})

RULES = (
    "We play Countdown. You get some numbers and a target. Write an arithmetic expression that uses "
    "each of the given numbers exactly once (no other numbers), combined with + - * / and "
    "parentheses, whose value is exactly the target. Division may give fractions along the way. "
    "You may think first; then end your reply with the line\n"
    "Answer: <expression>\n"
    "for example: Answer: (25 - 3) * 4 + 7\n"
    "You have one reply."
)


def parse_answer(text: str) -> str | None:
    """The expression after the last ``Answer:`` in ``text`` (a trailing ``= ...`` cut), or None."""
    matches = _ANSWER.findall(text)
    if not matches:
        return None
    expression = matches[-1].translate(_UNICODE_OPERATORS).split("=")[0]
    # Markdown and a full stop around the expression are common; a leading "." would be a decimal.
    expression = re.sub(r"^[\s`$*]+|[\s`$*.]+$", "", expression)
    return expression or None


class CountdownEnv(AgentEnv):
    """Countdown: combine the given numbers with + - * / to hit the target; 'Answer: <expression>'."""

    def __init__(
        self,
        split: Split = "train",
        num_numbers: int | None = None,
        max_turns: int | None = 1,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.split = check_split(split)
        if num_numbers is not None and not 2 <= num_numbers <= 6:
            raise ValueError(f"num_numbers must be between 2 and 6 (or None for 3 or 4), got {num_numbers}.")
        self.num_numbers = num_numbers
        self.numbers: list[int] = []
        self.target = 0
        self.solution = ""
        """An expression over ``numbers`` that makes ``target``: the one the target was made from."""

    def start(self, options: dict[str, Any] | None) -> Observation:
        """Draw numbers and a target of this env's split and pose the puzzle."""
        self.numbers, self.target, self.solution = draw(self.np_random, self._generate, self.split)
        puzzle = f"Numbers: {', '.join(map(str, self.numbers))}\nTarget: {self.target}"
        return [Message("system", RULES), Message("user", puzzle)]

    def respond(self, reply: Message) -> Feedback:
        """Grade the reply's expression; the episode always ends here."""
        expression = parse_answer(reply.content)
        if expression is None:
            return self._grade("I could not find 'Answer: <expression>' in your reply.", False)
        try:
            value = evaluate(expression, BASIC_OPERATORS)
            used = integer_literals(expression)
        except ExpressionError as e:
            return self._grade(f"Your answer {expression!r:.200} is not a valid expression: {e}.", False)
        if sorted(used) != sorted(self.numbers):
            return self._grade(f"You must use each of {self.numbers} exactly once; your expression uses {used}.", False)
        if value != self.target:
            return self._grade(f"{expression} = {format_number(value)}, not {self.target}.", False)
        return self._grade(f"Correct: {expression} = {self.target}.", True)

    def _grade(self, text: str, success: bool) -> Feedback:
        if not success:
            text += f" One solution was {self.solution} = {self.target}."
        info = {"success": success, "solution": self.solution}
        return Feedback([Message("user", text)], float(success), True, info)

    def _generate(self, rng: np.random.Generator) -> tuple[str, tuple[list[int], int, str]]:
        while True:  # about one draw in five makes a usable target, so this ends quickly
            count = self.num_numbers or int(rng.integers(3, 5))
            numbers = [int(n) for n in rng.integers(1, MAX_NUMBER + 1, size=count)]
            made = _random_expression(rng, numbers)
            if made is None:
                continue
            expression, target = made
            if 1 <= target <= MAX_TARGET and target not in numbers:
                key = f"countdown:{','.join(map(str, sorted(numbers)))}->{target}"
                return key, (numbers, target, expression)


def _random_expression(rng: np.random.Generator, numbers: list[int]) -> tuple[str, int] | None:
    """A random expression over all of ``numbers`` in a random order and shape, with its value;
    None if some step is not a positive whole number (a subtraction below 1, an inexact division)."""
    if len(numbers) == 1:
        return str(numbers[0]), numbers[0]
    order = [numbers[int(i)] for i in rng.permutation(len(numbers))]
    cut = int(rng.integers(1, len(order)))
    left, right = _random_expression(rng, order[:cut]), _random_expression(rng, order[cut:])
    if left is None or right is None:
        return None
    (a_text, a), (b_text, b) = left, right
    op = "+-*/"[int(rng.integers(4))]
    if op == "+":
        value = a + b
    elif op == "-":
        value = a - b
    elif op == "*":
        value = a * b
    else:
        value = a // b if a % b == 0 else 0
    if value < 1:
        return None
    return f"{_wrap(a_text)} {op} {_wrap(b_text)}", value


def _wrap(text: str) -> str:
    return text if text.isdigit() else f"({text})"


register("agentrl/Countdown-v0", entry_point="agentrl.envs.countdown:CountdownEnv", kwargs={"max_turns": 1})
