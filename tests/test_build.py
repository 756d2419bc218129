"""The set-up chain, written once: config -> policy -> agent -> engine, for every kind of env."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import gymnasium as gym
import pytest

import agentrl
from agentrl import Message, MessagesSpace, ReplySpace
from agentrl.build import build_rollout, make_policy, model_path, policy_options, rollout_settings, sampling_of
from agentrl.config import EngineConfig, RolloutConfig
from agentrl.policies import BACKENDS
from agentrl.policies import make_policy as make_backend
from agentrl.rollout import MultiAgentRollout, RolloutSettings, SingleAgentRollout
from agentrl.run import rollout
from agentrl.testing import ScriptedPolicy

PLAIN_ID = "tests/PlainEcho-v0"


class PlainEcho(gym.Env):
    """Say "echo" (a plain gymnasium.Env speaking messages, registered with gymnasium.register)."""

    observation_space = MessagesSpace()
    action_space = ReplySpace()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        return [Message("user", "Say echo.")], {}

    def step(self, action: Any) -> Any:
        won = action.content.strip() == "echo"
        return [], float(won), True, False, {"success": won}


if PLAIN_ID not in gym.registry:
    gym.register(PLAIN_ID, entry_point=PlainEcho)


def test_the_backend_table_explains_bad_backends(tiny_tokenizer):
    assert sorted(BACKENDS) == ["hf", "openai", "scripted", "vllm"]
    with pytest.raises(ValueError, match="Unknown backend 'hff'.*Did you mean 'hf'"):
        make_backend("hff", "model")
    with pytest.raises(ValueError, match="needs a model"):
        make_backend("hf")
    with pytest.raises(ValueError, match="callable backend takes no model"):
        make_backend(lambda: None, "model")
    assert isinstance(make_backend(lambda: ScriptedPolicy(tiny_tokenizer, "x")), ScriptedPolicy)


def test_a_config_gives_its_backend_the_options_it_names(tiny_model_dir):
    config = EngineConfig(model=str(tiny_model_dir), backend="vllm", max_length=512, seed=3)
    assert policy_options(config) == {
        "dtype": "float32",
        "max_model_len": 512,
        "seed": 3,
        "gpu_memory_utilization": 0.5,
    }
    assert policy_options(EngineConfig(backend="hf")) == {"dtype": "float32"}
    served = EngineConfig(backend="openai", base_url="http://127.0.0.1:1/v1", served_model_name="m")
    assert policy_options(served) == {"base_url": "http://127.0.0.1:1/v1", "model": "m"}
    assert model_path(served) is None  # the default model behind a server: its tokenizer comes from the server
    assert model_path(config) == str(tiny_model_dir)
    settings = rollout_settings(config, env_kwargs={"split": "test"}, policy_id="solver")
    assert settings.sampling == sampling_of(config) and settings.limits.max_length == 512 and settings.seed == 3
    assert settings.env_id == config.env_id and settings.env_kwargs == {"split": "test"}
    assert settings.policy_id == "solver" and settings.episodes_per_group == config.group_size + config.redundancy
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.seed = 4  # type: ignore[misc]
    with pytest.raises(ValueError, match="need group_size >= 1"):
        rollout_settings(config, group_size=0)


def test_a_missing_model_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a checkpoint directory"):
        make_policy(EngineConfig(model=str(tmp_path / "nowhere"), backend="hf"))


def test_one_builder_plays_a_single_agent_env(tiny_tokenizer):
    policy = ScriptedPolicy(tiny_tokenizer, '{"name": "calculate", "arguments": {"expression": "1+2"}}')
    engine = build_rollout(
        RolloutSettings("agentrl/Calculator-v0", env_kwargs={"split": "test"}, group_size=2, seed=5), policy
    )
    assert isinstance(engine, SingleAgentRollout) and engine.agent.tokenizer is policy.tokenizer
    assert "calculate" in engine.agent.tokenizer.decode(engine.agent.prompt_ids([Message("user", "hi")]))
    trajectories = asyncio.run(engine.collect(num_groups=2))
    assert len(trajectories) == 4 and {t.group_id for t in trajectories} == {engine.group_id(0), engine.group_id(1)}
    assert all(t.error is None and t.policy_id == "default" for t in trajectories)


def test_one_builder_plays_a_plain_gymnasium_env(tiny_tokenizer):
    assert PLAIN_ID in agentrl.registered_ids()  # listed: it declares message spaces
    engine = build_rollout(RolloutSettings(PLAIN_ID), ScriptedPolicy(tiny_tokenizer, "echo"))
    trajectories = asyncio.run(engine.collect(num_groups=3))
    assert [t.reward for t in trajectories] == [1.0, 1.0, 1.0] and all(t.info["success"] for t in trajectories)


def test_one_builder_plays_a_multi_agent_env_with_a_policy_per_agent(tiny_tokenizer):
    policies = {agent: ScriptedPolicy(tiny_tokenizer, "I accept.") for agent in ("trader_0", "trader_1")}
    engine = build_rollout(
        RolloutSettings(
            "agentrl/Negotiation-v0", mapping="individual", limits=agentrl.rollout.EpisodeLimits(max_turns=2)
        ),
        policies,
    )
    assert isinstance(engine, MultiAgentRollout) and engine.roster == {
        "trader_0": "trader_0",
        "trader_1": "trader_1",
    }
    trajectories = asyncio.run(engine.collect(num_groups=1))
    assert sorted(t.policy_id for t in trajectories) == ["trader_0", "trader_1"]
    assert all(policy.calls > 0 for policy in policies.values())


def test_a_policy_id_nobody_serves_is_named(tiny_tokenizer):
    with pytest.raises(ValueError, match="played by policy 'default', but the policies given are for \\['other'\\]"):
        build_rollout(RolloutSettings("agentrl/Calculator-v0"), {"other": ScriptedPolicy(tiny_tokenizer, "x")})
    with pytest.raises(ValueError, match="policy 'trader_1'"):
        build_rollout(
            RolloutSettings("agentrl/Negotiation-v0", mapping="individual"),
            {"trader_0": ScriptedPolicy(tiny_tokenizer, "x")},
        )


def test_rollout_runs_through_the_builder_and_writes_its_trajectories(tiny_model_dir, tiny_tokenizer, tmp_path):
    out = tmp_path / "out.jsonl"
    config = RolloutConfig(
        env_id=PLAIN_ID, model=str(tiny_model_dir), backend="hf", episodes=4, group_size=2, out=str(out)
    )
    with pytest.warns(UserWarning, match="takes no split argument"):
        trajectories, stats = rollout(config, policy=ScriptedPolicy(tiny_tokenizer, "echo"))
    assert len(trajectories) == 4 and stats.successes == 4 and len(list(agentrl.read_jsonl(out))) == 4


def test_rollout_plays_a_multi_agent_env_with_one_shared_policy(tiny_model_dir, tiny_tokenizer):
    config = RolloutConfig(
        env_id="agentrl/Negotiation-v0", model=str(tiny_model_dir), backend="hf", episodes=2, max_turns=2
    )
    trajectories, stats = rollout(config, policy=ScriptedPolicy(tiny_tokenizer, "Claim: 1 book, 1 hat, 1 ball"))
    assert sorted(t.agent_id for t in trajectories) == ["trader_0", "trader_0", "trader_1", "trader_1"]
    assert {t.policy_id for t in trajectories} == {"default"} and stats.episodes == 4
