"""What a programming problem of ``agentrl/CodeSandbox-v0`` is: a statement, a function to write, hidden cases.

A :class:`Problem` asks for one Python function in ``solution.py``. Its hidden :class:`Case` list
holds argument tuples and the values the function must return (or :class:`Raises` for an exception
it must raise). Only the arguments ever enter a sandbox; the expected values stay in the env's
process, which is what makes the grade impossible to forge (see :mod:`.grading`).

Every problem also carries a ``reference`` solution and a ``wrong`` one (a plausible near miss, not
a stub). Neither is shown to the agent: the test suite runs both through the real grader to prove
that the hidden cases accept the reference and catch the mistake.

Values in cases are Python literals (numbers, strings, ``None``, booleans, lists, tuples, dicts,
sets), because they travel to the sandbox and back as ``repr`` text read with ``ast.literal_eval``.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

Difficulty = Literal["easy", "medium", "hard"]
DIFFICULTIES: tuple[Difficulty, ...] = ("easy", "medium", "hard")

_FUNCTION = re.compile(r"^def\s+([A-Za-z_]\w*)\s*\(")


@dataclass(frozen=True)
class Raises:
    """The expected outcome of a case that must raise an exception, named by its class name.

    >>> Raises("ValueError")
    Raises(error='ValueError')
    """

    error: str


@dataclass(frozen=True)
class Case:
    """One hidden test: call the function with ``args``; it must return ``expected`` (or raise it)."""

    args: tuple[Any, ...]
    expected: Any


@dataclass(frozen=True)
class Problem:
    """One programming problem: write ``signature``'s function in ``solution.py``.

    Attributes:
        name: A unique snake_case name; also the name of the function to write.
        difficulty: ``easy``, ``medium`` or ``hard``.
        signature: The ``def`` line of the function, with type hints, e.g. ``def f(x: int) -> int:``.
        statement: What the function must do, in prose, edge cases included.
        cases: The hidden tests. The first ``shown`` of them appear in the statement as examples.
        reference: A correct ``solution.py`` (for the test suite only).
        wrong: A plausible, subtly wrong ``solution.py`` that the cases must catch (test suite only).
        shown: How many cases the statement shows as examples.
    """

    name: str
    difficulty: Difficulty
    signature: str
    statement: str
    cases: tuple[Case, ...]
    reference: str
    wrong: str
    shown: int = 2

    def __post_init__(self) -> None:
        match = _FUNCTION.match(self.signature)
        if match is None or match.group(1) != self.name:
            raise ValueError(
                f"Problem {self.name!r}: the signature must be 'def {self.name}(...) -> ...:', got {self.signature!r}."
            )
        if self.difficulty not in DIFFICULTIES:
            raise ValueError(
                f"Problem {self.name!r}: difficulty must be one of {DIFFICULTIES}, got {self.difficulty!r}."
            )
        if not 1 <= self.shown < len(self.cases):
            raise ValueError(
                f"Problem {self.name!r}: shown must leave hidden cases (1 <= shown < {len(self.cases)}), got {self.shown}."
            )

    @property
    def key(self) -> str:
        """The canonical key of the problem; its stable hash decides the train/test split."""
        return f"codesandbox:{self.name}"

    def call_text(self, case: Case) -> str:
        """How a call of the case reads in Python, e.g. ``rotate([1, 2, 3], 1)``."""
        return f"{self.name}({', '.join(map(repr, case.args))})"

    def example_text(self, case: Case) -> str:
        """One example line for the statement: ``call -> value`` or ``call raises Error``."""
        if isinstance(case.expected, Raises):
            return f"{self.call_text(case)} raises {case.expected.error}"
        return f"{self.call_text(case)} -> {case.expected!r}"

    def prompt(self) -> str:
        """The problem as the agent reads it: statement, signature and examples."""
        examples = "\n".join(f"    {self.example_text(c)}" for c in self.cases[: self.shown])
        return (
            f"{self.statement}\n\nWrite this function in solution.py:\n\n    {self.signature}\n\nExamples:\n{examples}"
        )


def problem(
    name: str,
    difficulty: Difficulty,
    signature: str,
    statement: str,
    cases: Iterable[tuple[tuple[Any, ...], Any]],
    reference: str,
    wrong: str,
    shown: int = 2,
) -> Problem:
    """Build a :class:`Problem` from ``(args, expected)`` pairs, dedenting the prose and the code."""
    return Problem(
        name=name,
        difficulty=difficulty,
        signature=signature,
        statement=" ".join(textwrap.dedent(statement).split()),
        cases=tuple(Case(tuple(args), expected) for args, expected in cases),
        reference=textwrap.dedent(reference).strip() + "\n",
        wrong=textwrap.dedent(wrong).strip() + "\n",
        shown=shown,
    )
