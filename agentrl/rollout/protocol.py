"""What every rollout shows its caller: :class:`Rollout`, met by the local engines
(:class:`~agentrl.rollout.SingleAgentRollout`, :class:`~agentrl.rollout.MultiAgentRollout`) and
by :class:`~agentrl.rollout.ray.DistributedRollout`, so that the training loop and ``agentrl
rollout`` play groups the same way wherever the episodes run."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol, runtime_checkable

from agentrl.rollout.buffer import TrajectoryBuffer
from agentrl.rollout.stats import RolloutStats
from agentrl.types import Trajectory


@runtime_checkable
class Rollout(Protocol):
    """Plays numbered groups of episodes (``group_size`` + ``redundancy`` episodes of one task each)."""

    stats: RolloutStats
    """Every trajectory played so far."""
    policy_stats: dict[str, RolloutStats]
    """The same per policy id."""
    failed_episodes: int
    """Episodes that ended with an error (any of their trajectories)."""

    def group_id(self, group: int) -> str:
        """The id of group number ``group`` (its env seed follows from the number too)."""
        ...

    def stream_episodes(
        self,
        num_groups: int | None = None,
        buffer: TrajectoryBuffer | None = None,
        *,
        groups: Sequence[int] | None = None,
    ) -> AsyncIterator[list[Trajectory]]:
        """Play ``num_groups`` new groups, or the groups numbered ``groups``; yield each episode's
        trajectories as it ends."""
        ...

    def close(self) -> None:
        """Free what the rollout holds (idle envs, worker actors)."""
        ...


@runtime_checkable
class ReplacesWorkers(Protocol):
    """A rollout whose workers can die and be replaced (Ray env workers): ``retired`` lists the dead."""

    retired: list[Any]
