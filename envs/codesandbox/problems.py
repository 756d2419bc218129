"""The catalogue of ``agentrl/CodeSandbox-v0``: every problem, by name, with its split.

The problems were written for agentrl (none is copied from a dataset). Each topic has its module;
this one gathers them, checks that names are unique, and splits them into train and test by the
stable hash of each problem's key (:func:`agentrl.envs._split.split_of`), so the split never
depends on the order of this list or on a seed.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentrl.envs._split import Split, split_of
from agentrl.envs.codesandbox import (
    problems_algorithms,
    problems_lists,
    problems_math,
    problems_parsing,
    problems_strings,
)
from agentrl.envs.codesandbox.problem import Difficulty, Problem
from agentrl.suggest import did_you_mean

PROBLEMS: tuple[Problem, ...] = (
    *problems_strings.PROBLEMS,
    *problems_lists.PROBLEMS,
    *problems_math.PROBLEMS,
    *problems_parsing.PROBLEMS,
    *problems_algorithms.PROBLEMS,
)
"""Every problem, grouped by topic."""

BY_NAME: dict[str, Problem] = {}
"""Every problem by its name."""
for _problem in PROBLEMS:
    if _problem.name in BY_NAME:
        raise ImportError(f"Problem names must be unique; {_problem.name!r} appears twice.")
    BY_NAME[_problem.name] = _problem


def problems_of(split: Split, difficulty: Difficulty | None = None) -> tuple[Problem, ...]:
    """The problems of ``split`` (and of ``difficulty``, if given), in catalogue order."""
    return tuple(p for p in PROBLEMS if split_of(p.key) == split and (difficulty is None or p.difficulty == difficulty))


def get_problem(name: str, choices: Sequence[Problem] = PROBLEMS) -> Problem:
    """The problem called ``name`` among ``choices``; an unknown name raises a ``ValueError``
    that suggests the closest names."""
    for p in choices:
        if p.name == name:
            return p
    names = [p.name for p in choices]
    hint = did_you_mean(name, names) or f"Known problems: {', '.join(names)}."
    where = "" if len(choices) == len(PROBLEMS) else " in this split"
    raise ValueError(f"Unknown problem {name!r}{where}. {hint}")
