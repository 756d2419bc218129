"""``agentrl/CodeSandbox-v0``: write a Python function in a sandbox of your own; hidden tests grade it.

Each episode poses one problem of the catalogue (:mod:`.problems`: a statement, the function to
write in ``solution.py``, a few examples). The agent works in its own sandbox through four tools:

- ``write_file(path, content)`` and ``read_file(path)``: files in its work directory;
- ``run(command)``: a shell command there (``run_timeout`` seconds), answered with the exit code,
  stdout and stderr, and whether it timed out or ran out of memory;
- ``submit()``: grade ``solution.py`` and end the episode.

Rules of an episode:

- A reply with tool calls is answered with one ``tool`` message per call and the episode goes on;
  calls after a ``submit`` in the same reply still run but cannot change the grade.
- ``submit()`` grades ``solution.py`` as it is at that moment and ends the episode (``terminated``).
- A reply without a tool call also ends it: ``solution.py`` is graded as it stands (a missing file
  scores 0). Like the calculator env's final answer, so a model that answers in prose learns fast
  that prose earns nothing.
- Replies run out after ``max_turns`` (default 8): the episode is truncated with reward 0 and no
  grading. The reply before the last is warned.
- Reward 1.0 if every hidden test passes, else 0.0.
- A sandbox that fails (its Docker Engine gone, its server dead and not restartable: a
  :class:`~agentrl.sandboxes.SandboxError`, e.g. :class:`~agentrl.sandboxes.DockerUnavailable`), the
  agent's or the grader's, fails the episode with that error: no reward can be given, and the agent
  is never shown a failure that is not its own.

Grading happens where the agent cannot reach it. The env reads the *text* of ``solution.py`` from
the agent's sandbox and nothing else; a separate grader sandbox from another pool, reset before it
is handed out, runs that text against the hidden cases' arguments only, and the expected values are
compared here, in the env's process (:mod:`.grading` explains the protocol). So a solution that
writes files, kills processes, prints fake results or edits anything in the agent's sandbox gains
nothing: only values it computes for the hidden inputs count.

Sandboxes come from the pools that every env of the process shares
(:func:`agentrl.sandboxes.shared_pool`, one per backend, image and limits, and per role), made on
demand, up to ``pool_size`` for agents and as many for grading: an env takes one at ``reset`` (a
:class:`~agentrl.sandboxes.Lease`) and gives it back when the episode ends or the env closes (or is
garbage-collected); the pool resets it in the background before anyone else gets it. A new ``reset``
in the middle of an episode resets the sandbox held and keeps it. Give ``pool_size`` at least the
number of episodes run at once, or resets wait for a free sandbox.

The final step's ``info`` holds ``success``, ``tests_passed``, ``tests_total``, ``problem``,
``difficulty`` and ``ended_by`` (``submit`` or ``reply``); every step's holds ``problem``.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from agentrl.env import Action, AgentEnv, Feedback, Observation, StepResult
from agentrl.envs._split import Split, check_split
from agentrl.envs.codesandbox.grading import SOLUTION_FILE, Grade, grade_source
from agentrl.envs.codesandbox.problem import DIFFICULTIES, Difficulty, Problem
from agentrl.envs.codesandbox.problems import get_problem, problems_of
from agentrl.registry import register
from agentrl.sandboxes.base import ExecResult, Sandbox, SandboxError, SandboxLimits
from agentrl.sandboxes.make import BACKENDS, Backend, SandboxSpec
from agentrl.sandboxes.shared import Lease, shared_pool
from agentrl.suggest import did_you_mean
from agentrl.tool_calls import format_tool_calls
from agentrl.tools import ToolResult
from agentrl.types import Message, ToolCall

MAX_OUTPUT_CHARS = 4000
"""Most characters of each output stream (and of a file read) shown to the agent; the middle goes."""
T = TypeVar("T")


class CodeSandboxEnv(AgentEnv):
    """Write ``solution.py`` in a sandbox with write_file / read_file / run, then submit() it."""

    def __init__(
        self,
        split: Split = "train",
        difficulty: Difficulty | None = None,
        backend: Backend = "auto",
        image: str | None = None,
        limits: SandboxLimits | Mapping[str, Any] | None = None,
        pool_size: int = 8,
        max_turns: int | None = 8,
        run_timeout: float = 10.0,
        grade_timeout: float = 30.0,
        render_mode: str | None = None,
    ):
        """Make the env; no sandbox starts until the first ``reset``.

        Args:
            split: ``train`` or ``test``: the problems whose key hashes to that split.
            difficulty: Only problems of this difficulty (``easy``, ``medium``, ``hard``); None for all.
            backend: ``auto`` (Docker if its engine and image answer, else bubblewrap), ``docker``
                or ``local``.
            image: The Docker image; None for ``agentrl.sandboxes.DEFAULT_IMAGE``.
            limits: Each sandbox's limits, as ``SandboxLimits`` or a dict of its fields.
            pool_size: Most agent sandboxes (and, apart, grader sandboxes) alive in this process
                for envs of the same backend, image and limits.
            max_turns: Most replies per episode.
            run_timeout: Seconds a ``run`` command may take before it is killed.
            grade_timeout: Seconds the hidden tests may take in all.
        """
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.split = check_split(split)
        if difficulty is not None and difficulty not in DIFFICULTIES:
            raise ValueError(f"difficulty must be one of {DIFFICULTIES} or None, got {difficulty!r}.")
        if backend not in BACKENDS:
            hint = did_you_mean(backend, BACKENDS)
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}. {hint}".rstrip())
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, got {pool_size}.")
        for name, value in (("run_timeout", run_timeout), ("grade_timeout", grade_timeout)):
            if not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}.")
        self.problems = problems_of(self.split, difficulty)
        if not self.problems:
            raise ValueError(f"No {difficulty} problem is in the {split!r} split; choose another difficulty or None.")
        self.run_timeout = float(run_timeout)
        self.grade_timeout = float(grade_timeout)
        # Tools get their own limit above the sandbox's, so a slow command reports its own timeout.
        self.tool_timeout = max(self.run_timeout, self.grade_timeout) + 30.0
        self._agent = Lease(SandboxSpec(backend, image, _limits(limits)), pool_size, "agent")
        # An env dropped without close() still gives its sandbox back.
        weakref.finalize(self, self._agent.release)
        self.problem: Problem = self.problems[0]
        """The problem of the current episode."""
        self.grade: Grade | None = None
        """The current episode's grade, once graded."""
        self._sandbox_error: BaseException | None = None
        """What broke a sandbox (the agent's, or the grader's) this episode; it fails the episode."""

    # --- the tools: methods, so they reach this env's own sandbox --------------------------------

    async def write_file(self, path: str, content: str) -> str:
        """Create or replace a text file in your sandbox (missing folders are made).

        Args:
            path: Where, relative to your work directory, e.g. "solution.py".
            content: The whole new content of the file.
        """
        await self._on_sandbox(self._sandbox().awrite_file(path, content))
        return f"Wrote {len(content.encode('utf-8'))} bytes to {path}."

    async def read_file(self, path: str) -> str:
        """Show a text file of your sandbox.

        Args:
            path: The file, relative to your work directory, e.g. "solution.py".
        """
        data = await self._on_sandbox(self._sandbox().aread_file(path))
        text = data.decode("utf-8", errors="replace")
        return _clip_middle(text, MAX_OUTPUT_CHARS) if text else f"({path} is empty)"

    async def run(self, command: str) -> str:
        """Run a shell command in your sandbox's work directory; see its exit code, stdout and stderr.

        Args:
            command: A /bin/sh command line, e.g. "python3 solution.py" or
                "python3 -c 'from solution import f; print(f(2))'". A background process that
                keeps the output open holds the command until its time limit: redirect it
                ("cmd > log.txt 2>&1 &").
        """
        result = await self._on_sandbox(self._sandbox().aexec(command, timeout=self.run_timeout))
        return describe_run(result, self.run_timeout)

    def submit(self) -> str:
        """Submit solution.py: hidden tests grade it and the problem ends. Call it once, when done."""
        # A plain function on purpose: grading is several blocking steps (read, take a grader,
        # write, run, reset), and the base class runs plain tools on a worker thread as one unit.
        if self.grade is None:
            try:
                self.grade = self._grade_solution()
            except BaseException as e:
                self._sandbox_error = e
                raise
        return _verdict(self.grade)

    tools = (write_file, read_file, run, submit)

    # --- the episode -------------------------------------------------------------------------

    def start(self, options: dict[str, Any] | None) -> Observation:
        """Pick a problem (``options={"problem": name}`` picks one by name) and ready a clean sandbox."""
        name = (options or {}).get("problem")
        if name is not None:
            self.problem = get_problem(str(name), self.problems)
        else:
            self.problem = self.problems[int(self.np_random.integers(len(self.problems)))]
        self.grade, self._sandbox_error = None, None
        self._agent.renew()
        return [Message("system", self._rules()), Message("user", self.problem.prompt())]

    def answer_tools(self, reply: Message, results: list[ToolResult]) -> Feedback:
        """Answer the calls; end the episode with the grade if one of them was ``submit``."""
        feedback = super().answer_tools(reply, results)
        info = {**feedback.info, "problem": self.problem.name}
        if self._sandbox_error is not None:
            # A sandbox failed, not the agent: no reward can be given, so the episode fails loudly.
            raise self._sandbox_error
        if self.grade is not None:
            return Feedback(feedback.messages, float(self.grade.success), True, {**info, **self._grade_info("submit")})
        messages = list(feedback.messages)
        if self.max_turns is not None and self.turn == self.max_turns - 1:
            messages.append(
                Message("user", "You have one reply left: call submit() in it, or the problem ends unscored.")
            )
        return Feedback(messages, 0.0, False, info)

    def respond(self, reply: Message) -> Feedback:
        """A reply without tool calls: grade ``solution.py`` as it stands and end the episode."""
        self.grade = self._grade_solution()
        text = "Your reply had no tool call, so solution.py was graded as it stands.\n" + _verdict(self.grade)
        info = {"problem": self.problem.name, **self._grade_info("reply")}
        return Feedback([Message("user", text)], float(self.grade.success), True, info)

    # The sandbox goes back when the episode ends or fails. Giving it back returns at once (the pool
    # resets it on its own thread), so astep does it on the loop. A call cancelled mid-way (an episode
    # timeout) may hold the sandbox on its thread for up to run_timeout more: _on_sandbox tainted the
    # lease, so the pool closes that sandbox instead of lending it again.

    def step(self, action: Action) -> StepResult:
        try:
            result = super().step(action)
        except BaseException:
            self._agent.release()
            raise
        if result.terminated or result.truncated:
            self._agent.release()
        return result

    async def astep(self, action: Action) -> StepResult:
        try:
            result = await super().astep(action)
        except BaseException:
            self._agent.release()
            raise
        if result.terminated or result.truncated:
            self._agent.release()
        return result

    def close(self) -> None:
        """Give the sandbox back to the pool (the pool itself lives on for other envs)."""
        self._agent.release()
        super().close()

    # --- helpers -------------------------------------------------------------------------------

    def _sandbox(self) -> Sandbox:
        sandbox = self._agent.sandbox
        if sandbox is None:
            raise RuntimeError("This env holds no sandbox: the episode is over. Call reset() to start one.")
        return sandbox

    async def _on_sandbox(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except asyncio.CancelledError:
            # The call may still run on its thread: the sandbox must not go to another episode.
            self._agent.taint()
            raise
        except SandboxError as e:
            # The sandbox itself failed (e.g. DockerUnavailable): answer_tools fails the episode, and
            # the sandbox is closed, not lent again.
            self._agent.taint()
            self._sandbox_error = e
            raise

    def _grade_solution(self) -> Grade:
        total = len(self.problem.cases)
        try:
            source = self._sandbox().read_file(SOLUTION_FILE).decode("utf-8", errors="replace")
        except FileNotFoundError:
            return Grade(0, total, error=f"There is no {SOLUTION_FILE} in your work directory.")
        except IsADirectoryError:
            return Grade(0, total, error=f"{SOLUTION_FILE} is a directory, not a file.")
        # A grader of its own pool: lent only once reset, given back (and reset again) after.
        graders = shared_pool(self._agent.spec, self._agent.size, "grader")
        with graders.sandbox() as grader:
            return grade_source(grader, self.problem, source, self.grade_timeout)

    def _grade_info(self, ended_by: str) -> dict[str, Any]:
        assert self.grade is not None
        return {
            "success": self.grade.success,
            "tests_passed": self.grade.passed,
            "tests_total": self.grade.total,
            "difficulty": self.problem.difficulty,
            "ended_by": ended_by,
        }

    def _rules(self) -> str:
        example = format_tool_calls(
            [
                ToolCall(
                    "write_file", {"path": SOLUTION_FILE, "content": "def double(x: int) -> int:\n    return 2 * x\n"}
                )
            ]
        )
        turns = f" You have at most {self.max_turns} replies." if self.max_turns else ""
        return (
            "You solve a programming problem by writing a Python function in solution.py, in a "
            "sandbox: a Linux machine of your own with python3 and its standard library (no network, "
            "no pip). Your tools:\n"
            "- write_file(path, content): create or replace a file in your work directory;\n"
            "- read_file(path): show a file;\n"
            f"- run(command): run a shell command in your work directory (at most {self.run_timeout:g} s) "
            "and see its exit code, stdout and stderr;\n"
            "- submit(): grade solution.py with hidden tests and end the problem.\n"
            f"To call a tool, write, for example:\n{example}\n"
            'Write solution.py, try it with run (for example: python3 -c "from solution import double; '
            'print(double(4))"), fix what fails, then call submit(). A reply without a tool call also '
            "ends the problem, grading solution.py as it stands. Only solution.py is graded, by hidden "
            "tests in a separate clean sandbox, so keep everything it needs in that one file and use the "
            f"standard library only. The reward is 1 if every hidden test passes, else 0.{turns}"
        )


def describe_run(result: ExecResult, timeout: float) -> str:
    """What the agent reads after ``run``: how the command ended, then its stdout and stderr."""
    if result.timed_out:
        head = f"Timed out after {timeout:g} s: the command was killed."
    elif result.oom:
        ended = "it was killed" if result.exit_code in (None, -9) else f"exit code {result.exit_code}"
        head = f"Out of memory: the command hit the sandbox's memory limit ({ended})."
    elif result.exit_code is None:
        head = "The command did not finish (see stderr)."
    else:
        head = f"Exit code: {result.exit_code}"
    parts = [head]
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        parts.append(f"{name}:\n{_clip_middle(text, MAX_OUTPUT_CHARS)}" if text else f"{name}: (empty)")
    return "\n".join(parts)


def _verdict(grade: Grade) -> str:
    return f"{grade.summary()}\nReward: {float(grade.success):g}"


def _clip_middle(text: str, limit: int) -> str:
    # Keep both ends: the first lines show what ran, the last ones how it ended (a traceback).
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def _limits(limits: SandboxLimits | Mapping[str, Any] | None) -> SandboxLimits:
    if limits is None:
        return SandboxLimits()
    if isinstance(limits, SandboxLimits):
        return limits
    try:
        return SandboxLimits(**dict(limits))
    except TypeError as e:
        raise ValueError(
            f"limits must be a SandboxLimits or a dict of its fields (memory_mb, cpus, pids, disk_mb, "
            f"output_bytes, timeout); got {dict(limits)!r}: {e}"
        ) from e


register("agentrl/CodeSandbox-v0", entry_point="agentrl.envs.codesandbox.env:CodeSandboxEnv", kwargs={"max_turns": 8})
