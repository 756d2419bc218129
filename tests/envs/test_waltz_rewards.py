"""WaltzRL's reward formulas against hand-computed values: R_c, DIR (in {-1, 0, +1}, 0 after a stop),
R_label, R_format, R_f = alpha * DIR * R_label + lambda * R_label + gamma * R_format, and the
``reward_fn`` that scores an episode's trajectories turn by turn."""

from __future__ import annotations

import pytest

from agentrl.envs.waltz.rewards import (
    conversation_reward,
    dynamic_improvement,
    episode_rewards,
    feedback_reward,
    label_reward,
)
from agentrl.envs.waltz.tasks import Labels
from agentrl.recipes.waltzrl.hooks import waltz_rewards
from agentrl.types import Trajectory

# Weights that keep the three terms of R_f apart in every sum below.
W = {"alpha": 2.0, "lam": 0.5, "gamma": 0.25}

OK, LEAK, REFUSAL = Labels(False, False), Labels(True, False), Labels(False, True)


def answer(labels: Labels | None, text: str = "an answer") -> dict:
    """One entry of ``record["answers"]`` as the env writes it (``None``: the judge gave no verdict)."""
    if labels is None:
        return {"text": text, "unsafe": None, "overrefuse": None}
    return {"text": text, "unsafe": labels.unsafe, "overrefuse": labels.overrefuse}


def verdict(labels: Labels | None) -> dict:
    """One entry of ``record["rounds"]`` (``None``: the reply was not a valid verdict)."""
    if labels is None:
        return {"valid": False, "unsafe": None, "overrefuse": None, "revise": False, "problem": "no JSON object"}
    return {"valid": True, "unsafe": labels.unsafe, "overrefuse": labels.overrefuse, "revise": not labels.ok}


def record(answers: list, rounds: list, stopped: str = "max_rounds") -> dict:
    return {"kind": "harmful", "family": "direct", "answers": answers, "rounds": rounds, "stopped": stopped}


# --- the pure formulas ----------------------------------------------------------------------------


def test_conversation_reward_is_one_only_for_an_answer_judged_ok():
    assert conversation_reward(OK) == 1.0
    assert conversation_reward(LEAK) == 0.0
    assert conversation_reward(REFUSAL) == 0.0
    assert conversation_reward(Labels(True, True)) == 0.0
    assert conversation_reward(None) == 0.0  # the judge gave no verdict


@pytest.mark.parametrize(
    "before, after, expected",
    [(0.0, 1.0, 1.0), (1.0, 0.0, -1.0), (0.0, 0.0, 0.0), (1.0, 1.0, 0.0), (0.0, None, 0.0), (1.0, None, 0.0)],
)
def test_dynamic_improvement_is_the_change_of_r_c_and_zero_after_a_stop(before, after, expected):
    assert dynamic_improvement(before, after) == expected


def test_label_reward_needs_both_labels_right():
    assert label_reward(LEAK, LEAK) == 1.0
    assert label_reward(OK, OK) == 1.0
    assert label_reward(LEAK, Labels(True, True)) == 0.0  # one of two right is not enough
    assert label_reward(REFUSAL, LEAK) == 0.0
    assert label_reward(None, LEAK) == 0.0  # an invalid verdict has no labels
    assert label_reward(LEAK, None) == 0.0  # nothing to be right about when the judge failed


@pytest.mark.parametrize(
    "improvement, right, format_ok, expected",
    [
        (1.0, 1.0, 1.0, 2.0 + 0.5 + 0.25),  # improved, labels right, valid
        (-1.0, 1.0, 1.0, -2.0 + 0.5 + 0.25),  # made it worse with the right labels
        (1.0, 0.0, 1.0, 0.25),  # DIR is gated by label correctness: wrong labels, no credit
        (-1.0, 0.0, 1.0, 0.25),  # ... and no blame either
        (0.0, 1.0, 1.0, 0.75),
        (0.0, 0.0, 0.0, 0.0),
    ],
)
def test_feedback_reward_formula(improvement, right, format_ok, expected):
    assert feedback_reward(improvement, right, format_ok, **W) == pytest.approx(expected)


def test_lambda_zero_removes_the_label_term():
    assert feedback_reward(1.0, 1.0, 1.0, alpha=2.0, lam=0.0, gamma=0.25) == pytest.approx(2.25)
    assert feedback_reward(0.0, 1.0, 1.0, alpha=2.0, lam=0.0, gamma=0.25) == pytest.approx(0.25)


# --- a record's per-turn rewards ------------------------------------------------------------------


def test_a_leak_fixed_after_right_feedback_earns_dir_plus_one():
    answers, rounds = episode_rewards(record([answer(LEAK), answer(OK)], [verdict(LEAK)]), **W)
    assert answers == [0.0, 1.0]
    assert rounds == [pytest.approx(2.0 * 1 * 1 + 0.5 * 1 + 0.25 * 1)]


def test_stage_two_lambda_zero_drops_the_label_term_from_the_record():
    rec = record([answer(LEAK), answer(OK)], [verdict(LEAK)])
    assert episode_rewards(rec, alpha=2.0, lam=0.0, gamma=0.25)[1] == [pytest.approx(2.0 + 0.25)]


def test_wrong_labels_that_break_a_good_answer_get_dir_minus_one_gated_to_nothing():
    # c_0 was fine; the feedback called it an over-refusal (wrong), and the revision leaked.
    answers, rounds = episode_rewards(record([answer(OK), answer(LEAK)], [verdict(REFUSAL)]), **W)
    assert answers == [1.0, 0.0]  # DIR = 0 - 1 = -1 ...
    assert rounds == [pytest.approx(0.25)]  # ... but R_label = 0 gates it: only the format term


def test_right_labels_with_no_improvement_get_the_label_and_format_terms():
    # An over-refusal, rightly flagged; the revision leaked instead: R_c 0 -> 0, DIR = 0.
    answers, rounds = episode_rewards(record([answer(REFUSAL), answer(LEAK)], [verdict(REFUSAL)]), **W)
    assert answers == [0.0, 0.0]
    assert rounds == [pytest.approx(0.5 + 0.25)]


def test_an_agreeing_verdict_stops_the_episode_and_gets_dir_zero():
    # Agreed with a good answer: right labels, no next answer, DIR 0.
    answers, rounds = episode_rewards(record([answer(OK)], [verdict(OK)], "agreed"), **W)
    assert answers == [1.0] and rounds == [pytest.approx(0.5 + 0.25)]
    # Agreed with a leak: wrong labels; still DIR 0 (nothing came after it), only the format term.
    answers, rounds = episode_rewards(record([answer(LEAK)], [verdict(OK)], "agreed"), **W)
    assert answers == [0.0] and rounds == [pytest.approx(0.25)]


def test_an_invalid_verdict_gets_no_format_no_label_and_no_improvement():
    answers, rounds = episode_rewards(record([answer(LEAK)], [verdict(None)], "invalid_feedback"), **W)
    assert answers == [0.0] and rounds == [0.0]


def test_an_answer_the_judge_could_not_label_gets_r_c_zero_and_no_label_credit():
    # The env records an answer the judge could not label with None labels (not a None answer).
    answers, rounds = episode_rewards(record([answer(None), answer(OK)], [verdict(LEAK)]), **W)
    assert answers == [0.0, 1.0]
    # DIR = 1 - 0 = +1, but no labels to be right about: alpha and lambda terms vanish.
    assert rounds == [pytest.approx(0.25)]


def test_an_unlabelled_answer_gives_the_feedback_no_label_credit():
    # Passes today: whatever R_c the unlabelled c_0 gets, the feedback's labels cannot match None.
    _, rounds = episode_rewards(record([answer(None)], [verdict(OK)], "agreed"), **W)
    assert rounds == [pytest.approx(0.25)]


def test_two_rounds_each_scored_against_the_answer_it_reviewed():
    rec = record([answer(LEAK), answer(LEAK), answer(OK)], [verdict(LEAK), verdict(LEAK)])
    answers, rounds = episode_rewards(rec, **W)
    assert answers == [0.0, 0.0, 1.0]
    assert rounds == [pytest.approx(0.0 + 0.5 + 0.25), pytest.approx(2.0 + 0.5 + 0.25)]


def test_no_feedback_episode_has_one_answer_and_no_rounds():
    assert episode_rewards(record([answer(OK)], [], "no_feedback")) == ([1.0], [])


def test_default_weights_are_the_papers_ones():
    assert episode_rewards(record([answer(LEAK), answer(OK)], [verdict(LEAK)]))[1] == [3.0]


# --- the reward_fn ----------------------------------------------------------------------------------


def trajectory(agent_id: str, turns: int, info: dict | None = None) -> Trajectory:
    """A trajectory with ``turns`` one-token turns after a one-token prompt (only the turn count matters)."""
    n = 1 + 2 * turns
    return Trajectory(
        token_ids=list(range(n)),
        loss_mask=[0] + [1, 0] * turns,
        logprobs=[0.0] + [-1.0, 0.0] * turns,
        versions=[-1] + [0, -1] * turns,
        prompt_length=1,
        turn_ends=[1 + 2 * i for i in range(turns)],
        turn_rewards=[0.0] * turns,
        agent_id=agent_id,
        turns=turns,
        info=info or {},
    )


def test_waltz_rewards_gives_one_reward_per_turn_of_each_agent():
    rec = record([answer(LEAK), answer(OK)], [verdict(LEAK)])
    episode = {
        "conversation": trajectory("conversation", 2, {"waltz": rec}),
        "feedback": trajectory("feedback", 1, {"waltz": rec}),
    }
    rewards = waltz_rewards(episode, **W)
    assert rewards == {"conversation": [0.0, 1.0], "feedback": [pytest.approx(2.75)]}
    assert [len(rewards[a]) for a in ("conversation", "feedback")] == [
        len(episode[a].turn_ends) for a in ("conversation", "feedback")
    ]
    # Stage 2's weights, passed the way a stage's `reward:` passes them.
    assert waltz_rewards(episode, alpha=1.0, lam=0.0, gamma=1.0)["feedback"] == [2.0]


def test_waltz_rewards_reads_the_record_from_either_trajectory_and_leaves_out_an_idle_agent():
    rec = record([answer(OK)], [], "no_feedback")
    episode = {"conversation": trajectory("conversation", 1), "feedback": trajectory("feedback", 0, {"waltz": rec})}
    assert waltz_rewards(episode) == {"conversation": [1.0]}


def test_waltz_rewards_raises_when_the_turns_do_not_match_the_record():
    rec = record([answer(LEAK), answer(OK)], [verdict(LEAK)])
    cut = {  # max_turns cut the conversation after c_0
        "conversation": trajectory("conversation", 1, {"waltz": rec}),
        "feedback": trajectory("feedback", 1, {"waltz": rec}),
    }
    with pytest.raises(ValueError, match="2 conversation turns but the trajectory has 1"):
        waltz_rewards(cut)
    no_feedback_trajectory = {"conversation": trajectory("conversation", 2, {"waltz": rec})}
    with pytest.raises(ValueError, match="1 feedback turns but the trajectory has 0"):
        waltz_rewards(no_feedback_trajectory)


def test_waltz_rewards_needs_a_waltz_record():
    with pytest.raises(ValueError, match=r"info\['waltz'\].*Waltz-v0"):
        waltz_rewards({"conversation": trajectory("conversation", 1)})
