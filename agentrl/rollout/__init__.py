"""Rollout: episodes played against a policy, in groups, into the buffer the trainer reads.

The stages, one module each:

- :mod:`.episode`: one single-agent episode (:func:`run_episode`, its limits and clock) and the
  :class:`SingleAgentRollout` that plays many at once;
- :mod:`.multiagent`: one multi-agent episode and :class:`MultiAgentRollout`;
- :mod:`.settings`: how episodes are played, one frozen value for every rollout
  (:class:`RolloutSettings`, with :class:`EpisodeLimits`);
- :mod:`.scheduler`: groups of episodes (:class:`GroupScheduler`, which takes a play function),
  their ids and seeds;
- :mod:`.stats`: the success and failure-cause rules and :class:`RolloutStats`;
- :mod:`.buffer`: finished groups waiting for the trainer (:class:`TrajectoryBuffer`);
- :mod:`.staleness`: how far generation may run ahead of training (:class:`StalenessWindow`);
- :mod:`.ray`: the same engines in Ray actors (imported on its own: it needs Ray).
"""

from agentrl.rollout.buffer import BufferStats, TrajectoryBuffer
from agentrl.rollout.episode import (
    EpisodeClock,
    EpisodeTimeout,
    SingleAgentRollout,
    fit_to_room,
    run_episode,
    timeout_error,
    turn_sampling_of,
)
from agentrl.rollout.multiagent import MultiAgentRollout, run_multiagent_episode
from agentrl.rollout.scheduler import (
    EpisodeTask,
    GroupFeed,
    GroupScheduler,
    close_quietly,
    flatten,
    group_env_seed,
    group_name,
    sample_sampling,
)
from agentrl.rollout.settings import EpisodeLimits, RolloutSettings
from agentrl.rollout.staleness import StalenessWindow
from agentrl.rollout.stats import FAULT_KINDS, RolloutStats, add_episode, failure_cause, fault_kind, is_success

__all__ = [
    "BufferStats",
    "EpisodeClock",
    "EpisodeLimits",
    "EpisodeTask",
    "EpisodeTimeout",
    "GroupFeed",
    "GroupScheduler",
    "MultiAgentRollout",
    "SingleAgentRollout",
    "RolloutSettings",
    "RolloutStats",
    "StalenessWindow",
    "TrajectoryBuffer",
    "add_episode",
    "close_quietly",
    "failure_cause",
    "fault_kind",
    "FAULT_KINDS",
    "fit_to_room",
    "flatten",
    "group_env_seed",
    "group_name",
    "is_success",
    "run_episode",
    "run_multiagent_episode",
    "sample_sampling",
    "timeout_error",
    "turn_sampling_of",
]
