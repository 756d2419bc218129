"""``agentrl train``: the job that closes the loop between rollouts and the trainers.

A run trains one or more policies, each a *lane*: a single-agent env has one, ``default``; a
multi-agent env one per policy id its ``mapping`` gives its agents (``policies:``, MARLlib-style).
Episodes are played in groups (``group_size`` episodes of one task); a finished group's episodes
become each lane's samples; each lane takes ``groups_per_step`` of its groups at a time, steps, and
the new weights go to its engine, whose version grows by one. How far generation may run ahead
of training is ``max_staleness`` (per policy: ``policies.<id>.max_staleness``):

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

Several policies: ``weights: lora`` policies are adapters on one shared engine, ``weights: full``
ones have engines of their own (:mod:`agentrl.train.serving`); a new group starts when every
policy training in the stage has room; each steps as soon as its own batch is ready (``lockstep:
false``) or all together; ``stages`` run in order, each with the policies that train in it;
``reward_fn`` and ``samples_fn`` turn an episode into samples (:mod:`agentrl.train.samples`).

Where the parts live: the settings in :mod:`agentrl.train.config`, the policies and refusals in
:mod:`agentrl.train.setup`, the engines and trainers in :mod:`agentrl.train.serving`, one
policy's trainer, buffer and window in :mod:`agentrl.train.lane`, the loop, evaluation and
checkpoints in :mod:`agentrl.train.loop`, what a checkpoint keeps in :mod:`agentrl.train.state`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch

from agentrl.build import build_trainer
from agentrl.config import to_dict
from agentrl.dashboard import make_dashboard
from agentrl.metrics import MetricsLogger
from agentrl.policies import Policy
from agentrl.policies.supervisor import EngineSupervisor
from agentrl.server.run import ServerThread
from agentrl.train.config import EVAL_SEED_OFFSET, CurriculumConfig, PolicyConfig, StageConfig, TrainConfig
from agentrl.train.lane import Lane
from agentrl.train.loop import Controller, Progress, TrainResult
from agentrl.train.serving import Serving, export
from agentrl.train.setup import plan
from agentrl.train.state import LaneState, RunState, plot_quietly
from agentrl.trainers.checkpoint import list_checkpoints, load_checkpoint
from agentrl.trainers.curriculum import PromptCurriculum, PromptValueModel

__all__ = [
    "EVAL_SEED_OFFSET",
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
    trainer's starting weights first, and is not closed here): it serves the LoRA policies as
    adapters (start it with ``max_loras`` for them) and the frozen policies as its base, or, in a
    run without LoRA policies (a single-agent run), its one ``weights: full`` policy.
    """
    progress = progress or Progress()
    for module in config.imports:
        importlib.import_module(module)
    with _dashboard(config):
        return _train(config, progress, policy)


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


def _train(config: TrainConfig, progress: Progress, lent: Policy | None) -> TrainResult:
    the_plan = plan(config)
    policies = the_plan.policies
    trainable = [p for p, s in policies.items() if s.trainable]
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {
        **to_dict(replace(config, trainer=config.trainer_settings())),  # what the run uses, filled in
        "policy_trainers": {p: to_dict(s) for p, s in the_plan.settings.items()},
    }
    (run_dir / "config.json").write_text(json.dumps(record, indent=1, default=str))
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    torch.manual_seed(config.trainer.seed)
    checkpoints = list_checkpoints(run_dir) if config.resume else []

    progress.on_phase("starting the inference engine" if len(policies) == 1 else "starting the inference engines", 0)
    serving = Serving(config, policies, the_plan.settings, lent)
    try:
        trainers = {p: serving.trainer(p) for p in trainable}
        served = {p: serving.serve(p, trainers.get(p)) for p in policies}
        state, buffered = RunState(), []
        if checkpoints:
            trainer_states, run_state, buffered = load_checkpoint(checkpoints[-1])
            state = RunState.from_dict(run_state)
            for policy_id, trainer in trainers.items():
                trainer.load_state_dict(trainer_states[policy_id])
            log.info("resumed from %s at step %d", checkpoints[-1], state.steps())
        lanes = {
            p: Lane(p, served[p], trainers.get(p), policies[p], config, state.lanes.setdefault(p, LaneState()))
            for p in policies
        }
        serving.count_restarts_from(
            {p: (lane.state.engine_restarts, lane.state.engine_seconds_lost) for p, lane in lanes.items()}
        )
        for lane in lanes.values():
            if lane.trainer is None:
                continue
            if checkpoints or serving.lends(lane.policy):  # the engine must serve exactly the trainer's weights
                lane.policy.update_weights(lane.weights())
            elif isinstance(lane.policy, EngineSupervisor):  # its own engine loaded the same model: tell it so,
                lane.policy.serves(lane.weights())  # and step 1's sync sends only what step 1 changed
        rollout = serving.rollout(served, the_plan.mapping, {**config.rollout.env_kwargs, "split": "train"})
        with MetricsLogger(run_dir, tensorboard=config.tensorboard, wandb=config.wandb, config=record) as metrics:
            curriculum = _curriculum(config, serving, trainable)
            controller = Controller(
                config, lanes, rollout, metrics, state, buffered, progress, the_plan.samples, the_plan.mapping,
                curriculum,
            )  # fmt: skip
            if config.eval_episodes and state.eval_before is None:
                state.eval_before = controller.evaluate()
            asyncio.run(controller.run())
            # The trainers have nothing left to do while the engines play the last evaluation: the
            # final checkpoint and the exported models are written meanwhile.
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentrl-save") as pool:
                saving = pool.submit(_save_run, controller, serving, run_dir / "model" if config.export else None)
                eval_after = controller.evaluate() if config.eval_episodes else None
                model_dir = saving.result()
            if eval_after is not None and config.eval_against_base:
                for policy_id in trainable:
                    eval_after.update(controller.evaluate(against_base=(policy_id, serving.base())))
    finally:
        serving.close()
    several = sorted(policies) if len(policies) > 1 else []
    return TrainResult(run_dir, state.steps(), state.eval_before, eval_after, model_dir, plot_quietly(run_dir), several)


def _save_run(controller: Controller, serving: Serving, out: Path | None) -> Path | None:
    """The run's last checkpoint, then each trained policy exported under ``out`` (None: not
    exported): one policy as ``out`` itself, several as ``out/<policy>``."""
    controller.checkpoint()
    if out is None:
        return None
    lanes = [lane for lane in controller.lanes.values() if lane.trainer is not None]
    for lane in lanes:
        where = out if len(controller.lanes) == 1 else out / lane.policy_id
        export(lane.trainer, lane.settings, serving.model_path(lane.policy_id), serving.tokenizer, where)  # type: ignore[arg-type]
    return out


def _curriculum(config: TrainConfig, serving: Serving, trainable: list[str]) -> PromptCurriculum | None:
    """PCL's value model (a copy of the policy's starting weights with a fresh head), or None."""
    if config.curriculum.selection != "pcl" or not trainable:
        return None
    settings = config.curriculum
    value_model = PromptValueModel(serving.model_path(trainable[0]), dtype=config.rollout.dtype, device=config.device)
    pad_token_id = serving.tokenizer.pad_token_id or 0
    return PromptCurriculum(value_model, lr=settings.lr, target=settings.target, pad_token_id=pad_token_id)
