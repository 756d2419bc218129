"""Training samples cut from trajectories, for a ``samples_fn`` of ``agentrl train``: part of an
episode (:func:`first_turns`) or one turn of it with the turns before as context (:func:`one_turn`).

Both keep the exact tokens of the trajectory (nothing is re-tokenised) and the invariants of
:class:`~agentrl.types.Trajectory`.
"""

from __future__ import annotations

import dataclasses

from agentrl.types import Trajectory


def first_turns(trajectory: Trajectory, turns: int) -> Trajectory:
    """``trajectory`` cut after its first ``turns`` turns (the observation after the last kept turn
    dropped): a training sample of part of an episode, e.g. for ``samples_fn``.

    The returned trajectory keeps those turns' rewards; ``reward`` is their sum.
    """
    if not 1 <= turns <= len(trajectory.turn_ends):
        raise ValueError(f"cannot keep {turns} turns of a trajectory with {len(trajectory.turn_ends)}.")
    end = trajectory.turn_ends[turns - 1] + 1
    rewards = list(trajectory.turn_rewards[:turns])
    return dataclasses.replace(
        trajectory,
        token_ids=trajectory.token_ids[:end],
        loss_mask=trajectory.loss_mask[:end],
        logprobs=trajectory.logprobs[:end],
        versions=trajectory.versions[:end],
        turn_ends=trajectory.turn_ends[:turns],
        turn_rewards=rewards,
        turn_states=trajectory.turn_states[:turns],
        reward=sum(rewards),
        turns=turns,
    )


def one_turn(trajectory: Trajectory, turn: int) -> Trajectory:
    """``trajectory`` as a sample of turn ``turn`` (0-based) alone: everything before that turn's
    generated tokens becomes prompt (loss mask 0, no log-probs, version -1), and the sequence ends
    after it. The sample has one turn, with that turn's reward.

    WaltzRL trains the feedback agent on one round per episode this way: the earlier rounds are
    what it read, not what it is trained to write.
    """
    if not 0 <= turn < len(trajectory.turn_ends):
        raise ValueError(f"cannot keep turn {turn} of a trajectory with {len(trajectory.turn_ends)} turns.")
    end = trajectory.turn_ends[turn] + 1
    start, floor = end - 1, trajectory.turn_ends[turn - 1] + 1 if turn else 0
    while start > floor and trajectory.loss_mask[start - 1] == 1:
        start -= 1
    reward = trajectory.turn_rewards[turn]
    return dataclasses.replace(
        trajectory,
        token_ids=trajectory.token_ids[:end],
        loss_mask=[0] * start + trajectory.loss_mask[start:end],
        logprobs=[0.0] * start + trajectory.logprobs[start:end],
        versions=[-1] * start + trajectory.versions[start:end],
        prompt_length=start,
        turn_ends=[end - 1],
        turn_rewards=[reward],
        turn_states=trajectory.turn_states[turn : turn + 1],
        reward=reward,
        turns=1,
    )
