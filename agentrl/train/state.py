"""What a checkpoint keeps of a run (:class:`RunState`, one :class:`LaneState` per policy), and the
small rules of resuming: versions moved onto a new engine's count, the ledger of batches.

A checkpoint holds every trainer's state by policy id, this state as JSON and the groups each
policy had buffered (:mod:`agentrl.trainers.checkpoint`). A single-agent run is a run of one lane,
``default``; its checkpoint has the same form.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.plot import plot_run
from agentrl.types import Trajectory

log = logging.getLogger(__name__)


@dataclass
class LaneState:
    """What a checkpoint keeps of one policy's lane (JSON)."""

    step: int = 0
    """Training steps this policy took over the run."""
    stage_step: int = 0
    """Steps it took in the current stage."""
    trained_groups: list[int] = field(default_factory=list)
    """The group numbers it trained on, in order."""
    lost_groups: list[int] = field(default_factory=list)
    """Groups started for it that never reached its trainer (failed, empty, stale)."""
    filtered_groups: list[int] = field(default_factory=list)
    """Groups it dropped for their equal rewards (``curriculum.selection: filter``)."""
    policy_version: int = 0
    """Its version after its last step, counted over the whole run (an engine started anew on resume
    counts from its own start; the difference is added back)."""
    engine_restarts: int = 0
    """Engines started to replace its dead one over the whole run: a resumed command goes on counting,
    so that ``max_engine_restarts`` bounds the run, not each command of it."""
    engine_seconds_lost: float = 0.0
    """Seconds those restarts cost, over the whole run."""
    pending_row: dict[str, float] | None = None
    """The metrics row of its last step while that step's weights are synced: kept with the
    checkpoint, so that a run that stops before the row is written writes it when resumed."""


@dataclass
class RunState:
    """What a checkpoint keeps of a run (JSON)."""

    stage: int = 0
    """The stage the run is in."""
    next_group: int = 0
    """The number the next new group gets."""
    finished_groups: list[int] = field(default_factory=list)
    """Groups whose episodes ended and went to the policies (or were lost)."""
    abandoned_groups: list[int] = field(default_factory=list)
    """Groups still running when their stage ended; never replayed."""
    skipped_groups: list[int] = field(default_factory=list)
    """Group numbers a PCL selection scored and did not play (``curriculum.selection: pcl``)."""
    tail_queue: list[int] = field(default_factory=list)
    """Tail batching: group numbers aborted in short rounds, waiting for a long round."""
    replaced_groups: list[int] = field(default_factory=list)
    """Groups left with fewer than ``group_size`` good episodes after every retry: never trained on,
    new groups took their places."""
    faults: dict[str, int] = field(default_factory=dict)
    """Failed episode tries by :func:`~agentrl.rollout.fault_kind`, over the whole run (retried ones included)."""
    retried_episodes: int = 0
    """Episode tries played again in a fresh env after a fault, over the whole run."""
    env_workers_replaced: int = 0
    """Ray env workers that died and were replaced, over the whole run."""
    lanes: dict[str, LaneState] = field(default_factory=dict)
    eval_before: dict[str, float] | None = None
    """The evaluation before the first step (not repeated on resume)."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunState:
        data = dict(data)
        lanes = {policy_id: LaneState(**lane) for policy_id, lane in data.pop("lanes", {}).items()}
        return cls(**data, lanes=lanes)

    def steps(self) -> int:
        """Steps of every policy together (a checkpoint's number)."""
        return sum(lane.step for lane in self.lanes.values())

    def replay(self) -> list[int]:
        """The groups a resumed run plays again: started, and neither finished, abandoned, skipped
        nor waiting for a long tail round."""
        seen = {*self.finished_groups, *self.abandoned_groups, *self.skipped_groups, *self.tail_queue}
        return [n for n in range(self.next_group) if n not in seen]


def shift_versions(trajectory: Trajectory, offset: int) -> Trajectory:
    """``trajectory`` with its generated tokens' versions lowered by ``offset`` (never below 0)."""
    if not offset:
        return trajectory
    versions = [v if v < 0 else max(v - offset, 0) for v in trajectory.versions]
    return dataclasses.replace(trajectory, versions=versions)


def oldest_version(group: list[Trajectory], default: int) -> int:
    """The policy version of the oldest generated token of ``group``."""
    return min((v for t in group for v in t.versions if v >= 0), default=default)


def append_json(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()


def plot_quietly(run_dir: Path) -> Path | None:
    try:
        return plot_run(run_dir)
    except Exception as e:  # a missing plot must not lose a finished run; say why
        log.warning("could not plot %s: %s", run_dir, e)
        return None
