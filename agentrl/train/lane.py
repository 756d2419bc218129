"""One policy of a run: its served policy, its trainer, its buffer and its staleness window.

A single-agent run has one lane, ``default``; a multi-agent run one per policy id of its mapping.
Each lane counts its own versions, steps and lost groups; the loop (:mod:`agentrl.train.loop`)
feeds every lane from one stream of groups.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from agentrl.policies import Policy
from agentrl.rollout import StalenessWindow, TrajectoryBuffer
from agentrl.train.config import PolicyConfig, TrainConfig
from agentrl.train.state import LaneState, oldest_version, shift_versions
from agentrl.trainers.models import adapter_weights
from agentrl.trainers.trainer import Trainer
from agentrl.types import Trajectory


class TrainerLike(Protocol):
    """What a lane needs of its trainer: a :class:`~agentrl.trainers.trainer.Trainer` in this
    process, or a :class:`~agentrl.trainers.ranks.TrainerGroup` of ranks on Ray."""

    last_advantages: Any

    def step(self, trajectories: Sequence[Trajectory], version: int | None = None) -> dict[str, float]: ...

    def inference_weights(self) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def reference_nll(self, trajectories: Sequence[Trajectory]) -> float | None: ...


class Lane:
    """One policy of the run: what plays it, what trains it, and where its groups wait."""

    def __init__(
        self,
        policy_id: str,
        policy: Policy,
        trainer: TrainerLike | None,
        settings: PolicyConfig,
        config: TrainConfig,
        state: LaneState,
    ):
        self.policy_id, self.policy, self.trainer, self.settings = policy_id, policy, trainer, settings
        self.state = state
        self.max_staleness = config.max_staleness if settings.max_staleness is None else settings.max_staleness
        self.groups_per_step = config.groups_per_step
        self.base_lr = trainer.config.lr if isinstance(trainer, Trainer) else None
        self.buffer = TrajectoryBuffer(1, max_staleness=self.max_staleness)
        self.window = StalenessWindow(self.groups_per_step, self.max_staleness)
        self.version_offset = 0
        """What the run's count of this policy's versions is ahead of its engine's (a resumed run's engine starts anew)."""
        self.start_versions: dict[int, int] = {}
        """Group number -> this policy's version when the group started (the groups in flight)."""
        self.dropped_seen = 0  # how many of the buffer's dropped groups were counted lost
        self.failed_seen = 0  # failed episodes of the run already reported by this policy's steps
        self.filtered = 0  # groups filtered out in this session (they free room like lost ones)
        self.filtered_reported = 0
        self.lock = asyncio.Lock()  # a checkpoint never sees a step half done
        self.probed_restarts = 0  # the engine restarts when its weights were last probed
        self.starved = 0  # finished groups in a row that held no sample for this policy

    def weights(self) -> Any:
        """What the engine loads after a step: the adapter's tensors, or every tensor of the model."""
        assert self.trainer is not None
        if self.settings.weights == "lora":
            assert isinstance(self.trainer, Trainer)
            return adapter_weights(self.trainer.model)
        return self.trainer.inference_weights()

    def resume(self, buffered: list[list[Trajectory]], numbers: Mapping[str, int]) -> None:
        """Take up where a checkpoint left: versions moved onto the engine's count, the buffered groups back."""
        self.version_offset = max(self.state.policy_version - self.policy.version, 0)
        self.buffer.set_version(self.policy.version)
        for group in buffered:
            group = [shift_versions(t, self.version_offset) for t in group]
            self.buffer.put_group(group[0].group_id, group)
            self.start_versions[numbers[group[0].group_id]] = oldest_version(group, self.policy.version)

    def open_stage(self, lr: float | None) -> None:
        """A new stage: a fresh window over what is buffered, and the stage's learning rate."""
        self.window = StalenessWindow(self.groups_per_step, self.max_staleness, started=len(self.buffer))
        if isinstance(self.trainer, Trainer) and self.base_lr is not None:
            set_lr(self.trainer, self.base_lr if lr is None else lr)

    def lose(self, number: int) -> None:
        """Group ``number`` will never reach this policy's trainer."""
        self.state.lost_groups.append(number)
        self.start_versions.pop(number, None)
        self.window.set_lost(self.window.lost + 1)

    def drop_filtered(self, number: int) -> None:
        """Group ``number`` had equal rewards and is not trained on; a new group takes its place."""
        self.state.filtered_groups.append(number)
        self.start_versions.pop(number, None)
        self.filtered += 1
        self.window.set_lost(self.window.lost + 1)

    def count_dropped(self, numbers: Mapping[str, int]) -> None:
        """Count the groups the buffer dropped as too stale since the last call as lost."""
        dropped = self.buffer.stats.dropped
        for group_id in dropped[self.dropped_seen :]:
            self.lose(numbers[group_id])
        self.dropped_seen = len(dropped)


def set_lr(trainer: Trainer, lr: float) -> None:
    """Make ``lr`` the trainer's learning rate from now on (its schedule still applies)."""
    scheduler = trainer.scheduler
    scheduler.base_lrs = [lr for _ in scheduler.base_lrs]
    for group, factor in zip(trainer.optimizer.param_groups, scheduler.lr_lambdas):
        group["lr"] = lr * factor(scheduler.last_epoch)  # type: ignore[operator]
