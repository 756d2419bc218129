"""DockerSandbox: commands in a locked-down container on a real Docker Engine, through a warm server.

What it protects against:

- network: ``network_mode="none"`` (a loopback device only);
- the host's files: the container sees only its image, read-only (``read_only=True``), plus two
  private size-limited tmpfs mounts, the work dir and ``/tmp`` (and Docker's own 64 MB
  ``/dev/shm``); no host path is mounted;
- privileges: an unprivileged user (65534, ``nobody``), every capability dropped
  (``cap_drop=["ALL"]``), ``no-new-privileges`` (setuid binaries do not elevate), Docker's default
  seccomp profile;
- resource exhaustion: a memory cgroup limit with memory+swap = memory (so no swap), a CPU quota
  (``nano_cpus``), a process limit (``pids_limit``), the tmpfs size limits, a wall-clock timeout that
  kills the command's whole process group, an output cap; the OOM flag comes from the cgroup's own
  OOM-kill counter;
- leaks: every container carries the label ``agentrl.sandbox=1`` and its owner's host, pid and pid
  start time; :func:`remove_leaked_containers` (run when the first DockerSandbox of a process starts,
  and by ``agentrl sandbox cleanup``) removes those whose owner is gone; an ``atexit`` hook and
  ``__del__`` remove the ones of a process that exits normally;
- a dead engine: a call that finds the engine unreachable raises :class:`DockerUnavailable`, which
  says how to bring it back; containers that could not be removed meanwhile are removed once it
  answers again, and sandboxes made before it went away start in fresh containers (never in one of
  the dead engine's).

What it does NOT protect against:

- the kernel is shared with the host (containers are not VMs): a kernel exploit reachable through
  the default seccomp profile escapes. For hostile code at scale run Docker with a VM-based runtime
  (gVisor, Kata) — ``DockerSandbox(runtime="runsc")``;
- tmpfs contents are charged to the container's memory: a full work dir leaves less memory for
  programs (``disk_mb`` of each of the two tmpfs counts against ``memory_mb``);
- timing and other side channels between containers on the same machine;
- whatever the image itself contains: use a minimal image (:data:`DEFAULT_IMAGE`, built offline by
  ``agentrl sandbox build-image``).

The container's main process is the exec server (:mod:`agentrl.sandboxes.server`), spoken to over
the container's attached stdin/stdout, so a warm call costs a fork and an exec in the container, not
a ``docker exec``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import struct
import threading
import time
import weakref
from typing import Any

from agentrl.sandboxes.base import SandboxError, SandboxLimits
from agentrl.sandboxes.client import ServerGone, ServerSandbox, Transport

logger = logging.getLogger(__name__)

DEFAULT_IMAGE = "agentrl/sandbox-python:0"
"""The default sandbox image: Debian bookworm minbase + python3, built offline by
``agentrl sandbox build-image`` (debootstrap + ``docker import``)."""
LABEL = "agentrl.sandbox"
"""Every sandbox container has ``agentrl.sandbox=1``; the owner label says which process made it."""
OWNER_LABEL = "agentrl.sandbox.owner"
USER = "65534:65534"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_client: Any = None
_client_lock = threading.Lock()
_cleaned = threading.Event()
_live: weakref.WeakSet[DockerSandbox] = weakref.WeakSet()
_engine_losses = 0
"""How many times a call found the engine unreachable; a sandbox made before the last time gets a
fresh container when it next starts, since its own may be a dead engine's."""
_unremoved: set[str] = set()
"""Ids of containers whose removal failed because the engine did not answer; removed once it does."""


class DockerUnavailable(SandboxError):
    """The Docker Engine does not answer (not running, its socket gone, or hung): no sandbox of it can
    run until it is back. Its message says where the engine was expected and how to start it."""


def engine_address() -> str:
    """Where the docker SDK looks for the engine: ``DOCKER_HOST``, else the default socket."""
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the engine could not be reached at all (rather than refusing a request)."""
    import requests

    return isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout))


def engine_lost(exc: BaseException) -> DockerUnavailable:
    """The error for a call that could not reach the engine; sandboxes made until now are marked
    stale (each gets a fresh container when it next starts)."""
    global _engine_losses
    _engine_losses += 1
    return DockerUnavailable(
        f"the Docker Engine at {engine_address()} does not answer ({exc}); start it (dockerd; CI: "
        "scripts/install.sh starts `dockerd --bridge=none --iptables=false`) and the run's next episodes "
        "will use it"
    )


def engine_errors() -> tuple[type[Exception], ...]:
    """What the docker SDK raises when the engine refuses or cannot be reached."""
    import docker
    import requests

    return (docker.errors.DockerException, requests.exceptions.RequestException)


def docker_client() -> Any:
    """The process's shared ``docker.DockerClient`` (from the environment: ``DOCKER_HOST`` or the
    default socket); SandboxError with what to do when the engine does not answer."""
    global _client
    with _client_lock:
        if _client is None:
            import docker  # the SDK; imported here so the rest of agentrl never pays for it

            try:
                # Many sandboxes start and stop at once from pool threads: more than the default 10 connections.
                client = docker.from_env(timeout=120, max_pool_size=64)
                client.ping()
            except Exception as exc:
                raise DockerUnavailable(
                    f"the Docker Engine at {engine_address()} does not answer ({exc}); start it (CI: "
                    "scripts/install.sh starts `dockerd --bridge=none --iptables=false`) or use the local "
                    "backend: make_sandbox('local')"
                ) from exc
            _client = client
        return _client


def docker_available(image: str | None = None) -> bool:
    """True when the Docker Engine answers now (and, given ``image``, that image is present)."""
    try:
        client = docker_client()
    except SandboxError:
        return False
    import docker

    try:
        if image is None:
            client.ping()
        else:
            client.images.get(image)
    except docker.errors.ImageNotFound:
        return False
    except engine_errors():  # the engine went away since the client was made
        return False
    return True


def process_start_time(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (field 22 of ``/proc/<pid>/stat``), or
    None when no such process exists; with the pid it names a process even after pid reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def owner_label() -> str:
    """``host/pid/start-time`` of this process, written on each container it makes."""
    return f"{socket.gethostname()}/{os.getpid()}/{process_start_time(os.getpid())}"


def owner_alive(owner: str) -> bool:
    """Whether the process an owner label names still runs; owners on other hosts count as alive
    (their containers are theirs to clean)."""
    try:
        host, pid, start = owner.split("/")
    except ValueError:
        return False  # not our format: a broken label, nobody will ever clean it otherwise
    if host != socket.gethostname():
        return True
    return process_start_time(int(pid)) == start


def remove_leaked_containers(client: Any = None) -> list[str]:
    """Remove sandbox containers whose owner process is gone (a crashed run); return their names."""
    client = client or docker_client()
    removed: list[str] = []
    for container in client.containers.list(all=True, filters={"label": f"{LABEL}=1"}):
        if owner_alive(container.labels.get(OWNER_LABEL, "")):
            continue
        try:
            container.remove(force=True)
        except engine_errors() as exc:  # already gone, or being removed by another cleaner
            logger.info("leaked sandbox container %s not removed: %s", container.name, exc)
            continue
        removed.append(container.name)
    return removed


def remove_unremoved(client: Any) -> None:
    """Remove the containers that could not be removed while the engine did not answer."""
    import docker

    while _unremoved:
        container_id = _unremoved.pop()
        try:
            client.api.remove_container(container_id, force=True)
        except docker.errors.NotFound:
            pass  # gone already: what was wanted
        except engine_errors() as exc:
            if unreachable(exc):
                _unremoved.add(container_id)  # away again: the next start tries once more
                return
            logger.info("sandbox container %s not removed: %s", container_id[:12], exc)


def _close_all_at_exit() -> None:
    for sandbox in list(_live):
        sandbox.close()


atexit.register(_close_all_at_exit)


class AttachTransport:
    """The container's attached stdin (raw) and stdout (Docker's multiplexed stream, 8-byte frame
    headers, since the container has no TTY)."""

    def __init__(self, sock: Any) -> None:
        self._holder = sock  # keeps the HTTP response (and so the connection) alive
        self._sock: socket.socket = getattr(sock, "_sock", sock)
        self._raw = bytearray()  # bytes read from the socket, not yet demultiplexed
        self._payload = bytearray()  # stdout bytes ready for the reader
        self._frame_left = 0
        self._frame_stream = 1

    def send(self, data: bytes) -> None:
        """Write all of ``data`` to the container's stdin."""
        try:
            self._sock.settimeout(30)
            self._sock.sendall(data)
        except OSError as exc:
            raise ServerGone(f"cannot write to the container's stdin: {exc}") from exc

    def _demux(self) -> None:
        while self._raw:
            if self._frame_left == 0:
                if len(self._raw) < 8:
                    return
                stream, size = self._raw[0], struct.unpack(">I", self._raw[4:8])[0]
                if stream not in (0, 1, 2):
                    raise ServerGone(f"unexpected bytes on the attach stream (stream type {stream})")
                del self._raw[:8]
                self._frame_left, self._frame_stream = size, stream
                continue
            take = min(self._frame_left, len(self._raw))
            if self._frame_stream == 1:  # only stdout carries answers; stderr is not even attached
                self._payload += self._raw[:take]
            del self._raw[:take]
            self._frame_left -= take

    def recv_exact(self, size: int, deadline: float) -> bytes:
        """Read exactly ``size`` bytes of the server's stdout by ``deadline``."""
        while len(self._payload) < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the exec server did not answer in time")
            self._sock.settimeout(remaining)
            try:
                chunk = self._sock.recv(1 << 20)
            except TimeoutError as exc:
                raise TimeoutError("the exec server did not answer in time") from exc
            except OSError as exc:
                raise ServerGone(f"the attach stream broke: {exc}") from exc
            if not chunk:
                raise ServerGone("the container's stdout closed")
            self._raw += chunk
            self._demux()
        data = bytes(self._payload[:size])
        del self._payload[:size]
        return data

    def close(self) -> None:
        """Close the attach connection (the container keeps running: its stdin stays open)."""
        with contextlib.suppress(OSError):  # already closed by the engine's side
            self._sock.close()


class DockerSandbox(ServerSandbox):
    """A sandbox in its own container on the Docker Engine (see the module doc for what it isolates).

    Example::

        with DockerSandbox() as sb:                       # DEFAULT_IMAGE, default SandboxLimits
            sb.write_file("main.py", "print(sum(range(10)))")
            print(sb.exec(["python3", "main.py"]).stdout)  # 45

    Args:
        image: Any image with ``python3`` (3.8+) and ``/bin/sh``, e.g. ``python:3.12-slim``.
        limits: Memory, CPU, processes, disk, output and default timeout.
        runtime: A Docker runtime name (e.g. ``"runsc"`` for gVisor), or None for the default.
    """

    def __init__(
        self, image: str = DEFAULT_IMAGE, limits: SandboxLimits | None = None, *, runtime: str | None = None
    ) -> None:
        super().__init__(limits or SandboxLimits())
        self.image = image
        self.runtime = runtime
        self._client = docker_client()
        if not _cleaned.is_set():
            _cleaned.set()
            remove_leaked_containers(self._client)
        self.container: Any = None
        self._losses_seen = _engine_losses  # the engine losses known when the container was made
        self._create()
        _live.add(self)
        self._first_boot()

    def _create(self) -> None:
        import docker

        self._losses_seen = _engine_losses
        limits = self.limits
        # Docker's tmpfs defaults to noexec, and a mount point the image lacks is root's: a work
        # dir must run the agent's scripts and belong to the sandbox user.
        size = f"size={limits.disk_mb}m,exec,nosuid,nodev"
        uid, gid = USER.split(":")
        try:
            self.container = self._client.containers.create(
                self.image,
                command=self.server_argv("python3"),
                user=USER,
                working_dir=self.workdir,
                environment={
                    "HOME": self.workdir,
                    "PATH": PATH,
                    "LANG": "C.UTF-8",
                    "PYTHONDONTWRITEBYTECODE": "1",
                    "PYTHONUNBUFFERED": "1",
                },
                network_mode="none",
                mem_limit=f"{limits.memory_mb}m",
                memswap_limit=f"{limits.memory_mb}m",
                nano_cpus=int(limits.cpus * 1e9),
                pids_limit=limits.pids,
                read_only=True,
                tmpfs={self.workdir: f"{size},uid={uid},gid={gid},mode=0755", "/tmp": f"{size},mode=1777"},
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                labels={LABEL: "1", OWNER_LABEL: owner_label()},
                stdin_open=True,
                hostname="sandbox",
                runtime=self.runtime,
                log_config={"type": "json-file", "config": {"max-size": "1m"}},
            )
        except docker.errors.ImageNotFound as exc:
            raise SandboxError(
                f"sandbox image {self.image!r} is not on this Docker Engine; build the default one offline with "
                "`agentrl sandbox build-image`, or pass an image that is present (docker images)"
            ) from exc
        except docker.errors.APIError as exc:
            raise SandboxError(f"the Docker Engine refused to create a sandbox container: {exc}") from exc
        except engine_errors() as exc:
            if unreachable(exc):
                raise engine_lost(exc) from exc
            raise SandboxError(f"the Docker Engine failed to create a sandbox container: {exc}") from exc
        remove_unremoved(self._client)  # the engine answers: clear what an outage left behind

    def _start_server(self) -> Transport:
        import docker

        if self.container is not None and self._losses_seen != _engine_losses:
            # The engine was unreachable since this container was made: it may be a dead engine's,
            # stopped or gone with it. Start afresh rather than revive it.
            self._remove_container()
        try:
            if self.container is None:
                self._create()
            self.container.start()
            sock = self.container.attach_socket(params={"stdin": 1, "stdout": 1, "stream": 1})
        except docker.errors.NotFound:
            self.container = None  # removed behind our back: make a new one
            self._create()
            self.container.start()
            sock = self.container.attach_socket(params={"stdin": 1, "stdout": 1, "stream": 1})
        except docker.errors.APIError as exc:
            raise SandboxError(
                f"cannot start the sandbox container {self._name()} of image {self.image!r}: {exc}; "
                "a sandbox image needs python3 (3.8 or newer) on its PATH and /bin/sh"
            ) from exc
        except engine_errors() as exc:
            if unreachable(exc):
                raise engine_lost(exc) from exc
            raise SandboxError(f"cannot start the sandbox container {self._name()}: {exc}") from exc
        return AttachTransport(sock)

    def _stop_server(self) -> None:
        if self.container is None:
            return
        # Not running, or gone: either way it is stopped; an engine that went away fails the restart.
        with contextlib.suppress(*engine_errors()):
            self.container.kill()
        with contextlib.suppress(*engine_errors()):
            self.container.wait(timeout=30)

    def _death_note(self) -> tuple[str, bool]:
        if self.container is None:
            return "no container", False
        try:
            self.container.reload()
        except engine_errors() as exc:
            return f"container {self._name()} is gone ({exc})", False
        state = self.container.attrs.get("State", {})
        oom = bool(state.get("OOMKilled"))
        if state.get("Running"):
            return f"container {self._name()} still runs but its server stopped answering", oom
        try:
            logs = self.container.logs(stdout=False, stderr=True, tail=5).decode(errors="replace").strip()
        except engine_errors() as exc:
            logs = f"(no logs: {exc})"
        note = f"container {self._name()} exited with {state.get('ExitCode')}"
        if oom:
            note += ", killed by the out-of-memory killer"
        return note + (f"; its last stderr: {logs}" if logs else ""), oom

    def _release(self) -> None:
        _live.discard(self)
        self._remove_container()

    def _remove_container(self) -> None:
        """Remove the container, if any (best effort: see the log), and forget it."""
        if self.container is None:
            return
        import docker

        try:
            self.container.remove(force=True)
        except docker.errors.NotFound:
            pass  # already gone, which is what close() wants
        except engine_errors() as exc:
            if unreachable(exc):
                _unremoved.add(self.container.id)
                later = "the next sandbox started once the engine answers again removes it"
            else:
                later = "`agentrl sandbox cleanup` removes it once this process has exited"
            logger.warning("sandbox container %s could not be removed (%s); %s", self._name(), exc, later)
        self.container = None

    def _name(self) -> str:
        return self.container.name if self.container is not None else "(none)"

    def __repr__(self) -> str:
        return f"DockerSandbox(image={self.image!r}, container={self._name()!r}, closed={self.closed})"
