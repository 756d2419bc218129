"""The loop of a training run: one producer of groups, and one lane per policy consuming them.

The producer starts groups whenever every lane training in the stage has room in its
:class:`~agentrl.rollout.StalenessWindow` (replays of a resumed run first, then new group numbers,
chosen as ``curriculum.selection`` says). A group's episodes play on the rollout (in this process,
or on Ray env workers); once ``group_size`` of them ended well, the group is done, later ones are
redundant, and :class:`~agentrl.train.samples.SampleMaker` cuts the episodes into each policy's
samples: for a single-agent env, the one lane's group is the episodes as played. Each lane takes
``groups_per_step`` groups from its buffer, steps its trainer in a thread (episodes go on
meanwhile), saves the step, sends the weights to its engine and tells its buffer the new version,
which drops groups that are now too stale. Lanes step as soon as their own batch is ready, or all
together (``lockstep``); ``stages`` run in order. With ``tail_batching`` there is no producer: each
batch plays a round of its own (:meth:`Controller._tail_round`).

One lane logs ``train/loss``; several log ``train/<policy>/loss`` (:func:`agentrl.metrics.policy_metric`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from agentrl.build import build_rollout, rollout_settings, sampling_of
from agentrl.dashboard.records import sample_kind, sample_records, write_samples
from agentrl.faults import EpisodesFailing, RunStalled, WeightsMismatch
from agentrl.metrics import MetricsLogger, policy_metric, read_metrics
from agentrl.policies import Policy, Sampling
from agentrl.policies.router import RouterPolicy
from agentrl.policies.supervisor import EngineSupervisor, engine_died
from agentrl.rollout import FAULT_KINDS, RolloutStats, fault_kind, group_env_seed
from agentrl.rollout.protocol import ReplacesWorkers, Rollout
from agentrl.rollout.scheduler import close_quietly
from agentrl.rollout.staleness import required_groups, take_required
from agentrl.train.config import EVAL_SEED_OFFSET, StageConfig, TrainConfig
from agentrl.train.lane import Lane
from agentrl.train.samples import SampleMaker
from agentrl.train.state import RunState, append_json
from agentrl.trainers.checkpoint import save_checkpoint
from agentrl.trainers.curriculum import PromptCurriculum, closest_to_target
from agentrl.trainers.models import load_adapter_weights
from agentrl.trainers.trainer import Trainer
from agentrl.types import Trajectory

log = logging.getLogger(__name__)

PROBE_TOKENS = 8
"""Tokens the engine samples for the weights probe (``probe_every``)."""
STARVED_GROUPS = 32
"""Groups in a row, played without a fault, that hold no sample for a training policy before the run
stops saying so (its trainer would wait for a batch for ever)."""


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
    """The policy ids of a run of several policies (its evaluations are ``eval/<policy>/...``); empty for one."""


@dataclass
class Progress:
    """What the loop tells its caller as it goes (the CLI draws progress from it)."""

    on_phase: Callable[[str, int], None] = lambda name, total: None
    """A phase starts: its name and how many advances it takes (0: unknown)."""
    on_advance: Callable[[dict[str, Any]], None] = lambda info: None
    """One advance: a training step's metrics, or ``{}`` for an evaluation's episode."""
    on_result: Callable[[dict[str, Any]], None] = lambda metrics: None
    """An evaluation ended: its ``eval/...`` metrics."""
    on_resumed: Callable[[int], None] = lambda done: None
    """The training phase goes on: this many of its steps were taken before (by an earlier command
    that saved a checkpoint, or before an evaluation in the middle of the run)."""


class Controller:
    """The loop of one run (see the module docstring)."""

    def __init__(
        self,
        config: TrainConfig,
        lanes: dict[str, Lane],
        rollout: Rollout,
        metrics: MetricsLogger,
        state: RunState,
        buffered: list[Trajectory],
        progress: Progress,
        samples: SampleMaker,
        mapping: Callable[[str], str],
        curriculum: PromptCurriculum | None = None,
    ):
        self.config, self.lanes, self.rollout, self.metrics = config, lanes, rollout, metrics
        self.state, self.progress, self.samples, self.mapping = state, progress, samples, mapping
        self.curriculum = curriculum
        self.one = len(lanes) == 1
        self.stages = config.run_stages()
        self.stage = self.stages[min(state.stage, len(self.stages) - 1)]
        """The stage running now (set again as each stage starts)."""
        self.active: list[Lane] = []
        """The lanes still training in the current stage."""
        self.group_size = config.rollout.group_size
        self.per_group = config.rollout.group_size + config.rollout.redundancy
        self.numbers = {rollout.group_id(n): n for n in range(state.next_group)}
        """Group id -> group number, of every group started in the run."""
        by_lane: dict[str, dict[str, list[Trajectory]]] = {}
        for trajectory in buffered:  # back into the buffer of the policy it was for, group by group
            by_lane.setdefault(trajectory.policy_id, {}).setdefault(trajectory.group_id, []).append(trajectory)
        for policy_id, lane in lanes.items():
            lane.resume(list(by_lane.get(policy_id, {}).values()), self.numbers)
        self.replay = state.replay()
        """Groups started before the checkpoint that reached no policy: played again first."""
        self.arrived: dict[int, list[list[Trajectory]]] = {}
        """The groups in flight: the episodes each has so far."""
        self._workers_replaced_before = state.env_workers_replaced  # by the commands before this one
        self.failed_episodes = 0
        self.failed_in_a_row = 0
        """Episodes failed since the last one that did not (:attr:`TrainConfig.max_failed_in_a_row`)."""
        self._finished_at = 0.0  # when a group last finished, or groups were played again after none was
        self.changed = asyncio.Condition()
        self._draining: set[asyncio.Task[None]] = set()
        self._drain_error: BaseException | None = None
        self._saved_at = -1
        self._predicted: dict[int, float] = {}  # PCL: the value model's prediction for each group played
        self._probe: Any = None  # PCL: the env that shows candidate prompts
        self._select_seconds = 0.0  # prompt selection since the last step
        self._tail: dict[str, float] = {}  # tail batching: what the last round did
        self._steps_shown = 0  # training steps the progress was told of, an earlier command's included

    # --- stages --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run the stages from the one reached; every training policy takes its steps in each."""
        self._steps_shown = sum(self.lanes[p].state.step for p in self._trainable())
        self._training_phase()
        self._restore_rows()
        try:
            # The last stage stays the run's stage when done, so that a run resumed with more steps
            # in it goes on where it stopped.
            while True:
                await self._run_stage(self.stages[self.state.stage])
                if self.state.stage == len(self.stages) - 1:
                    break
                self.state.stage += 1
                for lane in self.lanes.values():
                    lane.state.stage_step = 0
        finally:
            self.rollout.close()
            if self._probe is not None:
                close_quietly(self._probe)

    def _trainable(self) -> list[str]:
        return [p for p, lane in self.lanes.items() if lane.trainer is not None]

    async def _run_stage(self, stage: StageConfig) -> None:
        training = [self.lanes[p] for p in self._trainable() if self.config.trains_in(stage, p)]
        for lane in self.lanes.values():
            if lane not in training:  # it only plays: what it had buffered is not for it any more
                lane.buffer.get_nowait(len(lane.buffer))
                lane.start_versions.clear()
            lane.open_stage(stage.lr.get(lane.policy_id))
        for lane in training:
            if lane.settings.init_from and lane.state.step == 0 and lane.state.stage_step == 0:
                await self._init_from(lane, lane.settings.init_from)
        self.stage = stage
        self.samples.reward_args = dict(stage.reward)
        self.active = [lane for lane in training if lane.state.stage_step < stage.steps]
        producer = None if self.config.tail_batching else asyncio.create_task(self._produce())
        if producer is not None:  # a producer that raised starts no group again: the lanes raise it
            producer.add_done_callback(self._drained)
        watchdog = asyncio.create_task(self._watch()) if self.config.stall_timeout else None
        try:
            if producer is None:
                while self.active:  # every training policy steps on each round's groups
                    lanes = list(self.active)
                    waited = time.perf_counter()
                    batches = await self._tail_round(lanes)
                    seconds = time.perf_counter() - waited
                    await asyncio.gather(*(self._train_on(lane, batches[lane.policy_id], seconds) for lane in lanes))
            elif self.config.lockstep:
                while self.active:
                    lanes = list(self.active)
                    waited = time.perf_counter()
                    batches = await asyncio.gather(*(self._next_batch(lane) for lane in lanes))
                    seconds = time.perf_counter() - waited
                    await asyncio.gather(*(self._train_on(lane, b, seconds) for lane, b in zip(lanes, batches)))
            else:
                await asyncio.gather(*(self._train_lane(lane) for lane in list(self.active)))
        finally:
            for task in (producer, watchdog):
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            self.state.abandoned_groups += sorted(self.arrived)
            for number in self.arrived:  # never to arrive: no policy may wait for them next stage
                for lane in self.lanes.values():
                    lane.start_versions.pop(number, None)
            self.arrived.clear()

    async def _init_from(self, lane: Lane, source: str) -> None:
        """Start ``lane`` from ``source``: another lane's weights, or a LoRA adapter's directory."""
        assert lane.trainer is not None
        if source in self.lanes:
            other = self.lanes[source].trainer
            assert other is not None
            lane.trainer.model.load_state_dict(other.model.state_dict())  # type: ignore[attr-defined]
        else:
            load_adapter_weights(lane.trainer.model, source)  # type: ignore[attr-defined]
        version = await lane.policy.aupdate_weights(lane.weights())
        lane.buffer.set_version(version)
        log.info("policy %s starts from the weights of %s", lane.policy_id, source)

    async def _train_lane(self, lane: Lane) -> None:
        while lane in self.active:
            waited = time.perf_counter()
            groups = await self._next_batch(lane)
            await self._train_on(lane, groups, time.perf_counter() - waited)

    # --- producing groups ----------------------------------------------------------------------

    def _room(self) -> int:
        return min((lane.window.room() for lane in self.active), default=0)

    async def _produce(self) -> None:
        """Start groups whenever every active lane has room: replays first, then new group numbers."""
        try:
            while True:
                async with self.changed:
                    await self.changed.wait_for(lambda: self._room() > 0)
                    room = self._room()
                chunk = await self._take(room)  # only this task starts groups: the room is still there
                for lane in self.active:
                    lane.window.start(len(chunk))
                task = asyncio.create_task(self._drain(chunk))
                self._draining.add(task)
                task.add_done_callback(self._drained)
        finally:
            for task in self._draining:
                task.cancel()
            await asyncio.gather(*self._draining, return_exceptions=True)

    async def _take(self, room: int) -> list[int]:
        """The numbers of the next ``room`` groups to start, each noted with the versions it starts
        at: replays first, then new numbers (with PCL, the best of ``curriculum.pool`` candidates each)."""
        chunk = self.replay[:room]
        del self.replay[: len(chunk)]
        need = room - len(chunk)
        pool = self.config.curriculum.pool if self.curriculum is not None else 1
        candidates = list(range(self.state.next_group, self.state.next_group + need * pool))
        self.state.next_group += len(candidates)
        for number in candidates:
            self.numbers[self.rollout.group_id(number)] = number
        if self.curriculum is not None and candidates:
            chosen = set(await self._select(candidates, need))
            self.state.skipped_groups += [n for n in candidates if n not in chosen]
            candidates = [n for n in candidates if n in chosen]
        chunk += candidates
        for number in chunk:
            self.arrived[number] = []
            for lane in self.active:
                lane.start_versions[number] = lane.buffer.version
        return chunk

    async def _select(self, candidates: list[int], need: int) -> list[int]:
        """PCL: the ``need`` candidates whose first prompts the value model predicts closest to the target."""
        assert self.curriculum is not None
        started = time.perf_counter()
        if self._probe is None:
            self._probe = self.rollout.make_env()
        prompts = []
        for number in candidates:
            observation, _ = await self._probe.areset(seed=group_env_seed(self.rollout.settings.seed, number))
            prompts.append(self.rollout.agent.prompt_ids(observation))
        predictions = await asyncio.to_thread(self.curriculum.predict, prompts)
        kept = closest_to_target(predictions, need, self.curriculum.target)
        for index in kept:
            self._predicted[candidates[index]] = predictions[index]
        self._select_seconds += time.perf_counter() - started
        return [candidates[i] for i in kept]

    def _drained(self, task: asyncio.Task[None]) -> None:
        """A chunk's stream, or the producer, ended. An exception there (a setup error: the env
        cannot be made, say) is kept and raised by the lanes, which would otherwise wait forever."""
        self._draining.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._stop(task.exception())  # type: ignore[arg-type]

    def _stop(self, error: BaseException) -> None:
        """End the run with ``error``: the lanes, which look for it at least once a second, raise it."""
        if self._drain_error is None:
            self._drain_error = error

    async def _watch(self) -> None:
        """Stop the run when no group has finished for ``stall_timeout`` seconds while some were
        played (the clock stands while none is: the trainer stepping, a stage changing)."""
        limit = self.config.stall_timeout
        self._finished_at = time.monotonic()
        while True:
            await asyncio.sleep(min(limit / 4, 5.0))
            idle = time.monotonic() - self._finished_at
            if not self.arrived:
                self._finished_at = time.monotonic()
            elif idle > limit:
                self._stop(
                    RunStalled(
                        f"no group finished for {idle:.0f} s (stall_timeout {limit:g} s) while {len(self.arrived)} "
                        "were being played: an env, a sandbox, the env server or an engine hangs (the run's "
                        "train.log may say which); raise stall_timeout if episodes really take this long."
                    )
                )
                return

    async def _drain(self, chunk: list[int]) -> None:
        async for episode in self.rollout.stream_episodes(groups=chunk):
            if self._arrive(episode):
                async with self.changed:
                    self.changed.notify_all()

    def _number(self, group_id: str) -> int:
        """The group number of a trajectory's group id (a multi-agent one ends in ``/<agent>``)."""
        number = self.numbers.get(group_id)
        return number if number is not None else self.numbers[group_id.rsplit("/", 1)[0]]

    def _arrive(self, episode: list[Trajectory]) -> bool:
        """One episode ended; whether it finished its group (``group_size`` good episodes, or all
        of them). Episodes of a finished group are redundant and dropped."""
        errors = [t.error for t in episode if t.error is not None]
        retried = episode[0].info.get("retried", [])
        for error in [*retried, *errors[:1]]:  # every failed try, by kind
            kind = fault_kind(error)
            self.state.faults[kind] = self.state.faults.get(kind, 0) + 1
        self.state.retried_episodes += len(retried)
        self.failed_episodes += bool(errors)
        self.failed_in_a_row = self.failed_in_a_row + len(retried) + 1 if errors else 0
        limit = self.config.max_failed_in_a_row
        if limit and self.failed_in_a_row >= limit:
            self._stop(
                EpisodesFailing(
                    f"{self.failed_in_a_row} episodes failed one after another (max_failed_in_a_row {limit}), "
                    f"the last with: {errors[0]}"
                )
            )
        number = self._number(episode[0].group_id)
        episodes = self.arrived.get(number)
        if episodes is None:  # redundant, or its group was aborted
            return False
        episodes.append(episode)
        good = [e for e in episodes if all(t.error is None for t in e)]
        if len(good) < self.group_size and len(episodes) < self.per_group:
            return False
        del self.arrived[number]
        self._finish_group(number, good)
        return True

    def _finish_group(self, number: int, good: list[list[Trajectory]]) -> None:
        """Group ``number`` is done: each training policy gets its samples of it as one group, or
        counts the group lost (too few good episodes, or no sample for it)."""
        self.state.finished_groups.append(number)
        self._finished_at = time.monotonic()
        policies = {lane.policy_id for lane in self.active}
        if len(good) < self.group_size:  # failed past its retries: lost to every policy, replaced
            self.state.replaced_groups.append(number)
        samples = self.samples.split(good, policies) if len(good) >= self.group_size else {}
        group_id = self.rollout.group_id(number)
        for lane in self.active:
            group = samples.get(lane.policy_id, [])
            if not group:
                lane.lose(number)
                lane.starved += len(good) >= self.group_size
                if lane.starved == STARVED_GROUPS:
                    self._stop(
                        RunStalled(
                            f"policy {lane.policy_id} got no sample from the last {STARVED_GROUPS} groups in a row, "
                            f"played without a fault: none of its agents took a turn (in a turn-based game an "
                            f"earlier player may end every game first, e.g. by invalid moves), or the run's "
                            f"samples_fn gave it none. Its trainer would wait for a batch for ever: map its "
                            f"agents to a policy that plays, or pick an env where they move."
                        )
                    )
                continue
            lane.starved = 0
            lane.buffer.put_group(group_id, [replace(t, group_id=group_id) for t in group])
            lane.count_dropped(self.numbers)  # dropped on arrival if already too stale

    # --- batches -------------------------------------------------------------------------------

    async def _next_batch(self, lane: Lane) -> list[list[Trajectory]]:
        """The lane's next batch. With ``stragglers: wait``, first the groups it must hold so that
        none becomes too stale (:func:`~agentrl.rollout.staleness.required_groups`), waited for if
        they still run; the other places, and every place with ``drop``, go to groups in the order
        they completed."""
        need = lane.groups_per_step
        groups: list[list[Trajectory]] = []
        filtered_before = lane.filtered
        while len(groups) < need:
            if self._drain_error is not None:
                raise self._drain_error
            waiting = False
            if self.config.stragglers == "wait":
                ready = lambda g: lane.buffer.state_of(g) == "ready"  # noqa: E731
                taken, waiting = take_required(self._required(lane), ready, need - len(groups))
                groups += lane.buffer.take(taken)
            if waiting:
                await lane.buffer.wait(timeout=1.0)
            elif len(groups) < need:
                groups += await lane.buffer.get(need - len(groups), timeout=1.0)
            groups = self._filter(lane, groups, self.config.curriculum.max_filtered - (lane.filtered - filtered_before))
            async with self.changed:  # groups filtered out free room for replacements
                self.changed.notify_all()
        for group in groups:
            lane.start_versions.pop(self.numbers[group[0].group_id], None)
        return groups

    def _filter(self, lane: Lane, groups: list[list[Trajectory]], budget: int) -> list[list[Trajectory]]:
        """``curriculum.selection: filter``: ``groups`` without those whose rewards are all equal
        (GRPO gets no signal from them), at most ``budget`` of them (the step's ``max_filtered`` not
        yet used), which are counted and give their places to new groups."""
        if self.config.curriculum.selection != "filter":
            return groups
        kept = []
        for group in groups:
            if budget > 0 and len({t.reward for t in group}) == 1:
                lane.drop_filtered(self.numbers[group[0].group_id])
                budget -= 1
            else:
                kept.append(group)
        return kept

    def _required(self, lane: Lane) -> list[tuple[list[str], int]]:
        """:func:`~agentrl.rollout.staleness.required_groups` of the lane's groups in flight now."""
        starts = {self.rollout.group_id(n): v for n, v in lane.start_versions.items()}
        live = {g: v for g, v in starts.items() if lane.buffer.state_of(g) != "gone"}
        return required_groups(live, lane.buffer.version, lane.max_staleness, lane.groups_per_step)

    async def _tail_round(self, lanes: list[Lane]) -> dict[str, list[list[Trajectory]]]:
        """Tail batching (RollPacker, "Mitigating Long-Tail Rollouts for Fast, Synchronous RL
        Post-Training", 2025), one synchronous round per batch, every token from the current
        weights. A short round starts ``tail_extra`` more groups than a batch needs and each
        training policy takes the first ``groups_per_step`` of its groups to finish; the unfinished
        ones are aborted and queued (their episodes are never trained on), and once a batch's worth
        is queued, a long round plays those at full length. Groups that finished but no policy
        needed are played again later; one that some policies took is lost to the others."""
        need = self.config.groups_per_step
        queue = self.state.tail_queue
        long_round = len(queue) >= need
        if long_round:
            numbers = queue[:need]
            del queue[:need]
            for number in numbers:
                self.arrived[number] = []
                for lane in lanes:
                    lane.start_versions[number] = lane.buffer.version
        else:
            numbers = await self._take(need + math.ceil(need * self.config.tail_extra))
        rounds = [asyncio.create_task(self._drain(numbers))]
        batches: dict[str, list[list[Trajectory]]] = {lane.policy_id: [] for lane in lanes}
        short = lambda: [lane for lane in lanes if len(batches[lane.policy_id]) < need]  # noqa: E731
        try:
            while pending := short():
                if self._drain_error is not None:
                    raise self._drain_error
                got = await asyncio.gather(
                    *(lane.buffer.get(need - len(batches[lane.policy_id]), timeout=1.0) for lane in pending)
                )
                for lane, groups in zip(pending, got):
                    batches[lane.policy_id] += groups
                pending = short()
                if pending and all(r.done() for r in rounds) and not any(len(lane.buffer) for lane in pending):
                    for task in rounds:  # a stream that raised is a setup error: the run ends with it
                        if task.exception() is not None:
                            raise task.exception()  # type: ignore[misc]
                    missing = max(need - len(batches[lane.policy_id]) for lane in pending)
                    more = await self._take(missing)  # groups lost to failed episodes: replacements
                    numbers += more
                    rounds.append(asyncio.create_task(self._drain(more)))
            # The long tail is what runs when the batches are full; one finishing while the round is
            # cancelled below is still the tail, not a group finished but unneeded.
            tail = {number for number in numbers if number in self.arrived}
        finally:
            for task in rounds:
                task.cancel()
            await asyncio.gather(*rounds, return_exceptions=True)
        taken = {p: {self.numbers[group[0].group_id] for group in groups} for p, groups in batches.items()}
        anyone = set().union(*taken.values())
        aborted = []
        for number in numbers:
            group_id = self.rollout.group_id(number)
            if number in tail:  # was still running: the long tail, replayed in a long round
                for lane in lanes:
                    lane.buffer.abort(group_id)
                    lane.start_versions.pop(number, None)
                if self.arrived.pop(number, None) is None:  # it finished as the round was cancelled
                    self.state.finished_groups.remove(number)
                queue.append(number)
                aborted.append(number)
                continue
            unneeded = [
                lane
                for lane in lanes
                if number not in taken[lane.policy_id] and lane.buffer.state_of(group_id) == "ready"
            ]
            for lane in unneeded:  # finished, but this policy had its batch
                lane.buffer.abort(group_id)
                lane.start_versions.pop(number, None)
                if number in anyone:  # another policy trained on it: not played again
                    lane.lose(number)
            if unneeded and number not in anyone:  # nobody needed it: played again in a short round
                self.state.finished_groups.remove(number)
                self.replay.append(number)
        self._tail = {"train/tail_long_round": float(long_round), "train/tail_aborted_groups": float(len(aborted))}
        return batches

    # --- training ------------------------------------------------------------------------------

    async def _train_on(self, lane: Lane, groups: list[list[Trajectory]], rollout_seconds: float) -> None:
        assert lane.trainer is not None
        trajectories = [t for group in groups for t in group]
        async with lane.lock:
            metrics = await asyncio.to_thread(lane.trainer.step, trajectories, lane.buffer.version)
            lane.state.step += 1
            lane.state.stage_step += 1
            numbers = [self.numbers[group[0].group_id] for group in groups]
            lane.state.trained_groups += numbers
            lane.state.policy_version = lane.buffer.version + 1 + lane.version_offset  # what the sync makes it
        metrics.update(await self._curriculum_metrics(lane, groups))
        metrics.update(self._tail)
        record = {"step": lane.state.step, "groups": numbers}
        append_json(
            Path(self.config.run_dir) / "batches.jsonl", record if self.one else {"policy": lane.policy_id, **record}
        )
        # The step's records go first (its samples now, its row with the checkpoint), so that a
        # step a checkpoint saves is never without them, whatever ends the process after the save.
        env_metrics = self._complete(lane, metrics, groups, rollout_seconds)
        lane.state.pending_row = self._row(lane, metrics, groups, env_metrics)
        # The step is saved before its weights go to the engine (they become the next version: one
        # per update), so a fault in the sync or in the generation after it cannot cost the step.
        finishing = lane.state.stage_step >= self.stage.steps
        every = self.config.checkpoint_every
        if every and lane.state.step % every == 0 and any(other is not lane or not finishing for other in self.active):
            await self.acheckpoint()
        async with lane.lock:
            synced = time.perf_counter()
            try:
                version = await lane.policy.aupdate_weights(lane.weights())
            except BaseException:
                # The step is saved and a resume does not train it again: its row is written now,
                # with the version the sync was to make, or never.
                self._log_row(lane)
                raise
            metrics["perf/time_sync"] = time.perf_counter() - synced
            if self._weights_probe_due(lane):
                metrics["fault/adapter_probe_gap"] = await self._probe_weights(lane, groups[0][0])
            metrics["train/policy_version"] = float(version + lane.version_offset)
            lane.state.pending_row = self._row(lane, metrics, groups, env_metrics)
            lane.buffer.set_version(version)
            lane.window.trained(len(groups))
            lane.count_dropped(self.numbers)
            lane.state.policy_version = version + lane.version_offset
        if finishing and lane in self.active:
            self.active.remove(lane)
        self._log_row(lane)
        self._check_probe(lane, metrics.get("fault/adapter_probe_gap"))  # after its row: the gap is on record
        self.progress.on_advance(metrics)
        self._steps_shown += 1
        if self.config.eval_every and lane.state.step % self.config.eval_every == 0 and self.active:
            await self._evaluate()
            self._training_phase()  # training goes on after the evaluation
        async with self.changed:
            self.changed.notify_all()

    def _training_phase(self) -> None:
        """Tell the progress that training starts, or goes on (after a checkpoint or an evaluation)
        with the steps it was shown so far. Not the lanes' step counts: another policy's step may be
        counted there and not yet shown while an evaluation runs."""
        self.progress.on_phase("training", sum(self.config.policy_steps(p) for p in self._trainable()))
        if self._steps_shown:
            self.progress.on_resumed(self._steps_shown)

    def _weights_probe_due(self, lane: Lane) -> bool:
        """Whether ``lane``'s weights are probed after this step's sync: every ``probe_every`` steps,
        and at the first step after its engine was replaced."""
        if not self.config.probe_every or not isinstance(lane.trainer, Trainer):
            return False
        restarts = lane.policy.restarts if isinstance(lane.policy, EngineSupervisor) else 0
        due = lane.state.step % self.config.probe_every == 0 or restarts != lane.probed_restarts
        lane.probed_restarts = restarts
        return due

    async def _probe_weights(self, lane: Lane, sample: Trajectory) -> float:
        """The engine, just synced, samples a few tokens after ``sample``'s prompt and the trainer
        scores them (:meth:`~agentrl.trainers.trainer.Trainer.logprob_gap`); past
        ``probe_tolerance`` the step's row is written and the run ends (:meth:`_check_probe`)."""
        assert isinstance(lane.trainer, Trainer)
        prompt = sample.token_ids[: sample.prompt_length]
        sampling = Sampling(max_tokens=PROBE_TOKENS, temperature=lane.trainer.config.temperature or 1.0, seed=0)
        for tries_left in reversed(range(3)):
            try:
                generation = await lane.policy.generate(prompt, sampling)
                break
            except Exception as e:  # an engine that died is being replaced with these weights: probe the new one
                if not (isinstance(lane.policy, EngineSupervisor) and engine_died(e)) or not tries_left:
                    raise
        n, p = len(generation.token_ids), len(prompt)
        probe = Trajectory(
            token_ids=prompt + list(generation.token_ids), loss_mask=[0] * p + [1] * n,
            logprobs=[0.0] * p + list(generation.logprobs), versions=[-1] * p + [generation.version] * n,
            prompt_length=p, turn_ends=[p + n - 1], turn_rewards=[0.0],
        )  # fmt: skip
        return await asyncio.to_thread(lane.trainer.logprob_gap, [probe])

    def _check_probe(self, lane: Lane, gap: float | None) -> None:
        """End the run (:class:`~agentrl.faults.WeightsMismatch`) when this step's probe gap is past ``probe_tolerance``."""
        if gap is not None and gap > self.config.probe_tolerance:
            raise WeightsMismatch(
                f"policy {lane.policy_id}'s engine serves other weights than its trainer sent: right after step "
                f"{lane.state.step}'s sync its log-probs of its own {PROBE_TOKENS}-token sample (or fewer) differ "
                f"from the trainer's by {gap:.3g} per token (probe_tolerance {self.config.probe_tolerance:g}); an "
                "update did not reach it"
            )

    def _complete(
        self, lane: Lane, metrics: dict[str, float], groups: list[list[Trajectory]], rollout_seconds: float
    ) -> dict[str, float]:
        """Complete a step's ``metrics`` with its batch (at the version its sync is to make), its
        faults and rollout time; write its samples; return the env's own metrics of the batch, named."""
        trajectories = [t for group in groups for t in group]
        metrics.update(self._batch_metrics(lane, trajectories, lane.buffer.version + 1))
        metrics.update(self._fault_metrics(lane))
        metrics["perf/time_rollout"] = rollout_seconds
        if len(self.stages) > 1:
            metrics["train/stage"] = float(self.state.stage)
        reported = self.samples.report(lane.policy_id, trajectories)
        self._write_samples(lane, groups)
        return {self._env_prefix(lane) + k: v for k, v in reported.items()}

    def _env_prefix(self, lane: Lane) -> str:
        """Where the names ``metrics_fn`` reports are logged: ``env/<env id>/``, then the policy in
        a run of several."""
        return f"env/{self.config.rollout.env_id}/" + ("" if self.one else f"{lane.policy_id}/")

    def _row(
        self, lane: Lane, metrics: dict[str, float], groups: list[list[Trajectory]], env_metrics: dict[str, float]
    ) -> dict[str, float]:
        """The step's row as logged: ``metrics`` with the step's whole time and throughput (its sync
        included once timed), named for the lane, and the env's metrics."""
        metrics["perf/time_step"] = (
            metrics["perf/time_rollout"] + metrics["perf/time_train"] + metrics.get("perf/time_sync", 0.0)
        )
        metrics["perf/tokens_per_s"] = sum(t.num_generated for g in groups for t in g) / metrics["perf/time_step"]
        return {**self._named(metrics, lane), **env_metrics}

    def _log_row(self, lane: Lane) -> None:
        """Write the lane's pending row (its last step's) to the run's metrics."""
        assert lane.state.pending_row is not None
        self.metrics.log(lane.state.step, lane.state.pending_row)
        lane.state.pending_row = None

    def _restore_rows(self) -> None:
        """Log the row of a step its checkpoint saved but the metrics never got (the process was
        killed, or its disk filled up, between the two): the row as the checkpoint kept it."""
        pending = [lane for lane in self.lanes.values() if lane.state.pending_row is not None]
        if not pending:
            return
        logged = read_metrics(self.config.run_dir) if self.metrics.resumed else []
        for lane in pending:
            name = next(iter(self._named({"train/policy_version": 0.0}, lane)))
            if not any(entry["step"] == lane.state.step and entry.get(name) is not None for entry in logged):
                self._log_row(lane)
            lane.state.pending_row = None

    def _named(self, metrics: dict[str, float], lane: Lane) -> dict[str, float]:
        """``metrics`` as the run logs them: as they are for one lane, per policy for several."""
        if self.one:
            return metrics
        return {policy_metric(name, lane.policy_id): value for name, value in metrics.items()}

    def _batch_metrics(self, lane: Lane, trajectories: list[Trajectory], version: int) -> dict[str, float]:
        """``rollout/...`` of this step's batch (failed episodes since the lane's last step included)
        and ``train/staleness...`` of its tokens."""
        summary = RolloutStats.of(trajectories).summary()
        del summary["perf/rollout_tokens_per_s"]  # the step's own perf/tokens_per_s says it
        failed_total = self.failed_episodes + self.samples.failures
        failed, lane.failed_seen = failed_total - lane.failed_seen, failed_total
        staleness = [version - 1 - v for t in trajectories for v in t.versions if v >= 0]  # trained: version - 1
        return {
            **summary,
            "rollout/episodes": float(len(trajectories) + failed),
            "rollout/failed": float(failed),
            "train/staleness_mean": sum(staleness) / max(len(staleness), 1),
            "train/staleness_max": float(max(staleness, default=0)),
            "train/stale_groups": float(lane.buffer.stats.stale_groups),
            "train/policy_version": float(version + lane.version_offset),
        }

    def _fault_metrics(self, lane: Lane) -> dict[str, float]:
        """What the run's faults cost so far: episode tries failed by kind, retried, groups replaced;
        engines replaced or lost (and requests replayed), Ray env workers replaced."""
        metrics = lane.policy.metrics() if isinstance(lane.policy, (EngineSupervisor, RouterPolicy)) else {}
        metrics |= {f"fault/{kind}": float(self.state.faults.get(kind, 0)) for kind in FAULT_KINDS}
        metrics["fault/episodes_retried"] = float(self.state.retried_episodes)
        metrics["fault/groups_replaced"] = float(len(self.state.replaced_groups))
        if isinstance(self.rollout, ReplacesWorkers):  # a DistributedRollout's dead workers, resumes included
            self.state.env_workers_replaced = self._workers_replaced_before + len(self.rollout.retired)
            metrics["fault/env_workers_replaced"] = float(self.state.env_workers_replaced)
        return metrics

    async def _curriculum_metrics(self, lane: Lane, groups: list[list[Trajectory]]) -> dict[str, float]:
        """What the prompt selection did for this batch; with PCL, the value model's update on the
        success rates the batch's groups had (rewards clipped to [0, 1])."""
        selection = self.config.curriculum.selection
        if selection == "uniform":
            return {}
        metrics = {"perf/time_select": self._select_seconds}
        self._select_seconds = 0.0
        if selection == "filter":
            metrics["train/filtered_groups"] = float(lane.filtered - lane.filtered_reported)
            lane.filtered_reported = lane.filtered
            return metrics
        assert self.curriculum is not None
        numbers = [self.numbers[group[0].group_id] for group in groups]
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

    def _kind(self, kind: str, lane: Lane) -> str:
        return kind if self.one else sample_kind(kind, lane.policy_id)

    def _write_samples(self, lane: Lane, groups: list[list[Trajectory]]) -> None:
        """The first ``samples_per_step`` groups, with the advantages just trained on (``dashboard.records``)."""
        if self.config.samples_per_step <= 0 or lane.trainer is None:
            return
        sample = [t for group in groups[: self.config.samples_per_step] for t in group]
        advantages = lane.trainer.last_advantages
        rows = None
        if advantages is not None:  # rows follow the batch's trajectories, whose first ones these are
            rows = [advantages[i, : len(t.token_ids)].tolist() for i, t in enumerate(sample)]
        step, kind = lane.state.step, self._kind("train", lane)
        try:
            write_samples(
                self.config.run_dir, sample_records(sample, step, kind, lane.policy.tokenizer, rows), step, kind
            )
        except Exception as e:  # the viewer's samples never stop a run
            log.warning("writing the dashboard's samples of step %d failed: %s", step, e)

    # --- evaluation and checkpoints --------------------------------------------------------------

    def evaluate(self, against_base: tuple[str, Policy] | None = None) -> dict[str, float]:
        """Play the held-out episodes now (blocking); log and return ``eval/...`` (one lane) or
        ``eval/<policy>/...``, each at its policy's step.

        ``against_base=(policy_id, base)``: that policy plays its agents, ``base`` every other
        agent; logged as ``eval/<policy_id>/vs_base_success_rate`` and ``.../vs_base_reward_mean``.
        """
        return asyncio.run(self._evaluate(against_base))

    async def _evaluate(self, against_base: tuple[str, Policy] | None = None) -> dict[str, float]:
        rollout = self.config.rollout
        policies = {p: lane.policy for p, lane in self.lanes.items()}
        if against_base is not None:
            policies = {p: policy if p == against_base[0] else against_base[1] for p, policy in policies.items()}
        held_out = rollout_settings(
            rollout,
            env_kwargs={**rollout.env_kwargs, "split": "test"},
            sampling=replace(sampling_of(rollout, temperature=self.config.eval_temperature), seed=None),
            group_size=1,
            redundancy=0,
            seed=EVAL_SEED_OFFSET + rollout.seed,
            mapping=self.mapping,
        )
        engine = build_rollout(held_out, policies)
        steps = self.state.steps()
        if against_base is not None:
            phase = f"evaluating {against_base[0]} against the base model (step {steps})"
        else:
            phase = f"evaluating (step {steps})" if self.one else f"evaluating (step {steps} of all policies)"
        self.progress.on_phase(phase, self.config.eval_episodes)
        started = time.perf_counter()
        played: list[Trajectory] = []
        try:
            async for episode in engine.stream_episodes(self.config.eval_episodes):  # one tick per episode
                played += episode
                self.progress.on_advance({})
        finally:
            engine.close()
        seconds = time.perf_counter() - started
        result: dict[str, float] = {}
        for policy_id, stats in sorted(engine.policy_stats.items()):
            lane = self.lanes[policy_id]
            summary = stats.summary()
            if against_base is not None:
                if policy_id == against_base[0]:
                    named = {
                        policy_metric("eval/vs_base_success_rate", policy_id): summary["rollout/success_rate"],
                        policy_metric("eval/vs_base_reward_mean", policy_id): summary["rollout/reward_mean"],
                    }
                    self.metrics.log(lane.state.step, named)
                    result.update(named)
                continue
            scores = {
                "eval/success_rate": summary["rollout/success_rate"],
                "eval/reward_mean": summary["rollout/reward_mean"],
                "eval/episodes": float(stats.episodes),
                "eval/failed": float(stats.failed),
                "eval/seconds": seconds,
            }
            mine = [t for t in played if t.policy_id == policy_id]
            if lane.trainer is not None:
                nll = await asyncio.to_thread(lane.trainer.reference_nll, mine)
                if nll is not None:  # the env gave reference answers: how likely the policy finds them
                    scores["eval/reference_nll"] = nll
            self._write_eval_samples(lane, mine)
            named = self._named(scores, lane)
            reported = self.samples.report(policy_id, mine, held_out=True)
            named.update({f"{self._env_prefix(lane)}held_out/{k}": v for k, v in reported.items()})
            self.metrics.log(lane.state.step, named)  # at the policy's own step
            result.update(named)
        self.progress.on_result(result)
        return result

    def _write_eval_samples(self, lane: Lane, played: list[Trajectory]) -> None:
        """The first ``samples_per_eval`` held-out trajectories (the same seeds each time: lined up by group id)."""
        if self.config.samples_per_eval <= 0:
            return
        sample = sorted(played, key=lambda t: t.group_id)[: self.config.samples_per_eval]
        step, kind = lane.state.step, self._kind("eval", lane)
        try:
            write_samples(self.config.run_dir, sample_records(sample, step, kind, lane.policy.tokenizer), step, kind)
        except Exception as e:  # the viewer's samples never stop a run
            log.warning("writing the dashboard's held-out samples of step %d failed: %s", step, e)

    def checkpoint(self) -> None:
        """Save every trainer, the run state and every policy's buffered groups (see trainers.checkpoint)."""
        save_checkpoint(*self._checkpoint_parts(), keep=self.config.keep_checkpoints)

    async def acheckpoint(self) -> None:
        """:meth:`checkpoint` once no policy is mid-step, the writing off the event loop. The
        policies wait for it (their weights are being saved); episodes go on."""
        lanes = [self.lanes[p] for p in sorted(self.lanes)]
        for lane in lanes:
            await lane.lock.acquire()
        try:
            parts = self._checkpoint_parts()
            if parts[1] != self._saved_at:  # two policies reaching the mark together save once
                await asyncio.to_thread(save_checkpoint, *parts, keep=self.config.keep_checkpoints)
                self._saved_at = parts[1]
        finally:
            for lane in lanes:
                lane.lock.release()

    def _checkpoint_parts(self) -> tuple[Any, ...]:
        # Taken on the loop, in one go: the buffers and the state are consistent with each other.
        for lane in self.lanes.values():
            if isinstance(lane.policy, EngineSupervisor):
                lane.state.engine_restarts = lane.policy.restarts
                lane.state.engine_seconds_lost = lane.policy.seconds_lost
        trainers = {p: lane.trainer.state_dict() for p, lane in self.lanes.items() if lane.trainer is not None}
        buffered = [t for lane in self.lanes.values() for group in lane.buffer.ready_groups() for t in group]
        # Groups still running are neither finished nor abandoned: a resume replays them.
        return self.config.run_dir, self.state.steps(), trainers, asdict(self.state), buffered
