"""``agentrl/CodeSandbox-v0``: write a Python function in a sandbox; hidden tests in another sandbox grade it.

Importing the package registers the id (in :mod:`.env`).

:mod:`.env` holds the env and its rules, :mod:`.problems` the catalogue of problems, :mod:`.grading`
the tamper-proof grader. Sandboxes come from the pools of :mod:`agentrl.sandboxes.pool` that the
envs of a process share; ``close_pools``, re-exported here, closes them.
"""

from agentrl.envs.codesandbox.env import CodeSandboxEnv
from agentrl.envs.codesandbox.grading import Grade, grade_many, grade_source
from agentrl.envs.codesandbox.problem import Case, Problem, Raises
from agentrl.envs.codesandbox.problems import PROBLEMS, get_problem, problems_of
from agentrl.sandboxes.shared import close_pools

__all__ = [
    "PROBLEMS",
    "Case",
    "CodeSandboxEnv",
    "Grade",
    "Problem",
    "Raises",
    "close_pools",
    "get_problem",
    "grade_many",
    "grade_source",
    "problems_of",
]
