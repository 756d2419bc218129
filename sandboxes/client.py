"""The host side of the exec server: framing, deadlines, restarts, and the shared sandbox base.

Both backends are a long-lived process running :mod:`agentrl.sandboxes.server` plus a byte stream to
it (the container's attached stdin/stdout for Docker, bwrap's pipes for the local backend).
:class:`ServerSandbox` implements the whole :class:`~agentrl.sandboxes.base.Sandbox` protocol on top
of two backend hooks, :meth:`ServerSandbox._start_server` and :meth:`ServerSandbox._stop_server`, so
both backends behave the same way by construction:

- one request at a time per sandbox (a lock); parallelism comes from more sandboxes;
- every wait has a deadline: a server that neither answers nor closes its stream by then is taken as
  hung, killed and restarted, so no call hangs;
- a server that died (end of stream) is restarted; the command that was running gets an
  :class:`ExecResult` saying so (``exit_code=None``) instead of an exception, and a file operation is
  retried once on the fresh sandbox. Only a failed restart raises :class:`SandboxError`.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import functools
import json
import struct
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

from agentrl.sandboxes.base import Command, ExecResult, SandboxError, SandboxLimits, resolve_in_workdir

HEADER = struct.Struct(">I")
SERVER_SOURCE = (Path(__file__).parent / "server.py").read_bytes()
"""The exec server's source. It is sent down the server's stdin at start, after the short
:data:`BOOTSTRAP`: any image with a ``python3`` (3.8 or newer) can be a sandbox, nothing has to be
baked into it, and ``ps`` inside the sandbox shows a short command line."""
BOOTSTRAP = """import os
def take(size):
    data = b''
    while len(data) < size:
        chunk = os.read(0, size - len(data))
        if not chunk:
            raise SystemExit('agentrl sandbox: stdin closed before the server source came')
        data += chunk
    return data
exec(compile(take(int(take(10))), 'agentrl-sandbox-server', 'exec'))
"""
"""Reads a 10-digit length and that many bytes of server source from stdin, unbuffered (so that
no request frame behind it is swallowed), and runs it as ``__main__``."""
ANSWER_GRACE = 5.0
"""Seconds past a command's own timeout that the server may take to answer (kill, drain, reply)."""
FILE_OP_TIMEOUT = 60.0
FILE_CHUNK = 4 << 20
"""Bytes of a file per request: frames, and the server's memory, stay small whatever the file's size."""
RESET_TIMEOUT = 20.0
START_TIMEOUT = 30.0

T = TypeVar("T")

_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def io_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The thread pool behind the ``a*`` methods: sized for many sandboxes blocked on I/O at once
    (asyncio's default pool has only ``cpus + 4`` threads, which would cap parallel sandboxes)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(max_workers=128, thread_name_prefix="agentrl-sandbox")
        return _executor


async def in_thread(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking sandbox call on :func:`io_executor` without blocking the event loop."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(io_executor(), functools.partial(function, *args, **kwargs))


class ServerGone(Exception):
    """The stream to the exec server ended or broke (the server or its sandbox died)."""


class Transport(Protocol):
    """A byte stream to one exec server."""

    def send(self, data: bytes) -> None:
        """Write all of ``data``; raise :class:`ServerGone` if the stream is broken."""
        ...

    def recv_exact(self, size: int, deadline: float) -> bytes:
        """Read exactly ``size`` bytes by ``deadline`` (``time.monotonic``): :class:`ServerGone` at
        end of stream, :class:`TimeoutError` past the deadline."""
        ...

    def close(self) -> None:
        """Close the stream (the server sees end of file)."""
        ...


def argv_of(command: Command) -> list[str]:
    """A ``str`` runs under ``/bin/sh -c``; a sequence runs as argv."""
    if isinstance(command, str):
        return ["/bin/sh", "-c", command]
    argv = list(command)
    if not argv or not all(isinstance(arg, str) for arg in argv):
        raise ValueError(f"expected a shell command string or a non-empty list of str, got {command!r}")
    return argv


def os_error(answer: dict[str, Any]) -> OSError:
    """The exception a failed file operation stands for (FileNotFoundError for ENOENT, ...)."""
    number = int(answer.get("errno") or 0)
    message = str(answer.get("message", ""))
    if number:
        return OSError(number, message)  # OSError(errno, ...) picks the matching subclass
    return OSError(f"{answer.get('error')}: {message}")


class ServerSandbox(ABC):
    """A sandbox whose commands run through a long-lived exec server (see the module doc).

    Subclasses provide :meth:`_start_server`, :meth:`_stop_server`, :meth:`_death_note`,
    :meth:`_release`, and call :meth:`_first_boot` at the end of their ``__init__``.
    """

    workdir: str = "/work"
    limits: SandboxLimits
    restarts: int
    """How many times the server was found dead or hung and restarted (the ``sandbox/restarts`` metric)."""

    def __init__(self, limits: SandboxLimits) -> None:
        self.limits = limits
        self.restarts = 0
        self._lock = threading.RLock()
        self._transport: Transport | None = None
        self._closed = False

    # --- backend hooks ---------------------------------------------------------------------------
    @abstractmethod
    def _start_server(self) -> Transport:
        """Start the sandbox (or start it again after a death) and return the stream to its server."""

    @abstractmethod
    def _stop_server(self) -> None:
        """Kill the sandbox's processes so that a restart begins clean; must not raise."""

    @abstractmethod
    def _death_note(self) -> tuple[str, bool]:
        """Why the server died, for the result's stderr, and whether it was an OOM kill."""

    @abstractmethod
    def _release(self) -> None:
        """Free everything the sandbox holds (remove the container); called once by :meth:`close`."""

    def server_argv(self, python: str, *, scratch: Sequence[str] = ("/tmp", "/dev/shm"), **config: Any) -> list[str]:
        """The command that starts the exec server with ``python``; ``config`` adds to its JSON
        config (see :mod:`agentrl.sandboxes.server`)."""
        config_json = json.dumps({"workdir": self.workdir, "scratch": list(scratch), **config})
        return [python, "-I", "-S", "-c", BOOTSTRAP, config_json]

    # --- the request cycle -----------------------------------------------------------------------
    def _boot(self) -> None:
        """Start the server and check that it answers; a failure here raises SandboxError."""
        with self._lock:
            self._transport = self._start_server()
            try:
                self._transport.send(b"%010d" % len(SERVER_SOURCE) + SERVER_SOURCE)
                self._roundtrip({"op": "ping"}, START_TIMEOUT)
            except (ServerGone, TimeoutError, OSError) as exc:
                note, _ = self._death_note()
                self._stop_server()
                self._transport = None
                raise SandboxError(
                    f"{type(self).__name__}: the exec server did not answer after start ({exc!r}); {note}. "
                    "The sandbox needs python3 (3.8 or newer) on its PATH."
                ) from exc

    def _first_boot(self) -> None:
        """:meth:`_boot` for a new sandbox: on failure, release what was made before raising."""
        try:
            self._boot()
        except BaseException:
            self.close()
            raise

    def _roundtrip(self, request: dict[str, Any], wait: float) -> dict[str, Any]:
        assert self._transport is not None
        data = json.dumps(request).encode("utf-8")
        deadline = time.monotonic() + wait
        self._transport.send(HEADER.pack(len(data)) + data)
        (size,) = HEADER.unpack(self._transport.recv_exact(HEADER.size, deadline))
        answer: dict[str, Any] = json.loads(self._transport.recv_exact(size, deadline))
        return answer

    def _restart(self) -> None:
        """Replace a dead or hung server with a fresh sandbox; SandboxError if that fails too."""
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        self._stop_server()
        self.restarts += 1
        self._boot()

    def _request(self, request: dict[str, Any], wait: float) -> dict[str, Any]:
        """Send one request and wait for its answer; raises :class:`_ServerDied` after restarting."""
        if self._closed:
            raise SandboxError(f"{type(self).__name__} is closed; make a new sandbox")
        if self._transport is None:
            self._boot()
        try:
            return self._roundtrip(request, wait)
        except (ServerGone, TimeoutError, OSError, ValueError) as exc:
            if isinstance(exc, TimeoutError):
                reason, oom = f"the sandbox's exec server did not answer within {wait:.1f} s", False
            else:
                note, oom = self._death_note()
                reason = f"the sandbox's exec server died ({note})"
            self._restart()
            raise _ServerDied(reason, oom=oom, timed_out=isinstance(exc, TimeoutError)) from exc

    # --- the Sandbox protocol --------------------------------------------------------------------
    def exec(self, command: Command, *, timeout: float | None = None, stdin: str | bytes | None = None) -> ExecResult:
        """Run ``command`` in the work dir (see :class:`~agentrl.sandboxes.base.Sandbox`)."""
        argv = argv_of(command)
        timeout = self.limits.timeout if timeout is None else float(timeout)
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if isinstance(stdin, str):
            stdin = stdin.encode("utf-8")
        request = {
            "op": "exec",
            "argv": argv,
            "timeout": timeout,
            "stdin": base64.b64encode(stdin).decode("ascii") if stdin is not None else None,
            "output_bytes": self.limits.output_bytes,
        }
        start = time.monotonic()
        with self._lock:
            try:
                answer = self._request(request, timeout + ANSWER_GRACE)
            except _ServerDied as died:
                return ExecResult(
                    stdout="",
                    stderr=f"[agentrl: {died.reason}; the sandbox was restarted: its processes and files are gone]\n",
                    exit_code=None,
                    timed_out=died.timed_out,
                    oom=died.oom,
                    duration=time.monotonic() - start,
                )
        if not answer.get("ok"):
            raise SandboxError(
                f"the exec server failed to run {argv!r}: {answer.get('error')}: {answer.get('message')}"
            )
        return ExecResult(
            stdout=answer["stdout"],
            stderr=answer["stderr"],
            exit_code=answer["exit_code"],
            timed_out=answer["timed_out"],
            oom=answer["oom"],
            pids_limited=answer.get("pids_limited", False),
            duration=answer["duration"],
            truncated=answer["truncated"],
            orphans_killed=answer.get("orphans_killed", False),
        )

    def _file_op(self, request: dict[str, Any]) -> dict[str, Any]:
        answer = self._request(request, FILE_OP_TIMEOUT)
        if not answer.get("ok"):
            raise os_error(answer)
        return answer

    def _retried(self, operation: Callable[[], T]) -> T:
        """Run a whole file operation (all its chunks) under the lock; if the server dies during
        it, run it once more, from its first chunk, on the restarted sandbox."""
        with self._lock:
            try:
                return operation()
            except _ServerDied:
                return operation()

    def write_file(self, path: str, content: str | bytes) -> None:
        """Write ``content`` to ``path`` under the work dir (parents created); outside -> ValueError."""
        full = resolve_in_workdir(self.workdir, path)
        data = content.encode("utf-8") if isinstance(content, str) else bytes(content)

        def write() -> None:
            for start in range(0, max(len(data), 1), FILE_CHUNK):
                chunk = base64.b64encode(data[start : start + FILE_CHUNK]).decode("ascii")
                self._file_op({"op": "write", "path": full, "data": chunk, "append": start > 0})

        self._retried(write)

    def read_file(self, path: str) -> bytes:
        """The bytes of ``path`` under the work dir; missing -> FileNotFoundError, outside -> ValueError."""
        full = resolve_in_workdir(self.workdir, path)

        def read() -> bytes:
            parts: list[bytes] = []
            offset = 0
            while True:
                answer = self._file_op({"op": "read", "path": full, "offset": offset, "size": FILE_CHUNK})
                parts.append(base64.b64decode(answer["data"]))
                offset += len(parts[-1])
                if answer["eof"]:
                    return b"".join(parts)

        return self._retried(read)

    def reset(self) -> None:
        """Kill every process the last episode left and empty the work dir, ``/tmp`` and ``/dev/shm``.

        A reset the server cannot finish (a process that survives SIGKILL, a server that died)
        restarts the whole sandbox instead, which is a reset too.
        """
        with self._lock:
            try:
                answer = self._request({"op": "reset"}, RESET_TIMEOUT)
            except _ServerDied:
                return  # restarted: a fresh sandbox is a reset one
            if not answer.get("ok"):
                self._restart()

    def close(self) -> None:
        """Stop the server and release the sandbox; safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._transport is not None:
                self._transport.close()
                self._transport = None
            self._release()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    async def aexec(
        self, command: Command, *, timeout: float | None = None, stdin: str | bytes | None = None
    ) -> ExecResult:
        """:meth:`exec` without blocking the event loop."""
        return await in_thread(self.exec, command, timeout=timeout, stdin=stdin)

    async def awrite_file(self, path: str, content: str | bytes) -> None:
        """:meth:`write_file` without blocking the event loop."""
        await in_thread(self.write_file, path, content)

    async def aread_file(self, path: str) -> bytes:
        """:meth:`read_file` without blocking the event loop."""
        return await in_thread(self.read_file, path)

    async def areset(self) -> None:
        """:meth:`reset` without blocking the event loop."""
        await in_thread(self.reset)

    async def aclose(self) -> None:
        """:meth:`close` without blocking the event loop."""
        await in_thread(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A sandbox dropped without close() still frees its container; never raise from __del__.
        try:
            if not getattr(self, "_closed", True):
                self.close()
        except Exception:  # noqa: BLE001
            pass


class _ServerDied(Exception):
    """Internal: the server died or hung during a request and the sandbox was restarted."""

    def __init__(self, reason: str, *, oom: bool, timed_out: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.oom = oom
        self.timed_out = timed_out
