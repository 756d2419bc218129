"""Several policies trained in one job on a multi-agent env, MARLlib-style.

``agentrl train`` on a multi-agent env id comes here (:func:`train_policies`). The mapping
(``all`` / ``group`` / ``individual`` / ``module:function``) says which policy plays which agent;
``policies:`` says how each is held and trained (:class:`~agentrl.train_config.PolicyConfig`).

Serving: the ``weights: lora`` policies are adapters on ONE engine of ``rollout.model`` (vLLM's
multi-LoRA, or peft adapters on the hf backend); each request carries its policy's adapter, and a
policy's update loads its adapter under a new version that only its later requests see. A
``weights: full`` policy gets an engine of its own. A frozen LoRA policy plays the base model.

Training: one :class:`Lane` per policy, with its own trainer (optimizer, schedule, version counter),
buffer and staleness window (its ``max_staleness``). Episodes are played in groups (``group_size``
episodes of one task, the same env seed); when a group has finished, each episode is scored
(``reward_fn``, optional) and cut into training samples (``samples_fn``, optional; by default every
agent's trajectory), and each policy's samples of the group become one GRPO group of that policy
(MARLlib's rule: a policy learns only from the turns of the agents mapped to it; with ``all`` one
policy learns from every agent's turns). A new group starts when every policy training in the
stage has room in its window. Policies step as soon as their own batch is ready (``lockstep:
false``) or all together (``lockstep: true``). ``stages`` run in order, each with the policies that
train in it; a policy that does not train in a stage only plays, and its samples are not kept.

Checkpoints hold every policy's trainer, its counts and buffered groups, and the stage reached;
resume replays exactly the groups that were started and reached no policy. Metrics are per policy:
``train/<policy>/...``, ``rollout/<policy>/...``, ``eval/<policy>/...``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from agentrl.build import build_engine, build_trainer, engine_settings, limits_of, policy_options, sampling_of
from agentrl.config import ConfigError, to_dict
from agentrl.controller import Progress, TrainResult, append_json, oldest_version, plot_quietly, shift_versions
from agentrl.dashboard.records import sample_kind, sample_records, write_samples
from agentrl.mapping import PRESETS, policy_mapping
from agentrl.metrics import MetricsLogger, policy_metric
from agentrl.model_paths import resolve_model
from agentrl.policies import Policy, make_policy
from agentrl.policies.supervisor import EngineSupervisor
from agentrl.registry import make_multiagent
from agentrl.rollout import MultiAgentRolloutEngine, RolloutStats, StalenessWindow, TrajectoryBuffer
from agentrl.rollout.staleness import required_groups, take_required
from agentrl.suggest import did_you_mean
from agentrl.train_config import EVAL_SEED_OFFSET, PolicyConfig, StageConfig, TrainConfig
from agentrl.trainers.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from agentrl.trainers.models import adapter_config, adapter_weights, save_pretrained
from agentrl.trainers.trainer import Trainer
from agentrl.types import Trajectory

log = logging.getLogger(__name__)

Episode = dict[str, Trajectory]
"""One finished episode: each agent's trajectory, by agent id."""
RewardFn = Callable[..., Mapping[str, "float | list[float]"]]
"""``reward_fn(episode, **stage.reward) -> {agent_id: return, or one reward per turn}``."""
SamplesFn = Callable[..., list[Trajectory]]
"""``samples_fn(episode, **samples_args) -> trajectories``, each trained by the policy its ``policy_id`` names."""


# --- set-up ------------------------------------------------------------------------------------


def load_function(path: str, what: str) -> Callable[..., Any]:
    """The function ``module:function`` names (``what`` says which setting, for the error)."""
    module_name, sep, name = path.partition(":")
    if not sep or not module_name or not name:
        raise ConfigError(f"{what} must look like module:function, got {path!r}.")
    try:
        function = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{what}: cannot load {path!r} ({type(e).__name__}: {e}).") from e
    if not callable(function):
        raise ConfigError(f"{what}: {path!r} is not callable.")
    return function


def resolve_policies(config: TrainConfig, agents: list[str]) -> tuple[Callable[[str], str], dict[str, PolicyConfig]]:
    """The mapping function and every policy's settings, checked against the env's ``agents``.

    Raises ``ConfigError`` for a mapping that gives a policy id with no ``policies`` entry, an
    entry no agent maps to, a LoRA policy on another base than the engine's, or a backend that
    cannot take weights.
    """
    if config.mapping in PRESETS:
        mapping = policy_mapping(config.mapping)
    elif ":" in config.mapping:
        mapping = load_function(config.mapping, "mapping")
    else:
        raise ConfigError(
            f"mapping {config.mapping!r} is neither a preset {PRESETS} nor module:function. "
            f"{did_you_mean(config.mapping, PRESETS)}".rstrip()
        )
    roster = {agent: mapping(agent) for agent in agents}
    mapped = sorted(set(roster.values()))
    policies = dict(config.policies) or {policy_id: PolicyConfig() for policy_id in mapped}
    for agent, policy_id in roster.items():
        if policy_id not in policies:
            raise ConfigError(
                f"mapping {config.mapping!r} gives agent {agent!r} policy {policy_id!r}, which has no entry in "
                f"policies ({sorted(policies)}); add policies.{policy_id}, or change the mapping. "
                f"{did_you_mean(policy_id, policies)}".rstrip()
            )
    for policy_id in policies:
        if policy_id not in mapped:
            raise ConfigError(
                f"policies.{policy_id} is played by no agent: mapping {config.mapping!r} gives {roster}; "
                "remove the entry or change the mapping."
            )
    if config.rollout.ray_address:
        raise ConfigError(
            "multi-policy training plays in this process; unset rollout.ray_address (Ray runs single-policy training)."
        )
    if config.rollout.backend not in ("vllm", "hf"):
        raise ConfigError(
            f"training needs an engine that takes new weights: rollout.backend vllm or hf, not {config.rollout.backend!r}."
        )
    for policy_id, policy in policies.items():
        if policy.weights == "lora" and policy.model not in (None, config.rollout.model):
            raise ConfigError(
                f"policies.{policy_id} is a LoRA adapter on model {policy.model!r}, but the shared engine serves "
                f"rollout.model {config.rollout.model!r}: adapters need the engine's base. Set weights: full to "
                f"give it an engine of its own, or leave its model unset."
            )
        if policy.init_from is not None and not policy.trainable:
            raise ConfigError(
                f"policies.{policy_id}.init_from applies when it starts training, but it is not trainable."
            )
        if policy.init_from is not None and not policies[policy.init_from].trainable:
            raise ConfigError(
                f"policies.{policy_id}.init_from names {policy.init_from!r}, which never trains: give "
                f"policies.{policy_id} the same model instead."
            )
    return mapping, policies


@dataclass
class LaneState:
    """What a checkpoint keeps of one policy's lane (JSON)."""

    step: int = 0
    """Training steps this policy took over the run."""
    stage_step: int = 0
    """Steps it took in the current stage."""
    trained_groups: list[int] = field(default_factory=list)
    """The group numbers it trained on, in order."""
    lost_groups: list[int] = field(default_factory=list)
    """Groups started for it that never reached its trainer (failed, empty, stale)."""
    policy_version: int = 0
    """Its version after its last step, counted over the whole run."""


@dataclass
class RunState:
    """What a checkpoint keeps of a multi-policy run (JSON)."""

    stage: int = 0
    """The stage the run is in."""
    next_group: int = 0
    """The number the next new group gets."""
    finished_groups: list[int] = field(default_factory=list)
    """Groups whose episodes all ended and went to the policies (or were lost)."""
    abandoned_groups: list[int] = field(default_factory=list)
    """Groups still running when their stage ended; never replayed."""
    lanes: dict[str, LaneState] = field(default_factory=dict)
    eval_before: dict[str, float] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunState:
        lanes = {policy_id: LaneState(**lane) for policy_id, lane in data.pop("lanes", {}).items()}
        return cls(**data, lanes=lanes)


class Lane:
    """One policy of the run: its engine-side policy, trainer, buffer and staleness window."""

    def __init__(
        self,
        policy_id: str,
        policy: Policy,
        trainer: Trainer | None,
        settings: PolicyConfig,
        config: TrainConfig,
        state: LaneState,
    ):
        self.policy_id, self.policy, self.trainer, self.settings = policy_id, policy, trainer, settings
        self.state = state
        self.max_staleness = config.max_staleness if settings.max_staleness is None else settings.max_staleness
        self.groups_per_step = config.groups_per_step
        self.base_lr = trainer.config.lr if trainer is not None else 0.0
        self.buffer = TrajectoryBuffer(1, max_staleness=self.max_staleness)
        self.window = StalenessWindow(self.groups_per_step, self.max_staleness)
        self.version_offset = 0
        self.start_versions: dict[int, int] = {}  # group number -> this policy's version when it started
        self.dropped_seen = 0  # how many of the buffer's dropped groups were counted lost
        self.failed_seen = 0  # failed episodes of the run already reported by this policy's steps
        self.lock = asyncio.Lock()  # a checkpoint never sees a step half done

    def group_id(self, base: str) -> str:
        return f"{base}/{self.policy_id}"

    def weights(self) -> Any:
        """What the engine loads after a step: the adapter's tensors, or every tensor of the model."""
        assert self.trainer is not None
        if self.settings.weights == "lora":
            return adapter_weights(self.trainer.model)
        return self.trainer.inference_weights()

    def open_stage(self, lr: float | None) -> None:
        """A new stage: a fresh window over what is buffered, and the stage's learning rate."""
        self.window = StalenessWindow(self.groups_per_step, self.max_staleness, started=len(self.buffer))
        if self.trainer is not None:
            _set_lr(self.trainer, self.base_lr if lr is None else lr)

    def lose(self, number: int) -> None:
        """Group ``number`` will never reach this policy's trainer."""
        self.state.lost_groups.append(number)
        self.start_versions.pop(number, None)
        self.window.set_lost(self.window.lost + 1)

    def count_dropped(self, numbers: Mapping[str, int]) -> None:
        """Count the groups the buffer dropped as too stale since the last call as lost."""
        dropped = self.buffer.stats.dropped
        for group_id in dropped[self.dropped_seen :]:
            self.lose(numbers[group_id.rsplit("/", 1)[0]])
        self.dropped_seen = len(dropped)


def train_policies(config: TrainConfig, progress: Progress | None = None, host: Policy | None = None) -> TrainResult:
    """Train the policies of a multi-agent run (see the module docstring); ``agentrl train`` on a
    multi-agent env id calls this through :func:`agentrl.train.train`. ``host``: an engine already
    running that serves the LoRA policies (as adapters) and the frozen base; not closed here."""
    progress = progress or Progress()
    env_id = config.rollout.env_id
    probe = make_multiagent(env_id, **config.rollout.env_kwargs)
    try:
        agents = list(probe.possible_agents)
    finally:
        probe.close()
    mapping, policies = resolve_policies(config, agents)
    reward_fn = load_function(config.reward_fn, "reward_fn") if config.reward_fn else None
    samples_fn = load_function(config.samples_fn, "samples_fn") if config.samples_fn else None
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = {policy_id: config.trainer_settings(policy_id) for policy_id in policies}
    record = {**to_dict(config), "policy_trainers": {p: to_dict(s) for p, s in settings.items()}}
    (run_dir / "config.json").write_text(json.dumps(record, indent=1, default=str))
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    torch.manual_seed(config.trainer.seed)
    checkpoints = list_checkpoints(run_dir) if config.resume else []

    progress.on_phase("starting the inference engines", 0)
    engines = _Engines(config, policies, host)
    try:
        trainers = {
            policy_id: build_trainer(
                engines.model_path(policy_id),
                settings[policy_id],
                engines.tokenizer,
                device=config.device,
                dtype=config.rollout.dtype,
            )
            for policy_id, policy in policies.items()
            if policy.trainable
        }
        served = {policy_id: engines.serve(policy_id, trainers.get(policy_id)) for policy_id in policies}
        state, buffered = RunState(), []
        if checkpoints:
            trainer_states, run_state, buffered = load_checkpoint(checkpoints[-1])
            state = RunState.from_dict(run_state)
            for policy_id, trainer in trainers.items():
                trainer.load_state_dict(trainer_states[policy_id])
            log.info("resumed from %s at stage %d", checkpoints[-1], state.stage)
        lanes = {
            policy_id: Lane(
                policy_id,
                served[policy_id],
                trainers.get(policy_id),
                policies[policy_id],
                config,
                state.lanes.setdefault(policy_id, LaneState()),
            )
            for policy_id in policies
        }
        for lane in lanes.values():
            if lane.trainer is None:
                continue
            if checkpoints:  # the engine must serve exactly the trainer's weights
                lane.policy.update_weights(lane.weights())
            elif isinstance(lane.policy, EngineSupervisor):  # its own engine loaded the same model: tell it so,
                lane.policy.serves(lane.weights())  # and step 1's sync sends only what step 1 changed
        engine = build_engine(
            env_id,
            served,
            mapping=mapping,
            env_kwargs={**config.rollout.env_kwargs, "split": "train"},
            **engine_settings(config.rollout),
        )
        with MetricsLogger(run_dir, tensorboard=config.tensorboard, wandb=config.wandb, config=record) as metrics:
            run = MultiController(config, lanes, engine, metrics, state, buffered, progress, reward_fn, samples_fn)
            if config.eval_episodes and state.eval_before is None:
                state.eval_before = run.evaluate()
            asyncio.run(run.run())
            eval_after = run.evaluate() if config.eval_episodes else None
            if config.eval_episodes and config.eval_against_base and eval_after is not None:
                for policy_id in trainers:
                    eval_after.update(run.evaluate(against_base=(policy_id, engines.base())))
            run.checkpoint()
        model_dir = None
        if config.export:
            model_dir = run_dir / "model"
            for policy_id, trainer in trainers.items():
                _export(trainer, policies[policy_id], engines.tokenizer, model_dir / policy_id)
    finally:
        engines.close()
    result_steps = sum(lane.state.step for lane in lanes.values())
    return TrainResult(
        run_dir, result_steps, state.eval_before, eval_after, model_dir, plot_quietly(run_dir), sorted(policies)
    )


class _Engines:
    """The inference engines of a run: one for the LoRA policies (and the frozen base), one per
    ``weights: full`` policy."""

    def __init__(self, config: TrainConfig, policies: Mapping[str, PolicyConfig], host: Policy | None = None):
        self.config, self.policies = config, policies
        self.base_path = resolve_model(config.rollout.model)
        self.host: Any = host
        self.lent = host is not None  # the caller's engine: not closed here
        self.own: dict[str, Policy] = {}
        self.adapters: list[Policy] = []  # served by the host; closed with the run when the host is lent
        lora = [p for p, s in policies.items() if s.weights == "lora"]
        try:
            if lora and host is None:
                options = policy_options(config.rollout)
                if config.rollout.backend == "vllm":
                    ranks = [config.trainer_settings(p).lora_rank for p in lora]
                    options.update(max_loras=max(len(lora), 1), max_lora_rank=vllm_lora_rank(max(ranks)))
                self.host = make_policy(config.rollout.backend, self.base_path, options)
            for policy_id, policy in policies.items():
                if policy.weights == "full":  # its own engine, replaced when it dies (EngineSupervisor)
                    rollout = replace(config.rollout, model=policy.model or config.rollout.model)
                    start = functools.partial(
                        make_policy, rollout.backend, resolve_model(rollout.model), policy_options(rollout)
                    )
                    self.own[policy_id] = EngineSupervisor(start, max_restarts=config.max_engine_restarts)
        except BaseException:
            self.close()
            raise
        self.tokenizer = (self.host or next(iter(self.own.values()))).tokenizer

    def base(self) -> Policy:
        """The base model, untrained: the LoRA engine without an adapter, or an engine of its own."""
        if self.host is None:
            rollout = self.config.rollout
            self.host = make_policy(rollout.backend, self.base_path, policy_options(rollout))
        return self.host  # type: ignore[no-any-return]

    def model_path(self, policy_id: str) -> str:
        return resolve_model(self.policies[policy_id].model or self.config.rollout.model)

    def serve(self, policy_id: str, trainer: Trainer | None) -> Policy:
        """The policy the rollouts call for ``policy_id``."""
        if policy_id in self.own:
            return self.own[policy_id]
        if trainer is None:  # a frozen LoRA policy is the base model
            return self.host  # type: ignore[no-any-return]
        adapter = self.host.adapter(policy_id, adapter_config(trainer.model))
        self.adapters.append(adapter)
        return adapter  # type: ignore[no-any-return]

    def close(self) -> None:
        closing = [*self.own.values(), *(self.adapters if self.lent else [self.host] if self.host is not None else [])]
        for policy in closing:
            try:
                policy.close()
            except Exception as e:  # one engine failing to close must not keep the others open
                log.warning("closing an engine failed: %s", e)


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM's ``max_lora_rank`` accepts that holds ``rank``."""
    for allowed in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= allowed:
            return allowed
    raise ConfigError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank, 512.")


def _set_lr(trainer: Trainer, lr: float) -> None:
    """Make ``lr`` the trainer's learning rate from now on (its schedule still applies)."""
    scheduler = trainer.scheduler
    scheduler.base_lrs = [lr for _ in scheduler.base_lrs]
    for group, factor in zip(trainer.optimizer.param_groups, scheduler.lr_lambdas):
        group["lr"] = lr * factor(scheduler.last_epoch)  # type: ignore[operator]


def _export(trainer: Trainer, policy: PolicyConfig, tokenizer: Any, out: Path) -> None:
    """A LoRA policy as its adapter (peft's format, which vLLM serves with --lora-modules); a full
    one as a transformers checkpoint."""
    if policy.weights == "lora":
        trainer.model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    else:
        save_pretrained(trainer.model, tokenizer, out)


# --- the loop ----------------------------------------------------------------------------------


class MultiController:
    """The loop of a multi-policy run: a producer of groups, their episodes split into each
    policy's samples, and one training loop per policy (or one for all, ``lockstep``)."""

    def __init__(
        self,
        config: TrainConfig,
        lanes: dict[str, Lane],
        engine: MultiAgentRolloutEngine,
        metrics: MetricsLogger,
        state: RunState,
        buffered: list[Trajectory],
        progress: Progress,
        reward_fn: RewardFn | None = None,
        samples_fn: SamplesFn | None = None,
    ):
        self.config, self.lanes, self.engine, self.metrics = config, lanes, engine, metrics
        self.state, self.progress = state, progress
        self.reward_fn, self.samples_fn = reward_fn, samples_fn
        self.stages = config.run_stages()
        self.stage = self.stages[min(state.stage, len(self.stages) - 1)]
        """The stage running now (set again as each stage starts)."""
        self.active: list[Lane] = []
        """The lanes still training in the current stage."""
        self.per_group = config.rollout.group_size + config.rollout.redundancy
        self.numbers = {engine.group_id(n): n for n in range(state.next_group)}
        for lane in lanes.values():
            lane.version_offset = max(lane.state.policy_version - lane.policy.version, 0)
            lane.buffer.set_version(lane.policy.version)
        restored: dict[str, list[Trajectory]] = {}
        for trajectory in buffered:  # back into the buffer of the policy it was for, group by group
            shifted = shift_versions(trajectory, lanes[trajectory.policy_id].version_offset)
            restored.setdefault(trajectory.group_id, []).append(shifted)
        for group_id, group in restored.items():
            lanes[group[0].policy_id].buffer.put_group(group_id, group)
        for lane in lanes.values():
            for group in lane.buffer.ready_groups():
                number = self.numbers[group[0].group_id.rsplit("/", 1)[0]]
                lane.start_versions[number] = oldest_version(group, lane.policy.version)
        seen = set(state.finished_groups) | set(state.abandoned_groups)
        self.replay = [n for n in range(state.next_group) if n not in seen]
        self.arrived: dict[int, list[list[Trajectory]]] = {}
        self.changed = asyncio.Condition()
        self._draining: set[asyncio.Task[None]] = set()
        self._drain_error: BaseException | None = None
        self._warned: set[str] = set()
        self.hook_failures = 0
        self._saved_at = -1
        """Episodes lost because ``reward_fn`` or ``samples_fn`` raised on them."""

    def total_steps(self) -> int:
        return sum(lane.state.step for lane in self.lanes.values())

    # --- stages --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run the stages from the one reached; every training policy takes its steps in each."""
        total = sum(self.config.policy_steps(p) for p in self.lanes)
        self.progress.on_phase("training", total)
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
            self.engine.close()

    def _training(self, stage: StageConfig) -> list[Lane]:
        return [lane for p, lane in self.lanes.items() if self.config.trains_in(stage, p)]

    async def _run_stage(self, stage: StageConfig) -> None:
        training = self._training(stage)
        for lane in self.lanes.values():
            if lane not in training:  # it only plays: what it had buffered is not for it any more
                lane.buffer.get_nowait(len(lane.buffer))
                lane.start_versions.clear()
            lane.open_stage(stage.lr.get(lane.policy_id))
        for lane in training:
            if lane.settings.init_from and lane.state.step == 0 and lane.state.stage_step == 0:
                await self._init_from(lane, self.lanes[lane.settings.init_from])
        self.stage = stage
        self.active = [lane for lane in training if lane.state.stage_step < stage.steps]
        producer = asyncio.create_task(self._produce())
        try:
            if self.config.lockstep:
                while self.active:
                    lanes = list(self.active)
                    batches = await asyncio.gather(*(self._next_batch(lane) for lane in lanes))
                    await asyncio.gather(*(self._train_on(lane, batch) for lane, batch in zip(lanes, batches)))
            else:
                await asyncio.gather(*(self._train_lane(lane) for lane in list(self.active)))
        finally:
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
            self.state.abandoned_groups += sorted(self.arrived)
            for number in self.arrived:  # never to arrive: no policy may wait for them next stage
                for lane in self.lanes.values():
                    lane.start_versions.pop(number, None)
            self.arrived.clear()

    async def _init_from(self, lane: Lane, source: Lane) -> None:
        assert lane.trainer is not None and source.trainer is not None
        lane.trainer.model.load_state_dict(source.trainer.model.state_dict())
        version = await lane.policy.aupdate_weights(lane.weights())
        lane.buffer.set_version(version)
        log.info("policy %s starts from %s's weights", lane.policy_id, source.policy_id)

    async def _train_lane(self, lane: Lane) -> None:
        while lane in self.active:
            await self._train_on(lane, await self._next_batch(lane))

    # --- producing groups ----------------------------------------------------------------------

    def _room(self) -> int:
        return min((lane.window.room() for lane in self.active), default=0)

    async def _produce(self) -> None:
        try:
            while True:
                async with self.changed:
                    await self.changed.wait_for(lambda: self._room() > 0)
                    chunk = self._take(self._room())
                    for lane in self.active:
                        lane.window.start(len(chunk))
                task = asyncio.create_task(self._drain(chunk))
                self._draining.add(task)
                task.add_done_callback(self._drained)
        finally:
            for task in self._draining:
                task.cancel()
            await asyncio.gather(*self._draining, return_exceptions=True)

    def _take(self, room: int) -> list[int]:
        chunk = self.replay[:room]
        del self.replay[: len(chunk)]
        while len(chunk) < room:
            number = self.state.next_group
            chunk.append(number)
            self.numbers[self.engine.group_id(number)] = number
            self.state.next_group += 1
        for number in chunk:
            self.arrived[number] = []
            for lane in self.active:
                lane.start_versions[number] = lane.buffer.version
        return chunk

    def _drained(self, task: asyncio.Task[None]) -> None:
        self._draining.discard(task)
        if not task.cancelled() and task.exception() is not None and self._drain_error is None:
            self._drain_error = task.exception()

    async def _drain(self, chunk: list[int]) -> None:
        async for episode in self.engine.stream_episodes(groups=chunk):
            number = self.numbers[episode[0].group_id.rsplit("/", 1)[0]]
            self.arrived[number].append(episode)
            if len(self.arrived[number]) == self.per_group:
                self._finish_group(number, self.arrived.pop(number))
                async with self.changed:
                    self.changed.notify_all()

    def _finish_group(self, number: int, episodes: list[list[Trajectory]]) -> None:
        """All episodes of group ``number`` ended: score them, cut them into samples, and give
        each training policy its samples as one group (or count the group lost for it)."""
        self.state.finished_groups.append(number)
        good = [e for e in episodes if all(t.error is None for t in e)][: self.config.rollout.group_size]
        samples: dict[str, list[Trajectory]] = {}
        if len(good) == self.config.rollout.group_size:
            for episode in good:
                for sample in self._samples({t.agent_id: t for t in episode}):
                    samples.setdefault(sample.policy_id, []).append(sample)
        base = self.engine.group_id(number)
        for lane in self.active:
            group = samples.get(lane.policy_id, [])
            if not group:
                lane.lose(number)
                continue
            group_id = lane.group_id(base)
            lane.buffer.put_group(group_id, [replace(t, group_id=group_id) for t in group])
            lane.count_dropped(self.numbers)  # dropped on arrival if already too stale

    def _samples(self, episode: Episode) -> list[Trajectory]:
        """An episode's training samples: rewards from ``reward_fn``, samples from ``samples_fn``
        (default: each agent's trajectory that has a turn). A hook that raises loses the episode,
        counted and logged once per message, never the run."""
        try:
            if self.reward_fn is not None:
                episode = _rescored(episode, self.reward_fn(dict(episode), **self.stage.reward))
            samples = (
                self.samples_fn(dict(episode), **self.config.samples_args)
                if self.samples_fn is not None
                else list(episode.values())
            )
        except Exception as e:  # a user's hook failing on one episode must not end the run
            message = f"{type(e).__name__}: {e}"
            if message not in self._warned:
                self._warned.add(message)
                log.warning("reward_fn / samples_fn failed on an episode (counted, skipped): %s", message)
            self.hook_failures += 1
            return []
        return [t for t in samples if t.num_generated > 0 and t.policy_id in self.lanes]

    # --- training --------------------------------------------------------------------------------

    async def _next_batch(self, lane: Lane) -> list[list[Trajectory]]:
        need = lane.groups_per_step
        groups: list[list[Trajectory]] = []
        while len(groups) < need:
            if self._drain_error is not None:
                raise self._drain_error
            waiting = False
            if self.config.stragglers == "wait":
                taken, waiting = take_required(self._required(lane), lambda g: lane.buffer.state_of(g) == "ready",
                                               need - len(groups))  # fmt: skip
                groups += lane.buffer.take(taken)
            if waiting:
                await lane.buffer.wait(timeout=1.0)
            elif len(groups) < need:
                groups += await lane.buffer.get(need - len(groups), timeout=1.0)
        for group in groups:
            lane.start_versions.pop(self.numbers[group[0].group_id.rsplit("/", 1)[0]], None)
        return groups

    def _required(self, lane: Lane) -> list[tuple[list[str], int]]:
        starts = {lane.group_id(self.engine.group_id(n)): v for n, v in lane.start_versions.items()}
        live = {g: v for g, v in starts.items() if lane.buffer.state_of(g) != "gone"}
        return required_groups(live, lane.buffer.version, lane.max_staleness, lane.groups_per_step)

    async def _train_on(self, lane: Lane, groups: list[list[Trajectory]]) -> None:
        assert lane.trainer is not None
        trajectories = [t for group in groups for t in group]
        started = time.perf_counter()
        async with lane.lock:
            metrics = await asyncio.to_thread(lane.trainer.step, trajectories, lane.buffer.version)
            lane.state.step += 1
            lane.state.stage_step += 1
            numbers = [self.numbers[group[0].group_id.rsplit("/", 1)[0]] for group in groups]
            lane.state.trained_groups += numbers
            lane.state.policy_version = lane.buffer.version + 1 + lane.version_offset  # what the sync makes it
        record = {"policy": lane.policy_id, "step": lane.state.step, "groups": numbers}
        append_json(Path(self.config.run_dir) / "batches.jsonl", record)
        # The step is saved before its weights go to the engine, so a fault in the sync cannot cost it.
        finishing = lane.state.stage_step >= self.stage.steps
        every = self.config.checkpoint_every
        if every and lane.state.step % every == 0 and any(other is not lane or not finishing for other in self.active):
            await self.acheckpoint()
        async with lane.lock:
            synced = time.perf_counter()
            version = await lane.policy.aupdate_weights(lane.weights())
            metrics["perf/time_sync"] = time.perf_counter() - synced
            lane.buffer.set_version(version)
            lane.window.trained(len(groups))
            lane.count_dropped(self.numbers)
            lane.state.policy_version = version + lane.version_offset
        if finishing and lane in self.active:
            self.active.remove(lane)
        metrics.update(_batch_metrics(trajectories, version, lane.version_offset))
        if isinstance(lane.policy, EngineSupervisor):
            metrics.update(lane.policy.metrics())
        failed = self.engine.failed_episodes + self.hook_failures
        metrics["rollout/failed"], lane.failed_seen = float(failed - lane.failed_seen), failed
        metrics["rollout/episodes"] = float(len(trajectories)) + metrics["rollout/failed"]
        metrics["perf/time_step"] = time.perf_counter() - started
        metrics["train/stage"] = float(self.state.stage)
        self.metrics.log(lane.state.step, {policy_metric(name, lane.policy_id): v for name, v in metrics.items()})
        self._write_samples(lane, groups)
        self.progress.on_advance(metrics)
        if self.config.eval_every and lane.state.step % self.config.eval_every == 0 and self.active:
            await self._evaluate()
        async with self.changed:
            self.changed.notify_all()

    def _write_samples(self, lane: Lane, groups: list[list[Trajectory]]) -> None:
        """The first ``samples_per_step`` groups of this policy's step, for the dashboard (``dashboard.records``)."""
        if self.config.samples_per_step <= 0 or lane.trainer is None:
            return
        sample = [t for group in groups[: self.config.samples_per_step] for t in group]
        advantages = lane.trainer.last_advantages
        rows = (
            None if advantages is None else [advantages[i, : len(t.token_ids)].tolist() for i, t in enumerate(sample)]
        )
        kind = sample_kind("train", lane.policy_id)
        try:
            records = sample_records(sample, lane.state.step, kind, lane.policy.tokenizer, rows)
            write_samples(self.config.run_dir, records, lane.state.step, kind)
        except Exception as e:  # the viewer's samples never stop a run
            log.warning("writing the dashboard's samples of step %d failed: %s", lane.state.step, e)

    # --- evaluation and checkpoints --------------------------------------------------------------

    def evaluate(self, against_base: tuple[str, Policy] | None = None) -> dict[str, float]:
        """Play the held-out episodes now (blocking); log and return ``eval/<policy>/...``.

        ``against_base=(policy_id, base)``: that policy plays its agents, ``base`` every other
        agent; logged as ``eval/<policy_id>/vs_base_success_rate`` and ``.../vs_base_reward_mean``.
        """
        return asyncio.run(self._evaluate(against_base))

    async def _evaluate(self, against_base: tuple[str, Policy] | None = None) -> dict[str, float]:
        rollout = self.config.rollout
        policies = {p: lane.policy for p, lane in self.lanes.items()}
        if against_base is not None:
            policies = {p: policy if p == against_base[0] else against_base[1] for p, policy in policies.items()}
        engine = build_engine(
            rollout.env_id,
            policies,
            mapping=self.engine.mapping,
            env_kwargs={**rollout.env_kwargs, "split": "test"},
            system_prompt=rollout.system_prompt,
            sampling=replace(sampling_of(rollout, temperature=self.config.eval_temperature), seed=None),
            limits=limits_of(rollout),
            concurrency=rollout.concurrency,
            env_url=rollout.env_url,
            seed=EVAL_SEED_OFFSET + rollout.seed,
        )
        self.progress.on_phase(f"evaluating (step {self.total_steps()} of all policies)", self.config.eval_episodes)
        try:
            async for _ in engine.stream_episodes(self.config.eval_episodes):  # one tick per episode
                self.progress.on_advance({})
        finally:
            engine.close()
        result: dict[str, float] = {}
        for policy_id, stats in sorted(engine.policy_stats.items()):
            summary = stats.summary()
            if against_base is not None:
                if policy_id == against_base[0]:
                    named = {
                        policy_metric("eval/vs_base_success_rate", policy_id): summary["rollout/success_rate"],
                        policy_metric("eval/vs_base_reward_mean", policy_id): summary["rollout/reward_mean"],
                    }
                    self.metrics.log(self.lanes[policy_id].state.step, named)
                    result.update(named)
                continue
            scores = {
                "eval/success_rate": summary["rollout/success_rate"],
                "eval/reward_mean": summary["rollout/reward_mean"],
                "eval/episodes": float(stats.episodes),
                "eval/failed": float(stats.failed),
            }
            named = {policy_metric(name, policy_id): value for name, value in scores.items()}
            # at the policy's own step: each policy's metrics count its own steps
            self.metrics.log(self.lanes[policy_id].state.step, named)
            result.update(named)
        self.progress.on_result(result)
        return result

    def checkpoint(self) -> None:
        """Save every trainer, the run state and every policy's buffered groups."""
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
        trainers = {p: lane.trainer.state_dict() for p, lane in self.lanes.items() if lane.trainer is not None}
        buffered = [t for lane in self.lanes.values() for group in lane.buffer.ready_groups() for t in group]
        state = asdict(self.state)
        # Groups still running are neither finished nor abandoned: a resume replays them.
        return self.config.run_dir, self.total_steps(), trainers, state, buffered


def _rescored(episode: Episode, rewards: Mapping[str, float | list[float]]) -> Episode:
    """``episode`` with the agents ``rewards`` names rescored: a number is the agent's return, put
    at its last turn; a list gives one reward per turn."""
    out = dict(episode)
    for agent_id, value in rewards.items():
        if agent_id not in episode:
            raise ValueError(f"reward_fn scored agent {agent_id!r}, which is not in the episode ({sorted(episode)}).")
        trajectory = episode[agent_id]
        turns = len(trajectory.turn_ends)
        if isinstance(value, (int, float)):
            per_turn = [0.0] * max(turns - 1, 0) + [float(value)] if turns else []
        else:
            per_turn = [float(v) for v in value]
            if len(per_turn) != turns:
                raise ValueError(
                    f"reward_fn gave agent {agent_id!r} {len(per_turn)} turn rewards for {turns} turns; give one "
                    "per turn, or a single number for the whole episode."
                )
        out[agent_id] = dataclasses.replace(trajectory, turn_rewards=per_turn, reward=sum(per_turn))
    return out


def _batch_metrics(trajectories: list[Trajectory], version: int, offset: int) -> dict[str, float]:
    summary = RolloutStats.of(trajectories).summary()
    del summary["perf/rollout_tokens_per_s"]
    staleness = [version - 1 - v for t in trajectories for v in t.versions if v >= 0]
    return {
        **summary,
        "train/staleness_mean": sum(staleness) / max(len(staleness), 1),
        "train/staleness_max": float(max(staleness, default=0)),
        "train/policy_version": float(version + offset),
    }
