"""The adversarial suite, on both backends: what a hostile or broken agent program does to a sandbox.

Each attack must be contained and flagged (timed_out / oom / exit_code / truncated), this test
process must not notice (it can still fork, its files are intact), and the sandbox must work again
after a reset (or have been replaced); the module's fixture then checks that no container is left.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import threading
import time

import pytest

from agentrl.sandboxes import DockerSandbox, ExecResult, LocalSandbox, Sandbox

pytestmark = pytest.mark.docker  # the sandboxes' Docker backend


def usable_after_reset(sb: Sandbox) -> None:
    """The sandbox answers, clean, after a reset."""
    sb.reset()
    result = sb.exec("echo ok; ls -A /work /tmp")
    assert result.ok, result
    assert result.stdout.split() == ["ok", "/tmp:", "/work:"]
    host = subprocess.run(["true"], timeout=30, check=False)  # and the host still forks
    assert host.returncode == 0


def test_network_is_unreachable(sb):
    interfaces = sb.exec("cat /proc/net/dev").stdout.splitlines()[2:]
    assert [line.split(":")[0].strip() for line in interfaces] == ["lo"]
    probe = (
        "import socket\n"
        "for host in ('1.1.1.1', '8.8.8.8', '151.101.2.132'):\n"
        "    try:\n"
        "        socket.create_connection((host, 80), timeout=2)\n"
        "        print('CONNECTED', host)\n"
        "    except OSError as e:\n"
        "        print('refused', host, e.errno)\n"
        "try:\n"
        "    socket.getaddrinfo('deb.debian.org', 80)\n"
        "    print('RESOLVED')\n"
        "except OSError:\n"
        "    print('no dns')\n"
    )
    result = sb.exec(["python3", "-c", probe], timeout=20)
    assert result.ok, result
    assert "CONNECTED" not in result.stdout and "RESOLVED" not in result.stdout
    assert result.stdout.count("refused") == 3 and "no dns" in result.stdout
    usable_after_reset(sb)


def test_a_fork_bomb_is_contained_and_killed(sb):
    start = time.monotonic()
    # The bomb starts from a subshell (dash forks a background pipeline's parts from the shell that
    # runs it, and a shell whose fork fails exits), and the shell stays in a loop that never forks,
    # so the bomb is still running at the deadline.
    result = sb.exec("(bomb() { bomb | bomb & }; bomb); while :; do :; done", timeout=3)
    assert result.pids_limited and "Cannot fork" in result.stderr, result  # the process limit was hit
    assert result.timed_out and result.exit_code is None, result
    assert time.monotonic() - start < 15
    usable_after_reset(sb)


def test_a_fork_bomb_left_in_the_background_does_not_hold_the_call(sb):
    start = time.monotonic()
    result = sb.exec("bomb() { bomb | bomb & }; bomb", timeout=10)
    # The shell exits at once; the branches still holding its output are killed with its session a
    # moment later (orphans_killed), unless every branch gave up first at the process limit.
    assert result.orphans_killed or result.pids_limited, result
    assert not result.timed_out and time.monotonic() - start < 5, result
    usable_after_reset(sb)


def test_a_memory_bomb_is_stopped_and_flagged_oom(sb):
    one_shot = sb.exec(["python3", "-c", "x = bytearray(4 << 30); print('GOT 4 GiB')"], timeout=20)
    assert one_shot.oom and not one_shot.ok, one_shot
    assert "GOT" not in one_shot.stdout
    creeping = sb.exec(["python3", "-c", "x = []\nwhile True:\n    x.append(bytearray(16 << 20))"], timeout=20)
    assert creeping.oom and not creeping.ok and not creeping.timed_out, creeping
    usable_after_reset(sb)


def test_filling_the_disk_stops_at_the_limit(sb):
    limit = sb.limits.disk_mb * 1024 * 1024
    result = sb.exec("dd if=/dev/zero of=big bs=1M count=4096", timeout=30)
    assert result.exit_code != 0 and not result.timed_out, result
    assert "No space left on device" in result.stderr or "File too large" in result.stderr
    size = int(sb.exec("stat -c %s big").stdout)
    assert 0 < size <= limit
    assert "No space left" in sb.exec("echo more > /tmp/x && dd if=/dev/zero of=/work/more bs=1M count=1").stderr
    usable_after_reset(sb)


def test_an_endless_loop_times_out(sb):
    result = sb.exec("while :; do :; done", timeout=1)
    assert result.timed_out and result.exit_code is None, result
    assert 1 <= result.duration < 3
    usable_after_reset(sb)


def test_endless_output_is_truncated_and_timed_out(sb):
    result = sb.exec("yes", timeout=1)
    assert result.truncated and result.timed_out, result
    assert len(result.stdout) < sb.limits.output_bytes + 200
    finite = sb.exec("head -c 50000000 /dev/zero", timeout=30)
    assert finite.ok and finite.truncated and "kept 65536 of 50000000 bytes" in finite.stdout
    usable_after_reset(sb)


def test_host_files_cannot_be_read(sb, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("TOPSECRET")
    result = sb.exec(f"cat /etc/shadow; ls /root; cat {secret}; cat /proc/1/environ; echo end")
    assert "TOPSECRET" not in result.stdout
    assert "root:" not in result.stdout  # no shadow entry
    assert result.stdout.strip().endswith("end")
    assert "Permission denied" in result.stderr or "No such file" in result.stderr
    # The host's /root is not the sandbox's: nothing of it shows up, whatever the backend.
    host_root = set(os.listdir("/root")) if os.access("/root", os.R_OK) else set()
    listing = set(sb.exec("ls -A /root 2>/dev/null").stdout.split())
    assert not (host_root - {".bashrc", ".profile"}) & listing
    usable_after_reset(sb)


def test_nothing_outside_the_workdir_and_tmp_can_be_written(sb):
    result = sb.exec(
        "for p in /x /usr/x /etc/passwd /bin/sh /root/x /home/x /dev/x /proc/sys/kernel/hostname; do "
        "  (echo pwned > $p) 2>/dev/null && echo WROTE $p; done; echo done"
    )
    assert "WROTE" not in result.stdout, result
    assert result.stdout.strip() == "done"
    with pytest.raises(ValueError, match="outside the sandbox work dir"):
        sb.write_file("/etc/passwd", "pwned")
    # A symlink out of the work dir only leads elsewhere inside the sandbox, which is read-only.
    sb.exec("ln -s /etc etc-link")
    with pytest.raises(OSError):
        sb.write_file("etc-link/passwd", "pwned")
    assert "pwned" not in sb.exec("cat /etc/passwd").stdout
    usable_after_reset(sb)


def test_the_agent_cannot_kill_the_server(sb):
    before = sb.exec("echo $PPID").stdout
    result = sb.exec(
        "kill -9 1; kill -TERM 1; kill -INT 1; kill -HUP 1; "
        "python3 -c 'import os, signal; os.kill(1, signal.SIGKILL)'; echo still-here"
    )
    assert result.ok and result.stdout.endswith("still-here\n"), result
    # kill(-1) signals every process it may except init and itself: the bystander dies, PID 1 does not.
    everything = sb.exec("sleep 300 >/dev/null 2>&1 & pid=$!; sleep 0.2; kill -9 -1; wait $pid; echo $?")
    assert everything.ok and everything.stdout == "137\n", everything
    assert sb.exec("echo $PPID").stdout == before  # the same server (PID 1) answered throughout
    assert sb.restarts == 0
    usable_after_reset(sb)


def test_sleeping_past_the_limit_is_cut(sb):
    result = sb.exec("sleep 3600", timeout=1)
    assert result.timed_out and result.exit_code is None and 1 <= result.duration < 3
    usable_after_reset(sb)


def kill_server_from_outside(sandbox: Sandbox) -> None:
    """What an OOM kill or a crash would do: the server process dies under the sandbox."""
    if isinstance(sandbox, DockerSandbox):
        sandbox.container.kill()
        return
    assert isinstance(sandbox, LocalSandbox) and sandbox._process is not None
    # The server is bwrap's child (PID 1 of the sandbox); bwrap itself stays until it sees it die.
    bwrap = sandbox._process.pid
    children = pathlib.Path(f"/proc/{bwrap}/task/{bwrap}/children").read_text().split()
    assert len(children) == 1, children
    os.kill(int(children[0]), signal.SIGKILL)
    sandbox._process.wait(timeout=10)


def test_a_dead_server_is_detected_and_the_sandbox_restarted(fresh):
    sandbox = fresh()
    sandbox.write_file("lost.txt", "x")
    kill_server_from_outside(sandbox)
    result = sandbox.exec("echo after")
    assert result.exit_code is None and not result.ok
    assert "died" in result.stderr and "restarted" in result.stderr
    assert sandbox.restarts == 1
    assert sandbox.exec("echo after").stdout == "after\n"
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("lost.txt")  # a restart is a clean sandbox


def test_a_server_killed_during_a_command_ends_that_command_with_a_clear_result(fresh):
    sandbox = fresh()
    results: list[ExecResult] = []
    worker = threading.Thread(target=lambda: results.append(sandbox.exec("sleep 20", timeout=30)))
    worker.start()
    time.sleep(1.0)
    kill_server_from_outside(sandbox)
    worker.join(timeout=30)
    assert not worker.is_alive(), "exec hung after its server died"
    (result,) = results
    assert result.exit_code is None and "died" in result.stderr and result.duration < 15
    assert sandbox.exec("echo back").stdout == "back\n"


def test_a_file_operation_survives_a_dead_server(fresh):
    sandbox = fresh()
    kill_server_from_outside(sandbox)
    sandbox.write_file("a.txt", "written on the restarted sandbox")
    assert sandbox.read_file("a.txt") == b"written on the restarted sandbox"
    sandbox.reset()
    assert sandbox.restarts == 1
