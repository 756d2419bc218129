"""The sandbox contract: the :class:`Sandbox` protocol, its result and limit types, its error.

A sandbox is an isolated place to run untrusted code (an agent's program, a test suite over it)::

    from agentrl.sandboxes import make_sandbox

    sb = make_sandbox()                                  # docker if it answers, else bubblewrap
    sb.write_file("main.py", "print(6 * 7)")             # relative to sb.workdir ("/work")
    result = sb.exec(["python3", "main.py"], timeout=5)
    assert result.ok and result.stdout == "42\\n"
    sb.reset()                                           # next episode: no processes, empty workdir
    sb.close()

A ``str`` command runs under ``/bin/sh -c``; a sequence runs as argv. A command that misbehaves
(times out, runs out of memory, prints too much) never raises: the :class:`ExecResult` says what went
wrong. :class:`SandboxError` is raised only when the sandbox itself fails (the engine went away, the
in-sandbox server died and could not be restarted).

What the backends protect against, and what they do not, is written at the top of
:mod:`agentrl.sandboxes.docker` and :mod:`agentrl.sandboxes.local`, and in ``docs/sandboxes.md``.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

Command = str | Sequence[str]
"""A shell command line (run under ``/bin/sh -c``) or an argv list (run as it stands)."""


@dataclass(frozen=True)
class ExecResult:
    """What one command in a sandbox did.

    Attributes:
        stdout: Standard output, decoded as UTF-8 (undecodable bytes replaced).
        stderr: Standard error, decoded the same way.
        exit_code: The exit status; ``-N`` when killed by signal N; ``None`` when the sandbox killed
            it before it exited (a timeout).
        timed_out: The command ran past its timeout and its whole process group was killed.
        oom: The command (or a child) was killed for running out of memory.
        duration: Wall-clock seconds the command ran, measured inside the sandbox.
        truncated: ``stdout`` or ``stderr`` was cut at the output limit; the cut is marked in the
            text itself with a line starting ``[agentrl: output truncated``.
        pids_limited: A fork was refused because the sandbox's process limit was reached (a fork
            bomb, or a program that starts too many processes). Not part of :attr:`ok`: a program
            may survive a refused fork, and a fork bomb whose branches all give up exits 0.
        orphans_killed: The command's own process exited, but processes it left in the background
            still held its stdout or stderr; after a fraction of a second they were killed with its
            session, the call returned with the output read so far, and a line starting
            ``[agentrl: the command exited but`` ends ``stderr``. Not part of :attr:`ok`: the
            command itself finished, only what it left behind was stopped. A process that left the
            session (``setsid``) is not killed; ``reset()`` kills it.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool = False
    oom: bool = False
    duration: float = 0.0
    truncated: bool = False
    pids_limited: bool = False
    orphans_killed: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited 0, in time, without running out of memory (whatever it left
        in the background and :attr:`orphans_killed` says was killed)."""
        return self.exit_code == 0 and not self.timed_out and not self.oom


class SandboxError(RuntimeError):
    """The sandbox itself failed (engine gone, server dead and not restartable), not the command."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandbox; every backend enforces each as closely as it can.

    Attributes:
        memory_mb: Memory for all processes together, in MiB (docker: cgroup memory = memswap;
            local: address-space rlimit per process).
        cpus: CPU cores (docker: CFS quota; local: not enforced per sandbox, see its module doc).
        pids: Most processes at once (docker: cgroup pids limit; local: RLIMIT_NPROC).
        disk_mb: Size of the work dir and of ``/tmp``, each a size-limited tmpfs, in MiB.
        output_bytes: Most bytes kept of stdout and of stderr each, per command.
        timeout: Default seconds per command when ``exec`` gets no ``timeout``.
    """

    memory_mb: int = 512
    cpus: float = 1.0
    pids: int = 128
    disk_mb: int = 256
    output_bytes: int = 65536
    timeout: float = 10.0

    def __post_init__(self) -> None:
        for name in ("memory_mb", "cpus", "pids", "disk_mb", "output_bytes", "timeout"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {value!r}")


@runtime_checkable
class Sandbox(Protocol):
    """An isolated place to run commands and keep files, reused across episodes via :meth:`reset`.

    Attributes:
        workdir: The absolute work directory inside the sandbox (``"/work"``); relative paths given
            to :meth:`write_file` and :meth:`read_file` and the cwd of every command are there.
        limits: The limits this sandbox enforces.
    """

    workdir: str
    limits: SandboxLimits

    def exec(self, command: Command, *, timeout: float | None = None, stdin: str | bytes | None = None) -> ExecResult:
        """Run ``command`` in the work dir and wait for it (``timeout`` defaults to the limits')."""
        ...

    async def aexec(
        self, command: Command, *, timeout: float | None = None, stdin: str | bytes | None = None
    ) -> ExecResult:
        """:meth:`exec` without blocking the event loop."""
        ...

    def write_file(self, path: str, content: str | bytes) -> None:
        """Write ``content`` to ``path`` (parents created); outside the work dir -> ValueError."""
        ...

    async def awrite_file(self, path: str, content: str | bytes) -> None:
        """:meth:`write_file` without blocking the event loop."""
        ...

    def read_file(self, path: str) -> bytes:
        """The bytes of ``path``; a missing file -> FileNotFoundError."""
        ...

    async def aread_file(self, path: str) -> bytes:
        """:meth:`read_file` without blocking the event loop."""
        ...

    def reset(self) -> None:
        """Kill every process the last episode left and empty the work dir."""
        ...

    def close(self) -> None:
        """Release the sandbox (a container is removed); safe to call twice."""
        ...


def resolve_in_workdir(workdir: str, path: str) -> str:
    """The absolute, normalised form of ``path`` (relative to ``workdir``); outside it -> ValueError.

    >>> resolve_in_workdir("/work", "src/../main.py")
    '/work/main.py'
    """
    if not path:
        raise ValueError(f"expected a file path inside the sandbox work dir {workdir}, got ''")
    full = posixpath.normpath(posixpath.join(workdir, path))
    if full == workdir or not full.startswith(workdir.rstrip("/") + "/"):
        raise ValueError(
            f"path {path!r} resolves to {full!r}, outside the sandbox work dir {workdir}; "
            "sandbox files can only be written and read under the work dir (use a relative path)"
        )
    return full
