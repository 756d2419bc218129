"""The loop of a single-policy training run: a producer of groups and the trainer consuming them.

:class:`Controller` is what ``agentrl train`` runs for a single-agent env once :func:`agentrl.train.train`
has built the policy, the trainer and the engine (see :mod:`agentrl.train` for the staleness rules
it keeps). The multi-policy loop is :mod:`agentrl.multi_train`. Both report through
:class:`Progress` and end in a :class:`TrainResult`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from agentrl.build import build_engine, limits_of, sampling_of
from agentrl.dashboard.records import sample_records, write_samples
from agentrl.metrics import MetricsLogger
from agentrl.plot import plot_run
from agentrl.policies import Policy
from agentrl.policies.router import RouterPolicy
from agentrl.policies.supervisor import EngineSupervisor
from agentrl.rollout import RolloutEngine, RolloutStats, StalenessWindow, TrajectoryBuffer, group_env_seed
from agentrl.rollout.scheduler import close_quietly
from agentrl.rollout.staleness import required_groups, take_required
from agentrl.train_config import EVAL_SEED_OFFSET, TrainConfig
from agentrl.trainers.checkpoint import save_checkpoint
from agentrl.trainers.curriculum import PromptCurriculum, closest_to_target
from agentrl.trainers.trainer import Trainer
from agentrl.types import Trajectory

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a run did."""

    run_dir: Path
    steps: int
    eval_before: dict[str, float] | None
    eval_after: dict[str, float] | None
    model_dir: Path | None
    plot: Path | None
    policies: list[str] = field(default_factory=list)
    """The policy ids of a multi-policy run (its evaluations are ``eval/<policy>/...``); empty for one policy."""


@dataclass
class Progress:
    """What the controller tells its caller as it goes (the CLI draws progress bars from it)."""

    on_phase: Callable[[str, int], None] = lambda name, total: None
    """A phase starts: its name and how many advances it takes (0: unknown)."""
    on_advance: Callable[[dict[str, Any]], None] = lambda info: None
    """One advance: a training step's metrics, or ``{}`` for an evaluation's episode."""
    on_result: Callable[[dict[str, Any]], None] = lambda metrics: None
    """An evaluation ended: its ``eval/...`` metrics."""


@dataclass
class ControllerState:
    """What a checkpoint keeps of the controller (JSON)."""

    step: int = 0
    """Training steps done."""
    next_group: int = 0
    """The number the next new group gets."""
    trained_groups: list[int] = field(default_factory=list)
    """Every group number trained on, in order."""
    lost_groups: int = 0
    """Groups that never reached the trainer (failed or stale), over the whole run."""
    dropped_groups: list[int] = field(default_factory=list)
    """Their numbers."""
    skipped_groups: list[int] = field(default_factory=list)
    """Group numbers a PCL selection scored and did not play (``curriculum.selection: pcl``)."""
    filtered_groups: list[int] = field(default_factory=list)
    """Group numbers played and dropped for their equal rewards (``curriculum.selection: filter``)."""
    tail_queue: list[int] = field(default_factory=list)
    """Tail batching: group numbers aborted in short rounds, waiting for a long round."""
    policy_version: int = 0
    """The policy's version after the last step, counted over the whole run (an engine started
    anew on resume counts from its own start; the difference is added back)."""
    eval_before: dict[str, float] | None = None
    """The evaluation before the first step (not repeated on resume)."""


class Controller:
    """The loop of one run: a producer of groups and the trainer consuming them.

    The producer starts groups whenever the :class:`~agentrl.rollout.StalenessWindow` has room
    (replays of a resumed run first, then new group numbers, chosen as ``curriculum.selection``
    says); each group's episodes run on the engine and land in the buffer; the loop takes
    ``groups_per_step`` groups, steps the trainer in a thread (episodes go on meanwhile), sends the
    weights to the policy and tells the buffer the new version, which drops groups that are now
    too stale. With ``tail_batching`` there is no producer: each batch plays a round of its own
    (:meth:`_tail_round`).
    """

    def __init__(
        self,
        config: TrainConfig,
        policy: Policy,
        engine: RolloutEngine,
        trainer: Trainer,
        metrics: MetricsLogger,
        state: ControllerState,
        buffered: list[Trajectory],
        progress: Progress,
        curriculum: PromptCurriculum | None = None,
    ):
        self.config = config
        self.policy = policy
        self.engine = engine
        self.trainer = trainer
        self.metrics = metrics
        self.state = state
        self.progress = progress
        # A resumed run's engine counts versions from its own start: buffered tokens are moved onto
        # its count, so staleness compares like with like; metrics add the difference back.
        self.version_offset = max(state.policy_version - policy.version, 0)
        buffered = [shift_versions(t, self.version_offset) for t in buffered]
        self.buffer = TrajectoryBuffer(config.rollout.group_size, max_staleness=config.max_staleness)
        self.buffer.set_version(policy.version)
        for trajectory in buffered:
            self.buffer.put(trajectory)
        # Groups started before the checkpoint but neither trained on nor buffered: play them again.
        buffered_ids = {t.group_id for t in buffered}
        # A dropped or filtered group's place went to a new one; a skipped group was never to be played.
        trained = {*state.trained_groups, *state.dropped_groups, *state.skipped_groups, *state.filtered_groups}
        trained |= set(state.tail_queue)  # tail batching replays these in a long round
        self.replay = [
            n for n in range(state.next_group) if n not in trained and engine.group_id(n) not in buffered_ids
        ]
        self.group_numbers = {engine.group_id(n): n for n in range(state.next_group)}
        # The policy version each group in flight started at (a buffered group: its oldest token's).
        self.start_versions = {
            self.group_numbers[group[0].group_id]: oldest_version(group, policy.version)
            for group in self.buffer.ready_groups()
        }
        self.window = StalenessWindow(config.groups_per_step, config.max_staleness, started=len(self.buffer))
        self._lost_before = state.lost_groups  # lost in earlier sessions of this run
        self._dropped_before = len(state.dropped_groups)
        self._failed_seen = 0
        self.curriculum = curriculum
        self._predicted: dict[int, float] = {}  # PCL: the value model's prediction for each group played
        self._probe: Any = None  # PCL: the env that shows candidate prompts
        self._select_seconds = 0.0  # prompt selection since the last step
        self._filtered = 0  # groups filtered out in this session (they free room like lost ones)
        self._filtered_reported = 0
        self._tail: dict[str, float] = {}  # tail batching: what the last round did
        self._draining: set[asyncio.Task[None]] = set()
        self._drain_error: BaseException | None = None
        self.changed = asyncio.Condition()

    # --- the loop --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Train until ``config.steps``; the producer keeps the window of groups in flight (with
        ``tail_batching``, each batch plays its own round instead)."""
        self.progress.on_phase("training", self.config.steps)
        producer = None if self.config.tail_batching else asyncio.create_task(self._produce())
        try:
            while self.state.step < self.config.steps:
                waited = time.perf_counter()
                groups = await (self._next_batch() if producer is not None else self._tail_round())
                await self._train_on(groups, rollout_seconds=time.perf_counter() - waited)
        finally:
            if producer is not None:
                producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)
            self.engine.close()
            if self._probe is not None:
                close_quietly(self._probe)

    async def _produce(self) -> None:
        """Start groups whenever the window has room: replays first, then new group numbers."""
        draining = self._draining
        try:
            while True:
                async with self.changed:
                    await self.changed.wait_for(lambda: self.window.room() > 0)
                    room = self.window.room()
                chunk = await self._take(room)  # only this task starts groups: the room is still there
                self.window.start(len(chunk))
                task = asyncio.create_task(self._drain(chunk))
                draining.add(task)
                task.add_done_callback(self._drained)
        finally:
            for task in draining:
                task.cancel()
            await asyncio.gather(*draining, return_exceptions=True)

    async def _take(self, room: int) -> list[int]:
        """The numbers of the next ``room`` groups to start, each noted with the version it starts at:
        replays first, then new numbers (with PCL, the best of ``curriculum.pool`` candidates each)."""
        chunk = self.replay[:room]
        del self.replay[: len(chunk)]
        need = room - len(chunk)
        pool = self.config.curriculum.pool if self.curriculum is not None else 1
        candidates = list(range(self.state.next_group, self.state.next_group + need * pool))
        self.state.next_group += len(candidates)
        if self.curriculum is not None and candidates:
            chosen = set(await self._select(candidates, need))
            self.state.skipped_groups += [n for n in candidates if n not in chosen]
            candidates = [n for n in candidates if n in chosen]
        for number in candidates:
            self.group_numbers[self.engine.group_id(number)] = number
        chunk += candidates
        for number in chunk:
            self.start_versions[number] = self.buffer.version
        return chunk

    async def _select(self, candidates: list[int], need: int) -> list[int]:
        """PCL: the ``need`` candidates whose first prompts the value model predicts closest to the target."""
        assert self.curriculum is not None
        started = time.perf_counter()
        if self._probe is None:
            self._probe = self.engine.make_env()
        prompts = []
        for number in candidates:
            observation, _ = await self._probe.areset(seed=group_env_seed(self.engine.seed, number))
            prompts.append(self.engine.agent.prompt_ids(observation))
        predictions = await asyncio.to_thread(self.curriculum.predict, prompts)
        kept = closest_to_target(predictions, need, self.curriculum.target)
        for index in kept:
            self._predicted[candidates[index]] = predictions[index]
        self._select_seconds += time.perf_counter() - started
        return [candidates[i] for i in kept]

    def _drained(self, task: asyncio.Task[None]) -> None:
        """A chunk's stream ended. An exception there is a setup error (the env cannot be made,
        say): kept, and raised by the training loop, which would otherwise wait for it forever."""
        self._draining.discard(task)
        if not task.cancelled() and task.exception() is not None and self._drain_error is None:
            self._drain_error = task.exception()  # the loop polls the buffer each second and raises it

    def _raise_failed_drain(self) -> None:
        if self._drain_error is not None:
            raise self._drain_error

    async def _drain(self, chunk: list[int]) -> None:
        async for _ in self.engine.stream(groups=chunk, buffer=self.buffer):
            pass
        await self._notify()

    async def _next_batch(self) -> list[list[Trajectory]]:
        """The next batch. With ``stragglers: wait``, first the groups it must hold so that none
        becomes too stale (:func:`~agentrl.rollout.staleness.required_groups`), waited for if they
        still run; the other places, and every place with ``drop``, go to groups in the order they
        completed."""
        need = self.config.groups_per_step
        groups: list[list[Trajectory]] = []
        filtered_before = self._filtered
        while len(groups) < need:
            self._raise_failed_drain()
            waiting = False
            if self.config.stragglers == "wait":
                taken, waiting = take_required(self._required(), self._is_ready, need - len(groups))
                groups += self.buffer.take(taken)
            if waiting:
                await self.buffer.wait(timeout=1.0)
            elif len(groups) < need:
                groups += await self.buffer.get(need - len(groups), timeout=1.0)
            if self._filtered - filtered_before < self.config.curriculum.max_filtered:
                groups = self._filter(groups)
            await self._notify()  # groups lost to failures (or filtered out) free room for replacements
        for group in groups:
            self.start_versions.pop(self.group_numbers[group[0].group_id], None)
        return groups

    def _filter(self, groups: list[list[Trajectory]]) -> list[list[Trajectory]]:
        """``curriculum.selection: filter``: ``groups`` without those whose rewards are all equal
        (GRPO gets no signal from them), which are counted and give their places to new groups."""
        if self.config.curriculum.selection != "filter":
            return groups
        kept = []
        for group in groups:
            if len({t.reward for t in group}) > 1:
                kept.append(group)
                continue
            number = self.group_numbers[group[0].group_id]
            self.state.filtered_groups.append(number)
            self.start_versions.pop(number, None)
            self._filtered += 1
        return kept

    async def _tail_round(self) -> list[list[Trajectory]]:
        """Tail batching (RollPacker, "Mitigating Long-Tail Rollouts for Fast, Synchronous RL
        Post-Training", 2025), one synchronous round per batch, every token from the current
        weights. A short round starts ``tail_extra`` more groups than the batch needs and takes the
        first ``groups_per_step`` to finish; the unfinished ones are aborted and queued (their
        episodes are never trained on), and once a batch's worth is queued, a long round plays those
        at full length. Groups that finished but were not needed are played again later."""
        need = self.config.groups_per_step
        queue = self.state.tail_queue
        long_round = len(queue) >= need
        if long_round:
            numbers = queue[:need]
            del queue[:need]
            for number in numbers:
                self.start_versions[number] = self.buffer.version
        else:
            numbers = await self._take(need + math.ceil(need * self.config.tail_extra))
        rounds = [asyncio.create_task(self._drain(numbers))]
        groups: list[list[Trajectory]] = []
        try:
            while len(groups) < need:
                groups += await self.buffer.get(need - len(groups), timeout=1.0)
                await self._notify()
                if len(groups) < need and all(r.done() for r in rounds) and not len(self.buffer):
                    for task in rounds:  # a stream that raised is a setup error: the run ends with it
                        if task.exception() is not None:
                            raise task.exception()  # type: ignore[misc]
                    more = await self._take(need - len(groups))  # groups lost to failed episodes: replacements
                    numbers += more
                    rounds.append(asyncio.create_task(self._drain(more)))
        finally:
            for task in rounds:
                task.cancel()
            await asyncio.gather(*rounds, return_exceptions=True)
        taken = {group[0].group_id for group in groups}
        aborted = []
        for number in numbers:
            group_id = self.engine.group_id(number)
            fate = self.buffer.state_of(group_id)
            if group_id in taken or fate == "gone":  # trained now, or lost to failed episodes (counted)
                continue
            self.buffer.abort(group_id)
            self.start_versions.pop(number, None)
            if fate == "pending":
                queue.append(number)  # the long tail: replayed in a long round
                aborted.append(number)
            else:
                self.replay.append(number)  # finished but not needed: played again in a short round
        self._tail = {"train/tail_long_round": float(long_round), "train/tail_aborted_groups": float(len(aborted))}
        return groups

    def _is_ready(self, group_id: str) -> bool:
        return self.buffer.state_of(group_id) == "ready"

    def _required(self) -> list[tuple[list[str], int]]:
        """:func:`~agentrl.rollout.staleness.required_groups` of the groups in flight now."""
        starts = {self.engine.group_id(n): v for n, v in self.start_versions.items()}
        live = {g: v for g, v in starts.items() if self.buffer.state_of(g) != "gone"}
        return required_groups(live, self.buffer.version, self.config.max_staleness, self.config.groups_per_step)

    async def _notify(self) -> None:
        """Tell the window what the buffer lost, and wake the producer."""
        stats = self.buffer.stats
        lost = stats.incomplete_groups + stats.stale_groups
        self.window.set_lost(lost + self._filtered)
        self.state.lost_groups = self._lost_before + lost
        for group_id in stats.dropped[len(self.state.dropped_groups) - self._dropped_before :]:
            number = self.group_numbers[group_id]
            self.state.dropped_groups.append(number)
            self.start_versions.pop(number, None)
        async with self.changed:
            self.changed.notify_all()

    async def _train_on(self, groups: list[list[Trajectory]], rollout_seconds: float) -> None:
        config, state = self.config, self.state
        trajectories = [t for group in groups for t in group]
        metrics = await asyncio.to_thread(self.trainer.step, trajectories, self.buffer.version)
        metrics.update(await self._curriculum_metrics(groups))
        metrics.update(self._tail)
        state.step += 1
        numbers = [self.group_numbers[group[0].group_id] for group in groups]
        state.trained_groups += numbers
        append_json(Path(config.run_dir) / "batches.jsonl", {"step": state.step, "groups": numbers})
        # The step is saved before its weights go to the engine (they become the next version: one
        # per update), so a fault in the sync or in the generation after it cannot cost the step.
        state.policy_version = self.buffer.version + 1 + self.version_offset
        if config.checkpoint_every and state.step % config.checkpoint_every == 0 and state.step < config.steps:
            await self.acheckpoint()
        synced = time.perf_counter()
        version = await self.policy.aupdate_weights(self.trainer.inference_weights())
        metrics["perf/time_sync"] = time.perf_counter() - synced
        self.buffer.set_version(version)
        self.window.trained(len(groups))
        state.policy_version = version + self.version_offset
        metrics.update(self._batch_metrics(trajectories, version))
        metrics.update(self._fault_metrics())
        metrics["perf/time_rollout"] = rollout_seconds
        metrics["perf/time_step"] = rollout_seconds + metrics["perf/time_train"] + metrics["perf/time_sync"]
        metrics["perf/tokens_per_s"] = sum(t.num_generated for t in trajectories) / metrics["perf/time_step"]
        self.metrics.log(state.step, metrics)
        self._write_samples(groups, state.step)
        self.progress.on_advance(metrics)
        if config.eval_every and state.step % config.eval_every == 0 and state.step < config.steps:
            await self._evaluate(state.step)
        await self._notify()

    def _fault_metrics(self) -> dict[str, float]:
        """What the run's faults cost so far: engines replaced or lost (and requests replayed), Ray env workers replaced."""
        metrics = self.policy.metrics() if isinstance(self.policy, (EngineSupervisor, RouterPolicy)) else {}
        retired = getattr(self.engine, "retired", None)  # a DistributedRollout's dead workers
        if retired is not None:
            metrics["fault/env_workers_replaced"] = float(len(retired))
        return metrics

    async def _curriculum_metrics(self, groups: list[list[Trajectory]]) -> dict[str, float]:
        """What the prompt selection did for this batch; with PCL, the value model's update on the
        success rates the batch's groups had (rewards clipped to [0, 1])."""
        selection = self.config.curriculum.selection
        if selection == "uniform":
            return {}
        metrics = {"perf/time_select": self._select_seconds}
        self._select_seconds = 0.0
        if selection == "filter":
            metrics["train/filtered_groups"] = float(self._filtered - self._filtered_reported)
            self._filtered_reported = self._filtered
            return metrics
        assert self.curriculum is not None
        numbers = [self.group_numbers[group[0].group_id] for group in groups]
        prompts = [group[0].token_ids[: group[0].prompt_length] for group in groups]
        rates = [sum(min(max(t.reward, 0.0), 1.0) for t in group) / len(group) for group in groups]
        predicted = [self._predicted.pop(n) for n in numbers if n in self._predicted]
        started = time.perf_counter()
        metrics["train/pcl_value_loss"] = await asyncio.to_thread(self.curriculum.update, prompts, rates)
        metrics["perf/time_select"] += time.perf_counter() - started
        if predicted:
            metrics["train/pcl_predicted_mean"] = sum(predicted) / len(predicted)
        metrics["train/pcl_success_mean"] = sum(rates) / len(rates)
        return metrics

    def _write_samples(self, groups: list[list[Trajectory]], step: int) -> None:
        """The first ``samples_per_step`` groups, with the advantages just trained on (``dashboard.records``)."""
        if self.config.samples_per_step <= 0:
            return
        sample = [t for group in groups[: self.config.samples_per_step] for t in group]
        advantages = self.trainer.last_advantages
        rows = None
        if advantages is not None:  # rows follow the batch's trajectories, whose first ones these are
            rows = [advantages[i, : len(t.token_ids)].tolist() for i, t in enumerate(sample)]
        try:
            write_samples(
                self.config.run_dir, sample_records(sample, step, "train", self.policy.tokenizer, rows), step, "train"
            )
        except Exception as e:  # the viewer's samples never stop a run
            log.warning("writing the dashboard's samples of step %d failed: %s", step, e)

    def _batch_metrics(self, trajectories: list[Trajectory], version: int) -> dict[str, float]:
        """``rollout/...`` of this step's batch (failed episodes since the last step included) and
        ``train/staleness...`` of its tokens."""
        summary = RolloutStats.of(trajectories).summary()
        del summary["perf/rollout_tokens_per_s"]  # the step's own perf/tokens_per_s says it
        stats = self.buffer.stats
        failed, self._failed_seen = stats.failed - self._failed_seen, stats.failed
        staleness = [
            version - 1 - v for t in trajectories for v in t.versions if v >= 0
        ]  # trained weights: version - 1
        return {
            **summary,
            "rollout/episodes": float(len(trajectories) + failed),
            "rollout/failed": float(failed),
            "train/staleness_mean": sum(staleness) / max(len(staleness), 1),
            "train/staleness_max": float(max(staleness, default=0)),
            "train/stale_groups": float(stats.stale_groups),
            "train/policy_version": float(version + self.version_offset),
        }

    # --- evaluation and checkpoints --------------------------------------------------------------

    def evaluate(self, step: int) -> dict[str, float]:
        """Play the held-out episodes now (blocking); log and return ``eval/...`` metrics."""
        return asyncio.run(self._evaluate(step))

    async def _evaluate(self, step: int) -> dict[str, float]:
        rollout = self.config.rollout
        engine = build_engine(
            rollout.env_id,
            self.policy,
            env_kwargs={**rollout.env_kwargs, "split": "test"},
            system_prompt=rollout.system_prompt,
            sampling=replace(sampling_of(rollout, temperature=self.config.eval_temperature), seed=None),
            limits=limits_of(rollout),
            concurrency=rollout.concurrency,
            env_url=rollout.env_url,
            seed=EVAL_SEED_OFFSET + rollout.seed,
        )
        self.progress.on_phase(f"evaluating (step {step})", self.config.eval_episodes)
        started = time.perf_counter()
        played: list[Trajectory] = []
        try:
            async for trajectory in engine.stream(self.config.eval_episodes):
                played.append(trajectory)
                self.progress.on_advance({})
        finally:
            engine.close()
        if self.config.samples_per_eval > 0:  # the same held-out seeds each time: lined up by group id
            sample = sorted(played, key=lambda t: t.group_id)[: self.config.samples_per_eval]
            write_samples(
                self.config.run_dir, sample_records(sample, step, "eval", self.policy.tokenizer), step, "eval"
            )
        summary = engine.stats.summary()
        result = {
            "eval/success_rate": summary["rollout/success_rate"],
            "eval/reward_mean": summary["rollout/reward_mean"],
            "eval/episodes": float(engine.stats.episodes),
            "eval/failed": float(engine.stats.failed),
            "eval/seconds": time.perf_counter() - started,
        }
        nll = await asyncio.to_thread(self.trainer.reference_nll, played)
        if nll is not None:  # the env gave reference answers: how likely the policy finds them
            result["eval/reference_nll"] = nll
        self.metrics.log(step, result)
        self.progress.on_result(result)
        return result

    def checkpoint(self) -> None:
        """Save the trainer, the controller state and the buffered groups (see trainers.checkpoint)."""
        save_checkpoint(*self._checkpoint_parts(), keep=self.config.keep_checkpoints)

    async def acheckpoint(self) -> None:
        """:meth:`checkpoint` with the file writing off the event loop (episodes go on meanwhile)."""
        await asyncio.to_thread(save_checkpoint, *self._checkpoint_parts(), keep=self.config.keep_checkpoints)

    def _checkpoint_parts(self) -> tuple[Any, ...]:
        # Taken on the loop, in one go: the buffer and the state are consistent with each other.
        buffered = [t for group in self.buffer.ready_groups() for t in group]
        return self.config.run_dir, self.state.step, self.trainer.state_dict(), asdict(self.state), buffered


def shift_versions(trajectory: Trajectory, offset: int) -> Trajectory:
    """``trajectory`` with its generated tokens' versions lowered by ``offset`` (never below 0)."""
    if not offset:
        return trajectory
    versions = [v if v < 0 else max(v - offset, 0) for v in trajectory.versions]
    return dataclasses.replace(trajectory, versions=versions)


def oldest_version(group: list[Trajectory], default: int) -> int:
    """The policy version of the oldest generated token of ``group``."""
    return min((v for t in group for v in t.versions if v >= 0), default=default)


def append_json(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()


def plot_quietly(run_dir: Path) -> Path | None:
    try:
        return plot_run(run_dir)
    except Exception as e:  # a missing plot must not lose a finished run; say why
        log.warning("could not plot %s: %s", run_dir, e)
        return None
