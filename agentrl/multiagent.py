"""Several agents in one episode: policy mapping, a registry for PettingZoo envs, and their rollout.

A multi-agent env is a PettingZoo env, :class:`pettingzoo.ParallelEnv` (every live agent acts at
once) or :class:`pettingzoo.AECEnv` (agents take turns), that speaks the single-agent message
contract per agent: an observation is the list of *new* messages for that agent since it last
acted (a :class:`MessageList`), and an action is the reply text or an assistant
:class:`~agentrl.types.Message`. Spaces are :class:`~agentrl.env.MessagesSpace` and
:class:`~agentrl.env.ReplySpace`, one object per agent.

Each agent id maps to a policy id (:func:`policy_mapping`, with MARLlib's ``all`` / ``group`` /
``individual`` presets); every generation of an agent goes to ``policies[mapping(agent_id)]``, and
each agent gets its own :class:`~agentrl.types.Trajectory` (``agent_id``, ``policy_id``, the rewards
that agent got). :func:`run_multiagent_episode` plays one episode, :class:`MultiAgentRolloutEngine`
many at once, exactly as :mod:`agentrl.rollout` does for one agent: faults end the episode with
``error`` set on every agent's trajectory, are counted, and never stop the run.

Gymnasium's registry only makes ``gymnasium.Env`` s, so multi-agent envs have their own small
registry here, mirroring ``agentrl.register`` / ``agentrl.make`` (same ``namespace/Name-vN`` ids,
same "did you mean" errors, loaded from the same ``agentrl.envs`` entry-point group), and kept out
of ``agentrl.registered_ids()``::

    env = make_multiagent("agentrl/Negotiation-v0")              # a ParallelEnv
    aec = make_multiagent("agentrl/Negotiation-v0", api="aec")   # the same game as an AECEnv
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import re
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, overload

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator, parse_env_id
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import aec_to_parallel, parallel_to_aec

from agentrl.agents.chat import ChatAgent, TrajectoryBuilder
from agentrl.policy import Policy, Sampling
from agentrl.registry import UnknownEnvError, load_plugins
from agentrl.rollout import (
    EpisodeClock,
    EpisodeLimits,
    EpisodeTask,
    EpisodeTimeout,
    GroupScheduler,
    RolloutStats,
    add_episode,
    fit_to_room,
    sample_sampling,
    timeout_error,
    turn_sampling_of,
)
from agentrl.threads import ENV_THREADS
from agentrl.types import Message, Trajectory

MultiAgentEnv: TypeAlias = ParallelEnv[str, Any, Any] | AECEnv[str, Any, Any]
MappingPreset = Literal["all", "group", "individual"]
PRESETS: tuple[str, ...] = ("all", "group", "individual")
SHARED_POLICY_ID = "default"
"""The policy id of the ``all`` preset: the same name single-agent runs use, so a one-policy
trainer config works unchanged whether one agent or several play."""

# --- policy mapping ---------------------------------------------------------------------------


def group_of(agent_id: str) -> str:
    """The team prefix of ``agent_id``: the id without its trailing number, underscore kept.

    Only digits right after the *last* underscore at the very end are dropped, so ``red_tank_3``
    is in team ``red_tank_``. MARLlib's code instead cuts at the *first* underscore (``red_``); the
    two agree on the usual ``<team>_<number>`` ids. An id without a trailing ``_<number>`` is a
    team of its own.

    >>> group_of("adversary_0"), group_of("red_tank_12"), group_of("judge")
    ('adversary_', 'red_tank_', 'judge')
    """
    return re.sub(r"(?<=_)\d+$", "", agent_id)


def policy_mapping(mapping: MappingPreset | str | Callable[[str], str]) -> Callable[[str], str]:
    """The ``agent_id -> policy_id`` function for a MARLlib preset, or ``mapping`` itself if callable.

    - ``all``: every agent shares one policy, :data:`SHARED_POLICY_ID` (``"default"``);
    - ``group``: one policy per team, named by the team prefix (:func:`group_of`);
    - ``individual``: one policy per agent, named by the agent id.

    >>> [policy_mapping("group")(a) for a in ("adversary_0", "adversary_1", "agent_0")]
    ['adversary_', 'adversary_', 'agent_']
    >>> policy_mapping("all")("agent_0"), policy_mapping("individual")("agent_0")
    ('default', 'agent_0')
    """
    if callable(mapping):
        return mapping
    if mapping == "all":
        return _shared
    if mapping == "group":
        return group_of
    if mapping == "individual":
        return _individual
    close = difflib.get_close_matches(str(mapping), PRESETS, n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"Unknown policy mapping {mapping!r}; expected one of {PRESETS} or a callable agent_id -> policy_id.{hint}"
    )


def _shared(agent_id: str) -> str:
    return SHARED_POLICY_ID


def _individual(agent_id: str) -> str:
    return agent_id


# --- observations and the registry --------------------------------------------------------------


class MessageList(list[Message]):
    """A multi-agent env's observation for one agent: a plain list of new messages.

    The one addition to ``list`` is ``dtype = None``, equal to ``MessagesSpace().dtype``:
    PettingZoo's ``api_test`` compares each observation's ``dtype`` with its space's, a check
    written for numpy observations, and a bare list has no ``dtype`` to compare.
    """

    dtype: None = None


@dataclass(frozen=True)
class MultiAgentSpec:
    """What :func:`register_multiagent` stored for one id."""

    id: str
    entry_point: str | Callable[..., Any]
    """``"module:attr"`` (imported when first made) or a callable returning a PettingZoo env."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Default constructor arguments; ``make_multiagent`` keyword arguments override them."""


_REGISTRY: dict[str, MultiAgentSpec] = {}


def register_multiagent(id: str, entry_point: str | Callable[..., Any], kwargs: dict[str, Any] | None = None) -> None:
    """Register a PettingZoo env under ``id`` (``namespace/Name-vN``), as ``agentrl.register`` does
    for single-agent envs. The entry point may build a ``ParallelEnv`` or an ``AECEnv``.

    >>> register_multiagent("mypkg/Debate-v0", "mypkg.debate:DebateEnv", {"rounds": 3})  # doctest: +SKIP
    """
    parse_env_id(id)  # raises gymnasium's own error for a malformed id
    if id in gym.registry:
        raise ValueError(f"{id!r} is already a single-agent env id in gymnasium's registry; pick another id.")
    if id in _REGISTRY:
        warnings.warn(f"Overriding multi-agent env {id!r}, already registered.", stacklevel=2)
    _REGISTRY[id] = MultiAgentSpec(id, entry_point, dict(kwargs or {}))


def multiagent_spec(id: str) -> MultiAgentSpec:
    """The spec registered under ``id``; unknown ids raise :class:`~agentrl.registry.UnknownEnvError`."""
    load_plugins()
    if id in _REGISTRY:
        return _REGISTRY[id]
    raise UnknownEnvError(_unknown_message(id))


def multiagent_ids(namespace: str | None = None) -> list[str]:
    """The registered multi-agent ids, sorted (``namespace="agentrl"`` for the built-ins only)."""
    load_plugins()
    return sorted(i for i in _REGISTRY if namespace is None or i.startswith(f"{namespace}/"))


@overload
def make_multiagent(id: str, *, api: Literal["parallel"] = "parallel", **kwargs: Any) -> ParallelEnv[str, Any, Any]: ...
@overload
def make_multiagent(id: str, *, api: Literal["aec"], **kwargs: Any) -> AECEnv[str, Any, Any]: ...
def make_multiagent(id: str, *, api: Literal["parallel", "aec"] = "parallel", **kwargs: Any) -> MultiAgentEnv:
    """Make the multi-agent env registered under ``id``, as a ``ParallelEnv`` (``api="parallel"``)
    or an ``AECEnv`` (``api="aec"``), converting with PettingZoo's own wrappers when the registered
    class is the other kind. ``kwargs`` override the registered ones.

    >>> env = make_multiagent("agentrl/Negotiation-v0", split="test")
    >>> observations, infos = env.reset(seed=0)
    >>> sorted(observations)
    ['trader_0', 'trader_1']
    """
    if api not in ("parallel", "aec"):
        raise ValueError(f"api must be 'parallel' or 'aec', got {api!r}.")
    spec = multiagent_spec(id)
    entry_point = spec.entry_point
    creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    env = creator(**{**spec.kwargs, **kwargs})
    if isinstance(env, ParallelEnv):
        return env if api == "parallel" else parallel_to_aec(env)
    if isinstance(env, AECEnv):
        if api == "aec":
            return env
        if not env.metadata.get("is_parallelizable", False):
            raise ValueError(
                f"{id!r} is a turn-based AEC env not marked parallelizable "
                "(metadata['is_parallelizable']); make it with api='aec'."
            )
        return aec_to_parallel(env)
    raise TypeError(f"The entry point of {id!r} built a {type(env).__name__}, not a PettingZoo env.")


def _unknown_message(id: str) -> str:
    if id in gym.registry:
        return f"{id!r} is a single-agent env; make it with agentrl.make({id!r})."
    candidates = list(_REGISTRY)
    close = difflib.get_close_matches(id, candidates, n=3, cutoff=0.6)
    if not close:  # without version and case too: "negotiation" finds "agentrl/Negotiation-v0"
        lowered = {c.lower(): c for c in candidates}
        close = [lowered[c] for c in difflib.get_close_matches(id.lower(), list(lowered), n=3, cutoff=0.5)]
    message = f"Unknown multi-agent env {id!r}."
    if close:
        return message + " Did you mean " + " or ".join(repr(c) for c in close) + "?"
    return message + f" Registered multi-agent envs: {sorted(candidates)}."


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
    cancellation): an env that raises or hangs past ``limits.turn_timeout``, or a policy that
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


class MultiAgentRolloutEngine(GroupScheduler[MultiAgentEnv]):
    """Runs groups of multi-agent episodes concurrently, like :class:`~agentrl.rollout.RolloutEngine`.

    The scheduling is the same :class:`~agentrl.rollout.GroupScheduler`: each group plays
    ``group_size`` (+ ``redundancy``) episodes of the same task (the same env seed), at most
    ``concurrency`` at once, and :meth:`stream` / :meth:`stream_episodes` take the same arguments. Each
    agent's trajectories of a group share ``group_id`` ``"<env_id>#<seed>-<group>/<agent_id>"``,
    so a :class:`~agentrl.buffer.TrajectoryBuffer` releases one group per agent. ``stats`` counts
    every trajectory (one per agent per episode), ``policy_stats`` the same per policy id;
    ``episodes`` / ``failed_episodes`` count episodes. One env is made at construction to check
    that every agent has a chat agent and a policy.

    >>> engine = MultiAgentRolloutEngine(  # doctest: +SKIP
    ...     lambda: make_multiagent("agentrl/Negotiation-v0"), ChatAgent(tokenizer),
    ...     {"trader_0": policy_a, "trader_1": policy_b}, mapping="individual", group_size=4)
    >>> trajectories = asyncio.run(engine.collect(num_groups=8))  # doctest: +SKIP
    """

    def __init__(
        self,
        make_env: Callable[[], MultiAgentEnv],
        agents: ChatAgent | Mapping[str, ChatAgent],
        policies: Mapping[str, Policy],
        mapping: MappingPreset | str | Callable[[str], str] = "all",
        *,
        env_id: str = "",
        sampling: Sampling = Sampling(),
        limits: EpisodeLimits = EpisodeLimits(),
        group_size: int = 1,
        redundancy: int = 0,
        concurrency: int = 64,
        seed: int = 0,
    ):
        super().__init__(
            make_env, env_id=env_id, group_size=group_size, redundancy=redundancy, concurrency=concurrency, seed=seed
        )
        self.agents, self.policies = agents, dict(policies)
        self.mapping = policy_mapping(mapping)
        self.sampling, self.limits = sampling, limits
        self.stats = RolloutStats()
        self.policy_stats: dict[str, RolloutStats] = {}
        self.episodes = 0
        self.failed_episodes = 0
        env = make_env()
        self.roster = self._roster(env)
        """``{agent_id: policy_id}`` for every possible agent of the env (checked at construction)."""
        self._idle_envs.append(env)

    async def play(self, env: MultiAgentEnv, task: EpisodeTask) -> list[Trajectory]:
        """One :func:`run_multiagent_episode`; its trajectories in agent order."""
        trajectories = await run_multiagent_episode(
            env,
            self.agents,
            self.policies,
            self.mapping,
            sample_sampling(self.sampling, task.env_seed, task.sample),
            self.limits,
            seed=task.env_seed,
            env_id=self.env_id,
            group_id=task.group_id,
        )
        return list(trajectories.values())

    def count(self, episode: Sequence[Trajectory], seconds: float) -> None:
        """Count the episode and add its trajectories to :attr:`stats` and :attr:`policy_stats`."""
        self.episodes += 1
        self.failed_episodes += any(t.error is not None for t in episode)
        add_episode(self.stats, self.policy_stats, episode, seconds)

    def _roster(self, env: MultiAgentEnv) -> dict[str, str]:
        check = _Episode(self.agents, self.policies, self.mapping, self.sampling, self.limits, self.env_id, "")
        for agent_id in getattr(env, "possible_agents", None) or []:
            check.builder(agent_id)
        return dict(check.policy_ids)
