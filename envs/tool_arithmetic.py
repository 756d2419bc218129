"""``agentrl/ToolArithmetic-v0``: call the calculator, then submit its result (the quickstart's task).

This env is sized for the quickstart: training a 135M-parameter model (SmolLM2-135M-Instruct) on
a CPU for a few minutes must visibly raise its held-out success. So the task tests the *tool
protocol*, not arithmetic: each episode poses one expression (``865 * 67``, ``(42 + 17) * 38``, ...)
whose value a small model cannot work out in its head, and the user message shows the exact tool
call to make. Success still takes two well-formed tool calls in a row: ``calculate`` with the
expression, then ``answer`` with the number it returned. Before training, SmolLM2-135M's greedy
reply is already right, but its samples mostly chat ("I'm ready to assist you"), answer the sum
themselves, or garble, pretty-print or wrap the JSON in prose: on the test split it succeeds in
about 30% of episodes at temperature 0.7 and 2% at 1.0. Replying with the bare call and copying
the result is the behaviour reinforcement learning sharpens.

Calls are bare JSON objects, ``{"name": "calculate", "arguments": {"expression": "865 * 67"}}``,
which small models copy far more reliably than Hermes ``<tool_call>`` blocks; the ``auto`` tool
format reads both.

Rules of an episode:

- A reply with ``calculate`` calls gets one ``tool`` message per call; a successful one ends with
  the exact ``answer`` call that submits its result. The episode goes on.
- A reply with a well-formed ``answer`` call ends the episode: reward 1.0 if its number equals the
  expression's value (relative tolerance 1e-9), else 0.0. A malformed one gets an error message
  and the episode goes on.
- A reply without tool calls ends the episode with reward 0.0 and is told why.
- Replies run out after ``max_turns`` (default 3: the two calls and one retry); the episode is
  truncated with reward 0.0.
- ``call_reward`` (default 0.0) is an optional shaped reward, given once, for the first
  ``calculate`` call that returns the right value; a success then earns ``1 - call_reward`` more,
  so a successful episode's reward is 1.0 either way. ``info["success"]`` stays the strict test.

The final step's ``info`` holds ``success`` (bool), ``answer`` (the expected number) and
``calculated`` (whether a ``calculate`` call returned the right value).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from agentrl.env import AgentEnv, Feedback, Observation
from agentrl.envs import _arithmetic
from agentrl.envs._split import Split, check_split, draw
from agentrl.registry import register
from agentrl.tool_calls import format_tool_calls
from agentrl.tools import ToolResult, tool
from agentrl.types import Message, ToolCall

ANSWER_TOLERANCE = 1e-9
"""Relative tolerance of the ``answer`` check (results are whole numbers; a float may round)."""


@tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: Numbers combined with + - * / // % ** and parentheses, e.g. "865 * 67".
    """
    return _arithmetic.calculate(expression)


@tool
def answer(number: float) -> str:
    """Submit the final answer; this ends the problem.

    Args:
        number: The value of the expression, e.g. 57955.
    """
    # The env grades the call in answer_tools and replaces this text with its verdict.
    return _arithmetic.format_number(number)


def _between(rng: np.random.Generator, low: int, high: int) -> int:
    return int(rng.integers(low, high + 1))


def _product_minus(rng: np.random.Generator) -> str:
    a, b = _between(rng, 21, 99), _between(rng, 21, 99)
    return f"{a} * {b} - {_between(rng, 100, min(999, a * b - 100))}"  # a * b >= 441: never below 100


# Each shape draws its numbers and writes the expression. The expression text is the task's
# canonical key, so the split depends on the numbers and the shape only.
SHAPES: dict[str, Callable[[np.random.Generator], str]] = {
    "product": lambda rng: f"{_between(rng, 100, 999)} * {_between(rng, 11, 99)}",
    "product_plus": lambda rng: f"{_between(rng, 11, 99)} * {_between(rng, 11, 99)} + {_between(rng, 100, 999)}",
    "product_minus": _product_minus,
    "sum_times": lambda rng: f"({_between(rng, 10, 99)} + {_between(rng, 10, 99)}) * {_between(rng, 11, 99)}",
}
"""The kinds of expression posed, by name; each value is a whole number a small model cannot guess."""


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """One tool call written as the bare JSON object this env asks for.

    >>> call_text("calculate", {"expression": "2 + 3"})
    '{"name": "calculate", "arguments": {"expression": "2 + 3"}}'
    """
    return format_tool_calls([ToolCall(name, arguments)], "json")


class ToolArithmeticEnv(AgentEnv):
    """Call calculate on an expression, then submit its result with answer; the quickstart's task."""

    tools = (calculate, answer)

    def __init__(
        self,
        split: Split = "train",
        call_reward: float = 0.0,
        max_turns: int | None = 3,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.split = check_split(split)
        if not 0.0 <= call_reward < 1.0:
            raise ValueError(f"call_reward must be in [0, 1) so that a success still pays most, got {call_reward}.")
        self.call_reward = call_reward
        self.shape = ""
        """The name (in :data:`SHAPES`) of the current expression's kind."""
        self.expression = ""
        """The expression posed in the current episode; its canonical task key."""
        self.answer = 0
        self.calculated = False
        """Whether a ``calculate`` call in this episode has returned the right value."""

    def start(self, options: dict[str, Any] | None) -> Observation:
        """Draw an expression of this env's split and pose it, with the exact call to make."""
        self.shape, self.expression = draw(self.np_random, _generate, self.split)
        self.answer = int(_arithmetic.evaluate(self.expression))
        self.calculated = False
        call = call_text("calculate", {"expression": self.expression})
        # Measured on SmolLM2-135M: asking "What is ...?" first invites it to answer the question
        # itself; a plain order to call gets the bare JSON back about twice as often.
        return [Message("user", f"Call the calculator on {self.expression}. Reply with only this JSON:\n{call}")]

    def answer_tools(self, reply: Message, results: list[ToolResult]) -> Feedback:
        """Grade the first well-formed ``answer`` call, or answer the ``calculate`` calls and go on."""
        submitted = next((r for r in results if r.call.name == "answer" and r.error is None), None)
        if submitted is not None:
            return self._grade(float(submitted.call.arguments["number"]))
        reward = 0.0
        messages = []
        for result in results:
            message = result.to_message()
            if result.call.name == "calculate" and result.error is None and not result.content.startswith("Error:"):
                right = _equal(result.content, self.answer)
                if right and not self.calculated:
                    self.calculated, reward = True, self.call_reward
                # Showing the submitting call keeps the second step a copy, as the first one is.
                submit = call_text("answer", {"number": _as_json_number(result.content)})
                message.content = f"{result.content}\nNow reply with only this JSON: {submit}"
            messages.append(message)
        errors = sum(r.error is not None for r in results)
        info = {"tool_errors": errors, "success": False, "answer": self.answer, "calculated": self.calculated}
        return Feedback(messages, reward, False, info)

    def respond(self, reply: Message) -> Feedback:
        """A reply without a tool call ends the episode unsolved."""
        text = (
            "Your reply has no tool call, so it scores 0. Calls are JSON objects such as "
            f"{call_text('calculate', {'expression': self.expression})}. The answer was {self.answer}."
        )
        return Feedback([Message("user", text)], 0.0, True, self._info(False))

    def _grade(self, number: float) -> Feedback:
        success = math.isclose(number, self.answer, rel_tol=ANSWER_TOLERANCE)
        if success:
            text = "Correct!"
            reward = 1.0 - (self.call_reward if self.calculated else 0.0)
        else:
            text = f"Incorrect: you answered {_arithmetic.format_number(number)}, the answer was {self.answer}."
            reward = 0.0
        return Feedback([Message("user", text)], reward, True, self._info(success))

    def _info(self, success: bool) -> dict[str, Any]:
        return {"success": success, "answer": self.answer, "calculated": self.calculated}


def _generate(rng: np.random.Generator) -> tuple[str, tuple[str, str]]:
    shape = list(SHAPES)[int(rng.integers(len(SHAPES)))]
    expression = SHAPES[shape](rng)
    return f"tool_arithmetic:{expression}", (shape, expression)


def _equal(text: str, expected: int) -> bool:
    try:
        return math.isclose(float(text), expected, rel_tol=ANSWER_TOLERANCE)
    except ValueError:
        return False


def _as_json_number(text: str) -> int | float | str:
    """The tool's result text as a JSON number where it is one, so the shown call validates."""
    try:
        value = float(text)
    except ValueError:
        return text
    if not math.isfinite(value):
        return text
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


register(
    "agentrl/ToolArithmetic-v0",
    entry_point="agentrl.envs.tool_arithmetic:ToolArithmeticEnv",
    kwargs={"max_turns": 3},
)
