"""Grading a ``solution.py`` against a problem's hidden cases, in a sandbox the agent never touches.

How a grade is made, and why the agent cannot forge it:

1. The env reads ``solution.py`` from the agent's sandbox, as text. Nothing else of the agent's
   sandbox is used: no other file, no process, no environment variable.
2. A separate grader sandbox, reset (empty work dir, no processes) before and after, receives that
   text as its ``solution.py``. A short harness (:data:`HARNESS`, given on the command line) reads
   the cases' *arguments* from stdin, imports the solution, calls the function once per case and
   writes one JSON line per case with the ``repr`` of the value returned (or the exception's class
   name) on a private copy of stdout. The solution's own prints go to stderr.
3. The expected values never enter any sandbox. The env parses the report here, in its own
   process, with ``ast.literal_eval`` (never ``eval``), and compares each value with the expected
   one. A solution that prints fake reports, exits early, writes or deletes files, patches the
   harness or kills it only loses cases: a case passes only when a value the solution produced
   equals the hidden expected value, which it can do only by computing it. (A report line it forges
   on the harness's descriptor is a value it chose: forging the right one is answering.)

Comparison (:func:`matches`): exact for ``int``, ``str``, ``bool`` and ``None`` (``True`` is not
``1``); floats within a relative 1e-6 (absolute 1e-9); lists and tuples are interchangeable
sequences compared item by item; dicts and sets compare as such. A case that expects an exception
passes when the function raises one of that class name.

Limits, said plainly: the grader runs with the sandbox's limits plus a whole-run timeout; cases not
reported when it ends (timeout, crash, ``os._exit``) fail. The solution may use the standard library
only, since the grader holds nothing but ``solution.py``.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.envs.codesandbox.problem import Case, Problem, Raises
from agentrl.sandboxes.base import ExecResult, Sandbox

SOLUTION_FILE = "solution.py"
MAX_VALUE_CHARS = 20_000
"""The harness cuts a returned value's ``repr`` here; a value that long is never a right answer."""

# Run as `python3 -I -c HARNESS <case limit> <module:function>...` with one `repr((job, case, args))`
# per line on stdin; job i is the i-th module:function. It reads every case before importing any
# solution, so a solution cannot change them. A case limit of 0 means no limit per case.
HARNESS = r"""
import ast, copy, json, os, signal, sys

class CaseTimeout(BaseException):
    pass

def main():
    case_limit = float(sys.argv[1])
    jobs = [job.split(":") for job in sys.argv[2:]]
    cases = [ast.literal_eval(line) for line in sys.stdin.read().splitlines() if line.strip()]
    report = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the solutions' own prints go to stderr, never into the report

    def emit(entry):
        report.write(json.dumps(entry) + "\n")
        report.flush()

    def describe(error):
        try:
            return (type(error).__name__ + ": " + str(error))[:300]
        except BaseException:
            return type(error).__name__

    def on_alarm(signum, frame):
        raise CaseTimeout()

    def limited(call):
        if case_limit > 0:
            signal.setitimer(signal.ITIMER_REAL, case_limit)
        try:
            return call()
        finally:
            if case_limit > 0:
                signal.setitimer(signal.ITIMER_REAL, 0)

    if case_limit > 0:
        signal.signal(signal.SIGALRM, on_alarm)
    sys.path.insert(0, os.getcwd())
    functions = {}
    for job, (module, name) in enumerate(jobs):
        try:
            functions[job] = getattr(limited(lambda: __import__(module)), name)
        except BaseException as e:
            emit({"job": job, "load_error": describe(e)})
    for job, case, args in cases:
        if job not in functions:
            continue
        try:
            text = limited(lambda: repr(functions[job](*copy.deepcopy(args)))[:LIMIT])
        except CaseTimeout:
            emit({"job": job, "case": case, "timed_out": True})
        except BaseException as e:
            emit({"job": job, "case": case, "raised": type(e).__name__, "message": describe(e)})
        else:
            emit({"job": job, "case": case, "value": text})

main()
""".replace("LIMIT", str(MAX_VALUE_CHARS))


@dataclass(frozen=True)
class CaseOutcome:
    """What one hidden case came to: passed or not, and a line saying what happened."""

    passed: bool
    detail: str


@dataclass(frozen=True)
class Grade:
    """The verdict on one solution.

    Attributes:
        passed: Hidden cases passed.
        total: Hidden cases in all.
        outcomes: One :class:`CaseOutcome` per case, in order (empty when nothing ran).
        error: Why the solution could not be run at all, or why the run ended early (a timeout, a
            crash), else None.
    """

    passed: int
    total: int
    outcomes: tuple[CaseOutcome, ...] = ()
    error: str | None = None

    @property
    def success(self) -> bool:
        """Every hidden case passed."""
        return self.total > 0 and self.passed == self.total

    def summary(self) -> str:
        """A few lines for the agent: the count, what stopped the run, the first failure."""
        lines = [f"Passed {self.passed} of {self.total} hidden tests."]
        if self.error:
            lines.append(self.error)
        failed = next((o for o in self.outcomes if not o.passed), None)
        if failed is not None:
            lines.append(f"First failure: {failed.detail}")
        return "\n".join(lines)


def grade_source(sandbox: Sandbox, problem: Problem, source: str, timeout: float) -> Grade:
    """Grade ``source`` as ``solution.py`` in ``sandbox``, a clean grader sandbox; blocking.

    ``timeout`` bounds the whole run. Raises :class:`~agentrl.sandboxes.SandboxError` only when the
    sandbox itself fails; everything the solution does wrong is in the :class:`Grade`.
    """
    return grade_many(sandbox, [(problem, source)], timeout)[0]


def grade_many(
    sandbox: Sandbox, solutions: Sequence[tuple[Problem, str]], timeout: float, case_timeout: float = 0.0
) -> list[Grade]:
    """Grade several ``(problem, source)`` pairs in one Python process, one :class:`Grade` each.

    For checking many solutions at once (the catalogue's reference solutions, say): it costs one
    interpreter start instead of one per solution, but the solutions share that process, so one
    that calls ``os._exit`` or hangs past ``timeout`` costs the ones after it their unreported
    cases. ``case_timeout`` (seconds, 0 for none) stops a single slow case and moves on.
    """
    jobs: list[str] = []
    lines: list[str] = []
    for job, (problem, source) in enumerate(solutions):
        module = "solution" if len(solutions) == 1 else f"solution_{job}"
        sandbox.write_file(f"{module}.py", source)
        jobs.append(f"{module}:{problem.name}")
        lines += [repr((job, i, case.args)) + "\n" for i, case in enumerate(problem.cases)]
    argv = ["python3", "-I", "-c", HARNESS, repr(float(case_timeout)), *jobs]
    result = sandbox.exec(argv, timeout=timeout, stdin="".join(lines))
    return [judge(problem, result, timeout, job, case_timeout) for job, (problem, _) in enumerate(solutions)]


def judge(problem: Problem, result: ExecResult, timeout: float, job: int = 0, case_timeout: float = 0.0) -> Grade:
    """Compare the harness's report on ``job`` in ``result`` with ``problem``'s expected values."""
    reports: dict[int, dict[str, Any]] = {}
    load_error: str | None = None
    for line in result.stdout.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a torn or forged line: it can only cost the solution a case
        if not isinstance(entry, dict) or entry.get("job") != job:
            continue
        if "load_error" in entry and load_error is None and not reports:
            load_error = str(entry["load_error"])
        index = entry.get("case")
        if isinstance(index, int) and not isinstance(index, bool) and index not in reports:
            reports[index] = entry
    total = len(problem.cases)
    if load_error is not None:
        return Grade(0, total, error=f"{SOLUTION_FILE} could not be loaded: {load_error}")
    outcomes = tuple(_outcome(problem, case, reports.get(i), case_timeout) for i, case in enumerate(problem.cases))
    passed = sum(o.passed for o in outcomes)
    error = None
    if len(reports) < total:
        error = _why_cut_short(result, timeout)
    return Grade(passed, total, outcomes, error)


def matches(expected: Any, got: Any) -> bool:
    """Whether a returned value ``got`` counts as ``expected`` (see the module doc for the rules).

    >>> matches([1, (2.0, "a")], (1, [2.0000000001, "a"])), matches(1, True), matches(1.5, 1)
    (True, False, False)
    """
    if isinstance(expected, bool) or expected is None:
        return type(got) is type(expected) and got == expected
    if isinstance(expected, float):
        return (
            isinstance(got, (int, float))
            and not isinstance(got, bool)
            and math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9)
        )
    if isinstance(expected, (list, tuple)):
        return (
            isinstance(got, (list, tuple))
            and len(got) == len(expected)
            and all(matches(e, g) for e, g in zip(expected, got))
        )
    if isinstance(expected, dict):
        return (
            isinstance(got, dict)
            and set(_keys(got)) == set(_keys(expected))
            and all(matches(expected[k], got[k]) for k in expected)
        )
    if isinstance(expected, (set, frozenset)):
        return isinstance(got, (set, frozenset)) and got == expected
    return type(got) is type(expected) and got == expected


def _keys(mapping: dict[Any, Any]) -> Sequence[Any]:
    # A key of the wrong type (1 for "1", True for 1) must not pass for the right one.
    return [(type(k), k) for k in mapping]


def _outcome(problem: Problem, case: Case, entry: dict[str, Any] | None, case_timeout: float) -> CaseOutcome:
    call = problem.call_text(case)
    want = f"raise {case.expected.error}" if isinstance(case.expected, Raises) else f"return {case.expected!r}"
    if entry is None:
        return CaseOutcome(False, _clip(f"{call} should {want}, but the run ended before it was reported."))
    if entry.get("timed_out"):
        return CaseOutcome(
            False, _clip(f"{call} should {want}, but it ran past the limit of {case_timeout:g} s per test.")
        )
    if "raised" in entry:
        raised = str(entry["raised"])
        if isinstance(case.expected, Raises) and raised == case.expected.error:
            return CaseOutcome(True, f"{call} raised {raised}")
        return CaseOutcome(False, _clip(f"{call} should {want}, but it raised {entry.get('message', raised)}."))
    text = str(entry.get("value", ""))
    if isinstance(case.expected, Raises):
        return CaseOutcome(False, _clip(f"{call} should {want}, but it returned {text}."))
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return CaseOutcome(False, _clip(f"{call} should {want}, but it returned {text}, which is not a plain value."))
    if matches(case.expected, value):
        return CaseOutcome(True, f"{call} returned {text}")
    return CaseOutcome(False, _clip(f"{call} should {want}, but it returned {text}."))


def _why_cut_short(result: ExecResult, timeout: float) -> str:
    if result.timed_out:
        return f"The tests ran past the time limit of {timeout:g} s."
    if result.oom:
        return "The tests ran out of memory."
    if result.truncated:
        return "The tests printed too much output."
    tail = result.stderr.strip().splitlines()[-1:] or [f"exit code {result.exit_code}"]
    return _clip(f"The test run stopped early: {tail[0]}")


def _clip(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
