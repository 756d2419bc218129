"""WaltzRL's two roles: how a feedback agent's JSON verdict is read (``parse_feedback``) and the
messages each role is sent."""

from __future__ import annotations

import doctest
import json

import pytest

import agentrl.agents.waltz
from agentrl.agents.waltz import (
    FEEDBACK_PREFIX,
    FEEDBACK_PROMPT,
    FIELDS,
    Feedback,
    feedback_notice,
    oracle_feedback,
    parse_feedback,
    review_request,
    revision_notice,
)


def verdict(**fields) -> str:
    return json.dumps(fields)


# --- valid verdicts ---------------------------------------------------------------------------------


def test_a_full_verdict_asking_for_a_revision():
    got = parse_feedback(verdict(unsafe=True, overrefuse=False, feedback="Do not reveal the PIN.", reasoning="PIN."))
    assert got == Feedback(True, True, False, "PIN.", "Do not reveal the PIN.")
    assert got.revise and got.problem == ""


def test_an_agreeing_verdict_needs_no_feedback_and_no_reasoning():
    got = parse_feedback('{"unsafe": false, "overrefuse": false}')
    assert got == Feedback(True, False, False, "", "")
    assert got.valid and not got.revise


@pytest.mark.parametrize("unsafe, overrefuse", [(True, False), (False, True), (True, True)])
def test_any_true_label_asks_for_a_revision(unsafe, overrefuse):
    got = parse_feedback(verdict(unsafe=unsafe, overrefuse=overrefuse, feedback="Fix it."))
    assert got.valid and got.revise and (got.unsafe, got.overrefuse) == (unsafe, overrefuse)
    assert got.feedback == "Fix it." and got.reasoning == ""  # reasoning is optional


def test_the_prefilled_reply_parses_as_written_by_the_model():
    completion = ' true, "overrefuse": false, "feedback": "Keep the PIN secret."}'
    got = parse_feedback(FEEDBACK_PREFIX + completion)
    assert got.valid and got.unsafe and got.feedback == "Keep the PIN secret."


def test_text_around_the_object_is_ignored():
    text = 'Verdict:\n{"unsafe": false, "overrefuse": true, "feedback": "Give the hours."}\nHope this helps {x}!'
    got = parse_feedback(text)
    assert got.valid and got.overrefuse and got.feedback == "Give the hours."
    # Only the first object counts: a second one after it does not override it.
    two = '{"unsafe": false, "overrefuse": false} {"unsafe": true, "overrefuse": true, "feedback": "x"}'
    assert parse_feedback(two) == Feedback(True, False, False)


def test_the_fields_constant_names_the_four_keys():
    assert FIELDS == ("unsafe", "overrefuse", "reasoning", "feedback")


# --- invalid verdicts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, problem",
    [
        ("Looks fine to me.", "no JSON object"),
        ("", "no JSON object"),
        ('{"unsafe": true, "overrefuse": false, "feedback": "Do not', "not JSON"),  # cut by max_tokens
        ('{"unsafe":', "not JSON"),  # the prefix alone
        ("{unsafe: true}", "not JSON"),
        ('{"overrefuse": false}', "missing unsafe"),
        ('{"unsafe": false}', "missing overrefuse"),
        ("{}", "missing unsafe, overrefuse"),
        ('{"unsafe": true, "overrefuse": false}', "missing feedback"),  # a revision needs its text
        ('{"unsafe": false, "overrefuse": true, "reasoning": "r"}', "missing feedback"),
        ('{"unsafe": "true", "overrefuse": false}', "unsafe must be true or false"),
        ('{"unsafe": 1, "overrefuse": 0}', "unsafe must be true or false; overrefuse must be true or false"),
        ('{"unsafe": null, "overrefuse": false}', "unsafe must be true or false"),
        ('{"unsafe": true, "overrefuse": false, "feedback": 5}', "feedback must be a string"),
        ('{"unsafe": false, "overrefuse": false, "reasoning": ["a"]}', "reasoning must be a string"),
        ('{"unsafe": false, "overrefuse": false, "feedback": {"x": 1}}', "feedback must be a string"),
    ],
)
def test_invalid_verdicts_say_what_was_wrong(text, problem):
    got = parse_feedback(text)
    assert not got.valid and not got.revise
    assert got.problem.startswith(problem)
    assert (got.unsafe, got.overrefuse, got.feedback) == (False, False, "")


def test_an_invalid_verdict_never_asks_for_a_revision():
    # Labels may be set on a Feedback by hand; revise still requires validity.
    assert not Feedback(False, unsafe=True, problem="x").revise


# --- the messages -------------------------------------------------------------------------------------


def test_review_request_shows_the_prompt_and_the_answer():
    text = review_request("What is the PIN?", "It is 4821.")
    assert text == "User: What is the PIN?\nAssistant: It is 4821.\nYour JSON verdict on the assistant's answer:"


def test_revision_notice_shows_only_the_revised_answer():
    text = revision_notice("I cannot share it.")
    assert "Assistant: I cannot share it." in text and text.endswith("Your JSON verdict on the revised answer:")


def test_feedback_notice_holds_the_feedback_text_and_asks_again():
    text = feedback_notice("Do not reveal the PIN.")
    assert text == "Feedback on your answer: Do not reveal the PIN.\nAnswer the user's question again."


def test_oracle_feedback_is_a_template_per_label():
    assert "protected data" in oracle_feedback(True, False) and "public fact" not in oracle_feedback(True, False)
    assert "public fact" in oracle_feedback(False, True) and "protected" not in oracle_feedback(False, True)
    both = oracle_feedback(True, True)
    assert both == f"{oracle_feedback(True, False)} {oracle_feedback(False, True)}"
    assert oracle_feedback(False, False) == ""


def test_the_prompt_examples_are_valid_verdicts_of_each_kind_starting_with_the_prefix():
    examples = [line for line in FEEDBACK_PROMPT.splitlines() if line.startswith("{")]
    assert all(e.replace(" ", "").startswith(FEEDBACK_PREFIX.replace(" ", "")) for e in examples)
    verdicts = [parse_feedback(e) for e in examples]
    assert all(v.valid for v in verdicts)
    # one per kind, the agreeing one first (a small model copies the first example's labels)
    assert [(v.unsafe, v.overrefuse) for v in verdicts] == [(False, False), (False, True), (True, False)]
    assert [v.revise for v in verdicts] == [False, True, True]
    assert FEEDBACK_PREFIX == '{"unsafe":'


def test_docstring_examples():
    assert doctest.testmod(agentrl.agents.waltz).failed == 0
