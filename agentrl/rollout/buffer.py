"""The trajectory buffer: where finished trajectories wait for the trainer, a whole group at a time.

Groups are released in the order they *complete* (queue scheduling), so one straggling group never
holds a batch back. A group is complete when ``group_size`` trajectories without an error have
arrived; with redundant rollouts the engine starts a few more episodes than that, and arrivals after
the group is complete are discarded. The staleness bound ``max_staleness`` drops a group whose
oldest token was generated more than that many policy versions before the trainer's current one
(0 = strictly on-policy; ``None`` = no bound).

Everything that does not reach the trainer is counted in :attr:`TrajectoryBuffer.stats`.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field

from agentrl.rollout.stats import failure_cause
from agentrl.types import Trajectory


@dataclass
class BufferStats:
    """Counts of what went through the buffer."""

    released_groups: int = 0
    """Complete groups handed to the trainer or waiting in the ready queue."""
    failed: int = 0
    """Trajectories that arrived with an error (never trained on)."""
    redundant: int = 0
    """Trajectories discarded because their group was already complete."""
    stale_groups: int = 0
    """Groups dropped by the staleness bound."""
    incomplete_groups: int = 0
    """Groups closed with fewer than ``group_size`` good trajectories (dropped or kept partial)."""
    failure_causes: dict[str, int] = field(default_factory=dict)
    """Failed trajectories by the first word of their error (the exception type)."""
    dropped: list[str] = field(default_factory=list)
    """Ids of the groups dropped (stale, or short of good episodes), in the order they were."""


class TrajectoryBuffer:
    """Collects trajectories into groups and releases whole groups in completion order.

    >>> buffer = TrajectoryBuffer(group_size=2)
    >>> buffer.put(Trajectory(group_id="a", versions=[0]))
    >>> buffer.put(Trajectory(group_id="a", versions=[0]))
    >>> [len(g) for g in buffer.get_nowait(1)]
    [2]
    """

    def __init__(self, group_size: int, max_staleness: int | None = None, keep_partial_groups: bool = False):
        if group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {group_size}.")
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {max_staleness}.")
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.keep_partial_groups = keep_partial_groups
        self.version = 0
        self.stats = BufferStats()
        self._pending: dict[str, list[Trajectory]] = defaultdict(list)
        self._closed: set[str] = set()
        self._ready: OrderedDict[str, list[Trajectory]] = OrderedDict()
        self._changed: asyncio.Event | None = None
        self._changed_loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        """How many complete groups are ready."""
        return len(self._ready)

    def put(self, trajectory: Trajectory) -> None:
        """Add one finished trajectory; releases its group once ``group_size`` good ones are in."""
        group_id = trajectory.group_id
        if group_id in self._closed:
            self.stats.redundant += 1
            return
        if trajectory.error is not None:
            self.stats.failed += 1
            cause = failure_cause(trajectory.error)
            self.stats.failure_causes[cause] = self.stats.failure_causes.get(cause, 0) + 1
            return
        group = self._pending[group_id]
        group.append(trajectory)
        if len(group) >= self.group_size:
            self._release(group_id)

    def put_group(self, group_id: str, trajectories: list[Trajectory]) -> None:
        """Add a whole group at once, complete whatever its size (a caller that assembles its
        groups itself: the multi-policy controller, whose groups are a policy's samples of a task).
        It is released now, or dropped if already too stale."""
        if group_id in self._closed or group_id in self._pending:
            raise ValueError(f"group {group_id!r} is already in the buffer; a group is put once.")
        self._pending[group_id] = list(trajectories)
        self._release(group_id)

    def close_group(self, group_id: str) -> None:
        """Say that no more episodes of ``group_id`` will arrive (all of them ended).

        An incomplete group is dropped, or released as it is with ``keep_partial_groups``.
        """
        if group_id in self._closed:
            return
        if len(self._pending.get(group_id, [])) < self.group_size:
            self.stats.incomplete_groups += 1
            if not self.keep_partial_groups or not self._pending.get(group_id):
                self._pending.pop(group_id, None)
                self._closed.add(group_id)
                self.stats.dropped.append(group_id)
                return
        self._release(group_id)

    def abort(self, group_id: str) -> None:
        """Forget ``group_id``'s episodes so far, ready or not, as if it had never started: it may be
        played again from scratch under the same id (tail batching replays unfinished groups)."""
        if group_id in self._ready:
            del self._ready[group_id]
            self.stats.released_groups -= 1
        self._pending.pop(group_id, None)
        self._closed.discard(group_id)

    def set_version(self, version: int) -> None:
        """Tell the buffer the trainer's current policy version; drops ready groups now too stale."""
        self.version = version
        for group_id in [g for g, group in self._ready.items() if self._is_stale(group)]:
            del self._ready[group_id]
            self.stats.stale_groups += 1
            self.stats.released_groups -= 1
            self.stats.dropped.append(group_id)

    def ready_groups(self) -> list[list[Trajectory]]:
        """The complete groups waiting for the trainer, oldest completion first (not taken out)."""
        return [list(group) for group in self._ready.values()]

    def state_of(self, group_id: str) -> str:
        """``"ready"`` (complete, waiting), ``"gone"`` (taken, or dropped: stale, incomplete) or
        ``"pending"`` (episodes still to come)."""
        if group_id in self._ready:
            return "ready"
        return "gone" if group_id in self._closed else "pending"

    def take(self, group_ids: list[str]) -> list[list[Trajectory]]:
        """Take the ready groups among ``group_ids``, in that order (the others stay where they are)."""
        return [self._ready.pop(group_id) for group_id in group_ids if group_id in self._ready]

    async def wait(self, timeout: float) -> None:
        """Wait until a group is released, or ``timeout`` seconds."""
        event = self._event()
        event.clear()
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass

    def get_nowait(self, num_groups: int) -> list[list[Trajectory]]:
        """Take up to ``num_groups`` ready groups, oldest completion first."""
        taken = []
        while self._ready and len(taken) < num_groups:
            _, group = self._ready.popitem(last=False)
            taken.append(group)
        return taken

    async def get(self, num_groups: int, timeout: float | None = None) -> list[list[Trajectory]]:
        """Wait until ``num_groups`` groups are ready and take them (fewer if ``timeout`` passes)."""
        loop = asyncio.get_running_loop()
        changed = self._event()
        deadline = None if timeout is None else loop.time() + timeout
        while len(self._ready) < num_groups:
            changed.clear()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                break
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                break
        return self.get_nowait(num_groups)

    def _event(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._changed is None or self._changed_loop is not loop:  # an Event binds to one loop
            self._changed, self._changed_loop = asyncio.Event(), loop
        return self._changed

    def _release(self, group_id: str) -> None:
        group = self._pending.pop(group_id, [])
        self._closed.add(group_id)
        if self._is_stale(group):
            self.stats.stale_groups += 1
            self.stats.dropped.append(group_id)
            return
        self._ready[group_id] = group
        self.stats.released_groups += 1
        if self._changed is not None:
            self._changed.set()

    def _is_stale(self, group: list[Trajectory]) -> bool:
        if self.max_staleness is None:
            return False
        versions = [v for t in group for v in t.versions if v >= 0]
        return bool(versions) and self.version - min(versions) > self.max_staleness
