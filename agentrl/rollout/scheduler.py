"""Groups of episodes played concurrently: the scheduling every rollout shares.

A :class:`GroupScheduler` takes a *play function* (``play(env, task) -> trajectories``: one
trajectory for a single-agent episode, one per agent for a multi-agent one) and does the rest:
numbering groups, seeding them, running at most ``concurrency`` episodes at once, reusing envs, and
filling a :class:`~agentrl.rollout.buffer.TrajectoryBuffer`. The engines
(:class:`~agentrl.rollout.episode.SingleAgentRollout`,
:class:`~agentrl.rollout.multiagent.MultiAgentRollout`) are schedulers built with their play
function; the Ray controller (:mod:`agentrl.rollout.ray`) runs one in each env worker and feeds its
buffer with the same :class:`GroupFeed`.

The naming and seeding rules are functions here (:func:`group_name`, :func:`group_env_seed`,
:func:`sample_sampling`), so that group ``g`` is the same task, with the same ids and seeds, however
and wherever it is played.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Generic, NamedTuple, TypeVar

from agentrl.policies.base import Sampling
from agentrl.policies.router import episode_route
from agentrl.rollout.buffer import TrajectoryBuffer
from agentrl.rollout.settings import RolloutSettings
from agentrl.rollout.stats import RolloutStats, add_episode
from agentrl.types import Trajectory


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
PlayFn = Callable[[EnvT, EpisodeTask], Awaitable[Sequence[Trajectory]]]
"""``play(env, task)``: play one episode in ``env``; return its trajectories. Faults belong in the
trajectories' ``error``; an exception is a setup error, raised to the caller of ``stream``."""


def group_name(env_id: str, seed: int, group: int) -> str:
    """The id of group number ``group`` of a rollout of ``env_id`` with ``seed``."""
    return f"{env_id or 'env'}#{seed}-{group}"


def group_env_seed(seed: int, group: int) -> int:
    """The env seed every episode of group number ``group`` resets with (so they share a task)."""
    return seed * 1_000_003 + group


def group_numbers(next_group: int, num_groups: int | None, groups: Iterable[int] | None) -> list[int]:
    """The group numbers one call plays: ``groups`` (distinct numbers), or ``num_groups`` numbers
    from ``next_group`` on; exactly one of the two is given."""
    if (num_groups is None) == (groups is None):
        raise ValueError("pass exactly one of num_groups and groups.")
    if groups is None:
        assert num_groups is not None
        return list(range(next_group, next_group + num_groups))
    numbers = list(groups)
    if len(set(numbers)) != len(numbers):
        repeated = sorted(g for g, n in Counter(numbers).items() if n > 1)
        raise ValueError(f"groups must be distinct group numbers; {repeated} appear more than once.")
    return numbers


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


class GroupFeed:
    """Puts episodes into a buffer and closes each group there once all its episodes are in.

    A group's episodes may carry several group ids (a multi-agent episode has one per agent); each
    is closed when the group's ``per_group`` episodes have arrived.
    """

    def __init__(self, buffer: TrajectoryBuffer | None, per_group: int):
        self.buffer = buffer
        self.per_group = per_group
        self._arrived: Counter[int] = Counter()
        self._group_ids: dict[int, set[str]] = {}

    def add(self, group: int, episode: Sequence[Trajectory]) -> None:
        """One episode of group number ``group`` arrived."""
        if self.buffer is None:
            return
        ids = self._group_ids.setdefault(group, set())
        for trajectory in episode:
            self.buffer.put(trajectory)
            ids.add(trajectory.group_id)
        self._arrived[group] += 1
        if self._arrived[group] == self.per_group:
            for group_id in sorted(self._group_ids.pop(group)):
                self.buffer.close_group(group_id)


async def flatten(episodes: AsyncIterable[Sequence[Trajectory]]) -> AsyncIterator[Trajectory]:
    """The trajectories of ``episodes``, one by one (closing the episode stream when left early)."""
    async with contextlib.aclosing(episodes) as stream:  # type: ignore[type-var]
        async for episode in stream:
            for trajectory in episode:
                yield trajectory


class GroupScheduler(Generic[EnvT]):
    """Plays groups of episodes concurrently with a ``play`` function (see :data:`PlayFn`).

    How (``settings``, a :class:`~agentrl.rollout.settings.RolloutSettings`): each group plays
    ``group_size`` episodes of the same task (the same env seed) with independent
    samples; they share a group id. With ``redundancy`` > 0 a group starts that many extra
    episodes, and the :class:`~agentrl.rollout.buffer.TrajectoryBuffer` keeps the first
    ``group_size`` to finish. At most ``concurrency`` episodes run at once, across every stream of
    the scheduler, started in group order; finished envs are kept for later episodes, failed ones
    closed. A failed episode is played again in a fresh env, with the same seeds, up to
    ``episode_retries`` times; only its last try comes out.

    Every finished episode is counted: :attr:`stats` over every trajectory (one per agent per
    episode), :attr:`policy_stats` the same per policy id, :attr:`episodes` and
    :attr:`failed_episodes` over episodes.

    >>> async def play(env, task):  # doctest: +SKIP
    ...     return [await run_episode(env, agent, policy, sampling, limits, seed=task.env_seed)]
    >>> scheduler = GroupScheduler(lambda: agentrl.make("agentrl/Calculator-v0"), play, RolloutSettings(group_size=4))  # doctest: +SKIP
    >>> trajectories = asyncio.run(scheduler.collect(num_groups=8))  # doctest: +SKIP
    """

    def __init__(self, make_env: Callable[[], EnvT], play: PlayFn[EnvT], settings: RolloutSettings = RolloutSettings()):
        self.make_env = make_env
        self.play = play
        self.settings = settings
        self.stats = RolloutStats()
        self.policy_stats: dict[str, RolloutStats] = {}
        self.episodes = 0
        self.failed_episodes = 0
        self._idle_envs: list[EnvT] = []
        # One cap for every stream of this scheduler: a controller that runs several streams at
        # once (one per chunk of groups) still plays at most `concurrency` episodes. An asyncio
        # semaphore binds to one loop, so there is one per loop.
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self._next_group = 0
        self._seconds = 0.0  # the rollout time of earlier calls, for the stats' tokens/s

    def group_id(self, group: int) -> str:
        """The id of group number ``group`` (its env seed follows from the number too)."""
        return group_name(self.settings.env_id, self.settings.seed, group)

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
        per_group = self.settings.episodes_per_group
        todo = deque(
            EpisodeTask(g, self.group_id(g), group_env_seed(self.settings.seed, g), sample)
            for g in numbers
            for sample in range(per_group)
        )
        total = len(todo)
        feed = GroupFeed(buffer, per_group)
        done: asyncio.Queue[list[Trajectory] | Exception] = asyncio.Queue()

        # `concurrency` workers, each playing episodes one after another, rather than a task per
        # episode waiting on a semaphore: the same order and concurrency, a fraction of the tasks.
        slots = self._semaphore()

        async def worker() -> None:
            while todo:
                task = todo.popleft()
                try:
                    async with slots:
                        episode = await self._play_retrying(task)
                except Exception as e:  # a setup error (see PlayFn): hand it to the caller
                    done.put_nowait(e)
                    return
                feed.add(task.group, episode)
                done.put_nowait(episode)

        workers = [asyncio.create_task(worker()) for _ in range(min(self.settings.concurrency, total))]
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

    def stream(
        self,
        num_groups: int | None = None,
        buffer: TrajectoryBuffer | None = None,
        first_group: int | None = None,
        groups: Iterable[int] | None = None,
    ) -> AsyncIterator[Trajectory]:
        """Play ``num_groups`` groups; yield each trajectory as its episode finishes (and put it in
        ``buffer``). The arguments are those of :meth:`stream_episodes`."""
        return flatten(self.stream_episodes(num_groups, buffer, first_group, groups))

    async def collect(self, num_groups: int, buffer: TrajectoryBuffer | None = None) -> list[Trajectory]:
        """Play ``num_groups`` groups and return all their trajectories in completion order."""
        return [t async for t in self.stream(num_groups, buffer)]

    def count(self, episode: Sequence[Trajectory], seconds: float) -> None:
        """Count a finished episode; ``seconds`` is the rollout time so far, all calls together."""
        self.episodes += 1
        self.failed_episodes += any(t.error is not None for t in episode)
        add_episode(self.stats, self.policy_stats, episode, seconds)

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.settings.concurrency))
        return self._slots[1]

    def close(self) -> None:
        """Close the idle envs."""
        for env in self._idle_envs:
            close_quietly(env)
        self._idle_envs.clear()

    def _numbers(self, num_groups: int | None, first_group: int | None, groups: Iterable[int] | None) -> list[int]:
        if groups is None and first_group is not None:
            self._next_group = first_group
        numbers = group_numbers(self._next_group, num_groups, groups)
        if groups is None:
            self._next_group += len(numbers)
        return numbers

    async def _play_retrying(self, task: EpisodeTask) -> list[Trajectory]:
        """Play ``task``; an episode that failed (an infrastructure fault, see
        :func:`~agentrl.rollout.stats.fault_kind`) is played again in a fresh env with the same
        seeds, up to ``episode_retries`` times. The episode returned carries the earlier attempts'
        errors in each trajectory's ``info["retried"]``; it still has ``error`` set if every try failed."""
        retried: list[str] = []
        while True:
            episode = await self._play_one(task, fresh=bool(retried))
            error = next((t.error for t in episode if t.error is not None), None)
            if error is None or len(retried) >= self.settings.episode_retries:
                break
            retried.append(error)
        if retried:
            for trajectory in episode:
                trajectory.info["retried"] = list(retried)
        return episode

    async def _play_one(self, task: EpisodeTask, fresh: bool = False) -> list[Trajectory]:
        env = self._idle_envs.pop() if self._idle_envs and not fresh else self.make_env()
        try:
            with episode_route():  # several engines (RouterPolicy): the episode's turns go to one
                episode = list(await self.play(env, task))
        except BaseException:
            close_quietly(env)
            raise
        if all(t.error is None for t in episode):
            self._idle_envs.append(env)
        else:  # it may be wedged in a thread; a fresh one plays the next episode
            close_quietly(env)
        return episode
