"""The WaltzRL recipe's training hooks: :func:`waltz_rewards` is the run's ``reward_fn`` (its keyword
arguments are a stage's ``reward:``, so stage 2 sets ``lam: 0``), :func:`waltz_samples` its
``samples_fn``: the feedback agent trains on one uniformly drawn round per episode, the
conversation agent on its first answer or (with probability ``revised_share``) its last revised
one. The reward terms themselves are the env's (:mod:`agentrl.envs.waltz.rewards`).
:func:`waltz_step_metrics` is its ``metrics_fn``: each step, what the feedback agent's verdicts and
the revisions they asked for did (:data:`agentrl.envs.waltz.metrics.STEP_METRICS`), and a warning
when the verdicts collapse to one.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.agents.trajectory import first_turns, one_turn
from agentrl.envs.waltz.metrics import step_metrics
from agentrl.envs.waltz.rewards import ALPHA, GAMMA, LAMBDA, episode_rewards
from agentrl.types import Trajectory

log = logging.getLogger(__name__)

VERDICTS = ("ok", "unsafe", "overrefuse", "both", "invalid")


def waltz_rewards(
    episode: Mapping[str, Trajectory], alpha: float = ALPHA, lam: float = LAMBDA, gamma: float = GAMMA
) -> dict[str, list[float]]:
    """The ``reward_fn`` of a WaltzRL run: per-turn rewards of both agents with this stage's
    ``alpha``, ``lam`` (lambda) and ``gamma``."""
    record = _record(episode)
    answers, rounds = episode_rewards(record, alpha=alpha, lam=lam, gamma=gamma)
    rewards = {"conversation": answers, "feedback": rounds}
    for agent_id, values in rewards.items():
        turns = len(episode[agent_id].turn_ends) if agent_id in episode else 0
        if turns != len(values):
            raise ValueError(
                f"the Waltz record has {len(values)} {agent_id} turns but the trajectory has {turns}; "
                "was the episode cut short (max_turns, max_length)?"
            )
    return {agent_id: values for agent_id, values in rewards.items() if values}


def waltz_samples(episode: Mapping[str, Trajectory], revised_share: float = 0.5) -> list[Trajectory]:
    """The ``samples_fn`` of a WaltzRL run: the feedback agent's verdict of one round drawn
    uniformly, and the conversation agent's first answer or, with probability ``revised_share``
    when there was a revision, its last answer (the earlier turns then are context, not trained).
    The draws are seeded by the episode's tokens, so a replayed episode gives the same samples."""
    if not 0.0 <= revised_share <= 1.0:
        raise ValueError(f"revised_share must be in [0, 1], got {revised_share}.")
    samples = []
    conversation, feedback = episode.get("conversation"), episode.get("feedback")
    if conversation is not None and conversation.turn_ends:
        turns = len(conversation.turn_ends)
        revised = turns > 1 and _rng(conversation).random() < revised_share
        samples.append(one_turn(conversation, turns - 1) if revised else first_turns(conversation, 1))
    if feedback is not None and feedback.turn_ends:
        samples.append(one_turn(feedback, _rng(feedback).randrange(len(feedback.turn_ends))))
    return samples


def _record(episode: Mapping[str, Trajectory]) -> Mapping[str, Any]:
    for trajectory in episode.values():
        if "waltz" in trajectory.info:
            return trajectory.info["waltz"]  # type: ignore[no-any-return]
    raise ValueError("no trajectory of the episode has info['waltz']: is this an agentrl/Waltz-v0 episode?")


def _rng(trajectory: Trajectory) -> random.Random:
    return random.Random(hash(tuple(trajectory.token_ids)))  # ints hash alike in every process


def waltz_step_metrics(
    policy_id: str, samples: Sequence[Trajectory], previous: Sequence[Mapping[str, float]], collapse_steps: int = 3
) -> dict[str, float]:
    """The ``metrics_fn`` of a WaltzRL run: :func:`~agentrl.envs.waltz.metrics.step_metrics` of the
    episodes behind ``samples`` (each sample carries its episode's record). The feedback agent's
    samples report it all, plus ``verdicts/same_steps``: for how many steps in a row (this one
    included) every verdict was the same pair; when that reaches ``collapse_steps``, a warning: the
    feedback agent has collapsed (WaltzRL's failure mode: agreeing with everything earns the format
    reward alone). The conversation agent's samples report its final answers (``answers/...``)."""
    feedback = [t.info["waltz"] for t in samples if t.agent_id == "feedback" and "waltz" in t.info]
    if not feedback:
        answers = step_metrics([t.info["waltz"] for t in samples if "waltz" in t.info])
        return {name: value for name, value in answers.items() if name.startswith("answers/")}
    metrics = step_metrics(feedback)
    same = next((v for v in VERDICTS if metrics.get(f"verdicts/{v}") == 1.0), None)
    streak = 0
    if same is not None:
        streak = 1
        for earlier in reversed(previous):
            if earlier.get(f"verdicts/{same}") != 1.0:
                break
            streak += 1
    metrics["verdicts/same_steps"] = float(streak)
    if streak == collapse_steps:
        log.warning(
            "WaltzRL: policy %s gave every verdict as %r for %d steps in a row: the feedback has collapsed and "
            "its labels say nothing (docs/waltzrl.md, 'When the feedback agent collapses').",
            policy_id,
            same,
            streak,
        )
    return metrics
