"""From a config to a plan: which policies the run has, who plays which agent, and the refusals
that remain. A single-agent env is played by one policy, ``default``, with whole weights; a
multi-agent env by the policies its ``mapping`` gives its agents (``policies:``, MARLlib-style).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agentrl.build import agents_of, multiagent_at
from agentrl.config import ConfigError, load_function
from agentrl.mapping import PRESETS, SHARED_POLICY_ID, policy_mapping
from agentrl.registry import spec
from agentrl.suggest import did_you_mean
from agentrl.train.config import PolicyConfig, TrainConfig
from agentrl.train.samples import SampleMaker
from agentrl.trainers.trainer import TrainerConfig


@dataclass
class Plan:
    """What :func:`plan` makes of a config."""

    multiagent: bool
    mapping: Callable[[str], str]
    policies: dict[str, PolicyConfig]
    """Every policy of the run, by id."""
    settings: dict[str, TrainerConfig]
    """Each trainable policy's trainer settings, filled in (``TrainConfig.trainer_settings``)."""
    samples: SampleMaker


def plan(config: TrainConfig) -> Plan:
    """The run's policies, mapping and sample hooks, checked against its env.

    Raises ``ConfigError`` for a mapping that gives a policy id with no ``policies`` entry, an entry
    no agent maps to, a LoRA policy on another base than the engine's, a backend that cannot take
    weights, or a setting the env's kind does not take.
    """
    env_id, env_url = config.rollout.env_id, config.rollout.env_url
    if not multiagent_at(env_id, env_url):
        if config.rollout.env_url is None:
            spec(env_id)  # an unknown env fails now, not after the engine started
        settings = {SHARED_POLICY_ID: config.trainer_settings()}
        return Plan(False, policy_mapping("all"), _single(config), settings, _sample_maker(config))
    if config.curriculum.selection == "pcl":
        raise ConfigError(
            "curriculum.selection pcl chooses a single-agent env's prompts with a value model of its first "
            "observation; a multi-agent run plays its seeds in order or filters them (use filter or uniform)."
        )
    mapping, policies = resolve_policies(config, agents_of(env_id, config.rollout.env_kwargs, env_url))
    settings = {p: config.trainer_settings(p) for p in policies}
    return Plan(True, mapping, policies, settings, _sample_maker(config))


def _sample_maker(config: TrainConfig) -> SampleMaker:
    """The run's ``reward_fn``, ``samples_fn`` and ``metrics_fn`` (an episode of a single-agent env is ``{"agent": trajectory}``)."""
    return SampleMaker(
        load_function(config.reward_fn, "reward_fn") if config.reward_fn else None,
        load_function(config.samples_fn, "samples_fn") if config.samples_fn else None,
        config.samples_args,
        load_function(config.metrics_fn, "metrics_fn") if config.metrics_fn else None,
        config.metrics_args,
    )


def _single(config: TrainConfig) -> dict[str, PolicyConfig]:
    """A single-agent run's one policy: ``default``, whole weights (``policies.default`` may say more)."""
    unknown = sorted(set(config.policies) - {SHARED_POLICY_ID})
    if unknown:
        raise ConfigError(
            f"{config.rollout.env_id!r} is a single-agent env, played by one policy, {SHARED_POLICY_ID!r}; "
            f"policies names {unknown}: remove them (or use a multi-agent env)."
        )
    policy = config.policies.get(SHARED_POLICY_ID, PolicyConfig(weights="full"))
    if policy.weights != "full" or not policy.trainable or policy.init_from:
        raise ConfigError(
            f"a single-agent run trains its one policy with whole weights (trainer.lora_rank trains LoRA inside "
            f"them); policies.{SHARED_POLICY_ID} must keep weights: full, trainable: true and no init_from."
        )
    if config.eval_against_base:
        raise ConfigError(
            f"eval_against_base plays each trained policy against the base model in the env's other seats; "
            f"{config.rollout.env_id!r} is a single-agent env, with none: remove eval_against_base."
        )
    return {SHARED_POLICY_ID: policy}


def resolve_policies(config: TrainConfig, agents: list[str]) -> tuple[Callable[[str], str], dict[str, PolicyConfig]]:
    """The mapping function and every policy's settings, checked against the env's ``agents``."""
    if config.mapping in PRESETS:
        mapping = policy_mapping(config.mapping)
    elif ":" in config.mapping:
        mapping = load_function(config.mapping, "mapping")
    else:
        raise ConfigError(
            f"mapping {config.mapping!r} is neither a preset {PRESETS} nor module:function. "
            f"{did_you_mean(config.mapping, PRESETS)}".rstrip()
        )
    roster = {agent: mapping(agent) for agent in agents}
    mapped = sorted(set(roster.values()))
    policies = dict(config.policies) or {policy_id: PolicyConfig() for policy_id in mapped}
    for agent, policy_id in roster.items():
        if policy_id not in policies:
            raise ConfigError(
                f"mapping {config.mapping!r} gives agent {agent!r} policy {policy_id!r}, which has no entry in "
                f"policies ({sorted(policies)}); add policies.{policy_id}, or change the mapping. "
                f"{did_you_mean(policy_id, policies)}".rstrip()
            )
    for policy_id in policies:
        if policy_id not in mapped:
            raise ConfigError(
                f"policies.{policy_id} is played by no agent: mapping {config.mapping!r} gives {roster}; "
                "remove the entry or change the mapping."
            )
    if config.rollout.backend not in ("vllm", "hf"):
        raise ConfigError(
            f"training needs an engine that takes new weights: rollout.backend vllm or hf, not {config.rollout.backend!r}."
        )
    for policy_id, policy in policies.items():
        if policy.weights == "lora" and policy.model not in (None, config.rollout.model):
            raise ConfigError(
                f"policies.{policy_id} is a LoRA adapter on model {policy.model!r}, but the shared engine serves "
                f"rollout.model {config.rollout.model!r}: adapters need the engine's base. Set weights: full to "
                f"give it an engine of its own, or leave its model unset."
            )
        if policy.init_from is not None and not policy.trainable:
            raise ConfigError(
                f"policies.{policy_id}.init_from applies when it starts training, but it is not trainable."
            )
        if policy.init_from in policies and not policies[policy.init_from].trainable:
            raise ConfigError(
                f"policies.{policy_id}.init_from names {policy.init_from!r}, which never trains: give "
                f"policies.{policy_id} the same model instead."
            )
    return mapping, policies
