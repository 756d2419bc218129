"""Where a run's trainer ranks and engines go on Ray (``cluster:``,
:class:`~agentrl.train.config.ClusterConfig`): one placement group, bundles packed onto as few nodes
as fit, the ranks (:class:`~agentrl.trainers.ranks.TrainerGroup`) and ``engines``
:class:`~agentrl.policies.ray_actor.PolicyActor` actors behind a
:class:`~agentrl.policies.router.RouterPolicy` (sticky episodes, least-loaded first, a dead engine's
requests replayed on the others).

- ``disaggregated``: every rank and every engine has a bundle of its own (its own GPU on a GPU
  cluster), so generation and training run at once (``max_staleness`` > 0 overlaps them).
- ``colocated``: rank *i* and engine *i* share bundle *i* (on a GPU cluster, one GPU: half each).
  With GPUs the engines sleep (vLLM's sleep mode) while the ranks step, which needs
  ``max_staleness: 0`` (nothing generates during a step); on the CPU there is no sleep mode, and
  colocation only places them together.

The actors are named after the run (``agentrl-<id>-rank-<i>``, ``agentrl-<id>-engine-<i>``), which
is how ``ray list actors`` shows them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

try:
    import ray
except ImportError as e:  # an optional dependency: say which extra brings it
    raise ImportError(
        "agentrl.train.placement needs Ray: pip install -e '.[cpu]' (or '.[gpu]'), or ray==2.60.0."
    ) from e
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from agentrl.config import EngineConfig
from agentrl.policies.ray_actor import PolicyActor, RemotePolicy
from agentrl.policies.router import RouterPolicy
from agentrl.train.config import ClusterConfig
from agentrl.trainers.ranks import TrainerGroup
from agentrl.trainers.trainer import TrainerConfig


@dataclass
class Cluster:
    """The Ray side of one run: its placement group, trainer ranks and engines."""

    trainer: TrainerGroup
    policy: RouterPolicy
    placement: PlacementGroup
    own_ray: bool

    def close(self) -> None:
        self.trainer.close()
        self.policy.close()
        remove_placement_group(self.placement)
        if self.own_ray:
            ray.shutdown()


def start_cluster(
    cluster: ClusterConfig,
    rollout: EngineConfig,
    trainer: TrainerConfig,
    model_path: str,
    *,
    device: str,
    torch_threads: int,
    sleep: bool,
) -> Cluster:
    """Connect to Ray (``cluster.address``), reserve the placement, start the engines and the ranks."""
    from agentrl.build import load_tokenizer, policy_options  # the set-up chain (imports transformers)

    name = f"agentrl-{uuid.uuid4().hex[:8]}"
    own_ray = not ray.is_initialized()
    if own_ray:
        address = cluster.address
        ray.init(address=None if address == "local" else address, include_dashboard=False)
    gpu = device == "cuda"
    rank_needs = cluster.trainer_resources or {"CPU": 1.0, **({"GPU": 1.0} if gpu else {})}
    engine_needs = cluster.engine_resources or {
        "CPU": 1.0,
        **({"GPU": 1.0} if gpu and rollout.backend == "vllm" else {}),
    }
    if cluster.placement == "colocated":  # rank i and engine i in bundle i, sharing its GPU
        if gpu:
            rank_needs = {**rank_needs, "GPU": 0.5}
            engine_needs = {**engine_needs, "GPU": 0.5}
        bundles = [_sum(rank_needs, engine_needs) for _ in range(cluster.trainer_workers)]
        rank_bundles = engine_bundles = list(range(cluster.trainer_workers))
    else:
        bundles = [rank_needs] * cluster.trainer_workers + [engine_needs] * cluster.engines
        rank_bundles = list(range(cluster.trainer_workers))
        engine_bundles = list(range(cluster.trainer_workers, len(bundles)))
    group = placement_group(bundles, strategy="PACK", name=f"{name}-placement")
    if not group.wait(timeout_seconds=cluster.placement_timeout):
        remove_placement_group(group)
        if own_ray:
            ray.shutdown()
        raise RuntimeError(
            f"Ray could not place {len(bundles)} bundles {bundles} within {cluster.placement_timeout} s; "
            f"the cluster has {ray.cluster_resources()}. Lower cluster.trainer_workers / cluster.engines, "
            "or the resources each needs (cluster.trainer_resources, cluster.engine_resources)."
        )
    options = policy_options(rollout)
    if sleep:
        options["enable_sleep_mode"] = True
    engines = []
    try:
        actors = start_engines(group, engine_bundles, rollout.backend, model_path, options, engine_needs, name=name)
        tokenizer = load_tokenizer(model_path)
        engines = [RemotePolicy(actor, tokenizer, owns_actor=True) for actor in actors]
        ranks = TrainerGroup.start(
            model_path,
            trainer,
            bundles=[(group, b) for b in rank_bundles],
            resources=rank_needs,
            device=device,
            dtype=rollout.dtype,
            strategy=cluster.strategy,
            torch_threads=torch_threads,
            seed=trainer.seed,
            name=name,
            weight_sync=cluster.weight_path(device, rollout.backend),
        )
        ray.get([actor.ping.remote() for actor in actors])  # the engines are up (their start overlapped the ranks')
    except BaseException:
        for engine in engines:
            engine.close()
        remove_placement_group(group)
        if own_ray:
            ray.shutdown()
        raise
    router = RouterPolicy(engines)
    if sleep:
        ranks.colocated_engines = router
    return Cluster(ranks, router, group, own_ray)


def start_engines(
    group: PlacementGroup,
    bundles: Sequence[int],
    backend: str,
    model_path: str,
    options: dict[str, Any],
    resources: dict[str, float],
    *,
    name: str,
) -> list[Any]:
    """One :class:`~agentrl.policies.ray_actor.PolicyActor` per bundle of ``group``, named
    ``<name>-engine-<i>``; CPU vLLM engines that share a node on disjoint cores (:func:`engine_shares`)."""
    cpu_vllm = backend == "vllm" and not resources.get("GPU")
    shares = engine_shares(group, bundles) if cpu_vllm else [None] * len(bundles)
    return [
        PolicyActor.options(  # type: ignore[attr-defined]
            name=f"{name}-engine-{i}",
            num_cpus=resources.get("CPU", 1),
            num_gpus=resources.get("GPU", 0),
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=b),
        ).remote(backend, model_path, options, cores=shares[i])
        for i, b in enumerate(bundles)
    ]


def engine_shares(group: PlacementGroup, engine_bundles: Sequence[int]) -> list[tuple[int, int] | None]:
    """Per engine, ``(k, n)``: it is the k-th of n CPU vLLM engines on its node, or None when alone.

    Left alone, every CPU vLLM worker binds its threads to the same cores of its node (the first
    NUMA node's, less one kept for the scheduler), so engines that share a node would share those
    cores while the rest idle. Engines that share a node split its cores instead, one range each
    (:func:`~agentrl.policies.ray_actor.share_of_cores`, on the engine's own node: Ray's ``CPU``
    count may be more than the cores the machine has). A ``VLLM_CPU_OMP_THREADS_BIND`` set by the
    user wins (None here).
    """
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return [None] * len(engine_bundles)
    node_of = ray.util.placement_group_table(group)["bundles_to_node_id"]
    sharing: dict[str, list[int]] = {}
    for i, bundle in enumerate(engine_bundles):
        sharing.setdefault(node_of[bundle], []).append(i)
    shares: list[tuple[int, int] | None] = [None] * len(engine_bundles)
    for engines in sharing.values():
        if len(engines) > 1:  # alone on its node: vLLM's own binding
            for k, i in enumerate(engines):
                shares[i] = (k, len(engines))
    return shares


def _sum(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in {*a, *b}}
