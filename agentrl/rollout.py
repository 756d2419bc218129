"""The rollout engine: many episodes at once, each an asyncio task, all sharing the policy's engine.

One episode is a straight loop (:func:`run_episode`): render the observation, generate, let the env
answer, repeat. The :class:`RolloutEngine` runs many of them concurrently. A slow env call in one
episode never blocks another: env calls go through ``areset`` / ``astep`` (a thread unless the env
is natively async), and the policy batches the concurrent generation requests.

Nothing one episode does can stop the run. An env that raises, an env or a policy that runs past
its time limit, or a context that fills up ends *that* episode: its trajectory comes back with
``error`` (for failures) or ``truncated`` (for limits) set, and the engine counts it. An env that
failed or hung is thrown away and a fresh one is made for the next episode, since it may be stuck in
a thread that cannot be killed.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from agentrl.agents.chat import ChatAgent, TrajectoryBuilder
from agentrl.buffer import TrajectoryBuffer
from agentrl.env import AgentEnv
from agentrl.policy import Policy, Sampling
from agentrl.types import Trajectory


@dataclass(frozen=True)
class EpisodeLimits:
    """When an episode is cut short."""

    max_turns: int = 8
    """Most policy turns per episode; reaching it marks the episode truncated."""
    max_length: int | None = 4096
    """Most tokens in the whole sequence (prompt, turns and observations); ``None`` for no limit."""
    turn_timeout: float | None = 120.0
    """Seconds one generation or one env call may take before the episode fails."""
    episode_timeout: float | None = 600.0
    """Seconds a whole episode may take before it fails."""


class EpisodeTimeout(TimeoutError):
    """An env call, a generation or a whole episode ran past its time limit."""


async def run_episode(
    env: AgentEnv,
    agent: ChatAgent,
    policy: Policy,
    sampling: Sampling,
    limits: EpisodeLimits,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    env_id: str = "",
    group_id: str = "",
    agent_id: str = "agent",
    policy_id: str = "default",
) -> Trajectory:
    """Play one episode and return its trajectory; never raises except on cancellation.

    The final step's ``info`` (``success`` and the like) lands in ``trajectory.info``.
    """
    builder = TrajectoryBuilder(
        agent, max_length=limits.max_length, env_id=env_id, agent_id=agent_id, policy_id=policy_id, group_id=group_id
    )
    started = time.perf_counter()
    state = _EpisodeState()
    try:
        async with asyncio.timeout(limits.episode_timeout):
            await _play(env, builder, policy, sampling, limits, seed, options, state)
    except TimeoutError as e:
        where = state.phase
        limit = limits.episode_timeout if not isinstance(e, EpisodeTimeout) else limits.turn_timeout
        scope = "episode" if not isinstance(e, EpisodeTimeout) else where
        state.error = f"EpisodeTimeout: the {scope} ran past its limit of {limit} s (during {where})"
    except Exception as e:  # one bad episode is counted, never fatal
        state.error = f"{type(e).__name__}: {e} (during {state.phase})"
    info = {**state.info, "seconds": time.perf_counter() - started, "seed": seed}
    if state.error is not None:
        info["failed_during"] = state.phase
    return _finish(builder, state, info)


@dataclass
class _EpisodeState:
    phase: str = "reset"
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    final_reward: float = 0.0


async def _play(
    env: AgentEnv,
    builder: TrajectoryBuilder,
    policy: Policy,
    sampling: Sampling,
    limits: EpisodeLimits,
    seed: int | None,
    options: dict[str, Any] | None,
    state: _EpisodeState,
) -> None:
    observation, _ = await _within(env.areset(seed=seed, options=options), limits.turn_timeout)
    builder.start(observation)
    stop_ids = tuple(dict.fromkeys([*sampling.stop_token_ids, *builder.agent.end_of_turn_ids]))
    for turn in range(limits.max_turns):
        room = builder.room_left
        if room is not None and room <= 0:
            state.truncated, state.info["truncated_by"] = True, "max_length"
            return
        turn_sampling = replace(
            sampling, max_tokens=min(sampling.max_tokens, room or sampling.max_tokens), stop_token_ids=stop_ids
        )
        state.phase = f"generate (turn {turn})"
        generation = await _within(policy.generate(builder.token_ids, turn_sampling), limits.turn_timeout)
        reply = builder.add_turn(generation.token_ids, generation.logprobs, generation.version)
        state.phase = f"step (turn {turn})"
        result = await _within(env.astep(reply), limits.turn_timeout)
        state.info.update(result.info)
        if result.terminated or result.truncated:
            # The last answer is kept in the conversation but not tokenised: nothing follows it.
            builder.add_final_observation(result.observation, float(result.reward))
            state.terminated, state.truncated = result.terminated, result.truncated
            if result.truncated:
                state.info["truncated_by"] = "env"
            return
        if builder.would_exceed(result.observation):
            builder.add_final_observation(result.observation, float(result.reward))
            state.truncated, state.info["truncated_by"] = True, "max_length"
            return
        builder.add_observation(result.observation, float(result.reward))
    state.truncated, state.info["truncated_by"] = True, "max_turns"


async def _within(awaitable: Any, timeout: float | None) -> Any:
    # asyncio.timeout, not wait_for: on Python 3.11 wait_for runs every call in a new task, about
    # 4x the cost (40 µs against 11 µs here, twice per turn; benchmarks/rollout_overhead.py).
    try:
        async with asyncio.timeout(timeout):
            return await awaitable
    except TimeoutError as e:
        raise EpisodeTimeout() from e


def _finish(builder: TrajectoryBuilder, state: _EpisodeState, info: dict[str, Any]) -> Trajectory:
    return builder.finish(
        terminated=state.terminated, truncated=state.truncated, error=state.error, info=info
    )


@dataclass
class RolloutStats:
    """What a rollout produced, for the summary table and the ``rollout/…`` metrics."""

    episodes: int = 0
    failed: int = 0
    successes: int = 0
    reward_sum: float = 0.0
    turns_sum: int = 0
    generated_tokens: int = 0
    truncated: int = 0
    failure_causes: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def add(self, trajectory: Trajectory) -> None:
        self.episodes += 1
        self.turns_sum += trajectory.turns
        self.generated_tokens += trajectory.num_generated
        if trajectory.error is not None:
            self.failed += 1
            self.failure_causes[trajectory.error.split(":")[0]] += 1
            return
        self.reward_sum += trajectory.reward
        self.successes += bool(trajectory.info.get("success", trajectory.reward > 0))
        self.truncated += trajectory.truncated

    def summary(self) -> dict[str, float]:
        """The fixed-name metrics: ``rollout/episodes``, ``rollout/success_rate`` and so on."""
        ok = max(self.episodes - self.failed, 1)
        return {
            "rollout/episodes": self.episodes,
            "rollout/failed": self.failed,
            "rollout/success_rate": self.successes / ok,
            "rollout/reward_mean": self.reward_sum / ok,
            "rollout/turns_mean": self.turns_sum / max(self.episodes, 1),
            "rollout/truncated": self.truncated,
            "perf/rollout_tokens_per_s": self.generated_tokens / self.seconds if self.seconds else 0.0,
        }


class RolloutEngine:
    """Runs groups of episodes concurrently against one policy.

    Each group plays ``group_size`` episodes of the same task (the same env seed) with independent
    samples; they share a ``group_id``. With ``redundancy`` > 0 a group starts that many extra
    episodes, and the :class:`~agentrl.buffer.TrajectoryBuffer` keeps the first ``group_size`` to
    finish. At most ``concurrency`` episodes run at once.

    >>> engine = RolloutEngine(lambda: agentrl.make("agentrl/Calculator-v0"), agent, policy)  # doctest: +SKIP
    >>> trajectories = asyncio.run(engine.collect(num_groups=8))  # doctest: +SKIP
    """

    def __init__(
        self,
        make_env: Callable[[], AgentEnv],
        agent: ChatAgent,
        policy: Policy,
        *,
        env_id: str = "",
        sampling: Sampling = Sampling(),
        limits: EpisodeLimits = EpisodeLimits(),
        group_size: int = 1,
        redundancy: int = 0,
        concurrency: int = 64,
        seed: int = 0,
        policy_id: str = "default",
    ):
        if group_size < 1 or redundancy < 0 or concurrency < 1:
            raise ValueError(
                f"need group_size >= 1, redundancy >= 0 and concurrency >= 1; got {group_size}, "
                f"{redundancy} and {concurrency}."
            )
        self.make_env = make_env
        self.agent = agent
        self.policy = policy
        self.env_id = env_id
        self.sampling = sampling
        self.limits = limits
        self.group_size = group_size
        self.redundancy = redundancy
        self.concurrency = concurrency
        self.seed = seed
        self.policy_id = policy_id
        self.stats = RolloutStats()
        self._idle_envs: list[AgentEnv] = []
        self._next_group = 0

    def group_id(self, group: int) -> str:
        """The id of group number ``group`` (its env seed follows from the number too)."""
        return group_name(self.env_id, self.seed, group)

    async def stream(
        self,
        num_groups: int | None = None,
        buffer: TrajectoryBuffer | None = None,
        first_group: int | None = None,
        groups: Iterable[int] | None = None,
    ) -> AsyncIterator[Trajectory]:
        """Play ``num_groups`` groups; yield each trajectory as it finishes (and put it in ``buffer``).

        Groups are numbered on from the previous call, or from ``first_group`` when given (a
        distributed controller hands each worker its own range). ``groups`` names the group numbers
        outright instead (a resumed trainer replays exactly the groups it has not trained on).
        """
        if (num_groups is None) == (groups is None):
            raise ValueError("pass exactly one of num_groups and groups.")
        slots = asyncio.Semaphore(self.concurrency)
        done: asyncio.Queue[Trajectory] = asyncio.Queue()
        started = time.perf_counter()
        if groups is None:
            if first_group is not None:
                self._next_group = first_group
            groups = range(self._next_group, self._next_group + num_groups)
            self._next_group += num_groups
        groups = list(groups)
        num_groups = len(groups)
        tasks = [asyncio.create_task(self._run_group(group, slots, done, buffer)) for group in groups]
        expected = num_groups * (self.group_size + self.redundancy)
        try:
            for _ in range(expected):
                trajectory = await done.get()
                self.stats.add(trajectory)
                self.stats.seconds = time.perf_counter() - started
                yield trajectory
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def collect(self, num_groups: int, buffer: TrajectoryBuffer | None = None) -> list[Trajectory]:
        """Play ``num_groups`` groups and return all their trajectories in completion order."""
        return [t async for t in self.stream(num_groups, buffer)]

    def close(self) -> None:
        """Close the idle envs."""
        for env in self._idle_envs:
            close_quietly(env)
        self._idle_envs.clear()

    async def _run_group(
        self, group: int, slots: asyncio.Semaphore, done: asyncio.Queue[Trajectory], buffer: TrajectoryBuffer | None
    ) -> None:
        group_id = self.group_id(group)
        env_seed = group_env_seed(self.seed, group)
        episodes = [
            asyncio.create_task(self._run_one(group_id, env_seed, sample, slots))
            for sample in range(self.group_size + self.redundancy)
        ]
        for finished in asyncio.as_completed(episodes):
            trajectory = await finished
            if buffer is not None:
                buffer.put(trajectory)
            done.put_nowait(trajectory)
        if buffer is not None:
            buffer.close_group(group_id)

    async def _run_one(self, group_id: str, env_seed: int, sample: int, slots: asyncio.Semaphore) -> Trajectory:
        async with slots:
            env = self._idle_envs.pop() if self._idle_envs else self.make_env()
            trajectory = await run_episode(
                env,
                self.agent,
                self.policy,
                sample_sampling(self.sampling, env_seed, sample),
                self.limits,
                seed=env_seed,
                env_id=self.env_id,
                group_id=group_id,
                policy_id=self.policy_id,
            )
            if trajectory.error is None:
                self._idle_envs.append(env)
            else:  # it may be wedged in a thread; a fresh one plays the next episode
                close_quietly(env)
            return trajectory


def group_name(env_id: str, seed: int, group: int) -> str:
    """The id of group number ``group`` of a rollout of ``env_id`` with ``seed``."""
    return f"{env_id or 'env'}#{seed}-{group}"


def group_env_seed(seed: int, group: int) -> int:
    """The env seed every episode of group number ``group`` resets with (so they share a task)."""
    return seed * 1_000_003 + group


def sample_sampling(sampling: Sampling, env_seed: int, sample: int) -> Sampling:
    """The sampling settings of sample ``sample`` of a group: its own sampler seed, if seeded."""
    if sampling.seed is None:
        return sampling
    return replace(sampling, seed=sampling.seed + env_seed * 1000 + sample)


def close_quietly(env: Any) -> None:
    """Close an env, best effort: one that failed may fail to close too."""
    try:
        env.close()
    except Exception:  # closing a broken env is best effort; the episode already recorded why
        pass
