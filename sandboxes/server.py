"""The exec server that lives inside a sandbox and runs its commands (standard library only).

Both backends start this file as the sandbox's first process (``python3 -c <this source> <config>``)
and keep it for the sandbox's whole life, so a command costs a fork and an exec, not a ``docker
exec`` or a container start. It is PID 1 of the sandbox's PID namespace, and the kernel does not
deliver a signal to a namespace's init from inside the namespace unless init handles it, so the
agent's own ``kill -9 1`` does nothing. It can still die (the memory-cgroup OOM killer, a kill
from outside); the client then sees end-of-file and restarts the sandbox.

Protocol: on stdin, frames of a 4-byte big-endian length and a UTF-8 JSON object; each request gets
exactly one such frame on stdout. Nothing else is ever written to stdout. Requests::

    {"op": "ping"}
    {"op": "exec", "argv": [...], "timeout": 10.0, "stdin": "<base64>" | null, "output_bytes": 65536}
    {"op": "write", "path": "/work/a.py", "data": "<base64>", "append": false}
    {"op": "read", "path": "/work/a.py", "offset": 0, "size": 4194304}
    {"op": "reset"}

Answers carry ``"ok": true`` and the op's fields, or ``"ok": false`` with ``error`` (an exception
class name), ``errno`` and ``message``. An exec's fields are those of ``ExecResult``.

When a command is done: when its own process (the one started for ``argv``, a shell for a string
command) has exited and its stdout and stderr are closed. Until that exit the timeout applies
(``timed_out``: the command's session is killed). After it, processes the command left in the
background that still hold the pipes (``sleep 30 &`` without a redirect) get :data:`ORPHAN_GRACE`,
then the command's session is killed (its process group and any job-control group it made), the
output read so far is answered with ``orphans_killed`` and a line saying so in stderr; the exit code
stays the command's own. Background processes whose output is redirected do not hold the pipes and
run on until ``reset`` (unless others of the same command are killed: the whole session goes).
Known limit: a process that left the session (``setsid``, a daemon's double fork) is out of reach
here. If it holds the pipes, the server stops reading them after :data:`DRAIN_GRACE`, says so in
stderr, and the process runs on until ``reset``, which kills every process of the sandbox.

The config (``sys.argv[1]``, JSON): ``workdir``; ``scratch`` (other directories emptied by reset);
``rlimits`` (``RLIMIT_`` name without the prefix -> value, set on the server and so inherited by
every command); ``cpu_rlimit`` (a CPU-time rlimit of each command's timeout + 2 s); ``oom_score_adj`` (written for each command, so the kernel's OOM killer
takes a command before this server); ``infer_from_messages`` (a backend without cgroups: a failed
allocation in stderr counts as OOM, a failed fork as hitting the process limit). Commands inherit the server's environment (the
container's, or the one bwrap set).
"""

from __future__ import annotations

import base64
import ctypes
import errno
import json
import os
import resource
import select
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 30
DRAIN_GRACE = 0.2
"""Seconds to read what is left in the pipes after a kill, before giving up on them."""
ORPHAN_GRACE = 0.1
"""Seconds a command's output pipes may stay open after its own process exited before what holds
them is killed. Long enough for background work that ends just after the shell (a subshell's last
``echo``, a process flushing at exit) to finish by itself and keep its output; short enough that a
forgotten ``&`` costs a tenth of a second, not the whole timeout."""
ORPHANS_MARKER = (
    "[agentrl: the command exited but processes it left in the background still held its output; "
    "they were killed. To keep one running, redirect its output: cmd > cmd.log 2>&1 &]\n"
)
ESCAPED_MARKER = (
    "[agentrl: a process that left the command's session (setsid) still holds its output; "
    "its output is not read and it runs until the sandbox is reset]\n"
)
OOM_COUNTERS = (
    ("/sys/fs/cgroup/memory.events", "oom_kill "),  # cgroup v2 (private cgroup namespace)
    ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill "),  # cgroup v1
)
PIDS_COUNTERS = (
    ("/sys/fs/cgroup/pids.events", "max "),  # forks refused at pids.max, cgroup v2
    ("/sys/fs/cgroup/pids/pids.events", "max "),  # cgroup v1
)
MEMORY_ERROR_SIGNS = (b"MemoryError", b"Cannot allocate memory", b"std::bad_alloc", b"out of memory")
FORK_ERROR_SIGNS = (
    b"Cannot fork",
    b"fork: retry",
    b"fork: Resource temporarily unavailable",
    b"BlockingIOError: [Errno 11]",
)
CPU_SLACK = 2
"""Seconds of CPU time beyond a command's timeout before RLIMIT_CPU stops it (a backstop for
processes that leave the command's process group)."""


def read_exact(fd: int, size: int) -> bytes | None:
    """``size`` bytes from ``fd``, reaping orphans while waiting; None at end of file."""
    chunks: list[bytes] = []
    while size:
        readable, _, _ = select.select([fd, WAKEUP_R], [], [])
        if WAKEUP_R in readable:
            drain_wakeup()
            reap()
        if fd in readable:
            chunk = os.read(fd, size)
            if not chunk:
                return None
            chunks.append(chunk)
            size -= len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to a blocking ``fd``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def drain_wakeup() -> None:
    """Empty the signal wake-up pipe."""
    try:
        while os.read(WAKEUP_R, 4096):
            pass
    except BlockingIOError:
        pass


STATUSES: dict[int, int] = {}
"""Wait statuses of the commands being watched; every other reaped child is an orphan."""


def reap() -> None:
    """Reap every child that has exited: commands (status kept) and orphans re-parented to PID 1."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in STATUSES:
            STATUSES[pid] = status


def cgroup_count(counters: tuple[tuple[str, str], ...]) -> int | None:
    """The first readable of ``counters`` (file, line prefix), or None when none is readable."""
    for path, key in counters:
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith(key):
                        return int(line.split()[1])
        except OSError:
            continue
    return None


def limit_self(config: dict[str, Any]) -> None:
    """Apply the config's rlimits to this server, so that every command inherits them.

    Set here once rather than per command: a ``preexec_fn`` makes Python fork instead of vfork
    (several times the cost of a vfork + exec), and an exec'd ``prlimit`` trampoline costs about
    as much as the fork (figures in ``benchmarks/README.md``). The server lives within them too; it
    keeps its own memory small by moving files in chunks.
    """
    for name, value in config.get("rlimits", {}).items():
        resource.setrlimit(getattr(resource, f"RLIMIT_{name.upper()}"), (value, value))


def after_spawn(pid: int, config: dict[str, Any], timeout: float) -> None:
    """Adjust a command just after its spawn: the OOM killer takes it (and its children) before
    this server, and a CPU-time rlimit backs up the wall-clock timeout for processes that leave
    its process group. Done from here for the vfork reason above; the command's first instants
    run unadjusted, which only matters for a program that fills memory within microseconds."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w") as f:
            f.write(str(config.get("oom_score_adj", 1000)))
    except OSError:
        pass
    if config.get("cpu_rlimit", False):
        cpu = int(timeout) + CPU_SLACK
        try:
            resource.prlimit(pid, resource.RLIMIT_CPU, (cpu, cpu + 1))
        except (OSError, ValueError):
            pass  # already gone


class Capture:
    """One output pipe of a command: the first ``limit`` bytes kept, the total counted."""

    def __init__(self, fd: int, limit: int) -> None:
        self.fd = fd
        self.limit = limit
        self.data = bytearray()
        self.total = 0
        self.open = True

    def read(self) -> None:
        """Take what the pipe has (call when select says it is readable)."""
        chunk = os.read(self.fd, 65536)
        if not chunk:
            self.open = False
            return
        self.total += len(chunk)
        if len(self.data) < self.limit:
            self.data += chunk[: self.limit - len(self.data)]

    def text(self) -> tuple[str, bool]:
        """The kept bytes decoded, with the cut marked when the total went past the limit."""
        text = bytes(self.data).decode("utf-8", errors="replace")
        if self.total > self.limit:
            return text + f"\n[agentrl: output truncated: kept {self.limit} of {self.total} bytes]\n", True
        return text, False


def spawn(config: dict[str, Any], argv: list[str], with_stdin: bool) -> subprocess.Popen[bytes]:
    """Start ``argv`` in the work dir, in a new session (its own process group), by vfork + exec."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=config["workdir"],
        start_new_session=True,
    )


def op_exec(config: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """Run one command with a timeout, capped output and OOM detection; answer what it did."""
    argv: list[str] = request["argv"]
    timeout = float(request["timeout"])
    limit = int(request["output_bytes"])
    stdin_data = base64.b64decode(request["stdin"]) if request.get("stdin") is not None else None
    reap()
    oom_before, pids_before = cgroup_count(OOM_COUNTERS), cgroup_count(PIDS_COUNTERS)
    start = time.monotonic()
    try:
        proc = spawn(config, argv, stdin_data is not None)
    except OSError as exc:
        message = f"agentrl sandbox: cannot run {argv[0]!r}: {exc.strerror or exc}\n"
        return {
            "ok": True,
            "stdout": "",
            "stderr": message,
            "exit_code": 127 if exc.errno == errno.ENOENT else 126,
            "timed_out": False,
            "oom": False,
            "pids_limited": False,
            "duration": time.monotonic() - start,
            "truncated": False,
            "orphans_killed": False,
        }
    STATUSES[proc.pid] = -1
    after_spawn(proc.pid, config, timeout)
    out = Capture(proc.stdout.fileno(), limit)  # type: ignore[union-attr]
    err = Capture(proc.stderr.fileno(), limit)  # type: ignore[union-attr]
    writer = proc.stdin.fileno() if proc.stdin is not None else None
    pending = memoryview(stdin_data or b"")
    if writer is not None:
        os.set_blocking(writer, False)
    deadline = start + timeout
    timed_out = False
    exited_at: float | None = None
    # Done when the command's own process has exited and its output pipes are closed. Until that
    # exit the timeout applies; after it, a background process still holding the pipes gets
    # ORPHAN_GRACE, then is killed with the command's session (below).
    while out.open or err.open or STATUSES[proc.pid] == -1:
        now = time.monotonic()
        if exited_at is None and STATUSES[proc.pid] != -1:
            exited_at = now
        if exited_at is None:
            remaining = deadline - now
            if remaining <= 0:
                timed_out = True
                break
        else:
            remaining = exited_at + ORPHAN_GRACE - now
            if remaining <= 0:
                break
        readers = {c.fd: c for c in (out, err) if c.open}
        readable, writable, _ = select.select(
            [*readers, WAKEUP_R], [writer] if writer is not None else [], [], remaining
        )
        if WAKEUP_R in readable:
            drain_wakeup()
            reap()
        for fd in readable:
            if fd in readers:
                readers[fd].read()
        if writer is not None and writer in writable:
            try:
                pending = pending[os.write(writer, pending[:65536]) :]
            except BrokenPipeError:
                pending = memoryview(b"")
            if not pending:
                proc.stdin.close()  # type: ignore[union-attr]
                writer = None
    orphans_killed = not timed_out and (out.open or err.open)
    if timed_out or orphans_killed:
        kill_group(proc.pid, out, err)
    escaped = orphans_killed and (out.open or err.open)
    duration = time.monotonic() - start
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None and not stream.closed:
            stream.close()
    status = STATUSES.pop(proc.pid)
    # A command that exited before the deadline (only its pipes stayed open) keeps its exit code.
    exit_code = exit_code_of(status) if status != -1 else None
    if timed_out and exit_code == -signal.SIGKILL:
        exit_code = None
    proc.returncode = -signal.SIGKILL if exit_code is None else exit_code  # so Popen never waits on it
    stdout, cut_out = out.text()
    stderr, cut_err = err.text()
    oom = grew(oom_before, cgroup_count(OOM_COUNTERS))
    pids_limited = grew(pids_before, cgroup_count(PIDS_COUNTERS))
    if config.get("infer_from_messages"):
        oom = oom or (exit_code not in (0, None) and any(sign in err.data for sign in MEMORY_ERROR_SIGNS))
        pids_limited = pids_limited or any(sign in err.data for sign in FORK_ERROR_SIGNS)
    if orphans_killed:
        stderr += ("" if stderr.endswith("\n") or not stderr else "\n") + ORPHANS_MARKER
        stderr += ESCAPED_MARKER if escaped else ""
    return {
        "ok": True,
        "stdout": stdout,
        "stderr": stderr,
        "exit_code": exit_code,
        "timed_out": timed_out,
        "oom": oom,
        "pids_limited": pids_limited,
        "duration": duration,
        "truncated": cut_out or cut_err,
        "orphans_killed": orphans_killed,
    }


def grew(before: int | None, after: int | None) -> bool:
    """Whether a cgroup counter went up (False when it cannot be read)."""
    return before is not None and after is not None and after > before


def exit_code_of(status: int) -> int:
    """A wait status as an exit code, ``-N`` for signal N (``os.waitstatus_to_exitcode`` is 3.9+)."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def session_members(sid: int) -> list[int]:
    """The processes of session ``sid`` (read from ``/proc``, the sandbox's own PID namespace)."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after "pid (comm)": state ppid pgrp session
        except (OSError, IndexError):
            continue  # gone meanwhile
        if len(fields) > 3 and int(fields[3]) == sid:
            members.append(int(name))
    return members


def kill_group(pid: int, *captures: Capture) -> None:
    """Kill a command's whole process group, and any other group of its session (a shell's job
    control, ``Popen(process_group=0)``), take what is left in its pipes (for a moment: a process
    that left the session may hold them), and reap it. The command was started as a session
    leader, so its pid is both its group's and its session's id."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for member in session_members(pid):
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass
    end = time.monotonic() + DRAIN_GRACE
    while any(c.open for c in captures) and time.monotonic() < end:
        readers = {c.fd: c for c in captures if c.open}
        readable, _, _ = select.select(list(readers), [], [], max(0.0, end - time.monotonic()))
        for fd in readable:
            readers[fd].read()
    if STATUSES[pid] == -1:
        try:
            STATUSES[pid] = os.waitpid(pid, 0)[1]  # killed above, so at once
        except ChildProcessError:
            pass


def op_write(config: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """Write one chunk of a file (parents created) as the sandbox user; ``append`` for the next ones."""
    path: str = request["path"]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "ab" if request.get("append") else "wb") as f:
        f.write(base64.b64decode(request["data"]))
    return {"ok": True}


def op_read(config: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """Read up to ``size`` bytes of a file from ``offset``; ``eof`` when nothing is left after them."""
    size = int(request["size"])
    with open(request["path"], "rb") as f:
        f.seek(int(request.get("offset", 0)))
        data = f.read(size + 1)
    return {"ok": True, "data": base64.b64encode(data[:size]).decode("ascii"), "eof": len(data) <= size}


def make_removable(function: Any, path: str, excinfo: Any) -> None:
    """rmtree's error hook: give the owner write and search rights back, then retry once."""
    parent = os.path.dirname(path)
    for target in (parent, path):
        try:
            os.chmod(target, stat.S_IRWXU)
        except OSError:
            pass
    try:
        function(path)
    except FileNotFoundError:
        pass


def op_reset(config: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """Kill every other process in the sandbox, then empty the work dir and the scratch dirs."""
    me = os.getpid()
    killed = 0
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != me]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)
        reap()
    left = [name for name in os.listdir("/proc") if name.isdigit() and int(name) != me]
    if left:
        return {
            "ok": False,
            "error": "ProcessLookupError",
            "errno": 0,
            "message": f"{len(left)} processes survived SIGKILL for 5 s: {', '.join(left[:10])}",
        }
    for directory in (config["workdir"], *config.get("scratch", [])):
        if not os.path.isdir(directory):
            continue  # an image without /dev/shm, say
        for entry in os.scandir(directory):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, onerror=make_removable)
            else:
                os.unlink(entry.path)
    return {"ok": True, "killed": killed}


def op_ping(config: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """Liveness and identity."""
    return {"ok": True, "pid": os.getpid(), "uid": os.getuid(), "python": sys.version.split()[0]}


OPS = {"exec": op_exec, "write": op_write, "read": op_read, "reset": op_reset, "ping": op_ping}


def serve(config: dict[str, Any]) -> None:
    """Answer requests until stdin closes."""
    while True:
        header = read_exact(0, HEADER.size)
        if header is None:
            return
        (size,) = HEADER.unpack(header)
        if size > MAX_FRAME:
            sys.exit(f"agentrl sandbox server: frame of {size} bytes is over the {MAX_FRAME} limit")
        body = read_exact(0, size)
        if body is None:
            return
        try:
            request = json.loads(body)
            answer = OPS[request["op"]](config, request)
        except Exception as exc:  # noqa: BLE001 - every failure is answered, the server goes on
            answer = {
                "ok": False,
                "error": type(exc).__name__,
                "errno": getattr(exc, "errno", None) or 0,
                "message": str(exc),
            }
        data = json.dumps(answer).encode("utf-8")
        write_all(1, HEADER.pack(len(data)) + data)


def ignore(signum: int, frame: Any) -> None:
    """A signal handler that does nothing (wakes the select loop through the wake-up fd)."""


def harden() -> None:
    """Make this process hard to tamper with from the commands it runs (same uid)."""
    # Not dumpable: a command cannot ptrace this process or open /proc/1/fd/* (its protocol pipes).
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass
    # Caught and dropped, so a command cannot end the server with them. A handler rather than
    # SIG_IGN: handlers fall back to the default on exec, an ignored disposition would be inherited.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, ignore)


WAKEUP_R, _WAKEUP_W = os.pipe()


def main() -> None:
    """Entry point: ``python3 -c <source> <config json>``."""
    config = json.loads(sys.argv[1])
    limit_self(config)
    harden()
    os.set_blocking(WAKEUP_R, False)
    os.set_blocking(_WAKEUP_W, False)
    signal.set_wakeup_fd(_WAKEUP_W, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, ignore)
    serve(config)


if __name__ == "__main__":
    main()
