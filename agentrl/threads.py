"""Pools of daemon threads for blocking env and tool calls that may never return.

Not ``asyncio.to_thread`` nor ``concurrent.futures.ThreadPoolExecutor``: their threads are joined
when the event loop closes and when the interpreter exits, so one env or tool stuck in an endless
loop would hang the whole run at shutdown even after its episode was timed out and counted, and a
fixed-size pool lets a few hung calls starve every later one. Threads here are daemons that nobody
joins; idle ones are reused, and a new one starts only when none is idle. A call that overruns its
limit is *abandoned*: cancelled if it has not started, else left to finish (or not) on its own and
counted. Python cannot kill a thread; code that must be stopped for sure belongs in a sandbox
process (``agentrl.sandboxes``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
logger = logging.getLogger(__name__)


class DaemonThreadPool:
    """An unbounded pool of daemon threads (see the module docstring)."""

    def __init__(self, name: str):
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self.threads = 0
        """How many threads this pool has started (stuck ones included)."""
        self.abandoned = 0
        """Calls past their limit whose thread is still running."""

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``fn()`` on a pool thread; the future holds its result or exception."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fn, future))
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
                return future
            self.threads += 1
            number = self.threads
        threading.Thread(target=self._work, name=f"{self.name}-{number}", daemon=True).start()
        return future

    async def run(self, fn: Callable[[], T]) -> T:
        """Await ``fn()`` run on a pool thread; cancelling the await (a timeout) abandons the call."""
        future = self.submit(fn)
        try:
            return await asyncio.shield(asyncio.wrap_future(future))
        except asyncio.CancelledError:
            self.abandon(future)
            raise

    def abandon(self, future: concurrent.futures.Future[Any]) -> None:
        """Forget a call past its limit: cancel it if it has not started, else count it until it ends."""
        if future.cancel() or future.done():
            return
        with self._lock:
            self.abandoned += 1
            count = self.abandoned
        future.add_done_callback(self._release)
        if count >= 4 and count & (count - 1) == 0:  # warn at 4, 8, 16, ... without flooding the log
            logger.warning(
                "%d %s calls are still running past their time limit in abandoned threads; code that "
                "can hang belongs in a sandbox (agentrl.sandboxes), which can be killed.",
                count,
                self.name,
            )

    def _work(self) -> None:
        while True:
            fn, future = self._jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as e:  # handed to the caller; SystemExit must not end the thread
                    future.set_exception(e)
            with self._lock:
                self._idle += 1

    def _release(self, _: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self.abandoned -= 1


ENV_THREADS = DaemonThreadPool("agentrl-env")
"""Runs the blocking ``reset`` / ``step`` of envs for their awaitable versions."""
TOOL_THREADS = DaemonThreadPool("agentrl-tool")
"""Runs plain (non-async) tool functions."""
