"""One "did you mean" rule for every unknown name."""

from __future__ import annotations

import doctest

import agentrl.rollout.staleness
import agentrl.suggest
from agentrl.suggest import MAX_NAME_LENGTH, close_matches, did_you_mean

IDS = ["agentrl/Calculator-v0", "agentrl/CodeBreaker-v0", "agentrl/Countdown-v0", "agentrl/Negotiation-v0"]


def test_a_typo_has_one_clear_fix_even_among_ids_sharing_a_prefix():
    assert did_you_mean("agentrl/Calculater-v0", IDS) == "Did you mean 'agentrl/Calculator-v0'?"


def test_case_and_version_do_not_hide_the_name():
    assert close_matches("calculator", IDS) == ["agentrl/Calculator-v0"]


def test_nothing_close_gives_nothing_and_garbage_is_not_compared():
    assert did_you_mean("zzz", IDS) == ""
    assert close_matches("agentrl/Calculator-v0" * (MAX_NAME_LENGTH // 10), IDS) == []
    assert close_matches(None, IDS) == [] and close_matches(42, ["42"]) == []


def test_near_ties_are_all_offered():
    assert close_matches("lr_a", ["lr_b", "lr_c", "seed"]) == ["lr_b", "lr_c"]


def test_the_modules_examples_hold():
    for module in (agentrl.suggest, agentrl.rollout.staleness):
        failed, tried = doctest.testmod(module)
        assert tried > 0 and failed == 0, module.__name__
