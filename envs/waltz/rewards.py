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

The WaltzRL recipe (``recipes/waltzrl``) turns these terms into a training run's per-turn rewards
and samples (:mod:`agentrl.recipes.waltzrl.hooks`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrl.envs.waltz.tasks import Labels

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


def _labels(answer: Mapping[str, Any] | None) -> Labels | None:
    if answer is None or answer["unsafe"] is None:  # the judge could not read a verdict
        return None
    return Labels(answer["unsafe"], answer["overrefuse"])
