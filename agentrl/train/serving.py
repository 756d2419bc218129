"""Where each policy of a run plays and trains: :class:`Serving`.

- ``weights: lora`` policies are adapters on ONE engine of ``rollout.model`` (vLLM's multi-LoRA, or
  peft adapters on the hf backend); each request carries its policy's adapter, and an update loads
  the adapter under a new version that only the policy's later requests see. A frozen LoRA policy
  plays that engine's base model. The engine is supervised like the others: a new one replaces it
  when it dies, and each adapter is made again on it with its policy's last weights
  (:meth:`EngineSupervisor.adapter <agentrl.policies.supervisor.EngineSupervisor.adapter>`).
- a ``weights: full`` policy (a single-agent run's one policy is one) gets an engine of its own,
  replaced with the last weights when it dies (:class:`~agentrl.policies.supervisor.EngineSupervisor`):
  in this process, or with ``rollout.ray_address`` as a Ray actor under a name of the run, which
  the env workers on the cluster reach it by (:class:`RaySession`); with ``cluster:``, it trains on
  trainer ranks with engines of its own behind a router (:mod:`agentrl.train.placement`).
- ``train(policy=...)`` lends an engine already running: it hosts the LoRA policies and the frozen
  base, or, in a run without LoRA policies, the one ``weights: full`` policy of ``rollout.model``.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentrl.build import build_rollout, build_trainer, load_tokenizer, make_policy, policy_options, rollout_settings
from agentrl.config import ConfigError, EngineConfig
from agentrl.model_paths import resolve_model
from agentrl.policies import Policy
from agentrl.policies import make_policy as make_backend
from agentrl.policies.supervisor import EngineSupervisor
from agentrl.policies.vllm import lone_engine_cores
from agentrl.rollout import RolloutSettings
from agentrl.rollout.protocol import Rollout
from agentrl.train.config import PolicyConfig, TrainConfig
from agentrl.train.lane import TrainerLike
from agentrl.trainers.models import adapter_config, save_pretrained, save_weights
from agentrl.trainers.trainer import Trainer, TrainerConfig

log = logging.getLogger(__name__)


class Serving:
    """The engines of a run and the trainers behind them; :meth:`close` closes what it started."""

    def __init__(
        self,
        config: TrainConfig,
        policies: Mapping[str, PolicyConfig],
        settings: Mapping[str, TrainerConfig],
        lent: Policy | None = None,
    ):
        self.config, self.policies, self.settings = config, policies, settings
        self.base_path = resolve_model(config.rollout.model)
        self.ray = RaySession(config.rollout.ray_address)
        self.clusters: dict[str, Any] = {}
        """The trainer ranks and engines on Ray of each trainable ``weights: full`` policy, with ``cluster:``."""
        self.host: Policy | None = None
        """The engine of the LoRA policies and the frozen base."""
        self.lent = lent
        self.own: dict[str, Policy] = {}
        """The engines of the ``weights: full`` policies, by policy id."""
        self.adapters: dict[str, Policy] = {}  # by policy id; of a lent host, closed with the run
        lora = [p for p, s in policies.items() if s.weights == "lora"]
        full = [p for p, s in policies.items() if s.weights == "full"]
        on_lent = None
        if lent is not None and not lora:
            on_base = [p for p in full if policies[p].model in (None, config.rollout.model)]
            on_lent = on_base[0] if len(on_base) == 1 else None
        if lent is not None and config.cluster.enabled:
            raise ValueError(
                "train(policy=...) trains through your engine; a run with a cluster section starts its own."
            )
        self.lone_cores = self._lone_engine_cores(engines=len(full) + bool(lora))
        """The cores of the run's one local CPU vLLM engine (``cpu_cores``), or None: the environment's binding."""
        try:
            if lora:
                self.host = lent if lent is not None else self._start_host(lora)
            for policy_id in full:
                if policy_id == on_lent:
                    self.own[policy_id] = lent  # type: ignore[assignment]
                elif config.cluster.enabled and policies[policy_id].trainable:
                    self.clusters[policy_id] = self._start_cluster(policy_id)
                    self.own[policy_id] = self.clusters[policy_id].policy
                else:
                    self.own[policy_id] = self._supervised(policy_id)
        except BaseException:
            self.close()
            raise
        first = self.host if self.host is not None else next(iter(self.own.values()))
        self.tokenizer = first.tokenizer

    # --- set-up ------------------------------------------------------------------------------

    def _lone_engine_cores(self, engines: int) -> str | None:
        """Every core for the engine of a run that starts one vLLM engine, in this process, where
        that helps (:func:`~agentrl.policies.vllm.lone_engine_cores`); its replacements get them too."""
        config = self.config
        alone = engines == 1 and self.lent is None and not config.rollout.ray_address and not config.cluster.enabled
        if not alone or config.rollout.backend != "vllm":
            return None
        cores = lone_engine_cores()
        if cores is not None:
            log.info(
                "the engine's threads bound to cores %s, all of them (VLLM_CPU_OMP_THREADS_BIND=auto keeps vLLM's "
                "binding, which leaves one to its scheduler)", cores,
            )  # fmt: skip
        return cores

    def _start_host(self, lora: list[str]) -> Policy:
        rollout = self.config.rollout
        if rollout.ray_address:
            raise ConfigError(
                f"policies {lora} are LoRA adapters, which play on one engine in this process; with "
                "rollout.ray_address give them weights: full (each an engine of its own, a Ray actor), or unset "
                "ray_address."
            )
        options = policy_options(rollout)
        if rollout.backend == "vllm":
            options.update(cpu_cores=self.lone_cores)
            ranks = [self.settings[p].lora_rank for p in lora]
            options.update(max_loras=max(len(lora), 1), max_lora_rank=vllm_lora_rank(max(ranks)))
        start = functools.partial(make_backend, rollout.backend, self.base_path, options)
        return EngineSupervisor(start, max_restarts=self.config.max_engine_restarts)  # adapters follow it: .adapter()

    def _rollout_of(self, policy_id: str) -> EngineConfig:
        return replace(self.config.rollout, model=self.policies[policy_id].model or self.config.rollout.model)

    def _supervised(self, policy_id: str) -> Policy:
        """An engine of its own for ``policy_id``, replaced when it dies, ``max_engine_restarts`` times."""
        rollout = self._rollout_of(policy_id)
        start: Callable[[], Policy] = (
            functools.partial(self.ray.policy, rollout, self.model_path(policy_id), policy_id)
            if rollout.ray_address
            else functools.partial(make_policy, rollout, **({"cpu_cores": self.lone_cores} if self.lone_cores else {}))
        )
        return EngineSupervisor(start, max_restarts=self.config.max_engine_restarts)

    def _start_cluster(self, policy_id: str) -> Any:
        """``policy_id``'s trainer ranks and engines on Ray (:func:`agentrl.train.placement.start_cluster`),
        a placement of its own as ``cluster:`` describes it (each trainable ``weights: full`` policy gets one)."""
        from agentrl.train.placement import start_cluster  # imports Ray, an optional dependency

        config = self.config
        colocated_gpus = config.cluster.placement == "colocated" and config.device == "cuda"
        return start_cluster(
            config.cluster,
            self._rollout_of(policy_id),
            self.settings[policy_id],
            self.model_path(policy_id),
            device=config.device,
            torch_threads=config.torch_threads,
            sleep=colocated_gpus,  # the engines sleep while the ranks step on their GPUs
        )

    # --- what the lanes get ------------------------------------------------------------------

    def model_path(self, policy_id: str) -> str:
        return resolve_model(self.policies[policy_id].model or self.config.rollout.model)

    def trainer(self, policy_id: str) -> TrainerLike:
        """``policy_id``'s trainer: the cluster's ranks, or a :class:`Trainer` in this process."""
        if policy_id in self.clusters:
            return self.clusters[policy_id].trainer  # type: ignore[no-any-return]
        config = self.config
        return build_trainer(
            self.model_path(policy_id), self.settings[policy_id], self.tokenizer, device=config.device,
            dtype=config.rollout.dtype,
        )  # fmt: skip

    def serve(self, policy_id: str, trainer: TrainerLike | None) -> Policy:
        """The policy the rollouts call for ``policy_id``."""
        if policy_id in self.own:
            return self.own[policy_id]
        assert self.host is not None
        if trainer is None:  # a frozen LoRA policy is the base model
            return self.host
        assert isinstance(trainer, Trainer)
        adapter = self.host.adapter(policy_id, adapter_config(trainer.model))  # type: ignore[attr-defined]
        self.adapters[policy_id] = adapter
        return adapter  # type: ignore[no-any-return]

    def count_restarts_from(self, spent: Mapping[str, tuple[int, float]]) -> None:
        """The engine restarts (and the seconds they cost) that the run's earlier commands spent, by
        policy id, counted on by this command's supervisors: ``max_engine_restarts`` bounds a run. The
        shared LoRA engine has spent what the most of its policies saw."""
        on_host = [p for p in spent if p not in self.own]
        for policy_id, (restarts, seconds) in spent.items():
            engine = self.own.get(policy_id) or self.adapters.get(policy_id)
            if isinstance(engine, EngineSupervisor):
                engine.restarts, engine.seconds_lost = restarts, seconds
        if isinstance(self.host, EngineSupervisor) and on_host:
            self.host.restarts, self.host.seconds_lost = max(spent[p] for p in on_host)

    def lends(self, policy: Policy) -> bool:
        """Whether ``policy`` plays on the engine the caller lent (whose weights may be anything)."""
        return self.lent is not None and policy is self.lent

    def base(self) -> Policy:
        """The base model, untrained: the LoRA engine without an adapter, or an engine of its own."""
        if self.host is None:
            rollout = self.config.rollout
            self.host = make_backend(rollout.backend, self.base_path, policy_options(rollout))
        return self.host

    def rollout(self, served: Mapping[str, Policy], mapping: Any, env_kwargs: dict[str, Any]) -> Rollout:
        """What plays the train split: a rollout in this process, or with ``rollout.ray_address``
        env workers on the cluster, each reaching the policies' actors by name."""
        config = self.config
        settings = rollout_settings(config.rollout, mapping=mapping, env_kwargs=env_kwargs)
        if config.rollout.ray_address and self.lent is None:
            tokenizers = {p: self.model_path(p) for p in served}
            names = {p: self.ray.name_of(p) for p in served}
            return self.ray.env_workers(settings, names, tokenizers, config.imports)
        return build_rollout(settings, dict(served))

    def close(self) -> None:
        lent = [self.lent] if self.lent is not None else []
        closing = [
            p for p in self.own.values() if p not in lent and all(p is not c.policy for c in self.clusters.values())
        ]
        closing += (
            list(self.adapters.values()) if self.host is self.lent else [self.host] if self.host is not None else []
        )
        for policy in closing:
            try:
                policy.close()
            except Exception as e:  # one engine failing to close must not keep the others open
                log.warning("closing an engine failed: %s", e)
        for cluster in reversed(list(self.clusters.values())):  # the first started Ray: it shuts it down last
            cluster.close()
        self.ray.close()


class RaySession:
    """With ``rollout.ray_address``, each ``weights: full`` policy's engine runs as a Ray actor,
    registered under a name of this run, and the trainer's weights reach it through Ray's object
    store (:class:`agentrl.policies.ray_actor.RemotePolicy`); the train split is played by env
    workers on the cluster, which reach the actors by their names, and so follow each to a
    replacement."""

    def __init__(self, address: str | None):
        self.address = address
        self.own_ray = False
        self.run = uuid.uuid4().hex[:12]

    def name_of(self, policy_id: str) -> str:
        return f"agentrl-policy-{self.run}-{policy_id}"

    def policy(self, rollout: EngineConfig, model_path: str, policy_id: str) -> Policy:
        """A new policy actor under ``policy_id``'s name, owned by the policy returned (closing it kills the actor)."""
        import ray  # an optional dependency, only for ray_address

        from agentrl.policies.ray_actor import RemotePolicy, start_policy_actor  # imports Ray

        if not ray.is_initialized():
            ray.init(address=None if self.address == "local" else self.address)
            self.own_ray = True
        actor = start_policy_actor(rollout.backend, model_path, policy_options(rollout), name=self.name_of(policy_id))
        return RemotePolicy(actor, load_tokenizer(model_path), owns_actor=True)

    def env_workers(
        self, settings: RolloutSettings, names: dict[str, str], tokenizers: dict[str, str], imports: list[str]
    ) -> Any:
        """A :class:`~agentrl.rollout.ray.DistributedRollout` playing against the policy actors by
        name; its workers import the run's ``imports`` (which must be importable on every node) first."""
        from agentrl.rollout.ray import cluster_rollout  # imports Ray

        return cluster_rollout(names, tokenizers, settings, imports)

    def close(self) -> None:
        if self.address is None or not self.own_ray:
            return
        import ray  # only imported when a session was opened

        ray.shutdown()


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM's ``max_lora_rank`` accepts that holds ``rank``."""
    for allowed in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= allowed:
            return allowed
    raise ConfigError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank, 512.")


def export(trainer: TrainerLike, policy: PolicyConfig, model_path: str, tokenizer: Any, out: Path) -> Path:
    """A policy's trained weights: a LoRA policy as its adapter (peft's format, which vLLM serves with
    --lora-modules); a full one as a transformers checkpoint, from the trainer's model or from a
    cluster rank's published weights."""
    if isinstance(trainer, Trainer):
        if policy.weights == "lora":
            trainer.model.save_pretrained(out)
            tokenizer.save_pretrained(out)
            return out
        return save_pretrained(trainer.model, tokenizer, out)
    return save_weights(trainer.all_weights(), model_path, tokenizer, out)  # type: ignore[attr-defined]
