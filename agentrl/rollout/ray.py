"""Env workers and inference engines as Ray actors, running the same code as a local rollout.

Ray is a placement decision, not a second implementation. An :class:`EnvWorker` actor builds the
same engine a local rollout uses, with the same builder (:func:`agentrl.build.build_rollout`):
:class:`~agentrl.rollout.SingleAgentRollout` for a single-agent env,
:class:`~agentrl.rollout.MultiAgentRollout` for a multi-agent one, and plays a slice of the
groups with it. Each policy is a :class:`~agentrl.policies.ray_actor.RemotePolicy`, an ordinary
:class:`~agentrl.policies.Policy` that awaits a
:class:`~agentrl.policies.ray_actor.PolicyActor`, which hosts any backend (``hf``, ``vllm``, or a factory
of your own) and serves many requests at once; a multi-agent env maps its agents to policy ids
(``mapping``), one actor per policy id.
:class:`DistributedRollout` is the controller: it spreads the groups over the workers and merges what
comes back. Group ``g`` is the same task, with the same group id and seeds, as group ``g`` of a local
engine with the same settings.

How trajectories come back: ``EnvWorker.run(first_group, num_groups)`` is an async generator, which
Ray streams: each finished episode (its trajectories, one per agent) becomes one object that the
controller awaits as soon as it exists, so episodes arrive in completion order, as they do locally,
and whole. There is no queue actor and no polling; the controller only moves references.

A generation an episode gives up on (its turn or episode time limit passed) is cancelled on the
actor too: :class:`~agentrl.policies.ray_actor.RemotePolicy` calls ``ray.cancel`` on it, which cancels
the backend's coroutine, and the actor serves the next requests as before. vLLM then aborts the
request; the ``hf`` backend drops it from its queue, or stops its row of the running batch.

Faults. A worker that dies (``ray.kill``, its process killed, its node lost) ends its stream with
``ActorDiedError``, after the trajectories it had already sent. The controller then accounts for
every episode of that worker's groups:

- a group none of whose episodes arrived is played again, whole, by a replacement worker, placed
  as the dead one was (a pinned worker's replacement goes elsewhere if its node is gone);
- a group some of whose episodes already arrived gets each missing episode as failed trajectories
  (one per agent) with ``error="WorkerDied: ..."``. Playing only the missing samples again would
  repeat the samples (and sampler seeds) of episodes already delivered; the buffer counts the
  failures and drops or keeps the partial group as it does for any failed episode.

At most ``max_replacements`` workers are started per :meth:`DistributedRollout.stream`; past that,
unplayed groups are recorded as ``WorkerDied`` failures too, so a crash that repeats (an env that
kills its process) ends the run instead of looping. Ray never restarts these actors itself
(``max_restarts=0``, ``max_task_retries=0``): a retried stream would replay episodes that were
already delivered, and a restarted policy engine would come back with its initial weights while the
trainer believes it holds the latest. A dead :class:`~agentrl.policies.ray_actor.PolicyActor` fails the
episodes that wait on it (``ActorDiedError``, counted like any failed generation); start a new
one. Any other exception from a worker is a bug, not a fault, and is raised to the caller.

A worker does not share a filesystem with the controller unless the cluster does: the tokenizer is
a path or hub id that must load on every node that runs a worker.

>>> policy = PolicyActor.remote("hf", "path/to/checkpoint")  # doctest: +SKIP
>>> settings = RolloutSettings("agentrl/Calculator-v0", group_size=4)
>>> result = distributed_rollout(policy, "path/to/checkpoint", settings, num_groups=8, num_workers=2)  # doctest: +SKIP
>>> result.stats.summary()["rollout/episodes"]  # doctest: +SKIP
32
"""

from __future__ import annotations

import asyncio
import importlib
import math
import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple, cast

try:
    import ray
except ImportError as e:  # an optional dependency: say which extra brings it
    raise ImportError("agentrl.rollout.ray needs Ray: pip install -e '.[cpu]' (or '.[gpu]'), or ray==2.60.0.") from e
from ray.actor import ActorHandle
from ray.exceptions import ObjectLostError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from agentrl.build import LocalRollout, build_rollout, load_tokenizer, multiagent_at
from agentrl.mapping import policy_mapping
from agentrl.policies.ray_actor import RemotePolicy, WorkerLocation, current_location
from agentrl.rollout.buffer import TrajectoryBuffer
from agentrl.rollout.scheduler import GroupFeed, flatten, group_name, group_numbers
from agentrl.rollout.settings import RolloutSettings
from agentrl.rollout.stats import RolloutStats, add_episode
from agentrl.types import Trajectory

# What a worker's death looks like from the controller: the actor is gone, or a trajectory it
# had finished was lost with its node before it was read.
_DEATHS = (RayActorError, ObjectLostError)


# --- the env workers --------------------------------------------------------------------------------


Policies = ActorHandle | str | Mapping[str, ActorHandle | str]
"""One :class:`~agentrl.policies.ray_actor.PolicyActor` (serving ``settings.policy_id``), or one per
policy id; each a handle or the name of a named actor (followed to its replacement, see
:class:`~agentrl.policies.ray_actor.RemotePolicy`)."""
Tokenizers = str | Path | Mapping[str, str | Path]
"""One tokenizer (a path or hub id) for every policy, or one per policy id."""


@ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)
class EnvWorker:
    """A local rollout in a Ray actor, playing the groups it is given.

    The rollout is :func:`agentrl.build.build_rollout`'s, built here of ``settings``: each policy as a
    :class:`~agentrl.policies.ray_actor.RemotePolicy` on its actor, with the tokenizer of its
    policy id (loaded here, once per path). A multi-agent env's agents go to the actor of the
    policy id ``settings.mapping`` gives them. ``imports`` are modules imported first (a user's
    package that registers the env; it must be importable on the worker's node);
    ``settings.concurrency`` bounds the episodes of one :meth:`run` call.
    """

    def __init__(self, policy: Policies, tokenizer: Tokenizers, settings: RolloutSettings, imports: Sequence[str] = ()):
        for module in imports:  # modules that register the env (a run's ``imports:``)
            importlib.import_module(module)
        actors = dict(policy) if isinstance(policy, Mapping) else {settings.policy_id: policy}
        tokenizers = _Tokenizers(tokenizer)
        self.rollout: LocalRollout = build_rollout(
            settings, {pid: RemotePolicy(actor, tokenizers.of(pid)) for pid, actor in actors.items()}
        )
        self._roster = dict(self.rollout.roster)

    async def run(self, first_group: int, num_groups: int) -> AsyncIterator[list[Trajectory]]:
        """Play groups ``first_group`` to ``first_group + num_groups - 1``; yield each episode's
        trajectories as it finishes (Ray streams each episode to the caller as one object, so a
        multi-agent episode arrives whole or not at all)."""
        async for episode in self.rollout.stream_episodes(num_groups, first_group=first_group):
            yield episode

    async def roster(self) -> dict[str, str]:
        """``{agent_id: policy_id}`` of the agents of every episode (``{"agent": policy_id}`` for a
        single-agent env)."""
        return self._roster

    async def location(self) -> WorkerLocation:
        """The node and process this worker runs in (waits until it is built)."""
        return current_location()

    async def close(self) -> None:
        """Close the idle envs (sandboxes and the like) before the actor is killed."""
        self.rollout.close()


class _Tokenizers:
    """Loads each tokenizer once; ``of(policy_id)`` is that policy's."""

    def __init__(self, tokenizer: Tokenizers):
        self.paths = {k: str(v) for k, v in tokenizer.items()} if isinstance(tokenizer, Mapping) else str(tokenizer)
        self.loaded: dict[str, Any] = {}

    def of(self, policy_id: str) -> Any:
        if isinstance(self.paths, str):
            path = self.paths
        elif policy_id in self.paths:
            path = self.paths[policy_id]
        else:
            raise ValueError(f"No tokenizer for policy {policy_id!r}; tokenizer has {sorted(self.paths)}.")
        if path not in self.loaded:
            self.loaded[path] = load_tokenizer(path)
        return self.loaded[path]


# --- the controller ---------------------------------------------------------------------------------


@dataclass
class WorkerInfo:
    """One env worker actor as the controller sees it."""

    handle: ActorHandle
    """The actor."""
    slot: int
    """Which of the ``num_workers`` places it fills; a replacement takes its dead predecessor's slot."""
    node_id: str | None = None
    """The node it runs on (known once it has started)."""
    pid: int | None = None
    """Its process id on that node."""
    episodes: int = 0
    """Trajectories it delivered."""
    died: str | None = None
    """Why it died, if it did."""


@dataclass
class _Unit:
    """One ``run`` call: a contiguous range of groups on one worker."""

    worker: WorkerInfo
    first: int
    count: int
    stream: Any = field(default=None, repr=False)  # the ObjectRefGenerator, to cancel it early


class DistributedResult(NamedTuple):
    """What :func:`distributed_rollout` returns."""

    trajectories: list[Trajectory]
    """Every trajectory, in completion order, ``WorkerDied`` placeholders included."""
    stats: RolloutStats
    """The rollout's stats, counted over those trajectories."""
    workers: list[WorkerInfo]
    """Every worker that ran: the live ones, then the dead ones."""


class DistributedRollout:
    """Plays groups of episodes on ``num_workers`` :class:`EnvWorker` actors sharing the policy actors.

    The workers start here (a bad env id or tokenizer raises here, not mid-run) and live until
    :meth:`close`. By default Ray spreads them over the nodes (``SPREAD``); ``nodes`` (node ids, see
    ``ray.nodes()``) pins worker ``i`` to ``nodes[i % len(nodes)]``. Each :meth:`stream` splits its
    groups into one contiguous range per worker and continues the group numbering of the previous
    call, as :class:`~agentrl.rollout.SingleAgentRollout` does. ``settings`` mean what they mean there
    (each worker builds its rollout of them); ``settings.concurrency`` is per worker. See the module
    docstring for what happens when a worker dies.

    A multi-agent env plays as :class:`~agentrl.multiagent.MultiAgentRollout` does:
    ``policy`` maps each policy id of ``settings.mapping`` to its :class:`~agentrl.policies.ray_actor.PolicyActor`
    (and ``tokenizer`` may map policy ids to their tokenizers), and every episode yields one
    trajectory per agent.
    """

    def __init__(
        self,
        policy: Policies,
        tokenizer: Tokenizers,
        settings: RolloutSettings,
        *,
        num_workers: int = 2,
        nodes: Sequence[str] | None = None,
        num_cpus_per_worker: float = 1.0,
        max_replacements: int | None = None,
        imports: Sequence[str] = (),
    ):
        if num_workers < 1:
            raise ValueError(f"need num_workers >= 1, got {num_workers}.")
        if nodes is not None and not nodes:
            raise ValueError("nodes is empty; give at least one node id, or None to let Ray spread the workers.")
        policy_mapping(settings.mapping)  # an unknown preset fails here, not in every worker
        self.policy = policy
        self.settings = settings
        self.nodes = list(nodes) if nodes is not None else None
        self.num_cpus_per_worker = num_cpus_per_worker
        self.max_replacements = num_workers if max_replacements is None else max_replacements
        tokenizers = {k: str(v) for k, v in tokenizer.items()} if isinstance(tokenizer, Mapping) else str(tokenizer)
        self._worker_args = (policy, tokenizers, settings, list(imports))
        self.stats = RolloutStats()
        """Counts over every trajectory delivered so far (placeholders included), as the engine keeps."""
        self.policy_stats: dict[str, RolloutStats] = {}
        """The same, per policy id."""
        self.episodes = 0
        """Episodes delivered so far (placeholders included); one trajectory each per agent."""
        self.failed_episodes = 0
        self.workers: list[WorkerInfo] = []
        """The current worker of each slot."""
        self.retired: list[WorkerInfo] = []
        """Workers that died and were replaced."""
        self.roster: dict[str, str] = {}
        """``{agent_id: policy_id}`` of every episode's agents (``{"agent": policy_id}`` for one agent)."""
        self.multiagent = multiagent_at(settings.env_id, settings.env_url)
        self._next_group = 0
        self._seconds = 0.0
        try:
            self.workers = [self._start(slot) for slot in range(num_workers)]
            locations: list[WorkerLocation] = ray.get([w.handle.location.remote() for w in self.workers])
            for worker, (node_id, pid) in zip(self.workers, locations):
                worker.node_id, worker.pid = node_id, pid
            self.roster = cast(dict[str, str], ray.get(self.workers[0].handle.roster.remote()))
        except BaseException:
            self.close()
            raise

    @property
    def next_group(self) -> int:
        """The number of the next call's first group: groups are numbered on from call to call, as a
        local engine numbers them."""
        return self._next_group

    def group_id(self, group: int) -> str:
        """The id of group number ``group``, as a local rollout names it."""
        return group_name(self.settings.env_id, self.settings.seed, group)

    async def stream_episodes(
        self,
        num_groups: int | None = None,
        buffer: TrajectoryBuffer | None = None,
        *,
        groups: Sequence[int] | None = None,
    ) -> AsyncGenerator[list[Trajectory], None]:
        """Play ``num_groups`` groups numbered on from the last call, or the group numbers
        ``groups``; yield each episode's trajectories as they arrive (and put them in ``buffer``,
        closing each group there once all its episodes are in).

        Exactly ``(number of groups) * (group_size + redundancy)`` episodes come out, whatever dies.
        """
        numbers = sorted(group_numbers(self._next_group, num_groups, groups))
        if groups is None:
            self._next_group += len(numbers)
        num_groups = len(numbers)
        self._replace_dead()
        per_group = self.settings.episodes_per_group
        index = {group_name(self.settings.env_id, self.settings.seed, g): g for g in numbers}
        arrived: Counter[int] = Counter()
        feed = GroupFeed(buffer, per_group)
        events: asyncio.Queue[tuple[_Unit, Any]] = asyncio.Queue()
        units: list[_Unit] = []
        pumps: list[asyncio.Task[None]] = []
        replacements = [self.max_replacements]  # a cell, so that recovery can spend it

        def launch(worker: WorkerInfo, start: int, count: int) -> None:
            unit = _Unit(worker, start, count)
            units.append(unit)
            pumps.append(asyncio.create_task(self._pump(unit, events)))

        for worker, (start, count) in zip(self.workers, _split(0, num_groups, len(self.workers))):
            for run in _runs(numbers[start : start + count]):  # consecutive numbers: one call each
                launch(worker, *run)
        started = time.perf_counter()
        remaining = num_groups * per_group
        try:
            while remaining:
                unit, item = await events.get()
                if item is None:
                    self._check_complete(unit, arrived)
                    continue
                if isinstance(item, list):
                    unit.worker.episodes += 1
                    delivered = [item]
                elif isinstance(item, _DEATHS):
                    delivered = self._recover(unit, item, arrived, replacements, launch)
                else:
                    raise item
                for episode in delivered:
                    group = self._group_of(episode, index)
                    arrived[group] += 1
                    remaining -= 1
                    self._count(episode, self._seconds + time.perf_counter() - started)
                    feed.add(group, episode)
                    yield episode
        finally:
            self._seconds += time.perf_counter() - started
            for unit, pump in zip(units, pumps):
                if unit.stream is not None and not pump.done():
                    ray.cancel(unit.stream)  # the caller left early: stop that worker's episodes
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    def stream(
        self,
        num_groups: int | None = None,
        buffer: TrajectoryBuffer | None = None,
        *,
        groups: Sequence[int] | None = None,
    ) -> AsyncIterator[Trajectory]:
        """Play ``num_groups`` groups (or the group numbers ``groups``); yield each trajectory as it
        arrives (and put it in ``buffer``).

        Exactly ``(number of groups) * (group_size + redundancy)`` episodes' trajectories come out,
        one per agent of the roster each, whatever dies.
        """
        return flatten(self.stream_episodes(num_groups, buffer, groups=groups))

    async def collect(self, num_groups: int, buffer: TrajectoryBuffer | None = None) -> list[Trajectory]:
        """Play ``num_groups`` groups and return all their trajectories in completion order."""
        return [t async for t in self.stream(num_groups, buffer)]

    def close(self) -> None:
        """Let the workers close their envs, then end them. The policy actor is left running."""
        live = [w for w in self.workers if w.died is None]
        if live:
            try:  # best effort: a worker that cannot close its envs in time is killed anyway
                ray.get([w.handle.close.remote() for w in live], timeout=30)
            except Exception:
                pass
        for worker in self.workers:
            ray.kill(worker.handle)
        self.workers = []

    def __enter__(self) -> DistributedRollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ----------------------------------------------------------------------------------

    def _start(self, slot: int, *, replacing: str | None = None) -> WorkerInfo:
        if self.nodes is None:
            strategy: Any = "SPREAD"
        else:
            node = self.nodes[slot % len(self.nodes)]
            # A replacement may find its node gone (that may be why it is needed): soft lets Ray
            # place it elsewhere then. The first placement is exact, as asked.
            strategy = NodeAffinitySchedulingStrategy(node, soft=replacing is not None)
        handle = EnvWorker.options(  # type: ignore[attr-defined]  # ray.remote's class decorator is untyped
            num_cpus=self.num_cpus_per_worker, scheduling_strategy=strategy
        ).remote(*self._worker_args)
        return WorkerInfo(handle, slot)

    def _replace_dead(self) -> None:
        # Between calls a slot may hold a worker that died and was not replaced (the budget of the
        # last call ran out); a new call starts with a full set.
        for slot, worker in enumerate(self.workers):
            if worker.died is not None:
                self.retired.append(worker)
                self.workers[slot] = self._start(slot, replacing=worker.died)

    async def _pump(self, unit: _Unit, events: asyncio.Queue[tuple[_Unit, Any]]) -> None:
        """Move one unit's trajectories into ``events``, then ``None``, or the exception that ended it."""
        worker = unit.worker
        try:
            if worker.node_id is None:
                worker.node_id, worker.pid = await worker.handle.location.remote()
            unit.stream = worker.handle.run.remote(unit.first, unit.count)
            async for ref in unit.stream:
                events.put_nowait((unit, await ref))
            events.put_nowait((unit, None))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # handed to the controller's loop, which decides what it means
            events.put_nowait((unit, e))

    def _group_of(self, episode: list[Trajectory], index: dict[str, int]) -> int:
        """The group number of a delivered episode (its trajectories' group id, less ``/<agent_id>``)."""
        group_id = episode[0].group_id if episode else ""
        base = group_id if group_id in index or not self.multiagent else group_id.rsplit("/", 1)[0]
        if base not in index:
            raise RuntimeError(
                f"A worker returned group {group_id!r}, which is not among the groups "
                f"{min(index.values())}..{max(index.values())} it was given; the worker runs a different "
                "agentrl version than the controller."
            )
        return index[base]

    def _count(self, episode: list[Trajectory], seconds: float) -> None:
        self.episodes += 1
        self.failed_episodes += any(t.error is not None for t in episode)
        add_episode(self.stats, self.policy_stats, episode, seconds)

    def _check_complete(self, unit: _Unit, arrived: Counter[int]) -> None:
        missing = [
            g for g in range(unit.first, unit.first + unit.count) if arrived[g] < self.settings.episodes_per_group
        ]
        if missing:
            raise RuntimeError(
                f"Worker {unit.worker.slot}'s stream ended without all episodes of groups {missing}; "
                "the engine's stream_episodes should yield every episode it starts."
            )

    def _recover(
        self,
        unit: _Unit,
        error: Exception,
        arrived: Counter[int],
        replacements: list[int],
        launch: Callable[[WorkerInfo, int, int], None],
    ) -> list[list[Trajectory]]:
        """Account for a dead unit's groups: play the untouched ones again on a replacement if the
        budget allows, and return ``WorkerDied`` placeholders for every other missing episode (one
        trajectory per agent of the roster each)."""
        dead = unit.worker
        reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'no message'}"
        if dead.died is None:
            dead.died = reason
            # An actor only unreachable for now would go on playing groups that are now someone
            # else's; make sure it is gone.
            ray.kill(dead.handle)
        per_group = self.settings.episodes_per_group
        groups = range(unit.first, unit.first + unit.count)
        untouched = [g for g in groups if arrived[g] == 0]
        # Another unit of the same dead worker may already have brought a replacement in.
        successor = self.workers[dead.slot]
        if untouched and successor.died is not None and replacements[0] > 0:
            replacements[0] -= 1
            self.retired.append(successor)
            successor = self.workers[dead.slot] = self._start(dead.slot, replacing=reason)
        rerun = untouched if successor.died is None else []
        for start, count in _runs(rerun):
            launch(successor, start, count)
        where = f"worker {dead.slot} on node {dead.node_id} (pid {dead.pid})"
        error_text = f"WorkerDied: {where} died before finishing this episode ({reason})"
        placeholders = []
        for g in groups:
            if g in rerun:
                continue
            name = group_name(self.settings.env_id, self.settings.seed, g)
            for _ in range(per_group - arrived[g]):
                placeholders.append(
                    [
                        Trajectory(
                            env_id=self.settings.env_id,
                            agent_id=agent_id,
                            policy_id=policy_id,
                            group_id=f"{name}/{agent_id}" if self.multiagent else name,
                            error=error_text,
                            info={"failed_during": "worker", "node_id": dead.node_id},
                        )
                        for agent_id, policy_id in self.roster.items()
                    ]
                )
        return placeholders


def _split(first: int, num_groups: int, parts: int) -> list[tuple[int, int]]:
    """``num_groups`` groups from ``first`` as ``parts`` contiguous (start, count) ranges, sizes within one."""
    base, extra = divmod(num_groups, parts)
    ranges, start = [], first
    for part in range(parts):
        count = base + (part < extra)
        ranges.append((start, count))
        start += count
    return ranges


def _runs(groups: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted ``groups`` as maximal (start, count) runs of consecutive numbers."""
    runs: list[tuple[int, int]] = []
    for g in sorted(groups):
        if runs and runs[-1][0] + runs[-1][1] == g:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((g, 1))
    return runs


def distributed_rollout(
    policy: ActorHandle, tokenizer: str | Path, settings: RolloutSettings, num_groups: int, **kwargs: Any
) -> DistributedResult:
    """Start a :class:`DistributedRollout` (``kwargs`` are its other arguments), play ``num_groups``
    groups, end the workers, and return everything that came back."""
    with DistributedRollout(policy, tokenizer, settings, **kwargs) as rollout:
        trajectories = asyncio.run(rollout.collect(num_groups))
        workers = rollout.workers + rollout.retired
    return DistributedResult(trajectories, rollout.stats, workers)


def cluster_rollout(
    policy: Policies, tokenizer: Tokenizers, settings: RolloutSettings, imports: Sequence[str] = ()
) -> DistributedRollout:
    """A :class:`DistributedRollout` of ``settings`` on the connected cluster: one env worker per live
    node, sharing ``settings.concurrency``, importing ``imports`` first (``agentrl rollout`` and
    ``agentrl train`` with ``ray_address`` play this way)."""
    num_workers = max(1, sum(1 for node in ray.nodes() if node["Alive"]))
    share = replace(settings, concurrency=math.ceil(settings.concurrency / num_workers))
    return DistributedRollout(policy, tokenizer, share, num_workers=num_workers, imports=imports)
