"""From a finished episode to each policy's training samples: :class:`SampleMaker`.

By default an episode's samples are its agents' trajectories as played (a single-agent episode: its
one trajectory), each trained by the policy its ``policy_id`` names. ``reward_fn`` rescores an
episode first, ``samples_fn`` cuts it into samples of its own choosing, for instance with
:func:`~agentrl.agents.trajectory.first_turns` (part of an episode) or
:func:`~agentrl.agents.trajectory.one_turn` (one turn, the turns before it as context).
``metrics_fn`` reports what a training step's samples show in the env's own words (WaltzRL: the
feedback agent's label accuracy and revisions).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any

from agentrl.types import Trajectory

log = logging.getLogger(__name__)

Episode = dict[str, Trajectory]
"""One finished episode: each agent's trajectory, by agent id."""
RewardFn = Callable[..., Mapping[str, "float | list[float]"]]
"""``reward_fn(episode, **stage.reward) -> {agent_id: return, or one reward per turn}``."""
SamplesFn = Callable[..., list[Trajectory]]
"""``samples_fn(episode, **samples_args) -> trajectories``, each trained by the policy its ``policy_id`` names."""
MetricsFn = Callable[..., Mapping[str, float]]
"""``metrics_fn(policy_id, samples, previous, **metrics_args) -> {name: value}``: what a step's batch
shows in the env's own words; ``previous`` is what it said of the policy's earlier steps of this run."""


class SampleMaker:
    """Turns the episodes of a finished group into each training policy's samples."""

    def __init__(
        self,
        reward_fn: RewardFn | None = None,
        samples_fn: SamplesFn | None = None,
        samples_args: Mapping[str, Any] | None = None,
        metrics_fn: MetricsFn | None = None,
        metrics_args: Mapping[str, Any] | None = None,
    ):
        self.reward_fn, self.samples_fn, self.metrics_fn = reward_fn, samples_fn, metrics_fn
        self.samples_args = dict(samples_args or {})
        self.metrics_args = dict(metrics_args or {})
        self.reported: dict[str, list[dict[str, float]]] = {}
        """What ``metrics_fn`` said of each policy's steps so far, by policy id."""
        self.reward_args: dict[str, Any] = {}
        """The current stage's ``reward`` arguments (set as each stage starts)."""
        self.failures = 0
        """Episodes lost because ``reward_fn`` or ``samples_fn`` raised on them."""
        self._warned: set[str] = set()

    def split(self, episodes: list[list[Trajectory]], policies: Collection[str]) -> dict[str, list[Trajectory]]:
        """The samples of ``episodes`` (one group) for each of ``policies``, in episode order."""
        samples: dict[str, list[Trajectory]] = {}
        for episode in episodes:
            for sample in self.samples({t.agent_id: t for t in episode}):
                if sample.policy_id in policies:
                    samples.setdefault(sample.policy_id, []).append(sample)
        return samples

    def samples(self, episode: Episode) -> list[Trajectory]:
        """An episode's training samples (those with a generated token). A hook that raises loses
        the episode, counted and logged once per message, never the run."""
        if self.reward_fn is None and self.samples_fn is None:
            return [t for t in episode.values() if t.num_generated > 0]
        try:
            if self.reward_fn is not None:
                episode = rescored(episode, self.reward_fn(dict(episode), **self.reward_args))
            samples = (
                self.samples_fn(dict(episode), **self.samples_args)
                if self.samples_fn is not None
                else list(episode.values())
            )
        except Exception as e:  # a user's hook failing on one episode must not end the run
            message = f"{type(e).__name__}: {e}"
            if message not in self._warned:
                self._warned.add(message)
                log.warning("reward_fn / samples_fn failed on an episode (counted, skipped): %s", message)
            self.failures += 1
            return []
        return [t for t in samples if t.num_generated > 0]

    def report(self, policy_id: str, samples: list[Trajectory], *, held_out: bool = False) -> dict[str, float]:
        """What ``metrics_fn`` says of one step's ``samples`` of ``policy_id`` (nothing without one);
        ``held_out``: of an evaluation's episodes instead, which the policy's history of training
        steps (``previous``) neither sees nor keeps. A hook that raises or gives a value that is not
        a number costs the report, logged once per message, never the step."""
        if self.metrics_fn is None:
            return {}
        previous = [] if held_out else self.reported.setdefault(policy_id, [])
        try:
            report = {
                str(k): float(v)
                for k, v in self.metrics_fn(policy_id, samples, list(previous), **self.metrics_args).items()
            }
        except Exception as e:  # a user's report failing must not end the run
            message = f"{type(e).__name__}: {e}"
            if message not in self._warned:
                self._warned.add(message)
                log.warning("metrics_fn failed on a step of policy %s (its report is skipped): %s", policy_id, message)
            return {}
        previous.append(report)
        return report


def rescored(episode: Episode, rewards: Mapping[str, float | list[float]]) -> Episode:
    """``episode`` with the agents ``rewards`` names rescored: a number is the agent's return, put
    at its last turn; a list gives one reward per turn."""
    out = dict(episode)
    for agent_id, value in rewards.items():
        if agent_id not in episode:
            raise ValueError(f"reward_fn scored agent {agent_id!r}, which is not in the episode ({sorted(episode)}).")
        trajectory = episode[agent_id]
        turns = len(trajectory.turn_ends)
        if isinstance(value, (int, float)):
            per_turn = [0.0] * max(turns - 1, 0) + [float(value)] if turns else []
        else:
            per_turn = [float(v) for v in value]
            if len(per_turn) != turns:
                raise ValueError(
                    f"reward_fn gave agent {agent_id!r} {len(per_turn)} turn rewards for {turns} turns; give one "
                    "per turn, or a single number for the whole episode."
                )
        out[agent_id] = dataclasses.replace(trajectory, turn_rewards=per_turn, reward=sum(per_turn))
    return out
