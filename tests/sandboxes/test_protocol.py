"""The Sandbox protocol on both backends: commands, files, stdin, timeouts, output cap, reset, close."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from agentrl.sandboxes import ExecResult, Sandbox, SandboxError, SandboxLimits
from agentrl.sandboxes.base import resolve_in_workdir

pytestmark = pytest.mark.docker  # the sandboxes' Docker backend

# --- pure logic ---------------------------------------------------------------------------------


def test_ok_needs_exit_zero_in_time_and_no_oom():
    assert ExecResult("", "", 0).ok
    assert not ExecResult("", "", 1).ok
    assert not ExecResult("", "", None, timed_out=True).ok
    assert not ExecResult("", "", 0, timed_out=True).ok
    assert not ExecResult("", "", 0, oom=True).ok
    assert ExecResult("", "", 0, orphans_killed=True).ok  # what it left behind does not count


def test_limits_refuse_non_positive_values():
    with pytest.raises(ValueError, match="memory_mb must be > 0, got 0"):
        SandboxLimits(memory_mb=0)
    with pytest.raises(ValueError, match="timeout"):
        SandboxLimits(timeout=-1)


@pytest.mark.parametrize(
    ("path", "full"),
    [("a.py", "/work/a.py"), ("src/../b.py", "/work/b.py"), ("/work/c/d.txt", "/work/c/d.txt"), ("./e", "/work/e")],
)
def test_paths_resolve_under_the_workdir(path, full):
    assert resolve_in_workdir("/work", path) == full


@pytest.mark.parametrize("path", ["../etc/passwd", "/etc/passwd", "/work", "/work/..", "", "/workshop/x", "a/../../b"])
def test_paths_outside_the_workdir_are_refused(path):
    with pytest.raises(ValueError, match="outside the sandbox work dir|expected a file path"):
        resolve_in_workdir("/work", path)


# --- both backends ------------------------------------------------------------------------------


def test_the_sandbox_satisfies_the_protocol(sb):
    assert isinstance(sb, Sandbox)
    assert sb.workdir == "/work"


def test_a_shell_command_runs_in_the_workdir_as_an_unprivileged_user(sb):
    result = sb.exec("pwd; id -u; echo to-stderr >&2; exit 3")
    assert result.stdout == "/work\n65534\n"
    assert result.stderr == "to-stderr\n"
    assert result.exit_code == 3
    assert not result.ok and not result.timed_out and not result.oom and not result.truncated
    assert not result.pids_limited and not result.orphans_killed
    assert 0 < result.duration < 5


def test_a_list_runs_as_argv_without_a_shell(sb):
    result = sb.exec(["printf", "%s|", "a b", "$HOME", "*"])
    assert result.ok
    assert result.stdout == "a b|$HOME|*|"


def test_a_missing_program_exits_127(sb):
    result = sb.exec(["no-such-program-xyz"])
    assert result.exit_code == 127
    assert "no-such-program-xyz" in result.stderr


def test_stdin_is_passed_as_text_or_bytes(sb):
    assert sb.exec("cat", stdin="héllo\n").stdout == "héllo\n"
    assert sb.exec(["wc", "-c"], stdin=b"\x00\x01\x02" * 100_000).stdout.strip() == "300000"


def test_output_is_decoded_as_utf8_and_bad_bytes_replaced(sb):
    result = sb.exec(["python3", "-c", "import sys; sys.stdout.buffer.write('ü€'.encode() + b'\\xff')"])
    assert result.stdout == "ü€\ufffd"


def test_files_round_trip_and_commands_see_them(sb):
    sb.write_file("pkg/main.py", "print(6 * 7)\n")
    payload = bytes(range(256)) * 1000
    sb.write_file("/work/blob.bin", payload)
    assert sb.read_file("pkg/main.py") == b"print(6 * 7)\n"
    assert sb.read_file("blob.bin") == payload
    assert sb.exec(["python3", "pkg/main.py"]).stdout == "42\n"
    sb.exec("echo made-by-a-command > out.txt")
    assert sb.read_file("out.txt") == b"made-by-a-command\n"


def test_file_errors_say_what_is_wrong(sb):
    with pytest.raises(FileNotFoundError):
        sb.read_file("missing.txt")
    sb.exec("mkdir adir")
    with pytest.raises(IsADirectoryError):
        sb.read_file("adir")
    with pytest.raises(ValueError, match="outside the sandbox work dir"):
        sb.write_file("../etc/passwd", "x")
    with pytest.raises(ValueError, match="outside the sandbox work dir"):
        sb.read_file("/etc/passwd")


def test_a_timeout_kills_the_command_and_says_so(sb):
    start = time.monotonic()
    result = sb.exec("echo started; sleep 30", timeout=0.5)
    assert result.timed_out and result.exit_code is None and not result.ok
    assert result.stdout == "started\n"
    assert 0.5 <= result.duration < 2 and time.monotonic() - start < 5


def test_output_past_the_limit_is_cut_and_marked(sb):
    limit = sb.limits.output_bytes
    result = sb.exec(f"head -c {limit * 3} /dev/zero | tr '\\0' a; echo short >&2")
    assert result.ok and result.truncated
    assert result.stdout.startswith("a" * limit)
    assert f"[agentrl: output truncated: kept {limit} of {limit * 3} bytes]" in result.stdout
    assert result.stderr == "short\n"


def test_reset_kills_processes_and_empties_the_workdir_and_tmp(sb):
    sb.write_file("keep.txt", "x")
    sb.exec("mkdir -p deep/er && chmod 000 deep; echo t > /tmp/t; setsid sleep 300 >/dev/null 2>&1 &")
    sb.exec("sleep 300 >/dev/null 2>&1 &")
    assert sb.exec("ls /proc | grep -c '^[0-9]'").stdout.strip() not in ("", "0")
    sb.reset()
    assert sb.exec("ls -A /work /tmp").stdout.split() == ["/tmp:", "/work:"]
    # Only the server and this command's own shell, ls, grep (and its pipe partner) may be there.
    processes = sb.exec(
        ["python3", "-c", "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"]
    )
    assert len(eval(processes.stdout)) <= 2, processes.stdout


def test_the_environment_is_small_and_home_is_the_workdir(sb):
    env = dict(line.split("=", 1) for line in sb.exec("env").stdout.splitlines() if "=" in line)
    assert env["HOME"] == "/work"
    assert "/usr/bin" in env["PATH"]
    assert not any(key.startswith(("DOCKER", "AGENTRL", "PYTEST")) for key in env), sorted(env)


def test_async_calls_do_not_block_the_loop_and_give_the_same_answers(sb):
    async def main() -> list[ExecResult]:
        await sb.awrite_file("x.txt", "async")
        assert await sb.aread_file("x.txt") == b"async"
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick = asyncio.create_task(ticker())
        results = await asyncio.gather(*(sb.aexec(f"sleep 0.2; echo {i}") for i in range(3)))
        tick.cancel()
        assert ticks >= 20  # the loop ran while the three calls (one at a time on one sandbox) waited
        return results

    results = asyncio.run(main())
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n"]


def test_the_default_timeout_comes_from_the_limits(fresh):
    sandbox = fresh(SandboxLimits(timeout=0.5, output_bytes=10))
    slow = sandbox.exec("sleep 10")
    assert slow.timed_out and slow.duration < 2
    assert sandbox.exec("echo 0123456789abc").truncated


def test_close_is_idempotent_and_a_closed_sandbox_refuses_work(fresh):
    sandbox = fresh()
    assert sandbox.exec("echo hi").ok
    sandbox.close()
    sandbox.close()
    with pytest.raises(SandboxError, match="closed"):
        sandbox.exec("echo hi")


def test_large_files_move_in_chunks_both_ways(sb):
    payload = os.urandom(9 * 1024 * 1024 + 7)  # three chunks of the protocol
    sb.write_file("big.bin", payload)
    assert sb.exec("stat -c %s big.bin").stdout.strip() == str(len(payload))
    assert sb.read_file("big.bin") == payload
    sb.write_file("big.bin", b"short")  # a rewrite replaces, never appends to, the old content
    assert sb.read_file("big.bin") == b"short"
    sb.write_file("empty.txt", "")
    assert sb.read_file("empty.txt") == b""
