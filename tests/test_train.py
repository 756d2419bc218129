"""The training controller, fast: the tiny model, the hf backend or a scripted policy, a few steps.

The staleness window as the controller drives it (synchronous runs train only on the current
weights; asynchronous ones stay within their bound and start no more groups than the window
holds), resume, configs that are never changed, and a real hf policy that learns. The same loop on
the real vLLM engine is in tests/trainers/test_train_job.py (slow).
"""

from __future__ import annotations

import copy
import errno
import json
import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import agentrl
from agentrl.config import ConfigError, load_config
from agentrl.env import AgentEnv, Feedback, MessagesSpace, ReplySpace
from agentrl.faults import EngineLost, EpisodesFailing, RunStalled, failure_message, resume_command
from agentrl.metrics import MetricsLogger, read_metrics
from agentrl.policies.base import Generation
from agentrl.policies.supervisor import EngineSupervisor
from agentrl.testing import ScriptedPolicy
from agentrl.train import TrainConfig, train
from agentrl.train.setup import plan
from agentrl.types import Message

ENV_ID = "tests/SayB-v0"


class SayB(AgentEnv):
    """Say b: the reward is the share of the letter b in the reply."""

    def __init__(self, split: str = "train", max_turns: int = 1):
        super().__init__(max_turns=max_turns)
        self.split = split

    def start(self, options: dict[str, Any] | None) -> list[Message]:
        return [Message("user", f"Say {'b' * (1 + int(self.np_random.integers(3)))}")]

    def respond(self, reply: Message) -> Feedback:
        share = reply.content.count("b") / max(len(reply.content), 1)
        return Feedback([], reward=share, terminated=True, info={"success": share >= 0.5})


if ENV_ID not in agentrl.registered_ids():
    agentrl.register(ENV_ID, entry_point=SayB)


def _config(model_dir: Path, run_dir: Path, *overrides: str) -> TrainConfig:
    return load_config(
        TrainConfig,
        None,
        [
            f"rollout.env_id={ENV_ID}",
            f"rollout.model={model_dir}",
            "rollout.backend=hf",
            "rollout.group_size=4",
            "rollout.max_tokens=8",
            "rollout.max_length=256",
            "trainer.lr=1e-2",
            "trainer.micro_batch_size=8",
            "groups_per_step=2",
            "steps=3",
            "eval_episodes=0",
            "checkpoint_every=0",
            "export=false",
            "torch_threads=1",
            f"run_dir={run_dir}",
            *overrides,
        ],
    )


def _scripted(tokenizer: Any, delays: list[float] | float = 0.0) -> ScriptedPolicy:
    # Replies differ between samples so that a group has advantages to train on.
    return ScriptedPolicy(tokenizer, lambda prompt: "b" * (1 + len(prompt) % 3) + "a", delay=delays)


def _steps(run_dir: Path) -> list[dict[str, float]]:
    return [m for m in read_metrics(run_dir) if "train/policy_version" in m]


def longer_is_better(episode: dict[str, Any], bonus: float = 0.0) -> dict[str, float]:
    """A reward_fn for a single-agent run: the reply's length in tokens, plus a stage's ``bonus``."""
    return {agent: float(t.num_generated) + bonus for agent, t in episode.items()}


def _one_lane(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's run state with its one lane's fields (``default``'s) beside the run's."""
    return {**state, **state["lanes"]["default"]}


def _batches(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]


def test_synchronous_training_trains_only_on_the_current_weights(tiny_model_dir, tiny_tokenizer, tmp_path):
    policy = _scripted(tiny_tokenizer)
    result = train(_config(tiny_model_dir, tmp_path / "run", "max_staleness=0"), policy=policy)

    steps = _steps(result.run_dir)
    assert result.steps == 3 and [m["train/policy_version"] for m in steps] == [2.0, 3.0, 4.0]
    assert all(m["train/staleness_max"] == 0 for m in steps)
    # one batch of 2 groups at a time: group numbers 0..5, each trained once, in batches
    assert [sorted(b["groups"]) for b in _batches(result.run_dir)] == [[0, 1], [2, 3], [4, 5]]


def test_asynchronous_training_stays_within_its_bound(tiny_model_dir, tiny_tokenizer, tmp_path):
    # A long-tail policy: one slow generation in every few, so that later groups overtake earlier ones.
    delays = [0.4 if i % 5 == 0 else 0.01 for i in range(200)]
    config = _config(tiny_model_dir, tmp_path / "run", "max_staleness=1", "steps=5")
    result = train(config, policy=_scripted(tiny_tokenizer, delays))

    steps = _steps(result.run_dir)
    assert result.steps == 5
    assert max(m["train/staleness_max"] for m in steps) <= 1
    trained = [g for b in _batches(result.run_dir) for g in b["groups"]]
    assert len(trained) == len(set(trained)) == 10
    # the window holds 2 x (1 + 1) groups: nothing beyond 4 batches' worth was ever started early
    assert max(trained) < 10 + 4 + steps[-1]["train/stale_groups"]


def test_training_does_not_change_the_callers_config(tiny_model_dir, tiny_tokenizer, tmp_path):
    config = _config(tiny_model_dir, tmp_path / "run", "rollout.temperature=0.7")
    before = copy.deepcopy(config)
    train(config, policy=_scripted(tiny_tokenizer))
    assert config == before and config.trainer.temperature is None and config.trainer.total_steps == 0
    assert config.trainer_settings().temperature == 0.7 and config.trainer_settings().total_steps == 3


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ('policies={"other": {}}', "single-agent env, played by one policy, 'default'; policies names \\['other'\\]"),
        ('policies={"default": {"weights": "lora"}}', "must keep weights: full, trainable: true and no init_from"),
        ("eval_against_base=true", "single-agent env, with none: remove eval_against_base"),
    ],
)
def test_a_single_agent_run_refuses_what_only_several_policies_mean(tmp_path, override, message):
    # before any model or engine is loaded
    with pytest.raises(ConfigError, match=message):
        plan(_config(Path("unused"), tmp_path / "run", override))


def test_a_single_agent_run_takes_stages_and_a_reward_fn(tiny_model_dir, tiny_tokenizer, tmp_path):
    # One lane like any other: stages set its steps, learning rate and reward_fn's arguments.
    stages = [{"steps": 1, "reward": {"bonus": 10.0}}, {"steps": 2, "lr": {"default": 0.0}}]
    config = _config(
        tiny_model_dir, tmp_path / "run", f"stages={json.dumps(stages)}", "reward_fn=test_train:longer_is_better"
    )
    result = train(config, policy=_scripted(tiny_tokenizer))

    steps = _steps(result.run_dir)
    assert result.steps == 3 and [m["train/stage"] for m in steps] == [0.0, 1.0, 1.0]
    # the reply's length in tokens, plus the first stage's bonus: the reward the batch trained on
    bonuses = [m["rollout/reward_mean"] - m["rollout/response_tokens_mean"] for m in steps]
    assert bonuses == pytest.approx([10.0, 0.0, 0.0])
    assert steps[0]["train/lr"] == pytest.approx(1e-2) and steps[1]["train/lr"] == 0.0


def test_a_resumed_run_trains_every_group_once(tiny_model_dir, tiny_tokenizer, tmp_path):
    run_dir = tmp_path / "run"
    first = _config(tiny_model_dir, run_dir, "max_staleness=1", "steps=2", "checkpoint_every=1", "resume=true")
    train(first, policy=_scripted(tiny_tokenizer))
    second = _config(tiny_model_dir, run_dir, "max_staleness=1", "steps=4", "checkpoint_every=1", "resume=true")
    result = train(second, policy=_scripted(tiny_tokenizer))

    assert result.steps == 4
    batches = _batches(run_dir)
    by_step = {b["step"]: b["groups"] for b in batches}  # a step re-done after a resume: the last record wins
    trained = [g for step in sorted(by_step) for g in by_step[step]]
    assert sorted(by_step) == [1, 2, 3, 4] and len(trained) == len(set(trained)) == 8


class DiesInSync(ScriptedPolicy):
    """A scripted policy whose engine dies while the ``fatal``-th weight update is sent to it."""

    def __init__(self, tokenizer: Any, fatal: int):
        super().__init__(tokenizer, lambda prompt: "b" * (1 + len(prompt) % 3) + "a")
        self.fatal, self.updates = fatal, 0

    async def aupdate_weights(self, named_tensors: Any) -> int:
        self.updates += 1
        if self.updates == self.fatal:
            raise RuntimeError("the engine died during the weight sync")
        return await super().aupdate_weights(named_tensors)


def test_a_fault_in_the_weight_sync_after_a_checkpointed_step_does_not_cost_the_step(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    run_dir = tmp_path / "run"
    common = ("max_staleness=0", "checkpoint_every=2", "resume=true")
    # The second update sent during training is step 2's, which checkpoint_every=2 saves.
    with pytest.raises(RuntimeError, match="during the weight sync"):
        train(_config(tiny_model_dir, run_dir, "steps=4", *common), policy=DiesInSync(tiny_tokenizer, fatal=2))
    state = _one_lane(
        json.loads(sorted((run_dir / "checkpoints").iterdir())[-1].joinpath("controller.json").read_text())
    )
    assert state["step"] == 2 and sorted(state["trained_groups"]) == [0, 1, 2, 3]
    # the saved step's row is written though its sync failed (a resume does not make it again),
    # with the version that sync was to make
    rows = _steps(run_dir)
    assert [m["step"] for m in rows] == [1, 2]
    assert rows[1]["train/policy_version"] == rows[0]["train/policy_version"] + 1
    result = train(_config(tiny_model_dir, run_dir, "steps=4", *common), policy=_scripted(tiny_tokenizer))
    assert result.steps == 4
    by_step = {b["step"]: b["groups"] for b in _batches(run_dir)}
    assert sorted(by_step) == [1, 2, 3, 4]
    trained = [g for step in sorted(by_step) for g in by_step[step]]
    assert len(trained) == len(set(trained)) == 8  # step 2 was not re-done, nothing was trained twice
    assert [b["step"] for b in _batches(run_dir)] == [1, 2, 3, 4]
    assert [m["step"] for m in _steps(run_dir)] == [1, 2, 3, 4]


def test_the_hf_policy_learns_through_the_controller(tiny_model_dir, tmp_path):
    config = _config(tiny_model_dir, tmp_path / "run", "steps=6", "groups_per_step=4", "max_staleness=1")
    result = train(config)

    rewards = [m["rollout/reward_mean"] for m in _steps(result.run_dir)]
    assert max(m["train/staleness_max"] for m in _steps(result.run_dir)) <= 1
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2, f"reward did not go up: {rewards}"


def test_a_greedy_run_is_refused_with_the_reason(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="rollout.temperature must be above 0"):
        _config(tiny_model_dir, tmp_path / "run", "rollout.temperature=0")


@pytest.mark.parametrize("stragglers", ["wait", "drop"])
def test_a_straggling_group_is_waited_for_or_dropped(tiny_model_dir, tiny_tokenizer, tmp_path, stragglers):
    # Group 0's four episodes take the first four generations, 3 s each; every other one is quick.
    # With max_staleness 1 and 2 groups a step, group 0 must be in the second batch at the latest:
    # waiting puts it there; dropping trains the quick groups instead (and drops group 0 once it
    # finishes, if the run is still going then).
    delays = [3.0] * 4 + [0.01] * 200
    config = _config(
        tiny_model_dir,
        tmp_path / "run",
        "max_staleness=1",
        "steps=4",
        "rollout.concurrency=16",
        f"stragglers={stragglers}",
    )
    result = train(config, policy=_scripted(tiny_tokenizer, delays))

    state = _one_lane(
        json.loads(sorted((result.run_dir / "checkpoints").iterdir())[-1].joinpath("controller.json").read_text())
    )
    trained = [g for b in _batches(result.run_dir) for g in b["groups"]]
    assert max(m["train/staleness_max"] for m in _steps(result.run_dir)) <= 1
    if stragglers == "wait":
        assert 0 in trained[:4] and state["lost_groups"] == []
    else:
        assert 0 not in trained[:4] and trained[:4] == [1, 2, 3, 4]


class PlainSayB(gym.Env):
    """Say b, written the plain gymnasium way: messages in, a Message reply out."""

    observation_space = MessagesSpace()
    action_space = ReplySpace()

    def __init__(self, split: str = "train"):
        self.split = split

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        return [Message("user", "Say b")], {}

    def step(self, action: Message) -> Any:
        share = action.content.count("b") / max(len(action.content), 1)
        return [], share, True, False, {"success": share >= 0.5}


class OverridingSayB(AgentEnv):
    """Say b, an AgentEnv that overrides reset and step as gymnasium users do."""

    def __init__(self, split: str = "train"):
        super().__init__()
        self.split = split

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        return [Message("user", "Say b")], {}

    def step(self, action: Any) -> Any:
        reply = self.parse_reply(action)
        share = reply.content.count("b") / max(len(reply.content), 1)
        return [], share, True, False, {"success": share >= 0.5}


for _id, _entry in (("tests/PlainSayB-v0", PlainSayB), ("tests/OverridingSayB-v0", OverridingSayB)):
    if _id not in gym.registry:
        gym.register(_id, entry_point=_entry)


@pytest.mark.parametrize("env_id", ["tests/PlainSayB-v0", "tests/OverridingSayB-v0"])
def test_envs_written_the_gymnasium_way_train_and_evaluate(tiny_model_dir, tiny_tokenizer, tmp_path, env_id):
    config = _config(tiny_model_dir, tmp_path / "run", f"rollout.env_id={env_id}", "steps=2", "eval_episodes=4")
    result = train(config, policy=_scripted(tiny_tokenizer))
    assert result.steps == 2 and result.eval_before["eval/episodes"] == 4 and result.eval_after["eval/failed"] == 0
    assert [m["train/policy_version"] for m in _steps(result.run_dir)] == [2.0, 3.0]


class BrokenAfter(AgentEnv):
    """Say b; the fourth env made raises in its constructor (a setup error mid-run)."""

    made = 0

    def __init__(self, split: str = "train"):
        super().__init__(max_turns=1)
        BrokenAfter.made += 1
        if BrokenAfter.made > 3:
            raise RuntimeError("the env's service went away")

    def start(self, options: dict[str, Any] | None) -> list[Message]:
        return [Message("user", "Say b")]

    def respond(self, reply: Message) -> Feedback:
        return Feedback([], reward=float("b" in reply.content), terminated=True)


if "tests/BrokenAfter-v0" not in agentrl.registered_ids():
    agentrl.register("tests/BrokenAfter-v0", entry_point=BrokenAfter)


def test_a_setup_error_mid_run_ends_the_run_with_it_instead_of_hanging(tiny_model_dir, tiny_tokenizer, tmp_path):
    BrokenAfter.made = 0
    # Slow replies keep each env busy, so the engine has to make new ones and meets the error.
    config = _config(tiny_model_dir, tmp_path / "run", "rollout.env_id=tests/BrokenAfter-v0", "steps=5")
    with pytest.raises(RuntimeError, match="the env's service went away"):
        train(config, policy=_scripted(tiny_tokenizer, delays=0.05))


def test_a_producer_that_raises_ends_the_run_with_it_instead_of_hanging(
    tiny_model_dir, tiny_tokenizer, tmp_path, monkeypatch
):
    # The producer starts every group; had it died quietly, the trainer would wait forever.
    from agentrl.train.loop import Controller

    take = Controller._take
    calls = []

    async def take_then_fail(self, room):
        calls.append(room)
        if len(calls) > 1:
            raise RuntimeError("the prompt selection broke")
        return await take(self, room)

    monkeypatch.setattr(Controller, "_take", take_then_fail)
    config = _config(tiny_model_dir, tmp_path / "run", "steps=5", "max_staleness=0")
    with pytest.raises(RuntimeError, match="the prompt selection broke"):
        train(config, policy=_scripted(tiny_tokenizer))


def test_a_resumed_run_counts_versions_on_and_keeps_staleness_in_its_bound(tiny_model_dir, tiny_tokenizer, tmp_path):
    run_dir = tmp_path / "run"
    common = ("max_staleness=2", "checkpoint_every=1", "resume=true", "groups_per_step=1", "trainer.micro_batch_size=4")
    train(_config(tiny_model_dir, run_dir, "steps=3", *common), policy=_scripted(tiny_tokenizer, 0.05))
    train(_config(tiny_model_dir, run_dir, "steps=6", *common), policy=_scripted(tiny_tokenizer, 0.05))

    steps = _steps(run_dir)
    versions = [m["train/policy_version"] for m in steps]
    assert versions == sorted(versions) and len(set(versions)) == 6, versions
    assert all(0 <= m["train/staleness_mean"] <= m["train/staleness_max"] <= 2 for m in steps)
    state = _one_lane(
        json.loads(sorted((run_dir / "checkpoints").iterdir())[-1].joinpath("controller.json").read_text())
    )
    assert state["policy_version"] == versions[-1]


class Flaky(AgentEnv):
    """Say b; the episodes that ``fails(number)`` picks (numbered as they start, from 0) lose their
    backend at the start, as a sandbox's would when its Docker engine dies."""

    started = 0
    fails: Any = staticmethod(lambda number: True)

    def __init__(self, split: str = "train"):
        super().__init__(max_turns=1)

    def start(self, options: dict[str, Any] | None) -> list[Message]:
        number, Flaky.started = Flaky.started, Flaky.started + 1
        if Flaky.fails(number):
            raise ConnectionError("the sandbox backend does not answer")
        return [Message("user", "Say b")]

    def respond(self, reply: Message) -> Feedback:
        share = reply.content.count("b") / max(len(reply.content), 1)
        return Feedback([], reward=share, terminated=True)


if "tests/Flaky-v0" not in agentrl.registered_ids():
    agentrl.register("tests/Flaky-v0", entry_point=Flaky)


def test_a_step_its_checkpoint_saved_keeps_its_row_and_samples_when_the_disk_fills_before_the_row(
    tiny_model_dir, tiny_tokenizer, tmp_path, monkeypatch
):
    # Step 2 is trained and saved, then the disk is full when its metrics row is written: the run
    # stops. Resumed, it goes on from step 3 with step 2's row written from the checkpoint.
    original = MetricsLogger.log

    def full_at_step_2(self: MetricsLogger, step: int, metrics: Any) -> None:
        if step == 2 and "train/loss" in metrics:
            raise OSError(errno.ENOSPC, "No space left on device")
        original(self, step, metrics)

    monkeypatch.setattr(MetricsLogger, "log", full_at_step_2)
    config = _config(tiny_model_dir, tmp_path / "run", "checkpoint_every=1", "max_staleness=0")
    with pytest.raises(OSError, match="No space left"):
        train(config, policy=_scripted(tiny_tokenizer))
    monkeypatch.setattr(MetricsLogger, "log", original)
    assert [m["step"] for m in _steps(tmp_path / "run")] == [1]
    result = train(config, policy=_scripted(tiny_tokenizer))

    steps = _steps(result.run_dir)
    assert [m["step"] for m in steps] == [1, 2, 3] and all("train/loss" in m for m in steps)
    assert [b["step"] for b in _batches(result.run_dir)] == [1, 2, 3]  # step 2 trained once
    assert sorted(p.name for p in (result.run_dir / "samples").glob("train-*")) == [
        f"train-00000{n}.jsonl" for n in (1, 2, 3)
    ]


def test_an_engine_that_dies_under_the_weights_probe_is_replaced_and_the_new_one_probed(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    # The engine core dies just as the probe after step 1's sync asks it for tokens: the probe
    # waits for the new engine, which got the same weights, and probes it (the death ended the run before).
    engine_dead = type("EngineDeadError", (RuntimeError,), {})
    engines: list[ScriptedPolicy] = []

    class DiesUnderTheProbe(ScriptedPolicy):
        async def generate(self, prompt_ids: Any, sampling: Any) -> Generation:
            if self is engines[0] and self.version >= 2:  # the sync of step 1 (a lent engine got one update first)
                raise engine_dead("EngineCore encountered an issue.")
            return await super().generate(prompt_ids, sampling)

    def start() -> ScriptedPolicy:
        engines.append(DiesUnderTheProbe(tiny_tokenizer, lambda prompt: "b" * (1 + len(prompt) % 3) + "a"))
        return engines[-1]

    supervised = EngineSupervisor(start, max_restarts=1, watch_every=0)
    config = _config(tiny_model_dir, tmp_path / "run", "max_staleness=0", "probe_every=1", "probe_tolerance=10")
    result = train(config, policy=supervised)

    steps = _steps(result.run_dir)
    assert result.steps == 3 and len(engines) == 2 and supervised.restarts == 1
    assert all(m.get("fault/adapter_probe_gap") is not None for m in steps)


def test_a_run_whose_every_episode_fails_stops_with_one_message_instead_of_playing_on(
    tiny_model_dir, tiny_tokenizer, tmp_path, monkeypatch
):
    # Without the rule each lost group was replaced by another that failed too, for ever.
    monkeypatch.setattr(Flaky, "started", 0)
    monkeypatch.setattr(Flaky, "fails", staticmethod(lambda number: True))
    run_dir = tmp_path / "run"
    config = _config(tiny_model_dir, run_dir, "rollout.env_id=tests/Flaky-v0", "max_failed_in_a_row=6")
    with pytest.raises(EpisodesFailing) as failed:
        train(config, policy=_scripted(tiny_tokenizer))

    assert re.match(
        r"\d+ episodes failed one after another \(max_failed_in_a_row 6\), the last with: ConnectionError: "
        "the sandbox backend does not answer",
        str(failed.value),
    ), str(failed.value)
    assert not (run_dir / "batches.jsonl").exists()  # nothing trained, no failure turned into a sample
    message = failure_message(failed.value, run_dir, resume_command(["c.yaml"], resume=True))
    assert message.startswith(f"Training stopped after step 0: {failed.value}") and "agentrl train c.yaml" in message


def test_failed_episodes_between_good_ones_are_counted_and_the_run_goes_on(
    tiny_model_dir, tiny_tokenizer, tmp_path, monkeypatch
):
    monkeypatch.setattr(Flaky, "started", 0)
    monkeypatch.setattr(Flaky, "fails", staticmethod(lambda number: number % 10 == 3))
    config = _config(
        tiny_model_dir,
        tmp_path / "run",
        "rollout.env_id=tests/Flaky-v0",
        "max_failed_in_a_row=2",
        "rollout.episode_retries=0",
    )
    result = train(config, policy=_scripted(tiny_tokenizer))

    steps = _steps(result.run_dir)
    assert result.steps == 3 and sum(m["rollout/failed"] for m in steps) >= 1
    assert all(m["rollout/episodes"] - m["rollout/failed"] == 8 for m in steps)  # trained: 2 whole groups
    assert steps[-1]["fault/groups_replaced"] >= 1 and steps[-1]["fault/episodes_retried"] == 0


class SeededReplies(ScriptedPolicy):
    """Replies that differ between a group's samples and repeat with the sampler's seed, as a
    seeded engine's do: ``b`` one to three times, then ``a``."""

    async def generate(self, prompt_ids: Any, sampling: Any) -> Generation:
        text = "b" * (1 + sampling.seed % 3) + "a"
        ids = self.tokenizer.encode(text, add_special_tokens=False) + self.end_of_turn_ids
        return Generation(ids, [-1.0] * len(ids), self.version, "stop")


def _trained(run_dir: Path) -> list[list[tuple[Any, ...]]]:
    """Per step, what the trainer saw of each trajectory: group, tokens, reward, advantages (sorted)."""
    steps = []
    for path in sorted((run_dir / "samples").glob("train-*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        steps.append(sorted((r["group_id"], r["token_ids"], r["reward"], r["advantages"]) for r in records))
    return steps


def test_an_infrastructure_failure_is_retried_and_its_group_trains_as_if_it_never_happened(
    tiny_model_dir, tiny_tokenizer, tmp_path, monkeypatch
):
    # The same run twice: once clean, once with three episodes' sandboxes lost at the start (one
    # of them twice). Each failed episode is played again in a fresh env from the same seeds, so
    # the trainer sees the very same tokens, rewards and advantages, and no failure as a zero.
    runs = {}
    for name, fails in [("clean", lambda n: False), ("faulty", lambda n: n in (1, 6, 7, 13))]:
        monkeypatch.setattr(Flaky, "started", 0)
        monkeypatch.setattr(Flaky, "fails", staticmethod(fails))
        config = _config(
            tiny_model_dir,
            tmp_path / name,
            "rollout.env_id=tests/Flaky-v0",
            "max_staleness=0",
            "samples_per_step=2",
            "rollout.concurrency=4",
        )
        runs[name] = train(config, policy=SeededReplies(tiny_tokenizer, ""))

    clean, faulty = _trained(runs["clean"].run_dir), _trained(runs["faulty"].run_dir)
    assert len(clean) == 3 and all(len(step) == 8 for step in clean)
    assert any(a for step in clean for *_, advantages in step for a in advantages), "the groups have signal"
    assert faulty == clean
    last = _steps(runs["faulty"].run_dir)[-1]
    assert (last["fault/env_error"], last["fault/episodes_retried"], last["fault/groups_replaced"]) == (4, 4, 0)
    assert sum(m["rollout/failed"] for m in _steps(runs["faulty"].run_dir)) == 0
    losses = [[m["train/loss"] for m in _steps(runs[name].run_dir)] for name in ("clean", "faulty")]
    # The same samples (above); the losses to rounding: on an Intel Xeon with AMX (2026-12-06) two
    # runs of the same batches differed in the 8th digit (-0.16830456 and -0.16830453).
    assert losses[1] == pytest.approx(losses[0], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("tail_batching", [False, True])
def test_a_run_whose_episodes_hang_stops_after_stall_timeout_instead_of_waiting_for_ever(
    tiny_model_dir, tiny_tokenizer, tmp_path, tail_batching
):
    config = _config(tiny_model_dir, tmp_path / "run", "stall_timeout=2", f"tail_batching={str(tail_batching).lower()}")
    hung = _scripted(tiny_tokenizer, delays=[0.0] * 8 + [3600.0] * 100)  # the first step's groups, then nothing
    with pytest.raises(
        RunStalled, match=r"no group finished for \d+ s \(stall_timeout 2 s\) while \d+ were being played"
    ):
        train(config, policy=hung)
    assert len(_batches(tmp_path / "run")) == 1


@pytest.mark.parametrize("override", ["max_failed_in_a_row=-1", "stall_timeout=-5"])
def test_negative_fault_limits_are_refused(tiny_model_dir, tmp_path, override):
    with pytest.raises(ValueError, match="max_failed_in_a_row and stall_timeout must be >= 0"):
        _config(tiny_model_dir, tmp_path / "run", override)


class EngineDeadError(RuntimeError):
    """Named as vLLM's: the supervisor tells an engine's death by the exception's name."""


def test_engine_restarts_are_counted_over_the_run_not_per_command(tiny_model_dir, tmp_path, monkeypatch):
    # max_engine_restarts=1: the first command spends it; the resumed one must not get another.
    from agentrl.policies.hf import HFPolicy

    generate, calls, dies_at = HFPolicy.generate, [0], [5]

    async def dying(self, prompt_ids, sampling):
        calls[0] += 1
        if calls[0] == dies_at[0]:
            raise EngineDeadError("EngineCore encountered an issue.")
        return await generate(self, prompt_ids, sampling)

    monkeypatch.setattr(HFPolicy, "generate", dying)
    run_dir = tmp_path / "run"
    common = ("max_engine_restarts=1", "checkpoint_every=1", "resume=true")
    train(_config(tiny_model_dir, run_dir, "steps=2", *common))
    steps = _steps(run_dir)
    assert [m["fault/engine_restarts"] for m in steps] == [1.0, 1.0]
    seconds = steps[-1]["fault/engine_seconds_lost"]

    dies_at[0] = calls[0] + 3
    with pytest.raises(EngineLost, match=r"max_engine_restarts=1 allows no more new engines this run \(1 started\)"):
        train(_config(tiny_model_dir, run_dir, "steps=4", *common))
    assert all(m["fault/engine_seconds_lost"] >= seconds for m in _steps(run_dir))


def test_the_weights_probe_finds_the_engine_serving_what_the_trainer_sent(tiny_model_dir, tmp_path):
    result = train(_config(tiny_model_dir, tmp_path / "run", "steps=2", "probe_every=1"))
    gaps = [m["fault/adapter_probe_gap"] for m in _steps(result.run_dir)]
    assert len(gaps) == 2 and max(gaps) < 1e-4, gaps  # fp32 on both sides


def test_an_update_that_never_reaches_the_engine_stops_the_run_at_the_next_probe(tiny_model_dir, tmp_path, monkeypatch):
    # verl #7495's failure: the sync "succeeds", the engine keeps its old weights, the metrics look normal.
    from agentrl.faults import WeightsMismatch
    from agentrl.policies.hf import HFPolicy

    def lost(self, named_tensors):
        list(named_tensors)
        self._version += 1
        return self._version

    monkeypatch.setattr(HFPolicy, "update_weights", lost)
    config = _config(tiny_model_dir, tmp_path / "run", "steps=3", "probe_every=1", "probe_tolerance=1e-3")
    with pytest.raises(WeightsMismatch, match=r"policy default's engine serves other weights than its trainer sent: "
                       r"right after step 1's sync"):  # fmt: skip
        train(config)
    (step,) = _steps(tmp_path / "run")  # the step's row is written, with the gap that ended the run
    assert step["fault/adapter_probe_gap"] > 1e-3
