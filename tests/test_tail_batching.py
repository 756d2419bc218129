"""Tail batching (RollPacker) through the controller: short rounds train on the first groups to
finish and abort the rest, long rounds replay the aborted ones at full length, every trained token
comes from the weights being trained, no group is trained twice, and a resume keeps the queue.
The tiny model's trainer and a scripted policy whose slow prompts are known."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from test_train import _batches, _config, _steps

from agentrl.testing import ScriptedPolicy
from agentrl.train import train


class SlowOnBbb(ScriptedPolicy):
    """Replies at once, except to 'Say bbb' prompts: the long tail. Slow groups finish one after
    another, ``slow`` seconds apart (a reply started while k groups' worth of slow replies are
    running takes (k + 1) * ``slow``), so that which of them a round takes and which it aborts does
    not hang on a race between groups that end in the same millisecond."""

    def __init__(self, tokenizer: Any, slow: float = 0.4, group_size: int = 4):
        super().__init__(tokenizer, lambda prompt: "b" * (1 + self.calls % 3) + "a")
        self.slow = slow
        self.group_size = group_size
        self.running = 0

    async def generate(self, prompt_ids, sampling):
        if "Say bbb" in str(self.tokenizer.decode(list(prompt_ids))):
            rank = self.running // self.group_size
            self.running += 1
            try:
                await asyncio.sleep(self.slow * (1 + rank))
            finally:
                self.running -= 1
        return await super().generate(prompt_ids, sampling)


def _state(run_dir) -> dict[str, Any]:
    """The last checkpoint's run state, with its one lane's fields beside the run's."""
    state = json.loads(sorted((run_dir / "checkpoints").glob("*/controller.json"))[-1].read_text())
    return {**state, **state["lanes"]["default"]}


def test_short_rounds_abort_the_long_tail_and_long_rounds_replay_it(tiny_model_dir, tiny_tokenizer, tmp_path):
    config = _config(
        tiny_model_dir, tmp_path / "run", "tail_batching=true", "tail_extra=1.0", "steps=8", "samples_per_step=2"
    )
    result = train(config, policy=SlowOnBbb(tiny_tokenizer, slow=1.0))

    assert result.steps == 8
    steps = _steps(result.run_dir)
    assert all(m["train/staleness_max"] == 0 for m in steps)  # on-policy: every token from the weights trained
    long_steps = [m["step"] for m in steps if m["train/tail_long_round"] == 1.0]
    assert long_steps and sum(m["train/tail_aborted_groups"] for m in steps) >= 2 * len(long_steps)
    trained = [g for b in _batches(result.run_dir) for g in b["groups"]]
    assert len(trained) == len(set(trained)) == 16
    # long rounds trained the slow prompts the short rounds had aborted
    for step in long_steps:
        sample = (result.run_dir / "samples" / f"train-{int(step):06d}.jsonl").read_text().splitlines()[0]
        assert json.loads(sample)["messages"][0]["content"] == "Say bbb"
    state = _state(result.run_dir)
    assert not set(state["tail_queue"]) & set(trained)


def test_a_resumed_run_keeps_its_long_tail_queue(tiny_model_dir, tiny_tokenizer, tmp_path):
    run_dir = tmp_path / "run"
    options = ["tail_batching=true", "tail_extra=1.0", "checkpoint_every=1", "resume=true"]
    train(_config(tiny_model_dir, run_dir, *options, "steps=3"), policy=SlowOnBbb(tiny_tokenizer))
    queued = _state(run_dir)["tail_queue"]
    result = train(_config(tiny_model_dir, run_dir, *options, "steps=8"), policy=SlowOnBbb(tiny_tokenizer))

    assert result.steps == 8
    by_step = {b["step"]: b["groups"] for b in _batches(run_dir)}
    trained = [g for step in sorted(by_step) for g in by_step[step]]
    assert sorted(by_step) == list(range(1, 9)) and len(trained) == len(set(trained)) == 16
    assert set(queued) <= set(trained) | set(_state(run_dir)["tail_queue"])  # queued groups are not forgotten


def test_tail_batching_needs_a_synchronous_run(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="tail_batching is synchronous and needs max_staleness 0"):
        _config(tiny_model_dir, tmp_path / "run", "tail_batching=true", "max_staleness=1")
    with pytest.raises(ValueError, match="set curriculum.selection=uniform, or drop tail_batching"):
        _config(tiny_model_dir, tmp_path / "run", "tail_batching=true", "curriculum.selection=filter")
