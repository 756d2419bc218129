"""The rollout engine: many episodes at once, each an asyncio task, all sharing the policy's engine.

One episode is a straight loop (:func:`run_episode`): render the observation, generate, let the env
answer, repeat. The :class:`RolloutEngine` runs many of them concurrently. A slow env call in one
episode never blocks another: env calls go through ``areset`` / ``astep`` (a thread unless the env
is natively async), and the policy batches the concurrent generation requests.

How groups of episodes are scheduled (numbering, env seeds, concurrency, reusing envs, filling a
:class:`~agentrl.buffer.TrajectoryBuffer`) is :class:`GroupScheduler`, shared with the multi-agent
engine (:class:`~agentrl.multiagent.MultiAgentRolloutEngine`): an engine only says how one episode
is played and counted.

Nothing one episode does can stop the run. An env that raises, an env or a policy that runs past
its time limit, or a context that fills up ends *that* episode: its trajectory comes back with
``error`` (for failures) or ``truncated`` (for limits) set, and the engine counts it. An env that
failed or hung is thrown away and a fresh one is made for the next episode, since it may be stuck in
a thread that cannot be killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, NamedTuple, TypeVar

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


class EpisodeClock:
    """An episode's two time limits (per awaited call, and in all) as one asyncio timeout scope.

    Use it as ``async with clock:`` around the episode and call :meth:`start_call` before each
    awaited env call or generation; when a limit passes, the awaited call is cancelled and the
    ``async with`` raises :class:`EpisodeTimeout`, with :attr:`expired` saying which limit it was.

    Why not one ``asyncio.timeout`` per call: each costs a scope object and a timer scheduled and
    cancelled, about 10 µs, twice per turn (``benchmarks/rollout_overhead.py``). Here a call's
    deadline is a number; one timer checks the current deadline when it fires and re-arms itself
    if the deadline has moved on. Each call's deadline ("now + turn_timeout", capped by the
    episode's) is later than the last one's, so the timer only has to be moved earlier once, at
    the first call, from the episode's end.
    """

    def __init__(self, limits: EpisodeLimits):
        self.turn_timeout = limits.turn_timeout
        self.episode_timeout = limits.episode_timeout
        self.expired: str | None = None
        """``"turn"`` or ``"episode"`` once a limit has passed, else ``None``."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scope: asyncio.Timeout | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._deadline: float | None = None
        self._episode_end: float | None = None

    async def __aenter__(self) -> EpisodeClock:
        self._loop = asyncio.get_running_loop()
        self._scope = asyncio.timeout(None)
        await self._scope.__aenter__()
        if self.episode_timeout is not None:
            self._episode_end = self._deadline = self._loop.time() + self.episode_timeout
            self._arm(self._episode_end)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> bool | None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        assert self._scope is not None
        try:
            await self._scope.__aexit__(kind, error, tb)
        except TimeoutError as e:
            if self.expired is None:  # not ours (asyncio only converts its own cancellation)
                raise
            limit = self.episode_timeout if self.expired == "episode" else self.turn_timeout
            raise EpisodeTimeout(f"the {self.expired} limit of {limit} s passed") from e
        return None

    def start_call(self) -> None:
        """The next awaited call starts now: it may take ``turn_timeout`` seconds (within the
        episode's limit)."""
        if self.turn_timeout is None:
            return  # only the episode's own deadline, already armed
        assert self._loop is not None
        deadline = self._loop.time() + self.turn_timeout
        if self._episode_end is not None and self._episode_end < deadline:
            deadline = self._episode_end
        self._deadline = deadline
        if self._timer is None or deadline < self._timer_at:
            self._arm(deadline)

    def _arm(self, when: float) -> None:
        assert self._loop is not None
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = self._loop.call_at(when, self._check), when

    def _check(self) -> None:
        assert self._loop is not None and self._scope is not None
        self._timer = None
        now = self._loop.time()
        if self._deadline is None:
            return
        if now < self._deadline:  # the deadline moved on since this timer was set
            self._arm(self._deadline)
            return
        ended = self._episode_end is not None and now >= self._episode_end
        self.expired = "episode" if ended else "turn"
        self._scope.reschedule(now)  # cancels whatever the episode awaits


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
    clock = EpisodeClock(limits)
    try:
        async with clock:
            await _play(env, builder, policy, sampling, limits, seed, options, state, clock)
    except EpisodeTimeout:
        state.error = timeout_error(clock, state.phase)
    except Exception as e:  # one bad episode is counted, never fatal
        state.error = f"{type(e).__name__}: {e} (during {state.phase})"
    info = {**state.info, "seconds": time.perf_counter() - started, "seed": seed}
    if state.error is not None:
        info["failed_during"] = state.phase
    return builder.finish(terminated=state.terminated, truncated=state.truncated, error=state.error, info=info)


def timeout_error(clock: EpisodeClock, phase: str) -> str:
    """The ``error`` of an episode whose ``clock`` ran out during ``phase``."""
    scope, limit = ("episode", clock.episode_timeout) if clock.expired == "episode" else (phase, clock.turn_timeout)
    return f"EpisodeTimeout: the {scope} ran past its limit of {limit} s (during {phase})"


@dataclass
class _EpisodeState:
    phase: str = "reset"
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


async def _play(
    env: AgentEnv,
    builder: TrajectoryBuilder,
    policy: Policy,
    sampling: Sampling,
    limits: EpisodeLimits,
    seed: int | None,
    options: dict[str, Any] | None,
    state: _EpisodeState,
    clock: EpisodeClock,
) -> None:
    clock.start_call()
    observation, _ = await env.areset(seed=seed, options=options)
    builder.start(observation)
    turn_sampling = turn_sampling_of(sampling, builder.agent)
    for turn in range(limits.max_turns):
        room = builder.room_left
        if room is not None and room <= 0:
            state.truncated, state.info["truncated_by"] = True, "max_length"
            return
        state.phase = f"generate (turn {turn})"
        clock.start_call()
        generation = await policy.generate(builder.token_ids, fit_to_room(turn_sampling, room))
        reply = builder.add_turn(generation.token_ids, generation.logprobs, generation.version)
        state.phase = f"step (turn {turn})"
        clock.start_call()
        result = await env.astep(reply)
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


def turn_sampling_of(sampling: Sampling, agent: ChatAgent) -> Sampling:
    """``sampling`` for an agent's turns: it also stops on the agent's end-of-turn token."""
    stop_ids = tuple(dict.fromkeys([*sampling.stop_token_ids, *agent.end_of_turn_ids]))
    return sampling if stop_ids == tuple(sampling.stop_token_ids) else replace(sampling, stop_token_ids=stop_ids)


def fit_to_room(sampling: Sampling, room: int | None) -> Sampling:
    """``sampling`` with ``max_tokens`` cut to the ``room`` left in the context, if it is less."""
    return sampling if room is None or room >= sampling.max_tokens else replace(sampling, max_tokens=room)


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


def add_episode(
    stats: RolloutStats, policy_stats: dict[str, RolloutStats], episode: Sequence[Trajectory], seconds: float
) -> None:
    """Add an episode's trajectories (one per agent) to ``stats`` and to their policy's entry of
    ``policy_stats``, and set every one's wall time to ``seconds``."""
    for trajectory in episode:
        stats.add(trajectory)
        policy_stats.setdefault(trajectory.policy_id, RolloutStats()).add(trajectory)
    for each in (stats, *policy_stats.values()):
        each.seconds = seconds


# --- groups of episodes -------------------------------------------------------------------------


class EpisodeTask(NamedTuple):
    """Which episode to play: sample ``sample`` of group number ``group``."""

    group: int
    group_id: str
    """The group's id (:func:`group_name`); a multi-agent engine appends ``/<agent_id>``."""
    env_seed: int
    """The seed every episode of the group resets its env with (:func:`group_env_seed`)."""
    sample: int
    """Which of the group's ``group_size + redundancy`` episodes this is."""


EnvT = TypeVar("EnvT")


class GroupScheduler(Generic[EnvT]):
    """Plays groups of episodes concurrently: the scheduling every rollout engine shares.

    Each group plays ``group_size`` episodes of the same task (the same env seed) with independent
    samples; they share a group id. With ``redundancy`` > 0 a group starts that many extra
    episodes, and the :class:`~agentrl.buffer.TrajectoryBuffer` keeps the first ``group_size`` to
    finish. At most ``concurrency`` episodes run at once, started in group order; finished envs
    are kept for later episodes, failed ones closed.

    An engine subclasses this and says how one episode is played (:meth:`play`, one or several
    trajectories) and how it is counted (:meth:`count`); everything else is here.
    """

    def __init__(
        self,
        make_env: Callable[[], EnvT],
        *,
        env_id: str = "",
        group_size: int = 1,
        redundancy: int = 0,
        concurrency: int = 64,
        seed: int = 0,
    ):
        if group_size < 1 or redundancy < 0 or concurrency < 1:
            raise ValueError(
                f"need group_size >= 1, redundancy >= 0 and concurrency >= 1; got {group_size}, "
                f"{redundancy} and {concurrency}."
            )
        self.make_env = make_env
        self.env_id = env_id
        self.group_size = group_size
        self.redundancy = redundancy
        self.concurrency = concurrency
        self.seed = seed
        self._idle_envs: list[EnvT] = []
        self._next_group = 0
        self._seconds = 0.0  # the rollout time of earlier calls, for the stats' tokens/s

    async def play(self, env: EnvT, task: EpisodeTask) -> Sequence[Trajectory]:
        """Play one episode in ``env``; return its trajectories. Faults belong in the trajectories'
        ``error``; an exception here is a setup error, raised to the caller of :meth:`stream`."""
        raise NotImplementedError(f"{type(self).__name__} must implement play(env, task).")

    def count(self, episode: Sequence[Trajectory], seconds: float) -> None:
        """Count a finished episode; ``seconds`` is the rollout time so far, all calls together."""

    def group_id(self, group: int) -> str:
        """The id of group number ``group`` (its env seed follows from the number too)."""
        return group_name(self.env_id, self.seed, group)

    async def stream_episodes(
        self,
        num_groups: int | None = None,
        buffer: TrajectoryBuffer | None = None,
        first_group: int | None = None,
        groups: Iterable[int] | None = None,
    ) -> AsyncGenerator[list[Trajectory], None]:
        """Play ``num_groups`` groups; yield each episode's trajectories as it finishes (and put
        them in ``buffer``, closing each group there once all its episodes are in).

        Groups are numbered on from the previous call, or from ``first_group`` when given (a
        distributed controller hands each worker its own range). ``groups`` names the group numbers
        outright instead (a resumed trainer replays exactly the groups it has not trained on).
        """
        numbers = self._numbers(num_groups, first_group, groups)
        per_group = self.group_size + self.redundancy
        todo = deque(
            EpisodeTask(g, self.group_id(g), group_env_seed(self.seed, g), sample)
            for g in numbers
            for sample in range(per_group)
        )
        total = len(todo)
        left = dict.fromkeys(numbers, per_group)
        group_ids: dict[int, set[str]] = {g: set() for g in numbers}
        done: asyncio.Queue[list[Trajectory] | Exception] = asyncio.Queue()

        # `concurrency` workers, each playing episodes one after another, rather than a task per
        # episode waiting on a semaphore: the same order and concurrency, a fraction of the tasks.
        async def worker() -> None:
            while todo:
                task = todo.popleft()
                try:
                    episode = await self._play_one(task)
                except Exception as e:  # a setup error (see play): hand it to the caller
                    done.put_nowait(e)
                    return
                if buffer is not None:
                    for trajectory in episode:
                        buffer.put(trajectory)
                        group_ids[task.group].add(trajectory.group_id)
                    left[task.group] -= 1
                    if not left[task.group]:
                        for group_id in sorted(group_ids.pop(task.group)):
                            buffer.close_group(group_id)
                done.put_nowait(episode)

        workers = [asyncio.create_task(worker()) for _ in range(min(self.concurrency, total))]
        started = time.perf_counter()
        try:
            for _ in range(total):
                item = await done.get()
                if isinstance(item, Exception):
                    raise item
                self.count(item, self._seconds + time.perf_counter() - started)
                yield item
        finally:
            self._seconds += time.perf_counter() - started
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def stream(
        self,
        num_groups: int | None = None,
        buffer: TrajectoryBuffer | None = None,
        first_group: int | None = None,
        groups: Iterable[int] | None = None,
    ) -> AsyncIterator[Trajectory]:
        """Play ``num_groups`` groups; yield each trajectory as its episode finishes (and put it in
        ``buffer``). The arguments are those of :meth:`stream_episodes`."""
        async with contextlib.aclosing(self.stream_episodes(num_groups, buffer, first_group, groups)) as episodes:
            async for episode in episodes:
                for trajectory in episode:
                    yield trajectory

    async def collect(self, num_groups: int, buffer: TrajectoryBuffer | None = None) -> list[Trajectory]:
        """Play ``num_groups`` groups and return all their trajectories in completion order."""
        return [t async for t in self.stream(num_groups, buffer)]

    def close(self) -> None:
        """Close the idle envs."""
        for env in self._idle_envs:
            close_quietly(env)
        self._idle_envs.clear()

    def _numbers(self, num_groups: int | None, first_group: int | None, groups: Iterable[int] | None) -> list[int]:
        if (num_groups is None) == (groups is None):
            raise ValueError("pass exactly one of num_groups and groups.")
        if groups is not None:
            numbers = list(groups)
            if len(set(numbers)) != len(numbers):
                repeated = sorted(g for g, n in Counter(numbers).items() if n > 1)
                raise ValueError(f"groups must be distinct group numbers; {repeated} appear more than once.")
            return numbers
        assert num_groups is not None
        if first_group is not None:
            self._next_group = first_group
        numbers = list(range(self._next_group, self._next_group + num_groups))
        self._next_group += num_groups
        return numbers

    async def _play_one(self, task: EpisodeTask) -> list[Trajectory]:
        env = self._idle_envs.pop() if self._idle_envs else self.make_env()
        try:
            episode = list(await self.play(env, task))
        except BaseException:
            close_quietly(env)
            raise
        if all(t.error is None for t in episode):
            self._idle_envs.append(env)
        else:  # it may be wedged in a thread; a fresh one plays the next episode
            close_quietly(env)
        return episode


class RolloutEngine(GroupScheduler[AgentEnv]):
    """Runs groups of episodes of a single-agent env concurrently against one policy.

    The scheduling (groups, ``redundancy``, ``concurrency``, :meth:`stream` and its arguments) is
    :class:`GroupScheduler`'s; each episode is :func:`run_episode` with the group's env seed and
    the sample's own sampler seed (:func:`sample_sampling`).

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
        super().__init__(
            make_env, env_id=env_id, group_size=group_size, redundancy=redundancy, concurrency=concurrency, seed=seed
        )
        self.agent = agent
        self.policy = policy
        self.sampling = sampling
        self.limits = limits
        self.policy_id = policy_id
        self.stats = RolloutStats()

    async def play(self, env: AgentEnv, task: EpisodeTask) -> list[Trajectory]:
        """One :func:`run_episode`."""
        trajectory = await run_episode(
            env,
            self.agent,
            self.policy,
            sample_sampling(self.sampling, task.env_seed, task.sample),
            self.limits,
            seed=task.env_seed,
            env_id=self.env_id,
            group_id=task.group_id,
            policy_id=self.policy_id,
        )
        return [trajectory]

    def count(self, episode: Sequence[Trajectory], seconds: float) -> None:
        """Add the trajectory to :attr:`stats`."""
        for trajectory in episode:
            self.stats.add(trajectory)
        self.stats.seconds = seconds


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
