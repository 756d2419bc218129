"""``agentrl rollout`` / ``agentrl eval`` as a function: play episodes of an env with a model.

:class:`~agentrl.config.RolloutConfig` holds every setting (a YAML file fills it; the CLI overrides
any field as ``key=value``); :func:`rollout` builds the policy and the engine from it
(:mod:`agentrl.build`), plays the episodes here or on a Ray cluster (``ray_address``), calls a
progress callback per episode, and returns the trajectories and the stats. A multi-agent env id
plays with the one policy for every agent (MARLlib's ``all`` mapping): one trajectory per agent
per episode.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.build import build_rollout, make_policy, model_path, policy_options, rollout_settings
from agentrl.config import RolloutConfig
from agentrl.model_paths import resolve_model
from agentrl.policies import Policy
from agentrl.rollout import RolloutSettings, RolloutStats
from agentrl.types import Trajectory, write_jsonl

OnEpisode = Callable[[list[Trajectory], RolloutStats], None]
"""Called with each episode as it ends (its trajectories: one per agent that acted, one for a
single-agent env) and the stats of every trajectory so far."""


def rollout(
    config: RolloutConfig, policy: Any = None, on_episode: OnEpisode | None = None
) -> tuple[list[Trajectory], RolloutStats]:
    """Play ``config.episodes`` episodes; return the trajectories (completion order) and stats.

    Pass ``policy`` to reuse a running engine (a :class:`~agentrl.policies.Policy`, or with
    ``ray_address`` a :class:`~agentrl.policies.ray_actor.PolicyActor` handle); otherwise one is
    built and closed here.
    """
    if config.ray_address is not None:
        trajectories, stats = _rollout_on_ray(config, policy, on_episode)
    else:
        trajectories, stats = _rollout_here(config, policy, on_episode)
    if config.out:
        Path(config.out).parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(config.out, trajectories)
    return trajectories, stats


def _rollout_here(
    config: RolloutConfig, policy: Policy | None, on_episode: OnEpisode | None
) -> tuple[list[Trajectory], RolloutStats]:
    own_policy = policy is None
    policy = policy or make_policy(config)
    try:
        engine = build_rollout(_settings(config), policy)
        try:
            trajectories = asyncio.run(collect(engine, config.episodes // config.group_size, on_episode))
        finally:
            engine.close()
    finally:
        if own_policy:
            policy.close()
    return trajectories, engine.stats


def _rollout_on_ray(
    config: RolloutConfig, actor: Any, on_episode: OnEpisode | None
) -> tuple[list[Trajectory], RolloutStats]:
    """On the Ray cluster at ``config.ray_address``: one env worker per node, sharing
    ``config.concurrency`` between them, and a policy actor built from the same config (or
    ``actor``, a running one)."""
    import ray  # an optional dependency, only for ray_address

    from agentrl.policies.ray_actor import start_policy_actor  # these two import Ray at module level
    from agentrl.rollout.ray import cluster_rollout

    if actor is not None and not isinstance(actor, ray.actor.ActorHandle):
        raise ValueError(
            f"rollout with ray_address={config.ray_address!r} got a {type(actor).__name__}, which lives in "
            "this process; pass a PolicyActor handle, or no policy to start one from the config."
        )
    own_ray = not ray.is_initialized()
    if own_ray:
        ray.init(address=None if config.ray_address == "local" else config.ray_address)
    own_actor = actor is None
    try:
        # Resolved once, here: the checkpoint path must then be readable on every node. The workers'
        # tokenizer is the model's, also where a server holds the model (model_path gives None then).
        path = model_path(config)
        tokenizer = path or resolve_model(config.model)
        if actor is None:
            actor = start_policy_actor(config.backend, path, policy_options(config))
        with cluster_rollout(actor, tokenizer, _settings(config)) as distributed:
            trajectories = asyncio.run(collect(distributed, config.episodes // config.group_size, on_episode))
    finally:
        if own_actor and actor is not None:
            ray.kill(actor)
        if own_ray:
            ray.shutdown()
    return trajectories, distributed.stats


def _settings(config: RolloutConfig) -> RolloutSettings:
    return rollout_settings(config, env_kwargs={**config.env_kwargs, "split": config.split})


async def collect(engine: Any, num_groups: int, on_episode: OnEpisode | None = None) -> list[Trajectory]:
    """Drain ``engine.stream_episodes(num_groups)`` (a local or distributed engine), calling
    ``on_episode``; return the trajectories."""
    trajectories = []
    async for episode in engine.stream_episodes(num_groups):
        trajectories += episode
        if on_episode is not None:
            on_episode(episode, engine.stats)
    return trajectories


__all__ = ["RolloutConfig", "collect", "rollout"]
