import asyncio

import pytest

from agentrl.rollout import TrajectoryBuffer
from agentrl.types import Trajectory


def traj(group: str, version: int = 0, error: str | None = None, reward: float = 0.0) -> Trajectory:
    return Trajectory(group_id=group, versions=[-1, version, version], error=error, reward=reward)


def test_groups_are_released_in_completion_order_not_start_order():
    buffer = TrajectoryBuffer(group_size=2)
    buffer.put(traj("slow"))  # started first, finishes last
    buffer.put(traj("fast"))
    buffer.put(traj("fast"))
    assert len(buffer) == 1
    buffer.put(traj("slow"))
    assert [g[0].group_id for g in buffer.get_nowait(5)] == ["fast", "slow"]


def test_redundant_and_failed_trajectories_are_counted_not_trained_on():
    buffer = TrajectoryBuffer(group_size=2)
    buffer.put(traj("g", error="TimeoutError: env hung"))
    buffer.put(traj("g", reward=1.0))
    buffer.put(traj("g", reward=2.0))
    buffer.put(traj("g", reward=3.0))  # the redundant third good episode
    (group,) = buffer.get_nowait(1)
    assert [t.reward for t in group] == [1.0, 2.0]
    assert (buffer.stats.failed, buffer.stats.redundant) == (1, 1)
    assert buffer.stats.failure_causes == {"TimeoutError": 1}


def test_incomplete_groups_are_dropped_or_kept_partial():
    strict = TrajectoryBuffer(group_size=3)
    strict.put(traj("g"))
    strict.close_group("g")
    assert len(strict) == 0 and strict.stats.incomplete_groups == 1
    lenient = TrajectoryBuffer(group_size=3, keep_partial_groups=True)
    lenient.put(traj("g"))
    lenient.close_group("g")
    assert [len(g) for g in lenient.get_nowait(1)] == [1]


@pytest.mark.parametrize("max_staleness, kept", [(0, ["v2"]), (1, ["v1", "v2"]), (None, ["v0", "v1", "v2"])])
def test_staleness_bound_drops_old_groups(max_staleness, kept):
    buffer = TrajectoryBuffer(group_size=1, max_staleness=max_staleness)
    buffer.set_version(2)
    for version in range(3):
        buffer.put(traj(f"v{version}", version=version))
    assert [g[0].group_id for g in buffer.get_nowait(9)] == kept
    assert buffer.stats.stale_groups == 3 - len(kept)


def test_ready_groups_become_stale_when_the_version_moves_on():
    buffer = TrajectoryBuffer(group_size=1, max_staleness=0)
    buffer.put(traj("a", version=0))
    buffer.set_version(1)
    assert buffer.get_nowait(1) == [] and buffer.stats.stale_groups == 1


def test_get_waits_for_groups_and_times_out():
    buffer = TrajectoryBuffer(group_size=1)

    async def main():
        async def produce():
            await asyncio.sleep(0.05)
            buffer.put(traj("a"))
            await asyncio.sleep(0.05)
            buffer.put(traj("b"))

        producer = asyncio.create_task(produce())
        groups = await buffer.get(2)
        await producer
        partial = await buffer.get(1, timeout=0.05)
        return groups, partial

    groups, partial = asyncio.run(main())
    assert [g[0].group_id for g in groups] == ["a", "b"] and partial == []
    # A second event loop works too (the buffer is not bound to the first one).
    buffer.put(traj("c"))
    assert len(asyncio.run(buffer.get(1))) == 1
