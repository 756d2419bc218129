"""LocalSandbox: commands in a bubblewrap (``bwrap``) sandbox on this machine, no Docker needed.

What it protects against:

- network: a private network namespace with only a loopback device (``--unshare-all``);
- the host's files: the sandbox sees read-only ``/usr`` (and the ``/bin``, ``/lib``... links into
  it), a few files of ``/etc`` needed to run programs, its own ``/proc`` and (read-only) ``/dev``,
  and three private, size-limited tmpfs mounts: the work dir, ``/tmp`` and a 64 MB ``/dev/shm``.
  The root is read-only. ``/root``, ``/home``, ``/etc/shadow`` and the rest of the host do not
  exist inside;
- the host's processes: a private PID namespace (they cannot be seen or signalled), and a new
  session (no terminal injection);
- privileges: no capabilities; when the host process runs as root, the sandbox runs as the
  unprivileged host user ``nobody`` (65534) through ``setpriv``, so even a bound file is read with
  nobody's rights;
- runaway commands: a wall-clock timeout that kills the command's whole process group, rlimits
  on every process (address space = ``memory_mb``, processes = ``pids`` in the sandbox's user
  namespace, file size = ``disk_mb``; CPU time = timeout + 2 s, set on each command just after its
  spawn), the tmpfs size limits, an output cap;
- the sandbox outliving its owner: ``--die-with-parent``.

What it does NOT protect against, or does less well than :class:`~agentrl.sandboxes.DockerSandbox`:

- memory is limited per process (``RLIMIT_AS``), not for all processes together, and address
  space is not resident memory (a program that maps much and touches little can be refused, one
  spread over many processes can use ``pids x memory_mb``); tmpfs contents use host memory; ``oom``
  is inferred from the failed allocation's message (``MemoryError``, ``Cannot allocate memory``...)
  and ``pids_limited`` from the failed fork's (``Cannot fork``...): there are no cgroups to ask;
- CPU use is not capped per sandbox (only the CPU-time rlimit per process);
- the kernel is the host's: a kernel bug reachable from an unprivileged user namespace is an
  escape. Bubblewrap is as strong as the kernel's namespaces, no stronger; for untrusted code at
  scale prefer Docker (or a VM-based runtime behind it).

Each sandbox is one ``bwrap`` process running the exec server as PID 1 of its PID namespace (so a
command's ``kill -9 1`` does nothing); calls cost a vfork and an exec inside it. The rlimits are
set on the server and inherited, so the server lives within them too (files move in chunks).
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from agentrl.sandboxes.base import SandboxError, SandboxLimits
from agentrl.sandboxes.client import ServerGone, ServerSandbox, Transport

NOBODY = 65534
ETC_FILES = (
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/ssl/certs",
    "/etc/mime.types",
)
"""What of the host's ``/etc`` the sandbox sees (read-only): what the dynamic loader and common
programs need, nothing with secrets."""
SHM_MB = 64
"""Size of ``/dev/shm`` (as Docker's default): POSIX shared memory and semaphores need it."""
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_spawner: concurrent.futures.ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def bubblewrap_available() -> bool:
    """True when ``bwrap`` is installed and can make the namespaces a LocalSandbox needs here
    (probed once per process)."""
    return bubblewrap_problem() is None


@functools.cache
def bubblewrap_problem() -> str | None:
    """Why bubblewrap cannot be used here (in words, with what to do), or None when it can."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not installed (Debian: apt-get install bubblewrap)"
    if not Path("/usr/bin/python3").exists():
        return "/usr/bin/python3 is missing; the local sandbox runs the system Python (apt-get install python3)"
    try:
        probe = subprocess.run(
            [
                *_prefix(),
                bwrap,
                "--unshare-all",
                "--ro-bind",
                "/usr",
                "/usr",
                *_usr_links(),
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "/usr/bin/true",
            ],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap did not run: {exc}"
    if probe.returncode != 0:
        return f"bwrap cannot create namespaces here: {probe.stderr.decode(errors='replace').strip()}"
    return None


def _prefix() -> list[str]:
    """Drop from root to the unprivileged host user first (real uid 65534, no groups, no caps)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise SandboxError("running as root, the local sandbox needs setpriv (util-linux) to drop to nobody")
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all"]


def _usr_links() -> list[str]:
    """``/bin``, ``/lib``... as on the host: symlinks into ``/usr`` (merged /usr) or read-only binds."""
    args: list[str] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    return args


def _spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    """Start ``argv`` from one long-lived thread: ``--die-with-parent`` ends the sandbox when the
    *thread* that forked it exits, so sandboxes must not be forked from short-lived pool threads."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentrl-bwrap")
    return _spawner.submit(
        subprocess.Popen, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0
    ).result()


def bwrap_argv(command: list[str], disk_mb: int, workdir: str = "/work") -> list[str]:
    """The full command line that runs ``command`` in a fresh bubblewrap sandbox as described in
    the module doc (with the ``setpriv`` drop to nobody first when running as root)."""
    mib = 1024 * 1024
    etc: list[str] = []
    for path in ETC_FILES:
        etc += ["--ro-bind-try", path, path]
    size = str(disk_mb * mib)
    return [
        *_prefix(),
        shutil.which("bwrap") or "bwrap",
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
        "--cap-drop", "ALL",
        "--hostname", "sandbox",
        "--ro-bind", "/usr", "/usr",
        *_usr_links(),
        *etc,
        "--proc", "/proc",
        "--dev", "/dev",
        "--size", str(SHM_MB * mib), "--tmpfs", "/dev/shm",
        "--remount-ro", "/dev",  # else an unbounded tmpfs of host memory the agent could fill
        "--size", size, "--tmpfs", workdir,
        "--size", size, "--tmpfs", "/tmp",
        "--remount-ro", "/",  # bwrap's root is a tmpfs of ours: read-only, like a container's
        "--chdir", workdir,
        "--clearenv",
        "--setenv", "PATH", PATH,
        "--setenv", "HOME", workdir,
        "--setenv", "LANG", "C.UTF-8",
        "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
        "--setenv", "PYTHONUNBUFFERED", "1",
        "--",
        *command,
    ]  # fmt: skip


class PipeTransport:
    """The exec server's stdin and stdout pipes."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._process = process
        self._out = process.stdout.fileno()
        self._in = process.stdin.fileno()

    def send(self, data: bytes) -> None:
        """Write all of ``data`` to the server's stdin."""
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._in, view) :]
        except (BrokenPipeError, ValueError, OSError) as exc:
            raise ServerGone(f"cannot write to the exec server: {exc}") from exc

    def recv_exact(self, size: int, deadline: float) -> bytes:
        """Read exactly ``size`` bytes from the server's stdout by ``deadline``."""
        chunks: list[bytes] = []
        while size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the exec server did not answer in time")
            readable, _, _ = select.select([self._out], [], [], remaining)
            if not readable:
                continue
            chunk = os.read(self._out, min(size, 1 << 20))
            if not chunk:
                raise ServerGone("the exec server closed its stdout")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        """Close both pipes."""
        for stream in (self._process.stdin, self._process.stdout):
            if stream is not None:
                stream.close()


class LocalSandbox(ServerSandbox):
    """A sandbox in a bubblewrap process on this machine (see the module doc for what it isolates).

    Example::

        with LocalSandbox() as sb:
            print(sb.exec("echo hi").stdout)
    """

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        super().__init__(limits or SandboxLimits())
        problem = bubblewrap_problem()
        if problem is not None:
            raise SandboxError(f"LocalSandbox is not available: {problem}")
        self._process: subprocess.Popen[bytes] | None = None
        self._first_boot()

    def _argv(self) -> list[str]:
        mib = 1024 * 1024
        limits = self.limits
        server = self.server_argv(
            "/usr/bin/python3",
            # fsize a little over the tmpfs size, so that a full disk says ENOSPC, not SIGXFSZ.
            rlimits={"as": limits.memory_mb * mib, "nproc": limits.pids, "fsize": (limits.disk_mb + 1) * mib},
            cpu_rlimit=True,
            infer_from_messages=True,
        )
        return bwrap_argv(server, limits.disk_mb, self.workdir)

    def _start_server(self) -> Transport:
        self._process = _spawn(self._argv())
        return PipeTransport(self._process)

    def _stop_server(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            # bwrap runs the server as the sandbox's PID 1: killing it ends the whole PID namespace.
            try:
                process.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()

    def _death_note(self) -> tuple[str, bool]:
        process = self._process
        if process is None:
            return "no bwrap process", False
        try:
            code = process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "bwrap still running but its server stopped answering", False
        stderr = b""
        if process.stderr is not None:
            readable, _, _ = select.select([process.stderr], [], [], 0)
            if readable:
                stderr = os.read(process.stderr.fileno(), 4096)
        detail = stderr.decode(errors="replace").strip()
        return f"bwrap exited with {code}" + (f": {detail}" if detail else ""), False

    def _release(self) -> None:
        self._stop_server()
