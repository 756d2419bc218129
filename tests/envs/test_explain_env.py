"""Explain-v0: ROUGE-L by hand, the two reward modes, the reference's arithmetic, determinism and the split;
``agentrl eval`` scores the references it records."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

import agentrl
from agentrl.cli import app
from agentrl.envs.explain import ANSWER_REQUEST, FAMILIES, ExplainEnv, rouge_l


@pytest.mark.parametrize(
    ("candidate", "reference", "expected"),
    [
        ("a b c d", "a b c d", 1.0),
        ("a b c d", "a c d e", 0.75),  # LCS a c d: precision 3/4, recall 3/4
        ("x y", "a b c d", 0.0),
        ("", "a b", 0.0),
        ("The Cost: 21 dollars!", "cost 21 dollars", 2 * 1.0 * 0.75 / 1.75),  # LCS 3 of 4 and of 3 words
    ],
)
def test_rouge_l_by_hand(candidate: str, reference: str, expected: float) -> None:
    assert rouge_l(candidate, reference) == pytest.approx(expected)


def envs(split: str, seeds: range, **kwargs) -> list[ExplainEnv]:
    out = []
    for seed in seeds:
        env = ExplainEnv(split=split, **kwargs)  # type: ignore[arg-type]
        env.reset(seed=seed)
        out.append(env)
    return out


def test_the_same_seed_gives_the_same_problem_and_the_splits_share_none():
    a, b = envs("train", range(50)), envs("train", range(50))
    assert [e.question for e in a] == [e.question for e in b]
    train = {e.question for e in envs("train", range(300))}
    test = {e.question for e in envs("test", range(300))}
    assert not train & test
    assert {e.family for e in envs("train", range(200))} == {f.__name__.strip("_") for f in FAMILIES}


_EQUATION = re.compile(r"(\d+) ([×+−÷]) \(?(\d+)(?: \+ (\d+)\))? = (\d+)")


def test_every_equation_in_the_references_is_right():
    checked = 0
    for env in envs("train", range(300)) + envs("test", range(100)):
        for left, op, right, extra, result in _EQUATION.findall(env.reference):
            a, b = int(left), int(right) + (int(extra) if extra else 0)
            value = {"×": a * b, "+": a + b, "−": a - b, "÷": a // b}[op]
            assert value == int(result), env.reference
            assert op != "÷" or a % b == 0, env.reference
            checked += 1
    assert checked > 500


def test_likelihood_mode_ends_after_the_reasoning_and_hands_over_the_reference():
    env = agentrl.make("agentrl/Explain-v0")
    env.reset(seed=1)
    observation, reward, terminated, truncated, info = env.step("First I multiply, then I subtract.")
    assert terminated and not truncated and reward == 0.0
    assert [m.content for m in observation] == [ANSWER_REQUEST]
    assert info["reference"] == env.unwrapped.reference and info["family"] == env.unwrapped.family


def test_soft_match_mode_rewards_the_reply_by_rouge_l_against_the_reference():
    env = agentrl.make("agentrl/Explain-v0", reward="soft_match")
    env.reset(seed=2)
    reference = env.unwrapped.reference
    _, reward, terminated, _, info = env.step(reference)
    assert terminated and reward == 1.0 and info["soft_match"] == 1.0
    assert "reference" not in info  # nothing for the rollout to score: the reply itself is graded
    env.reset(seed=2)
    assert 0.0 < env.step(" ".join(reference.split()[:5]))[1] < 0.5


def test_the_direct_prompt_asks_the_same_question_for_an_answer_straight_away():
    env = ExplainEnv()
    env.reset(seed=3)
    system, user = env.direct_prompt()
    assert user.content == env.question and "full sentences" in system.content


def test_an_unknown_reward_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="likelihood.*soft_match"):
        ExplainEnv(reward="rouge")  # type: ignore[arg-type]


def test_the_checker_passes_in_both_modes():
    agentrl.check_env(agentrl.make("agentrl/Explain-v0"))
    agentrl.check_env(agentrl.make("agentrl/Explain-v0", reward="soft_match"))


def test_eval_scores_the_references_with_the_model(tiny_model_dir):
    result = CliRunner().invoke(
        app,
        ["eval", "agentrl/Explain-v0", "--backend", "hf", "--model", str(tiny_model_dir), "--episodes", "4",
         "group_size=2", "max_tokens=4"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "NLL per token after the episode" in result.output
    nll = float(re.search(r"NLL per token after the episode\s*│\s*([\d.]+)", result.output).group(1))
    assert 0.5 < nll < 20  # a random tiny model: about log(vocabulary) per token
