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
checkpoint every ``checkpoint_every`` steps (written right after the optimizer step, before its
weights go to the engine, so that a fault there cannot cost the step), the trained model to
``RUN_DIR/model`` and the curves to ``RUN_DIR/curves.png``. The last checkpoint and the model are
written while the engine plays the last evaluation.

An inference engine that dies under the run (vLLM's engine core, a Ray policy actor) is replaced by
a new one with the last weights, up to ``max_engine_restarts`` times
(:class:`~agentrl.policies.supervisor.EngineSupervisor`); ``agentrl train`` turns a fault that ends
the run into one message (:mod:`agentrl.faults`).

Resuming (``resume: true``, the default, when ``RUN_DIR`` holds a checkpoint) restores the trainer,
sends its weights to the engine, puts the buffered groups back, and replays exactly the groups that
were started but neither trained on nor buffered. ``RUN_DIR/batches.jsonl`` records which groups
each step trained on; a step re-done after a resume appears again, and the last record wins.

A multi-agent env id trains one policy per id of the run's ``policies`` / ``mapping``, each with
its own trainer, in :mod:`agentrl.multi_train`; the same rules hold per policy. Where the parts
live: the settings in :mod:`agentrl.train_config`, the set-up in :mod:`agentrl.build`, the loop in
:mod:`agentrl.controller`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import importlib
import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from agentrl.build import build_engine, build_trainer, engine_settings, load_tokenizer, make_policy, policy_options
from agentrl.config import EngineConfig, to_dict
from agentrl.controller import Controller, ControllerState, Progress, TrainResult, plot_quietly
from agentrl.dashboard import make_dashboard
from agentrl.metrics import MetricsLogger
from agentrl.model_paths import resolve_model
from agentrl.multi_train import train_policies
from agentrl.policies import Policy
from agentrl.policies.supervisor import EngineSupervisor
from agentrl.registry import is_multiagent, spec
from agentrl.server.run import ServerThread
from agentrl.train_config import EVAL_SEED_OFFSET, CurriculumConfig, PolicyConfig, StageConfig, TrainConfig
from agentrl.trainers.checkpoint import list_checkpoints, load_checkpoint
from agentrl.trainers.curriculum import PromptCurriculum, PromptValueModel
from agentrl.trainers.models import save_pretrained
from agentrl.trainers.trainer import Trainer

__all__ = [
    "EVAL_SEED_OFFSET",
    "Controller",
    "ControllerState",
    "CurriculumConfig",
    "PolicyConfig",
    "Progress",
    "StageConfig",
    "TrainConfig",
    "TrainResult",
    "build_trainer",
    "train",
]

log = logging.getLogger(__name__)


def train(config: TrainConfig, progress: Progress | None = None, policy: Policy | None = None) -> TrainResult:
    """Run the training job described by ``config``; see the module docstring.

    Pass ``policy`` to train through an inference engine that is already running (it is given the
    trainer's starting weights first, and is not closed here). A multi-agent run serves its LoRA
    policies as adapters of it (it must be started with ``max_loras`` for them) and its frozen
    policies as its base; its ``weights: full`` policies still get engines of their own.
    """
    progress = progress or Progress()
    for module in config.imports:
        importlib.import_module(module)
    with _dashboard(config):
        if is_multiagent(config.rollout.env_id):
            if config.tail_batching:
                raise ValueError(
                    "tail_batching plays a single-agent env's groups in rounds; a multi-agent run cannot use it."
                )
            if config.cluster.enabled:
                raise ValueError(
                    "the cluster section trains one policy (a single-agent env) for now; leave it out for a "
                    "multi-agent run, whose policies train in this process."
                )
            if config.curriculum.selection != "uniform":
                raise ValueError(
                    f"curriculum.selection {config.curriculum.selection!r} chooses a single-agent env's prompts; "
                    "a multi-agent run plays its seeds in order (leave curriculum.selection at uniform)."
                )
            return train_policies(config, progress, host=policy)
        return _train_one_policy(config, progress, policy)


@contextlib.contextmanager
def _dashboard(config: TrainConfig) -> Iterator[None]:
    """With ``dashboard: true``, the run's dashboard on 127.0.0.1 for as long as it trains."""
    if not config.dashboard:
        yield
        return
    Path(config.run_dir).mkdir(parents=True, exist_ok=True)
    server = ServerThread(make_dashboard([config.run_dir]), port=config.dashboard_port)
    url = server.start()
    print(f"dashboard: {url}", flush=True)
    try:
        yield
    finally:
        server.stop()


def _train_one_policy(config: TrainConfig, progress: Progress, policy: Policy | None) -> TrainResult:
    if config.rollout.env_url is None:
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
    cluster = None
    if config.cluster.enabled:  # trainer ranks and engines as Ray actors (agentrl.cluster)
        if policy is not None:
            raise ValueError(
                "train(policy=...) trains through your engine; a run with a cluster section starts its own."
            )
        cluster = _start_cluster(config, settings, model_path)
        policy = cluster.policy
    elif policy is None:  # an engine that dies is replaced (EngineSupervisor), max_engine_restarts times
        start = (
            functools.partial(ray_session.policy, config.rollout, model_path)
            if config.rollout.ray_address
            else functools.partial(make_policy, config.rollout)
        )
        policy = EngineSupervisor(start, max_restarts=config.max_engine_restarts)
    try:
        trainer = (
            cluster.trainer
            if cluster is not None
            else build_trainer(
                model_path, settings.trainer, policy.tokenizer, device=config.device, dtype=config.rollout.dtype
            )
        )
        state, buffered = ControllerState(), []
        if checkpoints:
            trainer_state, controller_state, buffered = load_checkpoint(checkpoints[-1])
            trainer.load_state_dict(trainer_state)
            state = ControllerState(**controller_state)
            log.info("resumed from %s at step %d", checkpoints[-1], state.step)
        if checkpoints or not own_policy:  # the engine must serve exactly the trainer's weights
            policy.update_weights(trainer.inference_weights())
        elif cluster is None:  # it does: both loaded model_path, so the first sync sends what step 1 changed
            policy.serves(trainer.inference_weights())
        env_kwargs = {**config.rollout.env_kwargs, "split": "train"}
        engine = (  # with ray_address, env workers on the cluster play against the policy actor
            ray_session.env_workers(config.rollout, model_path, env_kwargs, config.imports)
            if config.rollout.ray_address and own_policy
            else build_engine(config.rollout.env_id, policy, env_kwargs=env_kwargs, **engine_settings(config.rollout))
        )
        with MetricsLogger(
            run_dir, tensorboard=config.tensorboard, wandb=config.wandb, config=to_dict(settings)
        ) as metrics:
            curriculum = _curriculum(config, model_path, policy.tokenizer)
            controller = Controller(config, policy, engine, trainer, metrics, state, buffered, progress, curriculum)
            if config.eval_episodes and state.eval_before is None:
                state.eval_before = controller.evaluate(step=0)
            asyncio.run(controller.run())
            # The trainer has nothing left to do while the engine plays the last evaluation: the
            # final checkpoint and the exported model are written meanwhile.
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentrl-save") as pool:
                export = run_dir / "model" if config.export else None
                saving = pool.submit(_save_run, controller, trainer, model_path, policy.tokenizer, export)
                eval_after = controller.evaluate(step=state.step) if config.eval_episodes else None
                model_dir = saving.result()
    finally:
        if cluster is not None:
            cluster.close()
        elif own_policy:
            policy.close()
        ray_session.close()
    return TrainResult(run_dir, state.step, state.eval_before, eval_after, model_dir, plot_quietly(run_dir))


def _start_cluster(config: TrainConfig, settings: TrainConfig, model_path: str) -> Any:
    """The run's trainer ranks and engines on Ray (:func:`agentrl.cluster.start_cluster`)."""
    from agentrl.cluster import start_cluster  # imports Ray, an optional dependency

    colocated_gpus = config.cluster.placement == "colocated" and config.device == "cuda"
    return start_cluster(
        config.cluster,
        config.rollout,
        settings.trainer,
        model_path,
        device=config.device,
        torch_threads=config.torch_threads,
        sleep=colocated_gpus,  # the engines sleep while the ranks step on their GPUs
    )


def _save_run(
    controller: Controller, trainer: Any, model_path: str, tokenizer: Any, export: Path | None
) -> Path | None:
    """The run's last checkpoint, then its model exported to ``export`` (None: not exported)."""
    controller.checkpoint()
    return _export(trainer, model_path, tokenizer, export) if export is not None else None


def _export(trainer: Any, model_path: str, tokenizer: Any, out: Path) -> Path:
    """The trained model as a transformers checkpoint: from the trainer's model, or from a cluster
    rank's published weights."""
    if isinstance(trainer, Trainer):
        return save_pretrained(trainer.model, tokenizer, out)
    from agentrl.cluster import export_model  # a TrainerGroup: Ray is imported already

    return export_model(trainer.all_weights(), model_path, tokenizer, out)


class _RaySession:
    """With ``rollout.ray_address``, the inference engine runs as a Ray actor, registered under a name
    of this run, and the trainer's weights reach it through Ray's object store
    (:class:`agentrl.policies.ray_actor.RemotePolicy`); the train split is played by env workers on
    the cluster, which reach the actor by its name, and so follow it to a replacement."""

    def __init__(self, address: str | None):
        self.address = address
        self.own_ray = False
        self.name = f"agentrl-policy-{uuid.uuid4().hex[:12]}"

    def policy(self, rollout: EngineConfig, model_path: str) -> Policy:
        """A new policy actor under this run's name, owned by the policy returned (closing it kills the actor)."""
        import ray  # an optional dependency, only for ray_address

        from agentrl.policies.ray_actor import RemotePolicy, start_policy_actor  # imports Ray

        if not ray.is_initialized():
            ray.init(address=None if self.address == "local" else self.address)
            self.own_ray = True
        actor = start_policy_actor(rollout.backend, model_path, policy_options(rollout), name=self.name)
        return RemotePolicy(actor, load_tokenizer(model_path), owns_actor=True)

    def env_workers(
        self, rollout: EngineConfig, model_path: str, env_kwargs: dict[str, Any], imports: list[str]
    ) -> Any:
        """A :class:`~agentrl.rollout.ray.DistributedRollout` playing against the policy actor by name;
        its workers import the run's ``imports`` (which must be importable on every node) first."""
        from agentrl.rollout.ray import cluster_rollout  # imports Ray

        return cluster_rollout(self.name, rollout, model_path, env_kwargs, imports)

    def close(self) -> None:
        if self.address is None or not self.own_ray:
            return
        import ray  # only imported when a session was opened

        ray.shutdown()


def _curriculum(config: TrainConfig, model_path: str, tokenizer: Any) -> PromptCurriculum | None:
    """PCL's value model (a copy of the policy's starting weights with a fresh head), or None."""
    if config.curriculum.selection != "pcl":
        return None
    settings = config.curriculum
    value_model = PromptValueModel(model_path, dtype=config.rollout.dtype, device=config.device)
    return PromptCurriculum(
        value_model, lr=settings.lr, target=settings.target, pad_token_id=tokenizer.pad_token_id or 0
    )
