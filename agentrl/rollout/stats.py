"""What a rollout counts: the success rule, the failure-cause and fault-kind rules, and :class:`RolloutStats`.

Each rule is written once and everyone calls it: the stats of an engine, the buffer's failure
counts, the trainer's ``rollout/...`` metrics and the evaluations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentrl.types import Trajectory


def is_success(trajectory: Trajectory) -> bool:
    """Did the episode succeed? The env's ``info["success"]`` when it says, else a positive reward;
    a failed episode (``error`` set) never succeeds."""
    if trajectory.error is not None:
        return False
    return bool(trajectory.info.get("success", trajectory.reward > 0))


def failure_cause(error: str) -> str:
    """The cause an ``error`` is counted under: its first word before a colon, the exception type
    (``"EpisodeTimeout: the turn ran past ..."`` -> ``"EpisodeTimeout"``)."""
    head = error.split(":")[0].split()
    return head[0] if head else "error"


FAULT_KINDS = ("env_error", "env_timeout", "engine_error", "engine_timeout", "worker_died")
"""The kinds :func:`fault_kind` sorts failed episodes into (``fault/<kind>`` metrics count them)."""


def fault_kind(error: str) -> str:
    """The kind of infrastructure fault an episode's ``error`` is: where it happened and how.

    ``env_...`` during a reset or a step (the env raised or hung, and what stands behind it: an env
    server, a sandbox, Docker), ``engine_...`` during a generation (the engine died or hung),
    ``..._timeout`` when a time limit passed and ``..._error`` when something raised;
    ``worker_died`` for an episode lost with its Ray env worker. Only faults set ``error``: what the
    policy did (malformed output, running out of turns or tokens) is its result, with its reward.
    """
    if failure_cause(error) == "WorkerDied":
        return "worker_died"
    phase = error.rsplit("(during ", 1)[-1] if "(during " in error else ""
    where = "engine" if phase.startswith("generate") else "env"
    return f"{where}_timeout" if failure_cause(error) == "EpisodeTimeout" else f"{where}_error"


@dataclass
class RolloutStats:
    """What a rollout produced, for the summary table and the ``rollout/…`` metrics."""

    episodes: int = 0
    """Trajectories counted (one per agent per episode)."""
    failed: int = 0
    successes: int = 0
    reward_sum: float = 0.0
    turns_sum: int = 0
    generated_tokens: int = 0
    truncated: int = 0
    failure_causes: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def add(self, trajectory: Trajectory) -> None:
        self.episodes += 1
        self.turns_sum += trajectory.turns
        self.generated_tokens += trajectory.num_generated
        if trajectory.error is not None:
            self.failed += 1
            self.failure_causes[failure_cause(trajectory.error)] += 1
            return
        self.reward_sum += trajectory.reward
        self.successes += is_success(trajectory)
        self.truncated += trajectory.truncated

    def summary(self) -> dict[str, float]:
        """The fixed-name metrics: ``rollout/episodes``, ``rollout/success_rate`` and so on."""
        ok = max(self.episodes - self.failed, 1)
        return {
            "rollout/episodes": self.episodes,
            "rollout/failed": self.failed,
            "rollout/success_rate": self.successes / ok,
            "rollout/reward_mean": self.reward_sum / ok,
            "rollout/turns_mean": self.turns_sum / max(self.episodes, 1),
            "rollout/truncated": self.truncated,
            "rollout/response_tokens_mean": self.generated_tokens / max(self.episodes, 1),
            "perf/rollout_tokens_per_s": self.generated_tokens / self.seconds if self.seconds else 0.0,
        }

    @classmethod
    def of(cls, trajectories: Sequence[Trajectory]) -> RolloutStats:
        """The stats of ``trajectories`` (e.g. one training batch)."""
        stats = cls()
        for trajectory in trajectories:
            stats.add(trajectory)
        return stats


def add_episode(
    stats: RolloutStats, policy_stats: dict[str, RolloutStats], episode: Sequence[Trajectory], seconds: float
) -> None:
    """Add an episode's trajectories (one per agent) to ``stats`` and to their policy's entry of
    ``policy_stats``, and set every one's wall time to ``seconds``. In a multi-agent episode, an
    agent that sat it out (no turn, no error: Waltz's feedback agent with ``feedback: none``) is
    not counted."""
    for trajectory in episode:
        if len(episode) > 1 and trajectory.turns == 0 and trajectory.error is None:
            continue
        stats.add(trajectory)
        policy_stats.setdefault(trajectory.policy_id, RolloutStats()).add(trajectory)
    for each in (stats, *policy_stats.values()):
        each.seconds = seconds
