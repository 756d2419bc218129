"""Prompt selection in the controller (``curriculum:``): PCL plays exactly the candidates its value
model picks and never replays the others; DAPO-style filtering drops groups of equal rewards and
plays others in their place; both survive a resume. The tiny model, the hf trainer, a scripted policy."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from test_train import _batches, _config, _steps

import agentrl.train
from agentrl.metrics import read_metrics
from agentrl.testing import ScriptedPolicy
from agentrl.train import train
from agentrl.trainers.curriculum import PromptCurriculum, PromptValueModel


def _one_lane(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's run state with its one lane's fields (``default``'s) beside the run's."""
    return {**state, **state["lanes"]["default"]}


def _varied(tokenizer: Any) -> ScriptedPolicy:
    """Replies that differ between the samples of a group only for 'Say bbb' prompts: the other
    groups' rewards are all equal."""
    counter = itertools.count()

    def reply(prompt: str) -> str:
        if "Say bbb" in prompt:
            return "b" * (1 + next(counter) % 3) + "a"
        return "ba"

    return ScriptedPolicy(tokenizer, reply)


def _prompt_texts(run_dir: Path, tokenizer: Any) -> list[str]:
    """The prompt of every trained group, from the samples the run wrote (one group per step)."""
    texts = []
    for path in sorted((run_dir / "samples").glob("train-*.jsonl")):
        first = json.loads(path.read_text().splitlines()[0])
        texts.append(first["messages"][0]["content"])
    return texts


def test_filtering_drops_groups_of_equal_rewards_and_plays_others(tiny_model_dir, tiny_tokenizer, tmp_path):
    config = _config(tiny_model_dir, tmp_path / "run", "curriculum.selection=filter", "samples_per_step=2")
    result = train(config, policy=_varied(tiny_tokenizer))

    assert result.steps == 3
    steps = _steps(result.run_dir)
    assert all(m["train/effective_group_fraction"] == 1.0 for m in steps)  # every trained group has signal
    assert sum(m["train/filtered_groups"] for m in steps) > 0
    texts = _prompt_texts(result.run_dir, tiny_tokenizer)
    assert len(texts) == 3 and set(texts) == {"Say bbb"}
    # the checkpoint says which were filtered; trained and filtered numbers never overlap
    state = _one_lane(json.loads(next((result.run_dir / "checkpoints").glob("*/controller.json")).read_text()))
    trained = [g for b in _batches(result.run_dir) for g in b["groups"]]
    assert len(state["filtered_groups"]) == sum(m["train/filtered_groups"] for m in steps)
    assert not set(trained) & set(state["filtered_groups"]) and len(trained) == len(set(trained)) == 6


def test_filtering_gives_up_after_max_filtered_when_nothing_has_signal(tiny_model_dir, tiny_tokenizer, tmp_path):
    uniform = ScriptedPolicy(tiny_tokenizer, "ba")  # every group's rewards are equal
    config = _config(tiny_model_dir, tmp_path / "run", "curriculum.selection=filter", "curriculum.max_filtered=3")
    result = train(config, policy=uniform)
    steps = _steps(result.run_dir)
    assert result.steps == 3 and [m["train/filtered_groups"] for m in steps] == [3.0, 3.0, 3.0]  # max_filtered, no more
    assert all(m["train/effective_group_fraction"] == 0.0 for m in steps)


class _KnownDifficulty(PromptCurriculum):
    """A value model that knows the answer, for a test of the controller's use of it: 'Say bbb'
    prompts are predicted 0.5, the others 0.0 (the real model is tested in tests/trainers/)."""

    def __init__(self, tokenizer: Any, model: PromptValueModel):
        super().__init__(model, lr=1e-5)
        self.tokenizer = tokenizer
        self.scored = 0

    def predict(self, prompts):
        self.scored += len(prompts)
        return [0.5 if "Say bbb" in self.tokenizer.decode(p) else 0.0 for p in prompts]


@pytest.mark.parametrize("staleness", [0, 1])
def test_pcl_plays_the_candidates_closest_to_the_target(
    tiny_model_dir, tiny_tokenizer, tmp_path, monkeypatch, staleness
):
    curriculum = _KnownDifficulty(tiny_tokenizer, PromptValueModel(tiny_model_dir))
    monkeypatch.setattr(agentrl.train, "_curriculum", lambda *args: curriculum)
    config = _config(
        tiny_model_dir,
        tmp_path / "run",
        "curriculum.selection=pcl",
        "curriculum.pool=6",
        f"max_staleness={staleness}",
        "samples_per_step=2",
        "checkpoint_every=1",
    )
    result = train(config, policy=_varied(tiny_tokenizer))

    assert result.steps == 3
    texts = _prompt_texts(result.run_dir, tiny_tokenizer)
    assert len(texts) == 3 and set(texts) == {"Say bbb"}
    steps = _steps(result.run_dir)
    assert all(m["train/effective_group_fraction"] == 1.0 and m["train/pcl_predicted_mean"] == 0.5 for m in steps)
    assert all(m["perf/time_select"] > 0 and m["train/pcl_value_loss"] >= 0 for m in steps)
    state = _one_lane(json.loads(sorted((result.run_dir / "checkpoints").glob("*/controller.json"))[-1].read_text()))
    trained = {g for b in _batches(result.run_dir) for g in b["groups"]}
    assert not trained & set(state["skipped_groups"])
    assert curriculum.scored == state["next_group"]  # every candidate scored once
    assert 6 * len(state["skipped_groups"]) == 5 * state["next_group"]  # one in six candidates played


def test_pcl_with_the_real_value_model_trains_and_resumes_without_replaying_skipped_groups(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    run_dir = tmp_path / "run"
    options = ["curriculum.selection=pcl", "curriculum.pool=3", "curriculum.lr=1e-3", "checkpoint_every=1"]
    train(_config(tiny_model_dir, run_dir, *options, "steps=2", "resume=true"), policy=_varied(tiny_tokenizer))
    result = train(_config(tiny_model_dir, run_dir, *options, "steps=4", "resume=true"), policy=_varied(tiny_tokenizer))

    assert result.steps == 4
    by_step = {b["step"]: b["groups"] for b in _batches(run_dir)}
    trained = [g for step in sorted(by_step) for g in by_step[step]]
    state = _one_lane(json.loads(sorted((run_dir / "checkpoints").glob("*/controller.json"))[-1].read_text()))
    assert sorted(by_step) == [1, 2, 3, 4] and len(trained) == len(set(trained)) == 8
    assert not set(trained) & set(state["skipped_groups"]) and len(state["skipped_groups"]) >= 16
    losses = [m["train/pcl_value_loss"] for m in read_metrics(run_dir) if "train/pcl_value_loss" in m]
    assert len(losses) == 4


def test_a_multi_agent_run_refuses_prompt_selection(tmp_path):
    config = _config(
        Path("unused"), tmp_path / "run", "rollout.env_id=agentrl/Negotiation-v0", "curriculum.selection=pcl"
    )
    with pytest.raises(ValueError, match="multi-agent run plays its seeds in order"):
        train(config)
