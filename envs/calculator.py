"""``agentrl/Calculator-v0``: arithmetic word problems solved with a calculator tool.

Each episode is one word problem (shopping, travel, sharing a bill, ...) generated from a template
with numbers drawn from the env's seeded generator; each needs two to four operations, so a model
that calls the ``calculate`` tool beats one that does the sums in its head.

Rules of an episode:

- A reply with tool calls is answered with one ``tool`` message per call and the episode goes on
  (malformed or unknown calls get an error text, never an exception).
- The first reply without tool calls is graded and ends the episode: reward 1.0 if its last
  ``Answer: <number>`` equals the answer (relative tolerance 1e-6), else 0.0. A reply with no such
  line scores 0.0 and is told why.
- Replies run out after ``max_turns`` (default 6): the episode is truncated with reward 0.0.

The final step's ``info`` holds ``success`` (bool) and ``answer`` (the expected number).
"""

from __future__ import annotations

import math
import re
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

# Markdown emphasis around the label ("**Answer:** 42") and a dollar sign are common; allow them.
_ANSWER = re.compile(r"answer[*\s]*:[*\s]*\$?\s*(-?(?:\d[\d,]*(?:\.\d+)?|\.\d+))", re.IGNORECASE)
_NAMES = ("Maya", "Liam", "Aisha", "Kenji", "Sofia", "Omar", "Elena", "Tariq", "Grace", "Mateo")


@tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: Numbers combined with + - * / // % ** and parentheses, e.g. "12 * (3 + 4.5)".
    """
    return _arithmetic.calculate(expression)


def _between(rng: np.random.Generator, low: int, high: int) -> int:
    return int(rng.integers(low, high + 1))


def _name(rng: np.random.Generator) -> str:
    return _NAMES[int(rng.integers(len(_NAMES)))]


# Each template draws its numbers and returns (numbers, question, answer). The numbers alone, not
# the names or wording, make the task's canonical key, so two tasks that differ only in a name
# always fall in the same split.
Template = Callable[[np.random.Generator], tuple[tuple[int, ...], str, int]]


def _shopping(rng: np.random.Generator) -> tuple[tuple[int, ...], str, int]:
    a, p, b, q = _between(rng, 3, 12), _between(rng, 2, 19), _between(rng, 2, 9), _between(rng, 3, 25)
    bill = (a * p + b * q) // 50 * 50 + 50
    question = (
        f"{_name(rng)} buys {a} notebooks at ${p} each and {b} pens at ${q} each, and pays with "
        f"${bill}. How many dollars of change does {'she' if rng.integers(2) else 'he'} get back?"
    )
    return (a, p, b, q), question, bill - (a * p + b * q)


def _travel(rng: np.random.Generator) -> tuple[tuple[int, ...], str, int]:
    v, h, w, k = _between(rng, 40, 120), _between(rng, 2, 9), _between(rng, 30, 110), _between(rng, 2, 9)
    question = (
        f"A train travels at {v} km/h for {h} hours, then slows to {w} km/h for another {k} hours. "
        "How many kilometres does it travel in total?"
    )
    return (v, h, w, k), question, v * h + w * k


def _sharing(rng: np.random.Generator) -> tuple[tuple[int, ...], str, int]:
    n, share = _between(rng, 3, 8), _between(rng, 20, 150)
    total = n * share
    hotel = _between(rng, total // 4, 3 * total // 4)
    question = (
        f"{n} friends go on a trip. The hotel costs ${hotel} and the car rental costs "
        f"${total - hotel}. They split the total equally. How many dollars does each friend pay?"
    )
    return (n, hotel, total - hotel), question, share


def _bakery(rng: np.random.Generator) -> tuple[tuple[int, ...], str, int]:
    trays, per_tray, days = _between(rng, 3, 9), _between(rng, 6, 24), _between(rng, 2, 7)
    made = trays * per_tray * days
    sold = _between(rng, made // 3, made - 1)
    question = (
        f"A bakery bakes {trays} trays of {per_tray} muffins every day for {days} days and sells "
        f"{sold} muffins in that time. How many muffins are left?"
    )
    return (trays, per_tray, days, sold), question, made - sold


def _savings(rng: np.random.Generator) -> tuple[tuple[int, ...], str, int]:
    start, weekly, weeks = _between(rng, 20, 500), _between(rng, 5, 60), _between(rng, 4, 20)
    saved = start + weekly * weeks
    spent = _between(rng, 50, saved - 1)
    question = (
        f"{_name(rng)} has ${start} saved, saves ${weekly} every week for {weeks} weeks, and then "
        f"spends ${spent} on a bike. How many dollars are left?"
    )
    return (start, weekly, weeks, spent), question, saved - spent


def _fence(rng: np.random.Generator) -> tuple[tuple[int, ...], str, int]:
    length, width, cost = _between(rng, 5, 60), _between(rng, 3, 40), _between(rng, 4, 30)
    question = (
        f"A rectangular garden is {length} m long and {width} m wide. Fencing costs ${cost} per "
        "metre. How many dollars does it cost to fence the whole perimeter?"
    )
    return (length, width, cost), question, 2 * (length + width) * cost


def _crates(rng: np.random.Generator) -> tuple[tuple[int, ...], str, int]:
    boxes, per_box, crate = _between(rng, 12, 90), _between(rng, 6, 48), _between(rng, 7, 40)
    question = (
        f"A warehouse holds {boxes} boxes of {per_box} items each. The items are repacked into "
        f"crates of {crate}. After filling as many full crates as possible, how many items are left over?"
    )
    return (boxes, per_box, crate), question, boxes * per_box % crate


def _fuel(rng: np.random.Generator) -> tuple[tuple[int, ...], str, int]:
    per_100, one_way = _between(rng, 4, 12), 50 * _between(rng, 3, 24)
    question = (
        f"A car uses {per_100} litres of fuel per 100 km. How many litres does it need for a trip "
        f"of {one_way} km each way, there and back?"
    )
    return (per_100, one_way), question, per_100 * 2 * one_way // 100


TEMPLATES: dict[str, Template] = {
    "shopping": _shopping,
    "travel": _travel,
    "sharing": _sharing,
    "bakery": _bakery,
    "savings": _savings,
    "fence": _fence,
    "crates": _crates,
    "fuel": _fuel,
}


def parse_answer(text: str) -> float | None:
    """The number after the last ``Answer:`` in ``text``, or None if there is none."""
    matches = _ANSWER.findall(text)
    if not matches:
        return None
    try:
        return float(matches[-1].replace(",", ""))
    except ValueError:
        return None


class CalculatorEnv(AgentEnv):
    """Arithmetic word problems with a calculate tool; answer with 'Answer: <number>'."""

    tools = (calculate,)

    def __init__(self, split: Split = "train", max_turns: int | None = 6, render_mode: str | None = None):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.split = check_split(split)
        self.task_key = ""
        """The canonical key of the current problem (template and numbers); it decides the split."""
        self.question = ""
        self.answer = 0.0

    def start(self, options: dict[str, Any] | None) -> Observation:
        """Draw a word problem of this env's split and pose it."""
        self.task_key, self.question, self.answer = draw(self.np_random, _generate, self.split)
        return [Message("system", self._rules()), Message("user", self.question)]

    def answer_tools(self, reply: Message, results: list[ToolResult]) -> Feedback:
        """Answer the tool calls and go on; the outcome goes in ``info`` in case this turn is the last."""
        feedback = super().answer_tools(reply, results)
        return feedback._replace(info={**feedback.info, "answer": self.answer})

    def respond(self, reply: Message) -> Feedback:
        """Grade the reply's ``Answer:`` and end the episode."""
        given = parse_answer(reply.content)
        expected = _arithmetic.format_number(self.answer)
        if given is None:
            text = f"I could not find 'Answer: <number>' in your reply, so it scores 0. The answer was {expected}."
            return Feedback([Message("user", text)], 0.0, True, {"success": False, "answer": self.answer})
        success = math.isclose(given, self.answer, rel_tol=1e-6, abs_tol=1e-9)
        text = "Correct!" if success else f"Incorrect: you answered {given:g}, the answer was {expected}."
        return Feedback([Message("user", text)], float(success), True, {"success": success, "answer": self.answer})

    def _rules(self) -> str:
        example = format_tool_calls([ToolCall("calculate", {"expression": "12 * (3 + 4)"})])
        turns = f" You have at most {self.max_turns} replies in all." if self.max_turns else ""
        return (
            "You solve arithmetic word problems. You have one tool, calculate(expression), which "
            "evaluates an expression of numbers, + - * / // % ** and parentheses and returns the "
            "result. Use it for the arithmetic; you may call it as often as you need. To call it, "
            f"write:\n{example}\n"
            "When you know the result, reply without a tool call and end your reply with the line:\n"
            "Answer: <number>\n"
            f"Your first reply without a tool call is graded and ends the problem.{turns}"
        )


def _generate(rng: np.random.Generator) -> tuple[str, tuple[str, str, float]]:
    name = list(TEMPLATES)[int(rng.integers(len(TEMPLATES)))]
    numbers, question, answer = TEMPLATES[name](rng)
    key = f"calculator:{name}:" + ",".join(map(str, numbers))
    return key, (key, question, float(answer))


register("agentrl/Calculator-v0", entry_point="agentrl.envs.calculator:CalculatorEnv", kwargs={"max_turns": 6})
