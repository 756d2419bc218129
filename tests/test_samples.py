"""Training samples cut from trajectories: ``first_turns`` and ``one_turn`` keep the exact token ids
and the Trajectory invariants; WaltzRL's ``waltz_samples`` picks one feedback round and the first or
last answer, deterministically per episode."""

from __future__ import annotations

import pytest

from agentrl.agents import ChatAgent, TrajectoryBuilder
from agentrl.agents.trajectory import first_turns, one_turn
from agentrl.recipes.waltzrl.hooks import waltz_samples
from agentrl.types import Message, Trajectory

REPLIES = ["First answer.", "Second answer, longer than the first.", "Third."]


def build(agent: ChatAgent, replies=REPLIES, rewards=(0.5, -1.0, 2.0), *, cut: int | None = None) -> Trajectory:
    """A trajectory of one turn per reply: turn ``i`` has log-probs ``-(i + 1) - j / 100`` and version
    ``10 + i``, so a misplaced token shows; turn ``cut`` is cut before its end-of-turn token."""
    builder = TrajectoryBuilder(agent, agent_id="conversation")
    builder.start([Message("system", "Be brief."), Message("user", "Hello?")])
    for i, (reply, reward) in enumerate(zip(replies, rewards)):
        ids = agent.encode(reply) + ([] if i == cut else agent.end_of_turn_ids)
        builder.add_turn(ids, [-(i + 1) - j / 100 for j in range(len(ids))], version=10 + i)
        if i < len(replies) - 1:
            builder.add_observation([Message("user", f"Try again ({i}).")], reward=reward)
        else:
            builder.add_final_observation([Message("user", "Done.")], reward=reward)
    return builder.finish(terminated=True, info={"seed": 7})


def turn_span(trajectory: Trajectory, turn: int) -> range:
    """The indices of a turn's generated tokens, found from the mask (not from the code under test)."""
    end = trajectory.turn_ends[turn] + 1
    generated = [i for i in range(end) if trajectory.loss_mask[i]]
    previous_end = trajectory.turn_ends[turn - 1] if turn else -1
    start = min(i for i in generated if i > previous_end)
    return range(start, end)


@pytest.fixture
def agent(tiny_tokenizer):
    return ChatAgent(tiny_tokenizer)


# --- first_turns ----------------------------------------------------------------------------------


def test_first_turns_keeps_a_prefix_of_the_episode(agent):
    full = build(agent)
    for turns in (1, 2, 3):
        part = first_turns(full, turns)
        part.validate()
        end = full.turn_ends[turns - 1] + 1
        assert part.token_ids == full.token_ids[:end]
        assert (part.loss_mask, part.logprobs, part.versions) == (
            full.loss_mask[:end],
            full.logprobs[:end],
            full.versions[:end],
        )
        assert part.turn_ends == full.turn_ends[:turns] and part.turns == turns
        assert part.turn_rewards == full.turn_rewards[:turns]
        assert part.reward == pytest.approx(sum(full.turn_rewards[:turns]))
        assert part.prompt_length == full.prompt_length
    assert first_turns(full, 3).token_ids[-len(agent.end_of_turn_ids) :] == agent.end_of_turn_ids


@pytest.mark.parametrize("turns", [0, 4, -1])
def test_first_turns_refuses_a_count_outside_the_trajectory(agent, turns):
    with pytest.raises(ValueError, match=f"cannot keep {turns} turns of a trajectory with 3"):
        first_turns(build(agent), turns)


# --- one_turn -------------------------------------------------------------------------------------


@pytest.mark.parametrize("turn", [0, 1, 2])
def test_one_turn_trains_only_that_turn_with_the_rest_as_prompt(agent, tiny_tokenizer, turn):
    full = build(agent)
    span = turn_span(full, turn)
    sample = one_turn(full, turn)
    sample.validate()
    assert sample.token_ids == full.token_ids[: span.stop]  # exact ids, nothing re-tokenised
    assert sample.prompt_length == span.start
    assert sample.loss_mask == [0] * span.start + [1] * len(span)
    assert sample.logprobs == [0.0] * span.start + full.logprobs[span.start : span.stop]
    assert sample.versions == [-1] * span.start + [10 + turn] * len(span)
    assert sample.turn_ends == [span.stop - 1] and sample.turns == 1
    assert sample.turn_rewards == [full.turn_rewards[turn]] and sample.reward == full.turn_rewards[turn]
    assert tiny_tokenizer.decode([sample.token_ids[i] for i in span]) == REPLIES[turn] + "<|im_end|>"
    # The earlier turns are there, as context.
    assert tiny_tokenizer.decode(sample.token_ids[: sample.prompt_length]).endswith(
        f"Try again ({turn - 1}).<|im_end|>\n<|im_start|>assistant\n"
        if turn
        else "Hello?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (sample.agent_id, sample.info["seed"], sample.terminated) == ("conversation", 7, True)
    assert full.loss_mask.count(1) == sum(len(turn_span(full, t)) for t in range(3))  # the input is untouched


def test_one_turn_of_the_first_turn_has_the_original_prompt(agent):
    full = build(agent)
    assert one_turn(full, 0).prompt_length == full.prompt_length


def test_one_turn_after_a_cut_turn_keeps_the_inserted_end_of_turn_as_context(agent):
    full = build(agent, cut=0)  # turn 0 hit its token limit: <|im_end|> is an observation token
    assert full.info["cut_turns"] == [0]
    sample = one_turn(full, 1)
    sample.validate()
    span = turn_span(full, 1)
    assert sample.prompt_length == span.start and sum(sample.loss_mask) == len(span)


def test_one_turn_keeps_a_reply_prefix_out_of_the_trained_tokens(tiny_tokenizer):
    agent = ChatAgent(tiny_tokenizer, reply_prefix='{"unsafe":')
    full = build(agent, [" true}", " false}"], (1.0, 3.0))
    sample = one_turn(full, 1)
    sample.validate()
    assert tiny_tokenizer.decode(sample.token_ids[: sample.prompt_length]).endswith('assistant\n{"unsafe":')
    assert tiny_tokenizer.decode([t for t, m in zip(sample.token_ids, sample.loss_mask) if m]) == " false}<|im_end|>"
    assert sample.reward == 3.0


@pytest.mark.parametrize("turn", [-1, 3])
def test_one_turn_refuses_a_turn_outside_the_trajectory(agent, turn):
    with pytest.raises(ValueError, match=f"cannot keep turn {turn} of a trajectory with 3 turns"):
        one_turn(build(agent), turn)


def test_one_turn_stops_at_the_previous_turn_even_with_no_observation_between():
    # A valid trajectory (validate() passes) whose two turns are adjacent: prompt [0, 1], turn 0 = [2, 3],
    # turn 1 = [4, 5].
    adjacent = Trajectory(
        token_ids=[10, 11, 12, 13, 14, 15],
        loss_mask=[0, 0, 1, 1, 1, 1],
        logprobs=[0.0, 0.0, -0.1, -0.2, -0.3, -0.4],
        versions=[-1, -1, 0, 0, 1, 1],
        prompt_length=2,
        turn_ends=[3, 5],
        turn_rewards=[0.0, 1.0],
        turns=2,
    )
    adjacent.validate()
    sample = one_turn(adjacent, 1)
    assert sample.prompt_length == 4 and sample.loss_mask == [0, 0, 0, 0, 1, 1]


# --- waltz_samples --------------------------------------------------------------------------------


def waltz_episode(agent: ChatAgent, answers: list[str], verdicts: list[str]) -> dict[str, Trajectory]:
    conversation = build(agent, answers, [float(i) for i in range(len(answers))])
    feedback = build(agent, verdicts, [10.0 + i for i in range(len(verdicts))])
    feedback.agent_id = "feedback"
    return {"conversation": conversation, "feedback": feedback}


def test_waltz_samples_without_a_revision_trains_the_first_answer_and_the_one_verdict(agent):
    episode = waltz_episode(agent, ["The hours are 9 to 5."], ['{"unsafe": false}'])
    for share in (0.0, 0.5, 1.0):
        conversation, feedback = waltz_samples(episode, revised_share=share)
        assert conversation.token_ids == episode["conversation"].token_ids[: episode["conversation"].turn_ends[0] + 1]
        assert conversation.turns == 1 and conversation.reward == 0.0
        assert feedback.agent_id == "feedback" and feedback.turns == 1 and feedback.reward == 10.0
        feedback.validate()


def test_revised_share_zero_always_trains_the_first_answer_and_one_the_last(agent):
    for k in range(6):  # several episodes, so the draws differ
        episode = waltz_episode(agent, [f"Answer {k}.", f"Revised answer {k}."], ['{"unsafe": true}'])
        first = waltz_samples(episode, revised_share=0.0)[0]
        assert first.turn_rewards == [0.0] and first.prompt_length == episode["conversation"].prompt_length
        assert first.token_ids == first_turns(episode["conversation"], 1).token_ids
        last = waltz_samples(episode, revised_share=1.0)[0]
        assert last.turn_rewards == [1.0] and last == one_turn(episode["conversation"], 1)
        last.validate()


def test_half_the_episodes_train_the_revision_at_share_one_half(agent):
    picks = []
    for k in range(200):
        episode = waltz_episode(agent, [f"Answer {k}.", f"Again {k}."], ['{"unsafe": true}'])
        picks.append(waltz_samples(episode, revised_share=0.5)[0].reward)
    assert set(picks) == {0.0, 1.0} and 60 < picks.count(1.0) < 140


def test_the_feedback_sample_is_one_round_drawn_uniformly(agent):
    counts = {10.0: 0, 11.0: 0}
    for k in range(200):
        episode = waltz_episode(agent, ["a", "b", "c"], [f"verdict {k}", f"second verdict {k}"])
        feedback = waltz_samples(episode)[1]
        assert feedback.turns == 1 and sum(feedback.loss_mask) > 0
        feedback.validate()
        counts[feedback.reward] += 1
        expected = one_turn(episode["feedback"], 0 if feedback.reward == 10.0 else 1)
        assert feedback == expected
    assert 60 < counts[10.0] < 140


def test_waltz_samples_are_the_same_for_the_same_episode(agent):
    episode = waltz_episode(agent, ["First.", "Second."], ["v1", "v2"])
    assert waltz_samples(episode, 0.5) == waltz_samples(episode, 0.5)
    again = waltz_episode(agent, ["First.", "Second."], ["v1", "v2"])  # rebuilt: equal tokens, equal draws
    assert waltz_samples(again, 0.5) == waltz_samples(episode, 0.5)


def test_waltz_samples_skips_an_agent_that_did_not_act(agent):
    episode = waltz_episode(agent, ["Only answer."], ["v"])
    episode["feedback"] = Trajectory(agent_id="feedback")  # feedback="none" / "oracle": never selected
    (sample,) = waltz_samples(episode)
    assert sample.agent_id == "conversation"


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_waltz_samples_refuses_a_share_outside_zero_one(agent, share):
    with pytest.raises(ValueError, match=r"revised_share must be in \[0, 1\]"):
        waltz_samples(waltz_episode(agent, ["a"], ["v"]), revised_share=share)


def test_cut_samples_keep_the_state_keys_of_the_turns_they_keep(agent):
    trajectory = build(agent)
    assert len(trajectory.turn_states) == 3
    assert first_turns(trajectory, 2).turn_states == trajectory.turn_states[:2]
    assert one_turn(trajectory, 1).turn_states == [trajectory.turn_states[1]]
    one_turn(trajectory, 2).validate()
