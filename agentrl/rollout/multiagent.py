"""Multi-agent episodes: one PettingZoo env, several agents, each agent's turns to its own policy.

:func:`run_multiagent_episode` plays one episode of a ``ParallelEnv`` (every live agent acts at
once) or an ``AECEnv`` (agents take turns); every generation of an agent goes to
``policies[mapping(agent_id)]`` (:mod:`agentrl.mapping`), and each agent gets its own
:class:`~agentrl.types.Trajectory` (``agent_id``, ``policy_id``, the rewards that agent got).
:class:`MultiAgentRollout` plays many at once, exactly as
:class:`~agentrl.rollout.SingleAgentRollout` does for one agent: faults end the episode with ``error``
set on every agent's trajectory, are counted, and never stop the run. The env contract is
:mod:`agentrl.multiagent`.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from pettingzoo import AECEnv, ParallelEnv

from agentrl.agents.chat import ChatAgent
from agentrl.agents.trajectory import TrajectoryBuilder
from agentrl.faults import RunFailed
from agentrl.mapping import MappingPreset, policy_mapping
from agentrl.policies.base import Policy, Sampling
from agentrl.registry import MultiAgentEnv
from agentrl.rollout.episode import (
    EpisodeClock,
    EpisodeLimits,
    EpisodeTimeout,
    fit_to_room,
    timeout_error,
    turn_sampling_of,
)
from agentrl.rollout.scheduler import EpisodeTask, GroupScheduler, sample_sampling
from agentrl.rollout.settings import RolloutSettings
from agentrl.threads import ENV_THREADS
from agentrl.types import Message, Trajectory

# --- one episode ------------------------------------------------------------------------------


async def run_multiagent_episode(
    env: MultiAgentEnv,
    agents: ChatAgent | Mapping[str, ChatAgent],
    policies: Mapping[str, Policy],
    mapping: MappingPreset | str | Callable[[str], str],
    sampling: Sampling,
    limits: EpisodeLimits,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    env_id: str = "",
    group_id: str = "",
) -> dict[str, Trajectory]:
    """Play one episode of a PettingZoo env; return one trajectory per agent.

    ``agents`` is one :class:`~agentrl.agents.ChatAgent` per agent id (or one for all); each
    generation of ``agent_id`` goes to ``policies[mapping(agent_id)]``. An ``AECEnv`` is played in
    ``agent_iter`` order; in a ``ParallelEnv`` all live agents generate concurrently each step.
    ``limits.max_turns`` bounds each agent's turns; the first agent to run out of turns or context
    ends the episode for all (marked ``truncated``, ``info["truncated_by"]`` says why).

    The result has a trajectory for every agent of ``env.possible_agents`` (if the env has them)
    and every agent that took part; each has ``group_id`` ``f"{group_id}/{agent_id}"`` (each
    agent's samples of one task form their own GRPO group). Raises ``ValueError`` at once if a
    possible agent has no chat agent or no policy; after that never raises (except on
    cancellation and :class:`~agentrl.faults.RunFailed`): an env that raises or hangs past ``limits.turn_timeout``, or a policy that
    fails, sets ``error`` on every trajectory.

    >>> trajectories = await run_multiagent_episode(  # doctest: +SKIP
    ...     make_multiagent("agentrl/Negotiation-v0"), ChatAgent(tokenizer), {"default": policy},
    ...     "all", Sampling(max_tokens=128), EpisodeLimits(), seed=0)
    """
    if not isinstance(env, (ParallelEnv, AECEnv)):
        raise TypeError(f"run_multiagent_episode needs a PettingZoo ParallelEnv or AECEnv, got {type(env).__name__}.")
    episode = _Episode(agents, policies, policy_mapping(mapping), sampling, limits, env_id, group_id)
    roster = list(getattr(env, "possible_agents", None) or [])
    for agent_id in roster:
        episode.builder(agent_id)  # a missing agent or policy is a setup error: say so now
    started = time.perf_counter()
    try:
        async with episode.clock:
            if isinstance(env, AECEnv):
                await _play_aec(env, episode, seed, options)
            else:
                await _play_parallel(env, episode, seed, options)
    except EpisodeTimeout:
        episode.error = timeout_error(episode.clock, episode.phase)
    except RunFailed:  # the run cannot go on (its engine is gone for good): not this episode's fault
        raise
    except Exception as e:  # one bad episode is counted, never fatal
        episode.error = f"{type(e).__name__}: {e} (during {episode.phase})"
    return episode.finish({"seconds": time.perf_counter() - started, "seed": seed})


class _Episode:
    """The per-agent state of one episode: builders, turn counts, how each agent's part ended."""

    def __init__(
        self,
        agents: ChatAgent | Mapping[str, ChatAgent],
        policies: Mapping[str, Policy],
        mapping: Callable[[str], str],
        sampling: Sampling,
        limits: EpisodeLimits,
        env_id: str,
        group_id: str,
    ):
        self.agents, self.policies, self.mapping = agents, policies, mapping
        self.sampling, self.limits, self.env_id, self.group_id = sampling, limits, env_id, group_id
        self.builders: dict[str, TrajectoryBuilder] = {}
        self.policy_ids: dict[str, str] = {}
        self.started: set[str] = set()
        self.pending: set[str] = set()  # agents whose last turn the env has not answered yet
        self.turns: Counter[str] = Counter()
        self.ended: dict[str, tuple[bool, bool]] = {}  # agent -> (terminated, truncated) by the env
        self.infos: dict[str, dict[str, Any]] = {}
        self.unassigned: dict[str, float] = {}
        self.phase = "reset"
        self.clock = EpisodeClock(limits)
        self.error: str | None = None
        self.cut: str | None = None  # why the episode was cut short for everyone

    def builder(self, agent_id: str) -> TrajectoryBuilder:
        if agent_id in self.builders:
            return self.builders[agent_id]
        if isinstance(self.agents, ChatAgent):
            chat = self.agents
        elif agent_id in self.agents:
            chat = self.agents[agent_id]
        else:
            raise ValueError(f"No ChatAgent for agent {agent_id!r}; agents has {sorted(self.agents)}.")
        policy_id = self.mapping(agent_id)
        if policy_id not in self.policies:
            raise ValueError(
                f"Agent {agent_id!r} maps to policy {policy_id!r}, but policies has only "
                f"{sorted(self.policies)}; add it or change the mapping."
            )
        group = f"{self.group_id}/{agent_id}" if self.group_id else ""
        self.policy_ids[agent_id] = policy_id
        self.builders[agent_id] = TrajectoryBuilder(
            chat,
            max_length=self.limits.max_length,
            env_id=self.env_id,
            agent_id=agent_id,
            policy_id=policy_id,
            group_id=group,
        )
        return self.builders[agent_id]

    def begin(self, agent_id: str, messages: list[Message], reward: float, info: dict[str, Any]) -> None:
        """The agent's first observation; a reward before its first turn has no turn to go to."""
        self.builder(agent_id).start(messages)
        self.started.add(agent_id)
        self.infos[agent_id] = dict(info)
        self.unassigned[agent_id] = self.unassigned.get(agent_id, 0.0) + float(reward)

    def out_of_room(self, agent_ids: list[str]) -> bool:
        rooms = [self.builders[a].room_left for a in agent_ids]
        if any(room is not None and room <= 0 for room in rooms):
            self.cut = "max_length"
        return self.cut is not None

    async def generate(self, agent_id: str) -> Message:
        """The agent's next turn (the caller starts the clock: parallel agents share one start)."""
        builder = self.builders[agent_id]
        sampling = fit_to_room(turn_sampling_of(self.sampling, builder.agent), builder.room_left)
        policy = self.policies[self.policy_ids[agent_id]]
        generation = await policy.generate(builder.token_ids, sampling)
        self.turns[agent_id] += 1
        reply = builder.add_turn(generation.token_ids, generation.logprobs, generation.version)
        self.pending.add(agent_id)
        return reply

    def answer(
        self,
        agent_id: str,
        messages: list[Message],
        reward: float,
        terminated: bool,
        truncated: bool,
        info: dict[str, Any],
    ) -> None:
        """The env's answer to the agent's last turn; ends the episode if it would not fit."""
        builder = self.builders[agent_id]
        self.pending.discard(agent_id)
        self.infos.setdefault(agent_id, {}).update(info)
        if terminated or truncated:
            builder.add_final_observation(list(messages), float(reward))
            self.ended[agent_id] = (bool(terminated), bool(truncated))
        elif builder.would_exceed(messages):
            builder.add_final_observation(list(messages), float(reward))
            self.cut = "max_length"
        else:
            builder.add_observation(list(messages), float(reward))

    def finish(self, extra: dict[str, Any]) -> dict[str, Trajectory]:
        trajectories = {}
        for agent_id, builder in self.builders.items():
            terminated, truncated = self.ended.get(agent_id, (False, False))
            info = {**self.infos.get(agent_id, {}), **extra}
            if truncated:
                info["truncated_by"] = "env"
            elif agent_id not in self.ended and self.cut is not None and self.error is None:
                truncated, info["truncated_by"] = True, self.cut
            if self.error is not None:
                info["failed_during"] = self.phase
            if self.unassigned.get(agent_id):
                info["unassigned_reward"] = self.unassigned[agent_id]
            info["took_part"] = agent_id in self.started
            trajectories[agent_id] = builder.finish(
                terminated=terminated, truncated=truncated, error=self.error, info=info
            )
        return trajectories


async def _play_parallel(
    env: ParallelEnv[str, Any, Any], episode: _Episode, seed: int | None, options: dict[str, Any] | None
) -> None:
    observations, infos = await _env_call(functools.partial(env.reset, seed=seed, options=options), episode.clock)
    for agent_id in env.agents:
        episode.begin(agent_id, list(observations.get(agent_id, [])), 0.0, infos.get(agent_id, {}))
    for turn in range(episode.limits.max_turns):
        live = list(env.agents)
        if not live or episode.out_of_room(live):
            return
        episode.phase = f"generate (turn {turn})"
        episode.clock.start_call()
        replies = await _gather({a: episode.generate(a) for a in live})
        episode.phase = f"step (turn {turn})"
        observations, rewards, terminations, truncations, infos = await _env_call(
            functools.partial(env.step, replies), episode.clock
        )
        for agent_id in live:
            episode.answer(
                agent_id,
                list(observations.get(agent_id, [])),
                float(rewards.get(agent_id, 0.0)),
                bool(terminations.get(agent_id, False)),
                bool(truncations.get(agent_id, False)),
                infos.get(agent_id, {}),
            )
        for agent_id in env.agents:
            if agent_id not in episode.started:  # joined mid-episode
                episode.begin(
                    agent_id,
                    list(observations.get(agent_id, [])),
                    float(rewards.get(agent_id, 0.0)),
                    infos.get(agent_id, {}),
                )
        if episode.cut is not None:
            return
    if env.agents:
        episode.cut = "max_turns"


async def _play_aec(
    env: AECEnv[str, Any, Any], episode: _Episode, seed: int | None, options: dict[str, Any] | None
) -> None:
    def first() -> tuple[str, tuple[Any, ...]] | None:
        env.reset(seed=seed, options=options)
        return _selected(env)

    selected = await _env_call(first, episode.clock)
    idle = 0  # steps in a row without a generation: finished agents being removed
    while selected is not None:
        agent_id, (observation, reward, terminated, truncated, info) = selected
        if agent_id not in episode.started:
            episode.begin(agent_id, list(observation or []), float(reward), info)
        elif agent_id in episode.pending:
            episode.answer(agent_id, list(observation or []), float(reward), bool(terminated), bool(truncated), info)
        if (terminated or truncated) and agent_id not in episode.ended:
            episode.ended[agent_id] = (bool(terminated), bool(truncated))
        if episode.cut is not None:
            return
        action: Message | None = None
        if terminated or truncated:
            idle += 1
            if idle > 2 * len(getattr(env, "possible_agents", None) or [agent_id]) + 2:
                raise RuntimeError("the AEC env keeps selecting agents that have finished")
        else:
            turn = episode.turns[agent_id]
            if turn >= episode.limits.max_turns:
                episode.cut = "max_turns"
                return
            if episode.out_of_room([agent_id]):
                return
            idle = 0
            episode.phase = f"generate ({agent_id}, turn {turn})"
            episode.clock.start_call()
            action = await episode.generate(agent_id)
            episode.phase = f"step ({agent_id}, turn {turn})"

        def advance(action: Message | None = action) -> tuple[str, tuple[Any, ...]] | None:
            env.step(action)
            return _selected(env)

        selected = await _env_call(advance, episode.clock)


def _selected(env: AECEnv[str, Any, Any]) -> tuple[str, tuple[Any, ...]] | None:
    """The agent ``agent_iter`` would yield next and its ``last()``; ``None`` once all are done."""
    if not env.agents:
        return None
    return env.agent_selection, env.last()


async def _env_call(fn: Callable[[], Any], clock: EpisodeClock) -> Any:
    # A daemon thread, so an env stuck forever is abandoned at the timeout and never blocks shutdown.
    clock.start_call()
    return await ENV_THREADS.run(fn)


async def _gather(calls: Mapping[str, Any]) -> dict[str, Any]:
    """Await all ``calls`` concurrently; if one fails, cancel the others before raising."""
    tasks = {key: asyncio.ensure_future(call) for key, call in calls.items()}
    try:
        results = await asyncio.gather(*tasks.values())
    except BaseException:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        raise
    return dict(zip(tasks, results))


# --- many episodes ----------------------------------------------------------------------------


class MultiAgentRollout(GroupScheduler[MultiAgentEnv]):
    """Runs groups of multi-agent episodes concurrently, like :class:`~agentrl.rollout.SingleAgentRollout`.

    A :class:`~agentrl.rollout.scheduler.GroupScheduler` whose play function is
    :func:`run_multiagent_episode` with ``settings``' mapping, sampling and limits: each group plays ``group_size`` (+ ``redundancy``) episodes of
    the same task (the same env seed), at most ``concurrency`` at once, and :meth:`stream` /
    :meth:`stream_episodes` take the same arguments. Each agent's trajectories of a group share
    ``group_id`` ``"<env_id>#<seed>-<group>/<agent_id>"``, so a
    :class:`~agentrl.rollout.buffer.TrajectoryBuffer` releases one group per agent. ``stats`` counts
    every trajectory (one per agent per episode), ``policy_stats`` the same per policy id;
    ``episodes`` / ``failed_episodes`` count episodes. One env is made at construction to check
    that every agent has a chat agent and a policy.

    >>> engine = MultiAgentRollout(  # doctest: +SKIP
    ...     lambda: make_multiagent("agentrl/Negotiation-v0"), ChatAgent(tokenizer),
    ...     {"trader_0": policy_a, "trader_1": policy_b}, RolloutSettings(mapping="individual", group_size=4))
    >>> trajectories = asyncio.run(engine.collect(num_groups=8))  # doctest: +SKIP
    """

    def __init__(
        self,
        make_env: Callable[[], MultiAgentEnv],
        agents: ChatAgent | Mapping[str, ChatAgent],
        policies: Mapping[str, Policy],
        settings: RolloutSettings = RolloutSettings(),
    ):
        super().__init__(make_env, self.play_episode, settings)
        self.agents, self.policies = agents, dict(policies)
        self.mapping = policy_mapping(settings.mapping)
        env = make_env()
        self.roster = self._roster(env)
        """``{agent_id: policy_id}`` for every possible agent of the env (checked at construction)."""
        self._idle_envs.append(env)

    async def play_episode(self, env: MultiAgentEnv, task: EpisodeTask) -> list[Trajectory]:
        """The play function: one :func:`run_multiagent_episode`; its trajectories in agent order."""
        trajectories = await run_multiagent_episode(
            env,
            self.agents,
            self.policies,
            self.mapping,
            sample_sampling(self.settings.sampling, task.env_seed, task.sample),
            self.settings.limits,
            seed=task.env_seed,
            env_id=self.settings.env_id,
            group_id=task.group_id,
        )
        return list(trajectories.values())

    def _roster(self, env: MultiAgentEnv) -> dict[str, str]:
        settings = self.settings
        check = _Episode(
            self.agents, self.policies, self.mapping, settings.sampling, settings.limits, settings.env_id, ""
        )
        for agent_id in getattr(env, "possible_agents", None) or []:
            check.builder(agent_id)
        return dict(check.policy_ids)
