"""WaltzRL's rewards and training samples (Zhang et al., "The Alignment Waltz", arXiv 2510.08240).

For a prompt p, the conversation agent's answers c_0 .. c_T and the feedback agent's verdicts
f_0 .. f_{T-1} (f_t reviews c_t):

- conversation reward ``R_c(c) = 1`` if the judge labels c neither unsafe nor an over-refusal, else 0;
- dynamic improvement reward ``DIR(f_t) = R_c(c_{t+1}) - R_c(c_t)``, 0 when the episode stopped
  after f_t (the verdict agreed with the answer, or was not valid JSON);
- label reward ``R_label(f_t) = 1`` if f_t's two labels equal the judge's labels of c_t;
- format reward ``R_format(f_t) = 1`` if f_t is a valid verdict (:func:`~agentrl.agents.waltz.parse_feedback`);
- feedback reward ``R_f = alpha * DIR * R_label + lambda * R_label + gamma * R_format``: the
  improvement counts only when the labels are right (without that gate, label accuracy collapses).

:func:`waltz_rewards` is the ``reward_fn`` of ``examples/waltzrl.yaml`` (its keyword arguments are
a stage's ``reward:``, so stage 2 sets ``lam: 0``); :func:`waltz_samples` its ``samples_fn``: the
feedback agent trains on one uniformly drawn round per episode, the conversation agent on its
first answer or (with probability ``revised_share``) its last revised one.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from agentrl.agents.trajectory import first_turns, one_turn
from agentrl.envs.waltz.tasks import Labels
from agentrl.types import Trajectory

ALPHA, LAMBDA, GAMMA = 1.0, 1.0, 1.0
"""The default weights of the improvement, label and format terms of the feedback reward."""


def conversation_reward(labels: Labels | None) -> float:
    """``R_c``: 1 for an answer judged neither unsafe nor an over-refusal; 0 otherwise, and for an
    answer whose verdict could not be read (``None``)."""
    return 1.0 if labels is not None and labels.ok else 0.0


def dynamic_improvement(before: float, after: float | None) -> float:
    """``DIR``: how much the answer's reward changed after the feedback (``after`` is ``None`` when
    the episode stopped after it, and DIR is then 0)."""
    return 0.0 if after is None else after - before


def label_reward(given: Labels | None, judged: Labels | None) -> float:
    """``R_label``: 1 if the feedback's labels (``None``: not valid) equal the judge's."""
    return 1.0 if given is not None and judged is not None and tuple(given) == tuple(judged) else 0.0


def feedback_reward(
    improvement: float, labels_right: float, format_ok: float, *, alpha: float, lam: float, gamma: float
) -> float:
    """``R_f = alpha * DIR * R_label + lambda * R_label + gamma * R_format``."""
    return alpha * improvement * labels_right + lam * labels_right + gamma * format_ok


def episode_rewards(
    record: Mapping[str, Any], *, alpha: float = ALPHA, lam: float = LAMBDA, gamma: float = GAMMA
) -> tuple[list[float], list[float]]:
    """The per-turn rewards of one episode from its record (``info["waltz"]`` of the env): one
    ``R_c`` per answer and one ``R_f`` per feedback round."""
    judged = [_labels(a) for a in record["answers"]]
    answer_rewards = [conversation_reward(labels) for labels in judged]
    feedback_rewards = []
    for t, verdict in enumerate(record["rounds"]):
        given = Labels(verdict["unsafe"], verdict["overrefuse"]) if verdict["valid"] else None
        after = answer_rewards[t + 1] if t + 1 < len(answer_rewards) else None
        right = label_reward(given, judged[t])
        improvement = dynamic_improvement(answer_rewards[t], after)
        feedback_rewards.append(
            feedback_reward(improvement, right, float(verdict["valid"]), alpha=alpha, lam=lam, gamma=gamma)
        )
    return answer_rewards, feedback_rewards


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


def _labels(answer: Mapping[str, Any] | None) -> Labels | None:
    if answer is None or answer["unsafe"] is None:  # the judge could not read a verdict
        return None
    return Labels(answer["unsafe"], answer["overrefuse"])


def _rng(trajectory: Trajectory) -> random.Random:
    return random.Random(hash(tuple(trajectory.token_ids)))  # ints hash alike in every process
