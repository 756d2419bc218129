"""SandboxPool: warm sandboxes lent out and taken back, from sync or async code, on any thread or loop.

::

    from agentrl.sandboxes import SandboxPool, make_sandbox

    async with SandboxPool(8, lambda: make_sandbox("docker")) as pool:   # 8 started now, in parallel
        async with pool.sandbox() as sb:                                 # waits while all 8 are lent
            result = await sb.aexec("python3 -c 'print(42)'")
        # given back: reset in the background (processes killed, work dir emptied), then lent again

    with SandboxPool(8) as pool:                  # the same from plain threads (make_sandbox("auto"))
        with pool.sandbox() as sb:
            sb.exec("true")

Rules of a pool:

- At most ``size`` sandboxes exist at once: idle, lent, or being made or reset by the pool. A
  discarded one still being closed no longer counts: its slot goes to the next caller at once
  (a close can hang on a wedged sandbox; nobody should wait for it).
  :meth:`SandboxPool.start` (or entering ``with`` / ``async with``) makes them all now, in parallel;
  otherwise :meth:`~SandboxPool.acquire` makes them one at a time, as they are needed. A caller that
  finds none idle and the pool full waits, first come first served, at most ``timeout`` seconds,
  then gets a :class:`SandboxError` that says how to size the pool.
- :meth:`~SandboxPool.release` returns at once: a pool thread resets the sandbox (no processes, an
  empty work dir) and lends it to the next caller, so only reset sandboxes are ever lent.
  ``release(sb, discard=True)`` closes it instead, for a sandbox that a call abandoned mid-way may
  still be using.
- A sandbox that cannot be reset (its server died and could not restart, or its user closed it) is
  closed. A started pool makes its replacement at once in the background; otherwise, or if that
  fails too, the next caller makes one and gets the reason as a :class:`SandboxError` if it fails,
  so nobody waits forever.
- The pool is thread-safe and bound to no event loop: :meth:`~SandboxPool.aacquire` works from any
  loop, several at once (rollout runs env calls on worker threads, each with its own loop).
- :meth:`~SandboxPool.close` closes every sandbox of the pool, lent or not, and waits for the work in
  the background: when it returns, none is left.

Envs that keep one sandbox across episodes take it from the process-wide pools of
:func:`~agentrl.sandboxes.shared.shared_pool` (one per :class:`~agentrl.sandboxes.make.SandboxSpec`
and role) through a :class:`~agentrl.sandboxes.shared.Lease`; ``agentrl/CodeSandbox-v0`` does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self, TypeVar

from agentrl.sandboxes.base import Sandbox, SandboxError
from agentrl.sandboxes.client import in_thread, io_executor
from agentrl.sandboxes.make import make_sandbox

logger = logging.getLogger(__name__)

ACQUIRE_TIMEOUT = 600.0
"""Seconds :meth:`SandboxPool.acquire` waits for a full pool by default before it raises."""
START_THREADS = 32
"""Most sandboxes :meth:`SandboxPool.start` makes at once (a container start is mostly waiting)."""

T = TypeVar("T")
Grant = concurrent.futures.Future[Sandbox | None]
"""What a waiting caller is handed: a reset sandbox, or None for "a slot is yours: make one"."""


@dataclass
class PoolStats:
    """Counters of a pool's life.

    Attributes:
        created: Sandboxes made: at start, on demand, and as replacements.
        replaced: Sandboxes that could not be reset, closed to be replaced.
        discarded: Sandboxes given back with ``discard=True`` and closed.
        handed_out: Sandboxes lent (a sandbox lent twice counts twice).
    """

    created: int = 0
    replaced: int = 0
    discarded: int = 0
    handed_out: int = 0


class SandboxPool:
    """Up to ``size`` sandboxes made by ``factory``, lent out, reset when given back and reused.

    See the module doc for the rules. Thread-safe; the ``a``-methods work from any event loop.

    Args:
        size: Most sandboxes alive at once.
        factory: Makes one started sandbox; it blocks, so the pool calls it on a worker thread, e.g.
            ``lambda: make_sandbox("docker", limits=SandboxLimits(memory_mb=1024))``. Defaults to
            :func:`~agentrl.sandboxes.make_sandbox` with its defaults.
        name: What errors and logs call the pool (``"agent docker"``).
    """

    def __init__(self, size: int, factory: Callable[[], Sandbox] | None = None, *, name: str = "sandbox") -> None:
        if size < 1:
            raise ValueError(f"SandboxPool size must be >= 1, got {size}")
        self.size = size
        self.name = name
        self.stats = PoolStats()
        self._factory = factory or make_sandbox
        # One lock guards everything below; it is notified whenever background work ends.
        self._lock = threading.Condition()
        self._idle: deque[Sandbox] = deque()
        self._lent: dict[int, Sandbox] = {}
        self._making = 0  # slots whose sandbox a caller or start() is making
        self._working = 0  # slots whose sandbox a pool thread is resetting or replacing
        self._closing = 0  # discarded sandboxes a pool thread is closing (their slots are free)
        self._waiters: deque[Grant] = deque()
        self._warm = False  # start() ran: keep the pool full, replace broken sandboxes at once
        self._closed = False

    # --- state -----------------------------------------------------------------------------------

    @property
    def idle(self) -> int:
        """Sandboxes reset and ready to lend now."""
        with self._lock:
            return len(self._idle)

    @property
    def in_use(self) -> int:
        """Sandboxes lent and not yet given back."""
        with self._lock:
            return len(self._lent)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran; a closed pool lends nothing."""
        return self._closed

    def grow(self, size: int) -> None:
        """Raise the pool's size to ``size`` (a smaller ``size`` changes nothing)."""
        with self._lock:
            if size > self.size:
                self.size = size
                self._serve_waiters()

    # --- start and close -------------------------------------------------------------------------

    def start(self) -> None:
        """Make sandboxes now, in parallel, until the pool holds ``size``; from then on a broken one
        is replaced at once. If any cannot start, the pool is closed and :class:`SandboxError` says why."""
        with self._lock:
            self._check_open()
            self._warm = True
            missing = self.size - self._count()
            self._making += max(missing, 0)
        if missing <= 0:
            return
        with concurrent.futures.ThreadPoolExecutor(min(missing, START_THREADS), "agentrl-pool-start") as threads:
            futures = [threads.submit(self._factory) for _ in range(missing)]
        errors = [error for future in futures if (error := future.exception()) is not None]
        made = [future.result() for future in futures if future.exception() is None]
        with self._lock:
            self.stats.created += len(made)
            if not self._closed:
                self._idle.extend(made)
                made = []
        _close_all(made)  # the pool closed while they started; closed before close() returns
        with self._lock:
            self._making -= missing
            self._serve_waiters()
            self._lock.notify_all()
        if errors:
            self.close()
            raise SandboxError(
                f"The {self.name} pool could start only {missing - len(errors)} of {missing} sandboxes: {errors[0]}"
            ) from errors[0]

    async def astart(self) -> None:
        """:meth:`start` without blocking the event loop."""
        await in_thread(self.start)

    def close(self) -> None:
        """Close every sandbox of the pool, lent or not, and wait for the pool's background work;
        callers still waiting get a :class:`SandboxError`, and so do later ones. Idempotent."""
        with self._lock:
            self._closed = True
            sandboxes = [*self._idle, *self._lent.values()]
            self._idle.clear()
            self._lent.clear()
            while self._waiters:
                waiter = self._waiters.popleft()
                if waiter.set_running_or_notify_cancel():
                    waiter.set_exception(self._closed_error())
        _close_all(sandboxes)
        with self._lock:
            self._lock.wait_for(lambda: self._making == self._working == self._closing == 0)

    async def aclose(self) -> None:
        """:meth:`close` without blocking the event loop."""
        await in_thread(self.close)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        await self.astart()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # --- lending ---------------------------------------------------------------------------------

    def sandbox(self, timeout: float | None = None) -> Loan:
        """A sandbox for the duration of a ``with`` or ``async with`` block, given back after it."""
        return Loan(self, timeout)

    def acquire(self, timeout: float | None = None) -> Sandbox:
        """A reset sandbox for the caller alone, to :meth:`release` when done. When none is idle and
        the pool is full, it waits at most ``timeout`` seconds (default :data:`ACQUIRE_TIMEOUT`)."""
        timeout = ACQUIRE_TIMEOUT if timeout is None else timeout
        grant = self._claim()
        if isinstance(grant, concurrent.futures.Future):
            waiter = grant
            try:
                grant = waiter.result(timeout)
            except TimeoutError:
                if self._withdraw(waiter):
                    raise self._busy_error(timeout) from None
                grant = waiter.result()  # it came as the wait ended
            except BaseException:  # interrupted: what came meanwhile must not be lost
                self._abandon(waiter)
                raise
        return grant if grant is not None else self._make_lent()

    async def aacquire(self, timeout: float | None = None) -> Sandbox:
        """:meth:`acquire` without blocking the event loop; a cancelled caller loses nothing to the pool."""
        timeout = ACQUIRE_TIMEOUT if timeout is None else timeout
        grant = self._claim()
        if isinstance(grant, concurrent.futures.Future):
            grant = await self._await_grant(grant, timeout)
        if grant is not None:
            return grant
        making = _run_soon(self._make_lent)
        try:
            return await asyncio.wrap_future(making)
        except asyncio.CancelledError:
            making.add_done_callback(self._give_back_made)
            raise

    def release(self, sandbox: Sandbox, *, discard: bool = False) -> None:
        """Take back a sandbox this pool lent; returns at once. A pool thread resets it and lends it
        again, or closes it if ``discard`` is true, if the reset fails, or if the pool is closed."""
        with self._lock:
            if self._lent.pop(id(sandbox), None) is None:
                if self._closed:
                    return  # close() closed it already
                raise ValueError(f"this sandbox was not lent by the {self.name} pool, or was given back already")
            if discard:
                self.stats.discarded += 1
                self._closing += 1
                self._serve_waiters()  # its slot is free now
            else:
                self._working += 1
        _run_soon(self._discard if discard else self._recycle, sandbox)

    # --- internals: all state changes happen under self._lock ---------------------------------

    def _count(self) -> int:
        return len(self._idle) + len(self._lent) + self._making + self._working

    def _lend(self, sandbox: Sandbox) -> Sandbox:
        self._lent[id(sandbox)] = sandbox
        self.stats.handed_out += 1
        return sandbox

    def _claim(self) -> Sandbox | Grant | None:
        """An idle sandbox, or None (a free slot, reserved: make one), or a grant to wait for."""
        with self._lock:
            self._check_open()
            if self._idle:
                return self._lend(self._idle.popleft())
            if self._may_make(len(self._waiters) + 1):
                self._making += 1
                return None
            waiter: Grant = concurrent.futures.Future()
            self._waiters.append(waiter)
            return waiter

    def _may_make(self, queued: int) -> bool:
        """Whether the ``queued``-th caller in line may make a sandbox: only when there is room and
        the sandboxes being reset will not cover the callers before it (reusing one is far quicker
        than starting one)."""
        return self._count() < self.size and queued > self._working

    def _serve_waiters(self) -> None:
        """Hand idle sandboxes, then free slots, to the callers waiting longest (lock held)."""
        while self._waiters and not self._closed and (self._idle or self._may_make(len(self._waiters))):
            waiter = self._waiters.popleft()
            if not waiter.set_running_or_notify_cancel():
                continue  # its caller gave up
            if self._idle:
                waiter.set_result(self._lend(self._idle.popleft()))
            else:
                self._making += 1
                waiter.set_result(None)

    def _withdraw(self, waiter: Grant) -> bool:
        """Stop waiting; False if a grant came first (then it is the caller's)."""
        if not waiter.cancel():
            return False
        with self._lock:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        return True

    def _abandon(self, waiter: Grant) -> None:
        """The caller is gone: withdraw, or give back what it was granted."""
        if self._withdraw(waiter) or waiter.exception() is not None:
            return
        granted = waiter.result()
        with self._lock:
            if granted is None:
                self._making -= 1
            else:  # lent but never used: still clean
                self._lent.pop(id(granted), None)
                self._idle.append(granted)
            self._serve_waiters()
            self._lock.notify_all()

    async def _await_grant(self, waiter: Grant, timeout: float) -> Sandbox | None:
        loop = asyncio.get_running_loop()
        granted = asyncio.Event()

        def wake(_: Grant) -> None:
            try:
                loop.call_soon_threadsafe(granted.set)
            except RuntimeError:  # that loop is closed: nobody is waiting there any more
                pass

        waiter.add_done_callback(wake)
        try:
            await asyncio.wait_for(granted.wait(), timeout)
        except TimeoutError:
            if self._withdraw(waiter):
                raise self._busy_error(timeout) from None
        except BaseException:  # cancelled: what came meanwhile must not be lost
            self._abandon(waiter)
            raise
        return waiter.result()

    def _make_lent(self) -> Sandbox:
        """Make a sandbox in a slot this caller reserved, and lend it."""
        if self._closed:  # closed while the caller waited for its slot: start nothing
            with self._lock:
                self._making -= 1
                self._lock.notify_all()
            raise self._closed_error()
        try:
            sandbox = self._factory()
        except BaseException as exc:
            with self._lock:
                self._making -= 1
                self._serve_waiters()  # the slot is free: the next waiter tries, and learns why if it fails
                self._lock.notify_all()
            if isinstance(exc, Exception):
                # A SandboxError keeps its class (DockerUnavailable: the engine is away), with the pool's name.
                kind = type(exc) if isinstance(exc, SandboxError) else SandboxError
                raise kind(f"The {self.name} pool could not start a sandbox: {exc}") from exc
            raise
        with self._lock:
            self.stats.created += 1
            if not self._closed:
                self._making -= 1
                return self._lend(sandbox)
        _close_quietly(sandbox)  # the pool closed while it started; closed before close() returns
        with self._lock:
            self._making -= 1
            self._lock.notify_all()
        raise self._closed_error()

    def _give_back_made(self, making: concurrent.futures.Future[Sandbox]) -> None:
        """For a cancelled :meth:`aacquire`: the sandbox made for it goes back, or its slot does."""
        if making.cancelled():  # never ran: the slot it reserved is free
            with self._lock:
                self._making -= 1
                self._serve_waiters()
                self._lock.notify_all()
        elif making.exception() is None:
            self.release(making.result())

    def _recycle(self, sandbox: Sandbox) -> None:
        """Pool thread: reset a sandbox given back and lend it again; close a broken one."""
        try:
            if getattr(sandbox, "closed", False):
                raise SandboxError("its user closed it")
            if not self._closed:
                sandbox.reset()
        except Exception as exc:  # noqa: BLE001 - any failure means "broken": replace it, never crash the pool
            logger.warning("%s pool: closing a sandbox that could not be reset (%s)", self.name, exc)
            with self._lock:
                self.stats.replaced += 1
            _close_quietly(sandbox)
            self._refill()
            return
        self._finish(sandbox)

    def _refill(self) -> None:
        """Pool thread: make the replacement of a broken sandbox, if the pool is kept full."""
        if not self._warm or self._closed:
            self._finish(None)  # the next caller makes one when it needs it
            return
        try:
            sandbox = self._factory()
        except Exception as exc:  # noqa: BLE001 - the next caller tries again and is told why
            logger.warning("%s pool: could not replace a broken sandbox (%s)", self.name, exc)
            self._finish(None)
            return
        with self._lock:
            self.stats.created += 1
        self._finish(sandbox)

    def _finish(self, sandbox: Sandbox | None) -> None:
        """Pool thread: the slot's work is done; its sandbox (if any) is idle now, or closed."""
        if sandbox is not None:
            with self._lock:
                if not self._closed:
                    self._working -= 1
                    self._idle.append(sandbox)
                    self._serve_waiters()
                    self._lock.notify_all()
                    return
            _close_quietly(sandbox)  # the pool closed meanwhile; closed before close() is told
        with self._lock:
            self._working -= 1
            self._serve_waiters()
            self._lock.notify_all()

    def _discard(self, sandbox: Sandbox) -> None:
        """Pool thread: close a sandbox given back with ``discard``."""
        _close_quietly(sandbox)
        with self._lock:
            self._closing -= 1
            self._lock.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise self._closed_error()

    def _closed_error(self) -> SandboxError:
        return SandboxError(f"The {self.name} pool is closed; make a new one.")

    def _busy_error(self, timeout: float) -> SandboxError:
        return SandboxError(
            f"No sandbox of the {self.name} pool came free within {timeout:g} s: all {self.size} are in use. "
            "Make the pool larger (for an env, a larger pool_size: at least the number of episodes that run "
            "at once), or run fewer episodes at once."
        )


class Loan:
    """``with pool.sandbox() as sb:`` or ``async with pool.sandbox() as sb:``: a sandbox lent for
    the block and given back after it, even when the block raises."""

    def __init__(self, pool: SandboxPool, timeout: float | None) -> None:
        self._pool = pool
        self._timeout = timeout
        self._sandbox: Sandbox | None = None

    def __enter__(self) -> Sandbox:
        self._sandbox = self._pool.acquire(self._timeout)
        return self._sandbox

    def __exit__(self, *exc_info: object) -> None:
        self._give_back()

    async def __aenter__(self) -> Sandbox:
        self._sandbox = await self._pool.aacquire(self._timeout)
        return self._sandbox

    async def __aexit__(self, *exc_info: object) -> None:
        self._give_back()

    def _give_back(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            self._pool.release(sandbox)


# --- helpers -----------------------------------------------------------------------------------------


def _run_soon(function: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
    """Run ``function`` on the sandbox I/O threads; here and now if the interpreter is shutting down
    (no new threads then: a finalizer or ``atexit`` hook that gives a sandbox back still closes it)."""
    try:
        return io_executor().submit(function, *args)
    except RuntimeError:
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            done.set_result(function(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever reads the future
            done.set_exception(exc)
        return done


def _close_all(sandboxes: list[Sandbox]) -> None:
    """Close ``sandboxes`` in parallel (a container takes a moment to remove) and wait for them."""
    concurrent.futures.wait([_run_soon(_close_quietly, sandbox) for sandbox in sandboxes])


def _close_quietly(sandbox: Sandbox) -> None:
    try:
        sandbox.close()
    except Exception as exc:  # noqa: BLE001 - best effort: a container left behind is removed by the next start
        logger.warning("sandbox pool: closing a sandbox failed (%s)", exc)
