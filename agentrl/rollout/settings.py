"""How a rollout plays its episodes, as one frozen value: :class:`RolloutSettings` (the env and its
arguments, sampling, limits, groups, concurrency, seed, which policy plays).

Every rollout takes it whole, whether its episodes run here (:class:`~agentrl.rollout.SingleAgentRollout`,
:class:`~agentrl.rollout.MultiAgentRollout`) or in Ray env workers
(:class:`~agentrl.rollout.ray.DistributedRollout`, which sends it to each worker); the builder
(:func:`~agentrl.build.build_rollout`) and :func:`~agentrl.build.rollout_settings` (from a config)
make it. A variant is ``dataclasses.replace(settings, ...)``: the evaluation's test split and its
temperature, a worker's share of the concurrency.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl.mapping import MappingPreset
from agentrl.policies.base import Sampling


@dataclass(frozen=True)
class EpisodeLimits:
    """When an episode is cut short."""

    max_turns: int = 8
    """Most policy turns per episode; reaching it marks the episode truncated."""
    max_length: int | None = 4096
    """Most tokens in the whole sequence (prompt, turns and observations); ``None`` for no limit."""
    turn_timeout: float | None = 120.0
    """Seconds one generation or one env call may take before the episode fails."""
    episode_timeout: float | None = 600.0
    """Seconds a whole episode may take before it fails."""


@dataclass(frozen=True)
class RolloutSettings:
    """How a rollout plays its episodes."""

    env_id: str = ""
    """The env played (a registered id); it names the trajectories and the groups."""
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the env's constructor (``split`` among them)."""
    env_url: str | None = None
    """An env server (``agentrl serve``) the env runs on, each episode a session of it
    (:class:`~agentrl.server.RemoteEnv`), from this process or from every Ray env worker; ``None``: in process."""
    system_prompt: str | None = None
    """An extra system prompt for every agent, before the env's own."""
    sampling: Sampling = Sampling()
    """How each turn is sampled; a group's episodes draw seeds of their own from ``sampling.seed``."""
    limits: EpisodeLimits = EpisodeLimits()
    """When an episode is cut short."""
    group_size: int = 1
    """Episodes per task (same env seed, independent samples), sharing a group id."""
    redundancy: int = 0
    """Extra episodes started per group; the first ``group_size`` to finish are kept."""
    episode_retries: int = 2
    """Times an episode that failed (an infrastructure fault: the env raised or hung, the engine
    failed) is played again in a fresh env, with the same seeds, before it counts as failed."""
    concurrency: int = 64
    """Most episodes running at once (in each Ray env worker: its share)."""
    seed: int = 0
    """Seed of the env tasks: group ``g`` plays the task of seed ``seed + g``'s draw."""
    policy_id: str = "default"
    """The policy of a single-agent env's one agent."""
    mapping: MappingPreset | str | Callable[[str], str] = "all"
    """A multi-agent env's agents to policy ids (:func:`~agentrl.mapping.policy_mapping`)."""

    def __post_init__(self) -> None:
        if self.group_size < 1 or self.redundancy < 0 or self.episode_retries < 0 or self.concurrency < 1:
            raise ValueError(
                "need group_size >= 1, redundancy >= 0, episode_retries >= 0 and concurrency >= 1; got "
                f"{self.group_size}, {self.redundancy}, {self.episode_retries} and {self.concurrency}."
            )

    @property
    def episodes_per_group(self) -> int:
        """Episodes started per group: ``group_size + redundancy``."""
        return self.group_size + self.redundancy
