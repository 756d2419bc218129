"""Background processes, on both backends: a command returns when its own process exits.

What it left in the background holding its output pipes is killed with its session after a short
grace (``orphans_killed``); what it left with its output redirected runs on until ``reset``; what
left its session (``setsid``) is out of reach until ``reset``.
"""

from __future__ import annotations

import time

import pytest

from agentrl.sandboxes import ExecResult, Sandbox
from agentrl.sandboxes.server import DRAIN_GRACE, ORPHAN_GRACE

pytestmark = pytest.mark.docker  # the sandboxes' Docker backend

MARKER = "[agentrl: the command exited but processes it left in the background still held its output"
SLACK = 1.5
"""Seconds allowed on top of the server's graces for the round trip on a loaded 2-core machine."""
LIST_SLEEPS = (
    "import os\n"
    "for pid in sorted((p for p in os.listdir('/proc') if p.isdigit()), key=int):\n"
    "    try:\n"
    "        stat = open('/proc/%s/stat' % pid).read()\n"
    "    except OSError:\n"
    "        continue\n"
    "    comm, rest = stat[stat.index('(') + 1 : stat.rindex(')')], stat[stat.rindex(')') + 2 :].split()\n"
    "    if comm == 'sleep' and rest[0] != 'Z':\n"  # a killed one not reaped yet is not running
    "        print(pid, 'pgrp', rest[2], 'session', rest[3])\n"
)


def sleeps(sb: Sandbox) -> list[str]:
    """The ``sleep`` processes running in the sandbox, one line each."""
    result = sb.exec(["python3", "-c", LIST_SLEEPS])
    assert result.ok, result
    return result.stdout.splitlines()


def timed(sb: Sandbox, command: str | list[str], timeout: float = 10) -> tuple[ExecResult, float]:
    """The result of ``command`` and the seconds the call took, seen from here."""
    start = time.monotonic()
    result = sb.exec(command, timeout=timeout)
    return result, time.monotonic() - start


def test_a_background_process_holding_the_output_is_killed_when_the_command_exits(sb):
    result, took = timed(sb, "sleep 30 & echo parent-done; echo to-stderr >&2")
    assert took < ORPHAN_GRACE + DRAIN_GRACE + SLACK, (took, result)  # not the 10 s timeout
    assert result.orphans_killed and not result.timed_out, result
    assert result.exit_code == 0 and result.ok  # the command's own exit; the leftovers do not count
    assert result.stdout == "parent-done\n"
    assert result.stderr.startswith("to-stderr\n" + MARKER) and "cmd > cmd.log 2>&1 &" in result.stderr
    assert sleeps(sb) == []


def test_a_program_that_spawns_and_forgets_a_child_returns_too(sb):
    """Not only shells: an argv command whose child inherits the pipes (the default of Popen)."""
    spawn = "import subprocess; subprocess.Popen(['sleep', '30']); print('spawned'); raise SystemExit(3)"
    result, took = timed(sb, ["python3", "-c", spawn])
    assert took < ORPHAN_GRACE + DRAIN_GRACE + SLACK, (took, result)
    assert result.orphans_killed and result.exit_code == 3 and not result.ok
    assert result.stdout == "spawned\n"
    assert sleeps(sb) == []


def test_a_process_group_of_its_own_in_the_same_session_is_killed_too(sb):
    """Job control (``set -m``, ``Popen(process_group=0)``) moves a child out of the command's
    process group but not out of its session."""
    spawn = (
        "import os, subprocess\n"
        "child = subprocess.Popen(['sleep', '30'], preexec_fn=os.setpgrp)\n"
        "print(os.getpgid(child.pid) != os.getpgid(0))"
    )
    result, took = timed(sb, ["python3", "-c", spawn])
    assert took < ORPHAN_GRACE + DRAIN_GRACE + SLACK, (took, result)
    assert result.orphans_killed and result.stdout == "True\n", result
    assert sleeps(sb) == []


def test_a_background_process_with_its_output_redirected_runs_until_reset(sb):
    result, took = timed(sb, "sleep 30 >/dev/null 2>&1 & echo detached")
    assert result.ok and not result.orphans_killed and result.stdout == "detached\n", result
    assert result.stderr == "" and took < SLACK
    assert len(sleeps(sb)) == 1  # still running after the call
    sb.reset()
    assert sleeps(sb) == []


def test_output_written_just_after_the_command_exits_is_kept(sb):
    """Background work that ends within the grace keeps its output and is not flagged."""
    result = sb.exec("(sleep 0.01; echo late) & echo early")
    assert result.ok and not result.orphans_killed, result
    assert result.stdout == "early\nlate\n" and result.stderr == ""


def test_a_normal_command_is_unchanged(sb):
    result = sb.exec("echo out; echo err >&2; exit 4")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 4)
    assert not result.orphans_killed and not result.timed_out


def test_a_command_still_running_keeps_the_timeout(sb):
    result = sb.exec("sleep 30 & echo started; sleep 30", timeout=0.5)
    assert result.timed_out and not result.orphans_killed and result.exit_code is None, result
    assert result.stdout == "started\n" and 0.5 <= result.duration < 2
    assert sleeps(sb) == []  # both sleeps went with the command's process group


def test_a_setsid_daemon_holding_the_output_is_out_of_reach_until_reset(sb):
    """The known limit: a process that left the command's session is not killed. The call still
    returns (the server stops reading after DRAIN_GRACE) and says so; reset kills the process."""
    result, took = timed(sb, "setsid sleep 30 & echo started")
    assert took < ORPHAN_GRACE + DRAIN_GRACE + SLACK, (took, result)
    assert result.orphans_killed and result.ok and result.stdout == "started\n", result
    assert "left the command's session (setsid) still holds its output" in result.stderr
    (daemon,) = sleeps(sb)
    pid, _, pgrp, _, session = daemon.split()
    assert pid == pgrp == session  # a session leader of its own: setsid did that
    sb.reset()
    assert sleeps(sb) == []
