"""The set-up chain, written once: config -> policy -> agent -> engine, and the trainer.

Every entry point builds through here: ``agentrl rollout`` / ``eval`` (:mod:`agentrl.run`),
``agentrl train`` (:mod:`agentrl.train`), the Ray env workers (:mod:`agentrl.rollout.ray`) and a
script of your own (``examples/grpo_tool_arithmetic.py``)::

    policy = make_policy(config)                                     # the one backend table
    engine = build_rollout(rollout_settings(config, env_kwargs={"split": "train"}), policy)
    trajectories = asyncio.run(engine.collect(num_groups=8))

:func:`build_rollout` takes one frozen value, :class:`~agentrl.rollout.RolloutSettings`
(:func:`rollout_settings` makes it of an :class:`~agentrl.config.EngineConfig`), so callers that are
not driven by a config (a Ray worker, a test, a notebook) build the same engine. For a single-agent env it makes a
:class:`~agentrl.rollout.SingleAgentRollout`; for a multi-agent id a
:class:`~agentrl.rollout.MultiAgentRollout`, each agent's chat agent rendering with the
tokenizer of the policy it maps to.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from transformers import AutoTokenizer

from agentrl.agents.chat import ChatAgent
from agentrl.config import EngineConfig
from agentrl.env import AgentEnv, as_agent_env
from agentrl.mapping import policy_mapping
from agentrl.model_paths import DEFAULT_MODEL, resolve_model
from agentrl.policies import Policy, Sampling
from agentrl.policies import make_policy as make_backend
from agentrl.registry import is_multiagent, make, make_multiagent, takes_kwarg
from agentrl.rollout import EpisodeLimits, MultiAgentRollout, RolloutSettings, SingleAgentRollout, close_quietly
from agentrl.server.remote import EnvClient, remote_env_factory
from agentrl.server.remote_multiagent import remote_multiagent_factory
from agentrl.trainers.models import ValueModel, load_policy_model, load_reference_model, pad_token_id
from agentrl.trainers.trainer import Trainer, TrainerConfig

LocalRollout = SingleAgentRollout | MultiAgentRollout
"""A rollout whose episodes run in this process (a Ray env worker holds one)."""


def policy_options(config: EngineConfig) -> dict[str, Any]:
    """The keyword options ``config`` gives its backend (see :data:`agentrl.policies.BACKENDS`)."""
    if config.backend == "hf":
        return {"dtype": config.dtype}
    if config.backend == "vllm":
        return {
            "dtype": config.dtype,
            "max_model_len": config.max_length,
            "seed": config.seed,
            "gpu_memory_utilization": config.gpu_memory_utilization,
        }
    return {"base_url": config.base_url, "model": config.served_model_name}


def model_path(config: EngineConfig) -> str | None:
    """Where ``config.model`` loads from (``default`` converted on first use). ``None`` for an
    OpenAI server with the default model: the server says where its tokenizer is."""
    if config.backend == "openai" and config.model == DEFAULT_MODEL:
        return None
    return resolve_model(config.model)


def make_policy(config: EngineConfig, **options: Any) -> Policy:
    """The inference backend ``config.backend`` serving ``config.model``, in this process;
    ``options`` add to or override :func:`policy_options`."""
    return make_backend(config.backend, model_path(config), {**policy_options(config), **options})


def load_tokenizer(model: str) -> Any:
    """The tokenizer of ``model`` (a name :func:`~agentrl.model_paths.resolve_model` knows)."""
    return AutoTokenizer.from_pretrained(resolve_model(model))


def sampling_of(config: EngineConfig, *, temperature: float | None = None) -> Sampling:
    """The sampling settings ``config`` asks for (``temperature`` overrides its own)."""
    return Sampling(
        max_tokens=config.max_tokens,
        temperature=config.temperature if temperature is None else temperature,
        top_p=config.top_p,
        seed=config.seed,
    )


def limits_of(config: EngineConfig) -> EpisodeLimits:
    """The episode limits ``config`` asks for."""
    return EpisodeLimits(
        max_turns=config.max_turns,
        max_length=config.max_length,
        turn_timeout=config.turn_timeout,
        episode_timeout=config.episode_timeout,
    )


def rollout_settings(config: EngineConfig, **changes: Any) -> RolloutSettings:
    """How ``config`` plays its episodes, with ``changes`` (fields of
    :class:`~agentrl.rollout.RolloutSettings`: ``env_kwargs``, ``policy_id``, ``mapping``, ...)."""
    settings = RolloutSettings(
        env_id=config.env_id,
        env_kwargs=dict(config.env_kwargs),
        env_url=config.env_url,
        system_prompt=config.system_prompt,
        sampling=sampling_of(config),
        limits=limits_of(config),
        group_size=config.group_size,
        redundancy=config.redundancy,
        episode_retries=config.episode_retries,
        concurrency=config.concurrency,
        seed=config.seed,
    )
    return replace(settings, **changes)


def env_factory(env_id: str, env_kwargs: Mapping[str, Any] | None = None) -> Callable[[], AgentEnv]:
    """A function making a fresh single-agent env of ``env_id`` each call (a gymnasium-style env
    comes wrapped as an :class:`~agentrl.env.AgentEnv`, see :func:`~agentrl.env.as_agent_env`).

    ``split`` is the one argument the rollout passes on its own (``train`` to train, ``test`` to
    evaluate); an env whose constructor does not take it is made without it, with a warning that
    training and evaluation then draw from the same tasks.
    """
    kwargs = dict(env_kwargs or {})
    if "split" in kwargs and not takes_kwarg(env_id, "split"):
        warnings.warn(
            f"{env_id!r} takes no split argument, so training and evaluation draw from the same tasks; "
            "give its constructor a split parameter ('train' / 'test') for held-out evaluation.",
            stacklevel=2,
        )
        del kwargs["split"]
    return lambda: as_agent_env(make(env_id, **kwargs))  # adapted here too: the probe env is read before the engine


def build_rollout(settings: RolloutSettings, policies: Policy | Mapping[str, Policy]) -> LocalRollout:
    """The rollout of ``settings.env_id``: agents from the policies' tokenizers and the env's tools.

    ``policies`` is one policy (serving ``settings.policy_id``) or ``{policy_id: policy}``. A
    multi-agent env maps its agents to policy ids with ``settings.mapping``; a single-agent env is
    played by ``settings.policy_id``. One env is made here to read its tools (and its agents).
    With ``settings.env_url`` the env runs on that env server (``agentrl serve``), each episode a
    session of it (:class:`~agentrl.server.RemoteEnv`).
    """
    env_id, env_url, system_prompt = settings.env_id, settings.env_url, settings.system_prompt
    by_id = dict(policies) if isinstance(policies, Mapping) else {settings.policy_id: policies}
    kwargs = dict(settings.env_kwargs)
    if multiagent_at(env_id, env_url):
        make_env: Callable[[], Any] = (
            functools.partial(make_multiagent, env_id, **kwargs)
            if env_url is None
            else remote_multiagent_factory(env_url, env_id, kwargs)
        )
        agent_policy = policy_mapping(settings.mapping)
        probe = make_env()
        try:
            agents = {
                agent_id: ChatAgent(
                    _policy(by_id, agent_policy(agent_id), env_id).tokenizer,
                    getattr(probe.action_space(agent_id), "tools", ()),
                    system_prompt=system_prompt,
                    reply_prefix=getattr(probe.action_space(agent_id), "reply_prefix", ""),
                )
                for agent_id in probe.possible_agents
            }
        finally:
            probe.close()
        return MultiAgentRollout(make_env, agents, by_id, settings)
    policy = _policy(by_id, settings.policy_id, env_id)
    make_env = env_factory(env_id, kwargs) if env_url is None else remote_env_factory(env_url, env_id, kwargs)
    probe_env = make_env()
    try:
        agent = ChatAgent.from_env(policy.tokenizer, probe_env, system_prompt=system_prompt)
    finally:
        close_quietly(probe_env)
    return SingleAgentRollout(make_env, agent, policy, settings)


def multiagent_at(env_id: str, env_url: str | None = None) -> bool:
    """Whether ``env_id`` is a multi-agent env: by this process's registry, or as the env server at
    ``env_url`` describes it (``GET /envs``; the id need not be registered here)."""
    if env_url is None:
        return is_multiagent(env_id)
    client = EnvClient(env_url)
    try:
        return client.env_spec(env_id)["kind"] != "single"  # type: ignore[no-any-return]
    finally:
        client.close()


def agents_of(env_id: str, env_kwargs: Mapping[str, Any] | None = None, env_url: str | None = None) -> list[str]:
    """The possible agents of the multi-agent env ``env_id`` (a probe env is made, or the server asked)."""
    if env_url is not None:
        client = EnvClient(env_url)
        try:
            return list(client.env_spec(env_id)["agents"])
        finally:
            client.close()
    probe = make_multiagent(env_id, **dict(env_kwargs or {}))
    try:
        return list(probe.possible_agents)
    finally:
        probe.close()


def build_trainer(
    model_path: str,
    config: TrainerConfig,
    tokenizer: Any,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    wrap: Callable[[Any], Any] | None = None,
) -> Trainer:
    """The :class:`~agentrl.trainers.trainer.Trainer` of ``config`` on the model at ``model_path``
    (padding with ``tokenizer``'s pad id), with a reference model when ``config.kl_coef`` > 0 and a
    value model for PPO. ``wrap`` is applied to the policy model before the optimizer sees it
    (FSDP's ``fully_shard``, :mod:`agentrl.trainers.ranks`)."""
    model = load_policy_model(
        model_path,
        dtype=dtype,
        device=device,
        lora_rank=config.lora_rank,
        lora_alpha=config.lora_alpha,
        trainable_layers=config.trainable_layers,
        gradient_checkpointing=config.gradient_checkpointing,
    )
    if wrap is not None:
        model = wrap(model)
    ref_model = load_reference_model(model_path, device=device) if config.kl_coef > 0 else None
    value_model = ValueModel(model_path, device=device) if config.algorithm == "ppo" else None
    return Trainer(model, config, pad_token_id=pad_token_id(tokenizer), ref_model=ref_model, value_model=value_model)


def _policy(policies: Mapping[str, Policy], policy_id: str, env_id: str) -> Policy:
    if policy_id not in policies:
        raise ValueError(
            f"{env_id!r} is played by policy {policy_id!r}, but the policies given are for {sorted(policies)}; "
            f"pass {{{policy_id!r}: policy}}, or change the mapping (or policy_id)."
        )
    return policies[policy_id]
