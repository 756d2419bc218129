"""SandboxPool: warm sandboxes handed to episodes and taken back, so an episode never waits for a start.

::

    from agentrl.sandboxes import SandboxPool, make_sandbox

    async with SandboxPool(8, lambda: make_sandbox("docker")) as pool:   # 8 started now, in parallel
        async with pool.sandbox() as sb:                                 # waits if all 8 are in use
            result = await sb.aexec("python3 -c 'print(42)'")
        # back in the pool: its processes are killed and its work dir emptied before the next user

A sandbox that cannot be reset (its server died and could not be restarted, or a user closed it) is
closed and a new one is made in the background; if even that fails, the next :meth:`sandbox` call
tries again and raises :class:`SandboxError` with the reason, so no caller waits forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Self

from agentrl.sandboxes.base import Sandbox, SandboxError
from agentrl.sandboxes.client import in_thread

logger = logging.getLogger(__name__)


@dataclass
class PoolStats:
    """Counters of a pool's life (the ``sandbox/pool_*`` metrics).

    Attributes:
        created: Sandboxes made, at start and as replacements.
        replaced: Broken sandboxes closed and replaced.
        handed_out: ``sandbox()`` entries.
    """

    created: int = 0
    replaced: int = 0
    handed_out: int = 0


class SandboxPool:
    """``size`` warm sandboxes made by ``factory``, reset on return and reused (see the module doc).

    Args:
        size: How many sandboxes the pool keeps.
        factory: Makes one started sandbox (blocking; it runs in a worker thread), e.g.
            ``lambda: make_sandbox("docker", limits=SandboxLimits(memory_mb=1024))``. Defaults to
            :func:`~agentrl.sandboxes.make_sandbox` with its defaults.
    """

    def __init__(self, size: int, factory: Callable[[], Sandbox] | None = None) -> None:
        if size < 1:
            raise ValueError(f"SandboxPool size must be >= 1, got {size}")
        if factory is None:
            from agentrl.sandboxes.make import make_sandbox

            factory = make_sandbox
        self.size = size
        self.stats = PoolStats()
        self._factory = factory
        self._idle: asyncio.Queue[Sandbox | None] = asyncio.Queue()
        self._in_use: set[int] = set()
        self._all: dict[int, Sandbox] = {}
        self._returns: set[asyncio.Task[None]] = set()
        self._started = False
        self._closed = False
        self._start_lock: asyncio.Lock | None = None

    async def _make(self) -> Sandbox:
        sandbox = await in_thread(self._factory)
        self._all[id(sandbox)] = sandbox
        self.stats.created += 1
        return sandbox

    async def start(self) -> None:
        """Start all ``size`` sandboxes in parallel (done by the first :meth:`sandbox` otherwise)."""
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._started:
                return
            if self._closed:
                raise SandboxError("this SandboxPool is closed; make a new one")
            results = await asyncio.gather(*(self._make() for _ in range(self.size)), return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            for result in results:
                if not isinstance(result, BaseException):
                    self._idle.put_nowait(result)
            self._started = True
            if errors:
                await self.close()
                raise SandboxError(
                    f"SandboxPool could start only {self.size - len(errors)} of {self.size} sandboxes: {errors[0]}"
                ) from errors[0]

    @asynccontextmanager
    async def sandbox(self) -> AsyncIterator[Sandbox]:
        """A warm sandbox for the duration of the ``async with`` block; reset and reused after."""
        await self.start()
        if self._closed:
            raise SandboxError("this SandboxPool is closed; make a new one")
        item = await self._idle.get()
        if item is None:
            # A slot whose replacement failed earlier: make it now, or tell this caller why not.
            try:
                item = await self._make()
            except Exception as exc:
                self._idle.put_nowait(None)
                raise SandboxError(f"SandboxPool could not replace a broken sandbox: {exc}") from exc
        self._in_use.add(id(item))
        self.stats.handed_out += 1
        try:
            yield item
        finally:
            self._in_use.discard(id(item))
            task = asyncio.get_running_loop().create_task(self._take_back(item))
            self._returns.add(task)
            task.add_done_callback(self._returns.discard)

    async def _take_back(self, sandbox: Sandbox) -> None:
        """Reset a returned sandbox and put it back; replace it if it is broken."""
        if self._closed:
            await self._discard(sandbox)
            return
        try:
            if getattr(sandbox, "closed", False):
                raise SandboxError("the sandbox was closed by its user")
            await in_thread(sandbox.reset)
        except Exception as exc:  # noqa: BLE001 - any failure means "broken": replace, never crash the pool
            logger.warning("sandbox pool: replacing a broken sandbox (%s)", exc)
            await self._discard(sandbox)
            self.stats.replaced += 1
            try:
                replacement: Sandbox | None = await self._make()
            except Exception as make_exc:  # noqa: BLE001 - the next sandbox() call retries and raises
                logger.warning("sandbox pool: the replacement failed too (%s)", make_exc)
                replacement = None
            if self._closed and replacement is not None:
                await self._discard(replacement)
                return
            self._idle.put_nowait(replacement)
            return
        self._idle.put_nowait(sandbox)

    async def _discard(self, sandbox: Sandbox) -> None:
        self._all.pop(id(sandbox), None)
        try:
            await in_thread(sandbox.close)
        except Exception as exc:  # noqa: BLE001 - closing a broken sandbox may fail; it is gone anyway
            logger.warning("sandbox pool: closing a sandbox failed (%s)", exc)

    @property
    def idle(self) -> int:
        """Sandboxes ready to hand out now."""
        return self._idle.qsize()

    @property
    def in_use(self) -> int:
        """Sandboxes inside an ``async with pool.sandbox()`` block now."""
        return len(self._in_use)

    async def close(self) -> None:
        """Close every sandbox of the pool, in use or not (their containers are removed); idempotent."""
        self._closed = True
        if self._returns:
            await asyncio.gather(*list(self._returns), return_exceptions=True)
        sandboxes = list(self._all.values())
        self._all.clear()
        await asyncio.gather(*(in_thread(sandbox.close) for sandbox in sandboxes), return_exceptions=True)
        while not self._idle.empty():
            self._idle.get_nowait()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
