"""A pool of daemon threads for blocking env and tool calls that may never return.

``asyncio.to_thread`` and ``concurrent.futures.ThreadPoolExecutor`` both wait for their threads
when the event loop closes and when the interpreter exits, so one env stuck in an endless loop would
hang the whole run at shutdown even after its episode was timed out and counted. Threads here are
daemons and nobody joins them: a call that overruns its limit is abandoned, its thread is left to
finish (or not) on its own, and a new thread takes the next call. Python cannot kill a thread; code
that must be stopped for sure belongs in a sandbox process (``agentrl.sandboxes``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class DaemonThreadPool:
    """Runs calls on daemon threads; grows when every thread is busy (or stuck)."""

    def __init__(self, name: str):
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._started = 0

    @property
    def threads(self) -> int:
        """How many threads this pool has started (stuck ones included)."""
        return self._started

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``fn()`` on a pool thread; the future holds its result or exception."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._idle:
                self._idle -= 1
            else:
                self._started += 1
                threading.Thread(target=self._work, name=f"{self.name}-{self._started}", daemon=True).start()
        self._jobs.put((future, fn))
        return future

    async def run(self, fn: Callable[[], T]) -> T:
        """Await ``fn()`` run on a pool thread; cancelling the await abandons the call."""
        return await asyncio.wrap_future(self.submit(fn))

    def _work(self) -> None:
        while True:
            future, fn = self._jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as e:  # handed to the caller through the future
                    future.set_exception(e)
            with self._lock:
                self._idle += 1


ENV_THREADS = DaemonThreadPool("agentrl-env")
TOOL_THREADS = DaemonThreadPool("agentrl-tool")
