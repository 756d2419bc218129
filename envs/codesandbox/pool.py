"""Where ``agentrl/CodeSandbox-v0`` gets its sandboxes: pools shared by every env of the process.

One :class:`SharedPool` per sandbox configuration (:class:`SandboxSpec`: backend, image, limits)
and role (the agents' sandboxes, the graders'), made on first use by :func:`shared_pool` and closed
at interpreter exit. A pool makes sandboxes lazily, up to its size, and hands them out whole:
``acquire`` blocks while all are in use; ``release`` resets a sandbox (no processes, empty work
dir) and keeps it warm for the next taker, or closes it when asked to or when the reset fails.
Agents and graders never share a pool, so episodes holding every agent sandbox can still be graded.

:class:`Lease` is one env's hold on one sandbox: it survives across episodes (reset, not returned,
when an episode is abandoned by a new ``reset``), goes back to the pool when an episode ends or the
env closes, and is returned by a ``weakref.finalize`` if the env is dropped without ``close()``.

The API is synchronous on purpose: ``AgentEnv.reset`` and tools run on worker threads, and a pool
built on asyncio primitives would be bound to one event loop.
"""

from __future__ import annotations

import atexit
import threading
import time
from dataclasses import dataclass, field
from typing import Literal

from agentrl.sandboxes.base import Sandbox, SandboxError, SandboxLimits

Backend = Literal["auto", "docker", "local"]
BACKENDS: tuple[Backend, ...] = ("auto", "docker", "local")
ACQUIRE_TIMEOUT = 600.0
"""Seconds ``acquire`` waits for a busy pool before it raises, saying how to size the pool."""


@dataclass(frozen=True)
class SandboxSpec:
    """What kind of sandbox a pool makes: ``make_sandbox(backend, image, limits)``."""

    backend: Backend = "auto"
    image: str | None = None
    """The image (Docker backend); None for ``agentrl.sandboxes.DEFAULT_IMAGE``."""
    limits: SandboxLimits = field(default_factory=SandboxLimits)

    def make(self) -> Sandbox:
        """A new sandbox of this spec (``SandboxError`` saying what is missing if none can start)."""
        from agentrl.sandboxes import make_sandbox

        if self.image is None:
            return make_sandbox(self.backend, limits=self.limits)
        return make_sandbox(self.backend, image=self.image, limits=self.limits)


class SharedPool:
    """Up to ``size`` sandboxes of one spec, made on demand, reset and reused (see the module doc)."""

    def __init__(self, spec: SandboxSpec, size: int, name: str = "sandboxes"):
        if size < 1:
            raise ValueError(f"A sandbox pool needs size >= 1, got {size}.")
        self.spec = spec
        self.size = size
        self.name = name
        self._idle: list[Sandbox] = []
        self._count = 0  # idle + in use + being made
        self._closed = False
        self._changed = threading.Condition()

    @property
    def in_use(self) -> int:
        """Sandboxes handed out and not yet released."""
        with self._changed:
            return self._count - len(self._idle)

    @property
    def idle(self) -> int:
        """Warm sandboxes waiting for a taker."""
        with self._changed:
            return len(self._idle)

    def acquire(self, timeout: float | None = None) -> Sandbox:
        """A clean sandbox for the caller alone; blocks while all ``size`` are in use, at most
        ``timeout`` seconds (default :data:`ACQUIRE_TIMEOUT`)."""
        timeout = ACQUIRE_TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._changed:
            while not self._idle and self._count >= self.size:
                self._check_open()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxError(
                        f"No sandbox of the {self.name} pool came free within {timeout:g} s: all {self.size} "
                        "are in use. Give the env a larger pool_size (at least the number of episodes that "
                        "run at once), or run fewer episodes at once."
                    )
                self._changed.wait(left)
            self._check_open()
            if self._idle:
                return self._idle.pop()
            self._count += 1
        try:  # made outside the lock: a container start takes a second or more
            return self.spec.make()
        except BaseException:
            with self._changed:
                self._count -= 1
                self._changed.notify()
            raise

    def release(self, sandbox: Sandbox, *, discard: bool = False) -> None:
        """Take ``sandbox`` back: reset and keep it, or close it if ``discard`` or the reset fails."""
        if not discard and not self._closed:
            try:
                sandbox.reset()
            except Exception:  # noqa: BLE001 - a sandbox that cannot be reset is replaced later
                discard = True
        with self._changed:
            keep = not discard and not self._closed
            if keep:
                self._idle.append(sandbox)
            else:
                self._count -= 1
            self._changed.notify()
        if not keep:
            _close_quietly(sandbox)

    def close(self) -> None:
        """Close the idle sandboxes now and the others as they come back; later acquires fail."""
        with self._changed:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            self._changed.notify_all()
        for sandbox in idle:
            _close_quietly(sandbox)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"The {self.name} pool is closed; make a new env to get sandboxes again.")


_pools: dict[tuple[SandboxSpec, str], SharedPool] = {}
_pools_lock = threading.Lock()


def shared_pool(spec: SandboxSpec, size: int, role: str) -> SharedPool:
    """The process's pool for ``spec`` and ``role`` (``"agent"`` or ``"grader"``), made on first use.

    The first caller's ``size`` sets the pool's size; a later, larger ``size`` grows it.
    """
    with _pools_lock:
        pool = _pools.get((spec, role))
        if pool is None or pool._closed:
            pool = _pools[(spec, role)] = SharedPool(spec, size, name=f"{role} {spec.backend}")
        elif size > pool.size:
            with pool._changed:
                pool.size = size
                pool._changed.notify_all()
        return pool


def close_pools() -> None:
    """Close every shared pool (their sandboxes with them); envs made later start new ones."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()


atexit.register(close_pools)


class Lease:
    """One env's hold on at most one sandbox of a pool, safe to use from any thread.

    ``renew`` (at each reset) resets the sandbox held, or acquires one; ``release`` gives it back.
    ``taint`` marks the sandbox as possibly still in use by an abandoned call, so that ``release``
    closes it instead of handing it to another episode.
    """

    def __init__(self, spec: SandboxSpec, size: int, role: str):
        self.spec = spec
        self.size = size
        self.role = role
        self._pool: SharedPool | None = None
        self._sandbox: Sandbox | None = None
        self._tainted = False
        self._lock = threading.Lock()

    @property
    def sandbox(self) -> Sandbox | None:
        """The sandbox held, or None."""
        return self._sandbox

    def renew(self) -> Sandbox:
        """A clean sandbox for a new episode: the one held, reset, else a fresh one from the pool."""
        with self._lock:
            held = self._sandbox
            if held is not None and not self._tainted:
                try:
                    held.reset()
                    return held
                except Exception:  # noqa: BLE001 - a sandbox that cannot be reset is replaced below
                    self._tainted = True
        self.release()
        pool = shared_pool(self.spec, self.size, self.role)
        sandbox = pool.acquire()
        with self._lock:
            self._pool, self._sandbox, self._tainted = pool, sandbox, False
        return sandbox

    def taint(self) -> None:
        """A call on the sandbox was abandoned mid-way: do not hand it to anyone else."""
        self._tainted = True

    def release(self) -> None:
        """Give the sandbox back to its pool (closed instead if tainted); a no-op if none is held."""
        with self._lock:
            pool, sandbox, tainted = self._pool, self._sandbox, self._tainted
            self._pool, self._sandbox, self._tainted = None, None, False
        if pool is not None and sandbox is not None:
            pool.release(sandbox, discard=tainted)


def _close_quietly(sandbox: Sandbox) -> None:
    try:
        sandbox.close()
    except Exception:  # noqa: BLE001, S110 - best effort: a container left behind is removed by the next start
        pass
