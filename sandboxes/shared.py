"""Sandbox pools shared by the envs of a process, and an env's :class:`Lease` on one sandbox.

An env that keeps one sandbox across its episodes (``agentrl/CodeSandbox-v0``) holds a
:class:`Lease` on the process-wide :class:`~agentrl.sandboxes.pool.SandboxPool` of its
:class:`~agentrl.sandboxes.make.SandboxSpec` and role (:func:`shared_pool`): many envs, few warm
sandboxes, and roles that never share (an env holding every agent sandbox can still grade in a
sandbox of its own). The pools close at exit, or with :func:`close_pools`.
"""

from __future__ import annotations

import atexit
import threading

from agentrl.sandboxes.base import Sandbox
from agentrl.sandboxes.make import SandboxSpec
from agentrl.sandboxes.pool import SandboxPool

_shared: dict[tuple[SandboxSpec, str], SandboxPool] = {}
_shared_lock = threading.Lock()


def shared_pool(spec: SandboxSpec, size: int, role: str) -> SandboxPool:
    """The process's pool of ``spec`` sandboxes for ``role`` (e.g. ``"agent"``, ``"grader"``), made
    on first use and closed at exit. It makes sandboxes on demand; the first caller's ``size`` sets
    its size and a later, larger one grows it. Roles never share sandboxes, so envs holding every
    agent sandbox can still grade in a sandbox of their own."""
    with _shared_lock:
        pool = _shared.get((spec, role))
        if pool is None or pool.closed:
            pool = _shared[(spec, role)] = SandboxPool(size, spec.make, name=f"{role} {spec.backend}")
        else:
            pool.grow(size)
        return pool


def shared_pools() -> dict[tuple[SandboxSpec, str], SandboxPool]:
    """The shared pools alive now, by (spec, role)."""
    with _shared_lock:
        return dict(_shared)


def close_pools() -> None:
    """Close every shared pool and its sandboxes; envs that need one later start a new pool."""
    with _shared_lock:
        pools = list(_shared.values())
        _shared.clear()
    for pool in pools:
        pool.close()


atexit.register(close_pools)


class Lease:
    """One holder's claim (an env's) on at most one sandbox of a shared pool; safe from any thread.

    :meth:`renew` (at each episode's start) resets the sandbox held, or acquires one; :meth:`release`
    (at the episode's end, at close, or from a ``weakref.finalize``) gives it back. :meth:`taint` marks
    it as possibly still used by an abandoned call, so that it is closed instead of lent to anyone else.
    """

    def __init__(self, spec: SandboxSpec, size: int, role: str) -> None:
        self.spec = spec
        self.size = size
        self.role = role
        self._pool: SandboxPool | None = None
        self._sandbox: Sandbox | None = None
        self._tainted = False
        self._lock = threading.Lock()

    @property
    def sandbox(self) -> Sandbox | None:
        """The sandbox held, or None."""
        return self._sandbox

    def renew(self) -> Sandbox:
        """A clean sandbox for a new episode: the one held, reset, else one from the pool. All of it
        under the lease's lock: two callers at once would otherwise each take a sandbox, and the one
        overwritten would never go back to its pool."""
        with self._lock:
            held = self._sandbox
            if held is not None and not self._tainted:
                try:
                    held.reset()
                    return held
                except Exception:  # noqa: BLE001 - a sandbox that cannot be reset is replaced below
                    self._tainted = True
            self._give_back()
            pool = shared_pool(self.spec, self.size, self.role)
            sandbox = pool.acquire()
            self._pool, self._sandbox = pool, sandbox
            return sandbox

    def taint(self) -> None:
        """A call on the sandbox was abandoned mid-way: never lend it to anyone else."""
        self._tainted = True

    def release(self) -> None:
        """Give the sandbox back to its pool (closed instead if tainted); a no-op if none is held."""
        with self._lock:
            self._give_back()

    def _give_back(self) -> None:
        pool, sandbox, tainted = self._pool, self._sandbox, self._tainted
        self._pool, self._sandbox, self._tainted = None, None, False
        if pool is not None and sandbox is not None:
            pool.release(sandbox, discard=tainted)
