"""CodeSandbox-v0: the catalogue, the tamper-proof grader, episodes, and the sandbox pools.

Two tiers. The unit tests check the logic around the sandboxes (grading rules, episode rules,
pool bookkeeping) against a small in-process stand-in for the Sandbox protocol (a temp dir and
subprocess). The rest run on the real backends, Docker and bubblewrap, each skipped with its reason
only when it is absent: every problem's reference solution passes its hidden tests and its wrong
one fails, scripted episodes win and lose, tampering earns nothing, check_env passes, and no
sandbox is left behind.
"""

from __future__ import annotations

import ast
import asyncio
import gc
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import agentrl
from agentrl.envs._split import split_of
from agentrl.envs.codesandbox import PROBLEMS, CodeSandboxEnv, close_pools, get_problem, grade_many, problems_of
from agentrl.envs.codesandbox.grading import judge, matches
from agentrl.envs.codesandbox.problem import Raises
from agentrl.sandboxes import DEFAULT_IMAGE, SandboxPool, SandboxSpec, docker_available
from agentrl.sandboxes import pool as pool_module
from agentrl.sandboxes import shared as shared_module
from agentrl.sandboxes.base import ExecResult, SandboxError, SandboxLimits, resolve_in_workdir
from agentrl.sandboxes.docker import OWNER_LABEL, docker_client, owner_label
from agentrl.sandboxes.local import bubblewrap_problem
from agentrl.tool_calls import format_tool_calls
from agentrl.types import ToolCall

pytestmark = pytest.mark.docker  # the sandboxes' Docker backend


def call(name: str, **arguments: Any) -> str:
    return format_tool_calls([ToolCall(name, arguments)])


def calls(*pairs: tuple[str, dict[str, Any]]) -> str:
    return format_tool_calls([ToolCall(name, arguments) for name, arguments in pairs])


def train_problem(difficulty: str | None = None) -> str:
    return next(p.name for p in PROBLEMS if split_of(p.key) == "train" and difficulty in (None, p.difficulty))


# --- the catalogue ----------------------------------------------------------------------------


def test_catalogue_has_fifty_varied_problems_with_hidden_cases() -> None:
    assert len(PROBLEMS) >= 50
    assert len({p.name for p in PROBLEMS}) == len(PROBLEMS)
    assert {p.difficulty for p in PROBLEMS} == {"easy", "medium", "hard"}
    for p in PROBLEMS:
        assert len(p.cases) - p.shown >= 2, f"{p.name} hides too few cases"
        assert p.signature in p.prompt() and p.statement in p.prompt()
        assert p.reference != p.wrong
        for case in p.cases:  # every argument and expected value survives the trip through repr
            assert ast.literal_eval(repr(case.args)) == case.args
            if not isinstance(case.expected, Raises):
                assert matches(case.expected, ast.literal_eval(repr(case.expected)))


def test_split_is_stable_disjoint_and_roughly_a_fifth() -> None:
    train, test = problems_of("train"), problems_of("test")
    assert {p.name for p in train}.isdisjoint(p.name for p in test)
    assert len(train) + len(test) == len(PROBLEMS)
    assert 0.05 <= len(test) / len(PROBLEMS) <= 0.35
    assert all(split_of(f"codesandbox:{p.name}") == "test" for p in test)
    assert all(p.difficulty == "easy" for p in problems_of("train", "easy"))


def test_unknown_problem_names_get_a_suggestion() -> None:
    with pytest.raises(ValueError, match="Did you mean 'squeeze_runs'"):
        get_problem("squeeze_run")


# --- grading rules, on hand-made harness reports -----------------------------------------------


def test_matches_is_exact_on_types_but_lenient_on_floats_and_sequences() -> None:
    assert matches([1, (2, "a")], ((1), [2, "a"]))
    assert matches(0.1 + 0.2, 0.3) and matches(2.0, 2)
    assert not matches(1, True) and not matches(True, 1) and not matches(1, 1.0)
    assert not matches(None, 0) and not matches("1", 1)
    assert matches({"a": [1]}, {"a": (1,)}) and not matches({1: 2}, {"1": 2}) and not matches({1: 2}, {True: 2})
    assert matches({1, 2}, {2, 1}) and not matches({1, 2}, [1, 2])


def report(*lines: str, timed_out: bool = False) -> ExecResult:
    return ExecResult("\n".join(lines), "", None if timed_out else 0, timed_out=timed_out)


def test_judge_counts_only_values_that_equal_the_hidden_ones() -> None:
    p = get_problem("squeeze_runs")
    expected = [c.expected for c in p.cases]
    honest = [json.dumps({"job": 0, "case": i, "value": repr(e)}) for i, e in enumerate(expected)]
    assert judge(p, report(*honest), 5).success
    # A forged "all passed", a torn line, another job's lines: none counts.
    forged = ["ALL TESTS PASSED", '{"passed": true}', "{torn", json.dumps({"job": 1, "case": 0, "value": "'a3bc2'"})]
    grade = judge(p, report(*forged, *honest[1:]), 5)
    assert (grade.passed, grade.success) == (len(expected) - 1, False)
    assert "ended before it was reported" in grade.summary()
    # The first report of a case wins; a later correction does not.
    wrong_first = [json.dumps({"job": 0, "case": 0, "value": "'nope'"}), *honest]
    assert not judge(p, report(*wrong_first), 5).success
    # A timeout before the end fails the unreported cases and says so.
    grade = judge(p, report(*honest[:3], timed_out=True), 7)
    assert grade.passed == 3 and "time limit of 7 s" in grade.summary()
    # A value that is not a literal, and a load error.
    grade = judge(p, report(json.dumps({"job": 0, "case": 0, "value": "<object at 0x1>"})), 5)
    assert "not a plain value" in grade.summary()
    grade = judge(p, report(json.dumps({"job": 0, "load_error": "SyntaxError: bad"})), 5)
    assert grade.passed == 0 and "could not be loaded: SyntaxError" in grade.summary()


def test_judge_accepts_the_expected_exception_only() -> None:
    p = get_problem("chunked")
    index = next(i for i, c in enumerate(p.cases) if isinstance(c.expected, Raises))
    right = judge(p, report(json.dumps({"job": 0, "case": index, "raised": "ValueError", "message": "x"})), 5)
    wrong = judge(p, report(json.dumps({"job": 0, "case": index, "raised": "TypeError", "message": "x"})), 5)
    returned = judge(p, report(json.dumps({"job": 0, "case": index, "value": "[]"})), 5)
    assert right.outcomes[index].passed
    assert not wrong.outcomes[index].passed and not returned.outcomes[index].passed


# --- a stand-in sandbox for the logic tests ------------------------------------------------------


class DirSandbox:
    """The Sandbox protocol over a temp dir and subprocess: no isolation at all, logic tests only."""

    made = 0

    def __init__(self) -> None:
        DirSandbox.made += 1
        self.workdir = tempfile.mkdtemp(prefix="codesandbox-test-")
        self.limits = SandboxLimits()
        self.resets = 0
        self.closed = False

    def exec(self, command: Any, *, timeout: float | None = None, stdin: Any = None) -> ExecResult:
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        try:
            done = subprocess.run(
                argv, cwd=self.workdir, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return ExecResult("", "", None, timed_out=True)
        return ExecResult(done.stdout, done.stderr, done.returncode)

    async def aexec(self, command: Any, *, timeout: float | None = None, stdin: Any = None) -> ExecResult:
        return await asyncio.to_thread(self.exec, command, timeout=timeout, stdin=stdin)

    def write_file(self, path: str, content: str | bytes) -> None:
        full = resolve_in_workdir(self.workdir, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(content.encode() if isinstance(content, str) else content)

    async def awrite_file(self, path: str, content: str | bytes) -> None:
        self.write_file(path, content)

    def read_file(self, path: str) -> bytes:
        with open(resolve_in_workdir(self.workdir, path), "rb") as f:
            return f.read()

    async def aread_file(self, path: str) -> bytes:
        return self.read_file(path)

    def reset(self) -> None:
        self.resets += 1
        shutil.rmtree(self.workdir)
        os.makedirs(self.workdir)

    def close(self) -> None:
        self.closed = True
        shutil.rmtree(self.workdir, ignore_errors=True)


@pytest.fixture
def dir_sandboxes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make every pool of this test hand out DirSandbox instances."""
    close_pools()
    monkeypatch.setattr(SandboxSpec, "make", lambda self: DirSandbox())
    yield
    close_pools()


def pools() -> dict[str, SandboxPool]:
    return {role: p for (_, role), p in shared_module.shared_pools().items()}


def eventually(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Whether ``condition`` holds within ``seconds`` (the pools reset sandboxes on their own threads)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_scripted_episode_wins_with_the_reference_and_loses_with_the_wrong_one(dir_sandboxes: None) -> None:
    name = train_problem()
    p = get_problem(name)
    env = CodeSandboxEnv()
    for source, reward in ((p.reference, 1.0), (p.wrong, 0.0)):
        obs, _ = env.reset(seed=1, options={"problem": name})
        assert [m.role for m in obs] == ["system", "user"] and p.signature in obs[1].content
        result = env.step(call("write_file", path="solution.py", content=source))
        assert result.observation[0].content.startswith("Wrote ") and not result.terminated
        result = env.step(call("run", command=f"python3 -c 'import solution; print(solution.{name}.__name__)'"))
        assert result.observation[0].content == f"Exit code: 0\nstdout:\n{name}\n\nstderr: (empty)"
        result = env.step(call("read_file", path="solution.py"))
        assert result.observation[0].content == source
        result = env.step(call("submit"))
        assert (result.reward, result.terminated, result.truncated) == (reward, True, False)
        assert result.info["success"] is (reward == 1.0) and result.info["ended_by"] == "submit"
        assert result.info["tests_total"] == len(p.cases) and result.info["problem"] == name
        assert f"Reward: {reward:g}" in result.observation[0].content
        assert pools()["agent"].in_use == 0 and pools()["grader"].in_use == 0
    env.close()


def test_a_reply_without_tool_calls_grades_solution_py_as_it_stands(dir_sandboxes: None) -> None:
    name = train_problem()
    env = CodeSandboxEnv()
    env.reset(seed=0, options={"problem": name})
    result = env.step("I think I am done.")
    assert (result.reward, result.terminated) == (0.0, True)
    assert "There is no solution.py" in result.observation[0].content and result.info["ended_by"] == "reply"
    env.reset(seed=0, options={"problem": name})
    env.step(call("write_file", path="solution.py", content=get_problem(name).reference))
    result = env.step("Done.")
    assert (result.reward, result.info["success"], result.info["tests_passed"]) == (
        1.0,
        True,
        result.info["tests_total"],
    )


def test_max_turns_warns_then_truncates_unscored(dir_sandboxes: None) -> None:
    env = CodeSandboxEnv(max_turns=3)
    env.reset(seed=0)
    env.step(call("run", command="true"))
    warned = env.step(call("run", command="true"))
    assert warned.observation[-1].role == "user" and "one reply left" in warned.observation[-1].content
    last = env.step(call("write_file", path="solution.py", content=env.problem.reference))
    assert (last.reward, last.terminated, last.truncated, last.info["success"]) == (0.0, False, True, False)
    assert pools()["agent"].in_use == 0


def test_run_reports_exit_codes_stderr_and_timeouts(dir_sandboxes: None) -> None:
    env = CodeSandboxEnv(run_timeout=0.5)
    env.reset(seed=0)
    failed = env.step(call("run", command="echo out; echo err >&2; exit 3")).observation[0].content
    assert failed == "Exit code: 3\nstdout:\nout\n\nstderr:\nerr\n"
    slow = env.step(call("run", command="sleep 5")).observation[0].content
    assert slow.startswith("Timed out after 0.5 s")
    missing = env.step(call("read_file", path="nope.py")).observation[0].content
    assert missing.startswith("Error:") and "FileNotFoundError" in missing
    outside = env.step(call("write_file", path="../escape.py", content="x")).observation[0].content
    assert outside.startswith("Error:") and "outside the sandbox work dir" in outside
    env.close()


def test_bad_submit_calls_do_not_end_the_episode_and_a_second_submit_changes_nothing(dir_sandboxes: None) -> None:
    env = CodeSandboxEnv()
    env.reset(seed=0)
    bad = env.step('<tool_call>{"name": "submit", "arguments": {"no_such_arg": 1}}</tool_call>')
    assert not bad.terminated and bad.observation[0].content.startswith("Error:")
    result = env.step(
        calls(("submit", {}), ("write_file", {"path": "solution.py", "content": env.problem.reference}), ("submit", {}))
    )
    assert (result.reward, result.terminated) == (0.0, True)
    assert result.observation[0].content == result.observation[2].content  # the same grade twice
    env.close()


def test_reset_mid_episode_keeps_and_cleans_the_sandbox_and_close_returns_it(dir_sandboxes: None) -> None:
    env = CodeSandboxEnv()
    env.reset(seed=0)
    held = env._agent.sandbox
    env.step(call("write_file", path="junk.txt", content="left over"))
    env.reset(seed=1)  # the episode is abandoned
    assert env._agent.sandbox is held and not os.listdir(held.workdir)  # type: ignore[union-attr]
    assert pools()["agent"].in_use == 1
    env.close()
    assert pools()["agent"].in_use == 0 and eventually(lambda: pools()["agent"].idle == 1)  # reset in the background
    env.close()  # twice is fine


def test_an_env_dropped_without_close_gives_its_sandbox_back(dir_sandboxes: None) -> None:
    env = CodeSandboxEnv()
    env.reset(seed=0)
    assert pools()["agent"].in_use == 1
    del env
    gc.collect()
    assert pools()["agent"].in_use == 0


def test_a_full_pool_makes_reset_wait_and_then_fail_clearly(
    dir_sandboxes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "ACQUIRE_TIMEOUT", 0.3)
    first, second = CodeSandboxEnv(pool_size=1), CodeSandboxEnv(pool_size=1)
    first.reset(seed=0)
    with pytest.raises(SandboxError, match="larger pool_size"):
        second.reset(seed=0)
    first.close()
    second.reset(seed=0)  # once given back, the sandbox serves the other env
    assert DirSandbox.made >= 1 and pools()["agent"].in_use == 1
    second.close()


def test_a_grader_failure_fails_the_episode_loudly(dir_sandboxes: None, monkeypatch: pytest.MonkeyPatch) -> None:
    env = CodeSandboxEnv()
    env.reset(seed=0)
    env.step(call("write_file", path="solution.py", content=env.problem.reference))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise SandboxError("the grader's engine went away")

    monkeypatch.setattr("agentrl.envs.codesandbox.env.grade_source", broken)
    with pytest.raises(SandboxError, match="engine went away"):
        env.step(call("submit"))
    assert pools()["agent"].in_use == 0 and pools()["grader"].in_use == 0


def test_async_steps_match_sync_ones_and_keep_the_loop_free(dir_sandboxes: None) -> None:
    name = train_problem()
    reference = get_problem(name).reference
    replies = [
        call("write_file", path="solution.py", content=reference),
        call("run", command="sleep 0.5; echo slept"),
        call("submit"),
    ]

    def play() -> list[Any]:
        env = CodeSandboxEnv()
        record: list[Any] = [env.reset(seed=3, options={"problem": name}).observation]
        record += [env.step(r)[:4] for r in replies]
        env.close()
        return record

    async def aplay() -> tuple[list[Any], int]:
        env = CodeSandboxEnv()
        ticks = 0

        async def heartbeat() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        beat = asyncio.create_task(heartbeat())
        record: list[Any] = [(await env.areset(seed=3, options={"problem": name})).observation]
        record += [(await env.astep(r))[:4] for r in replies]
        beat.cancel()
        env.close()
        return record, ticks

    sync_record = play()
    async_record, ticks = asyncio.run(aplay())
    assert async_record == sync_record and sync_record[-1][1] == 1.0
    assert ticks >= 10  # the loop kept running through the 0.5 s command


def test_env_kwargs_are_checked() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        CodeSandboxEnv(backend="podman")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="difficulty must be one of"):
        CodeSandboxEnv(difficulty="trivial")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limits must be a SandboxLimits"):
        CodeSandboxEnv(limits={"memory": 10})
    with pytest.raises(ValueError, match="run_timeout must be a positive"):
        CodeSandboxEnv(run_timeout=0)
    env = CodeSandboxEnv(limits={"memory_mb": 256})
    assert env._agent.spec.limits == SandboxLimits(memory_mb=256)
    with pytest.raises(ValueError, match="Unknown problem 'knapsackk' in this split"):
        CodeSandboxEnv(split="train").reset(options={"problem": "knapsackk"})


# --- on the real backends -----------------------------------------------------------------------


def backend_missing(backend: str) -> str | None:
    """Why ``backend`` cannot run here, or None when it can."""
    if backend == "local":
        return bubblewrap_problem()
    if not docker_available():
        return "the Docker Engine does not answer"
    if not docker_available(DEFAULT_IMAGE):
        return f"the image {DEFAULT_IMAGE} is not built (agentrl sandbox build-image)"
    return None


@pytest.fixture(scope="module", params=["docker", "local"])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """A real sandbox backend; skipped, with the reason, only where it is absent."""
    missing = backend_missing(request.param)
    if missing is not None:
        pytest.skip(f"{request.param} sandbox backend unavailable: {missing}")
    close_pools()
    yield request.param
    close_pools()


@pytest.fixture
def any_backend() -> Iterator[str]:
    """``auto``: skipped only when neither Docker nor bubblewrap can run here."""
    reasons = {b: backend_missing(b) for b in ("docker", "local")}
    if all(reasons.values()):
        pytest.skip(f"no sandbox backend: docker: {reasons['docker']}; local: {reasons['local']}")
    close_pools()
    yield "auto"
    close_pools()


def leftovers() -> dict[str, int]:
    """Sandboxes of this process still alive: Docker containers with its owner label, bwrap children."""
    counts = {"containers": 0, "bwrap": 0}
    if backend_missing("docker") is None:
        found = docker_client().containers.list(all=True, filters={"label": f"{OWNER_LABEL}={owner_label()}"})
        counts["containers"] = len(found)
    me = str(os.getpid())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                name, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        if rest.split()[1] == me and name.endswith("(bwrap"):
            counts["bwrap"] += 1
    return counts


def test_every_reference_passes_its_hidden_tests_and_every_wrong_solution_fails(backend: str) -> None:
    sandbox = SandboxSpec(backend).make()  # type: ignore[arg-type]
    try:
        started = time.perf_counter()
        references = grade_many(sandbox, [(p, p.reference) for p in PROBLEMS], timeout=120, case_timeout=2)
        sandbox.reset()
        wrongs = grade_many(sandbox, [(p, p.wrong) for p in PROBLEMS], timeout=120, case_timeout=1)
        seconds = time.perf_counter() - started
    finally:
        sandbox.close()
    failing = {p.name: g.summary() for p, g in zip(PROBLEMS, references) if not g.success}
    passing = [p.name for p, g in zip(PROBLEMS, wrongs) if g.success or g.passed == g.total]
    assert not failing, failing
    assert not passing, f"the hidden tests do not catch these wrong solutions: {passing}"
    print(f"{backend}: {len(PROBLEMS)} references and {len(PROBLEMS)} wrong solutions graded in {seconds:.1f} s")


def test_scripted_episodes_on_a_real_sandbox(backend: str) -> None:
    name = train_problem("medium")
    p = get_problem(name)
    env = CodeSandboxEnv(backend=backend)  # type: ignore[arg-type]
    for source, reward in ((p.reference, 1.0), (p.wrong, 0.0)):
        env.reset(seed=0, options={"problem": name})
        env.step(call("write_file", path="solution.py", content=source))
        ran = env.step(call("run", command="python3 -c 'import solution, sys; print(sys.version_info[0])'"))
        assert ran.observation[0].content.startswith("Exit code: 0\nstdout:\n3\n")
        result = env.step(call("submit"))
        assert (result.reward, result.terminated, result.info["success"]) == (reward, True, reward == 1.0)
        assert result.info["tests_total"] == len(p.cases)
    env.reset(seed=0, options={"problem": name})
    limited = env.step(call("run", command="python3 -c 'x = b\"x\" * 1024**3'")).observation[0].content
    assert limited.startswith("Out of memory: the command hit the sandbox's memory limit")
    env.close()
    assert pools()["agent"].in_use == 0


TAMPERING = {
    # A grader that trusted the exit code or the output would pay these.
    "claims success and exits 0": "import os\nprint('All tests passed. OK')\nos._exit(0)\n",
    "forges reports on every descriptor": (
        "import json, os\n"
        "for fd in range(1, 20):\n"
        "    for case in range(50):\n"
        "        try:\n"
        "            os.write(fd, (json.dumps({'job': 0, 'case': case, 'value': 'True'}) + '\\n').encode())\n"
        "        except OSError:\n"
        "            pass\n"
        "os._exit(0)\n"
    ),
    "patches json.dumps to report passes": (
        "import json\n"
        "real = json.dumps\n"
        "json.dumps = lambda entry: real({**entry, 'value': 'True'}) if 'case' in entry else real(entry)\n"
        "def is_loose_palindrome(text):\n"
        "    return None\n"
    ),
    "rewrites the files around it": (
        "import os, glob\n"
        "for path in glob.glob('/work/*') + glob.glob('*'):\n"
        "    try:\n"
        "        open(path, 'w').write('print(\"ALL PASSED\")')\n"
        "    except OSError:\n"
        "        pass\n"
        "def is_loose_palindrome(text):\n"
        "    return True\n"
    ),
    "kills every process it can": "import os, signal\nos.kill(-1, signal.SIGKILL)\n",
}


@pytest.mark.parametrize("how", sorted(TAMPERING))
def test_tampering_solutions_get_no_credit(backend: str, how: str) -> None:
    name = "is_loose_palindrome"  # its hidden answers mix True and False
    env = CodeSandboxEnv(split=split_of(f"codesandbox:{name}"), backend=backend)  # type: ignore[arg-type]
    env.reset(seed=0, options={"problem": name})
    env.step(call("write_file", path="solution.py", content=TAMPERING[how]))
    result = env.step(call("submit"))
    assert (result.reward, result.info["success"]) == (0.0, False), result.observation[0].content
    env.close()


def test_an_agent_that_wrecks_its_own_sandbox_cannot_touch_the_grader(backend: str) -> None:
    name = train_problem()
    p = get_problem(name)
    env = CodeSandboxEnv(backend=backend)  # type: ignore[arg-type]
    env.reset(seed=0, options={"problem": name})
    wreck = "echo 'print(1)' > harness.py; mkdir -p tests; echo 'assert True' > tests/test_all.py; kill -9 -1; true"
    env.step(calls(("write_file", {"path": "solution.py", "content": p.wrong}), ("run", {"command": wreck})))
    assert env.step(call("submit")).reward == 0.0
    env.reset(seed=0, options={"problem": name})
    env.step(calls(("run", {"command": wreck}), ("write_file", {"path": "solution.py", "content": p.reference})))
    assert env.step(call("submit")).reward == 1.0
    env.close()


def test_check_env_passes(any_backend: str) -> None:
    agentrl.check_env(agentrl.make("agentrl/CodeSandbox-v0", backend=any_backend))
    agentrl.check_env(agentrl.make("agentrl/CodeSandbox-v0", split="test", backend=any_backend))


def test_concurrent_episodes_overlap_and_abandoned_ones_leave_nothing_behind(backend: str) -> None:
    name = train_problem()
    reference = get_problem(name).reference

    async def main() -> tuple[list[float], float]:
        envs = [CodeSandboxEnv(backend=backend) for _ in range(4)]  # type: ignore[arg-type]
        await asyncio.gather(*(env.areset(seed=0, options={"problem": name}) for env in envs))
        started = time.perf_counter()
        await asyncio.gather(*(env.astep(call("run", command="sleep 1")) for env in envs))
        seconds = time.perf_counter() - started
        write = call("write_file", path="solution.py", content=reference)
        await asyncio.gather(*(env.astep(write) for env in envs))
        results = await asyncio.gather(*(env.astep(call("submit")) for env in envs))
        for env in envs:
            env.close()
        return [float(r.reward) for r in results], seconds

    rewards, seconds = asyncio.run(main())
    assert rewards == [1.0] * 4
    assert seconds < 3.0, f"4 episodes' 1 s commands took {seconds:.1f} s in all: they did not overlap"

    # Abandoned three ways: reset mid-episode, dropped without close, cancelled mid-command.
    kept = CodeSandboxEnv(backend=backend)  # type: ignore[arg-type]
    kept.reset(seed=0)
    kept.step(call("run", command="sleep 60 > /dev/null 2>&1 &"))
    kept.reset(seed=1)
    count_sleeps = "import os; print(sum(open(f'/proc/{p}/comm').read() == 'sleep\\n' for p in os.listdir('/proc') if p.isdigit()))"
    assert (
        kept.step(call("run", command=f'python3 -c "{count_sleeps}"'))
        .observation[0]
        .content.startswith("Exit code: 0\nstdout:\n0\n")
    )
    dropped = CodeSandboxEnv(backend=backend)  # type: ignore[arg-type]
    dropped.reset(seed=0)
    del dropped
    gc.collect()
    cancelled = CodeSandboxEnv(backend=backend, run_timeout=3)  # type: ignore[arg-type]
    cancelled.reset(seed=0)

    async def cut_short() -> float:
        started = time.perf_counter()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(cancelled.astep(call("run", command="sleep 30")), 0.5)
        return time.perf_counter() - started

    assert asyncio.run(cut_short()) < 2.0  # the cancel does not wait for the command
    cancelled.close()
    kept.close()
    deadline = time.monotonic() + 30
    while pools()["agent"].in_use and time.monotonic() < deadline:
        time.sleep(0.1)  # the cancelled one comes back when its command's thread lets go of it
    assert pools()["agent"].in_use == 0
    close_pools()
    while any(leftovers().values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers() == {"containers": 0, "bwrap": 0}
