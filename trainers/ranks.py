"""The trainer on N ranks (``cluster.trainer_workers``): :class:`TrainerGroup` stands where one
:class:`~agentrl.trainers.trainer.Trainer` stands, over :class:`TrainerRank` Ray actors, one
``torch.distributed`` process each (gloo on the CPU, NCCL on GPUs).

Each step the group splits the batch into whole groups, one share per rank (balanced by tokens,
:func:`shard_groups`), and every rank runs the same ``Trainer.step`` on its share. With
``strategy: ddp`` each rank holds the whole model and the gradients are summed over ranks before
the optimizer step (the Trainer's own all-reduce, what ``DistributedDataParallel`` does), so N ranks
make exactly the update one process makes on the whole batch; with ``fsdp`` the model's decoder
layers and root are ``fully_shard``-ed (FSDP2) and each rank holds a shard. The ranks' metrics are
merged into the batch's (:func:`merge_rank_metrics`).

After each step rank 0 publishes the new weights: in Ray's object store once
(:class:`~agentrl.policies.ray_actor.SharedWeights`), or by broadcast to the engines
(:mod:`agentrl.policies.weight_sync`).

A rank that dies stops the run: the other ranks would wait for it in their next collective, so they
are killed too and the run ends with :class:`~agentrl.faults.TrainerLost`, whose message says to
resume (the last checkpoint has every rank's state; a resumed run starts new ranks and loads it).
Where the ranks run is the training job's placement (:mod:`agentrl.train.placement`).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import random
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    import ray
except ImportError as e:  # an optional dependency: say which extra brings it
    raise ImportError("agentrl.trainers.ranks needs Ray: pip install -e '.[cpu]' (or '.[gpu]'), or ray==2.60.0.") from e
import torch
from ray.exceptions import RayActorError
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from agentrl.faults import TrainerLost
from agentrl.policies import broadcast
from agentrl.policies.ray_actor import SharedWeights, WorkerLocation, current_location
from agentrl.policies.router import RouterPolicy
from agentrl.policies.vllm import changed_units
from agentrl.policies.weight_sync import BroadcastWeights, WeightBroadcaster
from agentrl.trainers.trainer import TrainerConfig
from agentrl.types import Trajectory

log = logging.getLogger(__name__)

COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)
"""How long a rank waits in a collective for the others (a dead rank is noticed sooner: its actor)."""


# --- one rank ---------------------------------------------------------------------------------------


def rendezvous_port(host: str, tries: int = 200) -> int:
    """A port free on ``host`` now, for a rendezvous store that binds it a moment later: drawn from
    below the kernel's ephemeral range, whose ports are handed to outgoing connections at any time (a
    port found free there was taken before rank 0's store bound it, and the run failed with
    EADDRINUSE). Falls back to any free port if none below is free."""
    low = ephemeral_ports()[0]
    below = range(max(1024, low - 12000), low)
    for port in random.sample(below, min(tries, len(below))):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux's default where it cannot be read)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


@ray.remote(max_restarts=0, max_task_retries=0)
class TrainerRank:
    """One ``torch.distributed`` process of a :class:`TrainerGroup`, holding a
    :class:`~agentrl.trainers.trainer.Trainer` (the whole model with ``ddp``, a shard with ``fsdp``)."""

    def __init__(self, rank: int, world: int, torch_threads: int, seed: int):
        self.rank, self.world = rank, world
        if torch_threads:
            torch.set_num_threads(torch_threads)
        torch.manual_seed(seed)
        self.trainer: Any = None
        self.device = "cpu"
        self._weight_group: Any = None  # rank 0's weight broadcast group (agentrl.policies.broadcast)
        self._held: list[tuple[str, torch.Tensor]] = []  # rank 0: the weights of the sync under way
        self._sent: dict[str, Any] = {}  # rank 0: the stamps of the weights the engines hold

    def address(self) -> tuple[str, int]:
        """An address on this rank's node where rank 0 can host the process group's rendezvous."""
        host = ray.util.get_node_ip_address()
        return host, rendezvous_port(host)

    def start(
        self, master: tuple[str, int], model_path: str, config: TrainerConfig, device: str, dtype: str, strategy: str
    ) -> None:
        """Join the process group and build the trainer (every rank at once: the group waits for all)."""
        from agentrl.build import build_trainer, load_tokenizer  # the trainer's set-up chain, on this node

        backend = "nccl" if device == "cuda" else "gloo"
        host, port = master
        torch.distributed.init_process_group(
            backend,
            init_method=f"tcp://{host}:{port}",
            rank=self.rank,
            world_size=self.world,
            timeout=COLLECTIVE_TIMEOUT,
        )
        self.device = device
        if device == "cuda":
            torch.cuda.set_device(0)  # Ray shows each rank the GPU it was given as device 0
        shard = _fully_shard if strategy == "fsdp" else None
        self.trainer = build_trainer(
            model_path, config, load_tokenizer(model_path), device=device, dtype=dtype, wrap=shard
        )

    def step(self, trajectories: list[Trajectory], version: int | None) -> tuple[dict[str, float], Any]:
        """``Trainer.step`` on this rank's share; its metrics and advantages (``[B_rank, T]``)."""
        metrics = self.trainer.step(trajectories, version)
        return metrics, self.trainer.last_advantages

    def inference_weights(self, hold: bool = False, whole: bool = False) -> Any:
        """Rank 0: the weights for the engines, put in the object store (inside a list, so that Ray
        passes the reference, not the tensors); with ``hold``, kept here (on the device) for
        :meth:`send_weights` and described (:class:`~agentrl.policies.broadcast.TensorSpec` list).
        Only the decoder layers and modules that changed since the last call are sent
        (:func:`~agentrl.policies.vllm.changed_units`: the engines hold the rest), unless ``whole``.
        With ``fsdp`` every rank must call (a collective)."""
        weights = [(name, _gathered(tensor)) for name, tensor in self.trainer.inference_weights()]
        if self.rank != 0:
            return None
        if not whole:
            weights, self._sent = changed_units(self._sent, weights)
        if hold:
            self._held = weights
            return broadcast.spec_of(weights)
        return [ray.put(_on_cpu(weights))]

    def join_weights(self, host: str, port: int, world: int) -> None:
        """Rank 0: form a new weight broadcast group with ``world - 1`` engines, as its member 0."""
        self.leave_weights()
        self._weight_group = broadcast.join(host, port, world, 0, self.device)

    def leave_weights(self) -> None:
        group, self._weight_group = self._weight_group, None
        if group is not None:
            try:
                group.shutdown()
            except Exception as e:  # a member died: nothing more to do with the group
                log.info("the old weight broadcast group did not shut down cleanly: %s", e)

    def send_weights(self) -> None:
        """Rank 0: broadcast the held weights to the group's engines."""
        broadcast.send(self._weight_group, self._held, self.device)

    def put_weights(self) -> list[ray.ObjectRef]:
        """Rank 0: the held weights in the object store (for an engine the broadcast missed)."""
        return [ray.put(_on_cpu(self._held))]

    def state_dict(self) -> dict[str, Any]:
        """This rank's trainer state (weights and optimizer whole on rank 0 with ``fsdp``, gathered; a collective)."""
        return _full_state(self.trainer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _load_full_state(self.trainer, state)

    def reference_nll(self, trajectories: list[Trajectory]) -> float | None:
        return self.trainer.reference_nll(trajectories)

    def gradients(self) -> dict[str, torch.Tensor]:
        """The gradients of the last step, whole (for checks: every rank holds the summed ones)."""
        return {n: _full(p.grad) for n, p in self.trainer.model.named_parameters() if p.grad is not None}

    def location(self) -> WorkerLocation:
        return current_location()

    def close(self) -> None:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _fully_shard(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: each decoder layer sharded as a unit of its own, the gradients of its shard summed over
    ranks (the Trainer's losses are already divided by the whole batch's counts). The embeddings,
    final norm and (tied) head stay whole on every rank, their gradients summed by the Trainer: the
    trainer's passes call the decoder and the head separately, and a tied head cannot be split from
    the embeddings it shares its weight with."""
    from torch.distributed.fsdp import fully_shard

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for layer in base.model.layers:
        fully_shard(layer)
        layer.set_gradient_divide_factor(1.0)
        layer.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return model


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) tensor gathered whole, on the CPU; a plain one as it is (a collective for a DTensor)."""
    return _gathered(tensor).cpu()


def _gathered(tensor: torch.Tensor) -> torch.Tensor:
    """:func:`_full` on the tensor's own device (a plain tensor: itself, detached)."""
    if hasattr(tensor, "full_tensor"):
        tensor = tensor.full_tensor()
    return tensor.detach()


def _on_cpu(named_tensors: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    return [(name, tensor.cpu()) for name, tensor in named_tensors]


def _full_state(trainer: Any) -> dict[str, Any]:
    state = trainer.state_dict()
    if not any(hasattr(t, "full_tensor") for t in state["model"].values()):
        return state
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state["model"], state["optimizer"] = get_state_dict(trainer.model, trainer.optimizer, options=options)
    return state


def _load_full_state(trainer: Any, state: dict[str, Any]) -> None:
    if not any(hasattr(p, "full_tensor") for p in trainer.model.parameters()):
        trainer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    from agentrl.trainers.trainer import set_rng_state

    set_state_dict(
        trainer.model,
        trainer.optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=StateDictOptions(full_state_dict=True),
    )
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.step_count = int(state["step"])
    set_rng_state(state["rng"])


# --- the ranks together -----------------------------------------------------------------------------


class TrainerGroup:
    """``trainer_workers`` :class:`TrainerRank` actors standing where one
    :class:`~agentrl.trainers.trainer.Trainer` stands: :meth:`step`, :meth:`inference_weights`,
    :meth:`state_dict`, :meth:`load_state_dict`, :meth:`reference_nll` and ``last_advantages`` are the
    Trainer's, so the controller does not know the difference."""

    def __init__(
        self, ranks: Sequence[Any], *, colocated_engines: RouterPolicy | None = None, weight_sync: str = "store"
    ):
        self.ranks = list(ranks)
        self.colocated_engines = colocated_engines
        """Engines that sleep while the ranks step (colocated on GPUs), else None."""
        self.broadcaster = WeightBroadcaster(self.ranks[0]) if weight_sync == "broadcast" else None
        """With ``cluster.weight_sync: broadcast``, the weight group of rank 0 and the engines."""
        self.last_advantages: torch.Tensor | None = None
        self.step_seconds: list[float] = []

    @classmethod
    def start(
        cls,
        model_path: str,
        config: TrainerConfig,
        *,
        bundles: Sequence[tuple[PlacementGroup, int]],
        resources: dict[str, float],
        device: str,
        dtype: str,
        strategy: str,
        torch_threads: int,
        seed: int,
        name: str,
        weight_sync: str = "store",
    ) -> TrainerGroup:
        """Start one rank per placement-group bundle, join them in a process group, build their trainers."""
        world = len(bundles)
        ranks = [
            TrainerRank.options(  # type: ignore[attr-defined]
                name=f"{name}-rank-{rank}",
                num_cpus=resources.get("CPU", 1),
                num_gpus=resources.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index),
            ).remote(rank, world, torch_threads, seed)
            for rank, (group, index) in enumerate(bundles)
        ]
        group = cls(ranks, weight_sync=weight_sync)
        master = ray.get(ranks[0].address.remote())
        group._all(lambda r: r.start.remote(master, model_path, config, device, dtype, strategy))
        return group

    def step(self, trajectories: Sequence[Trajectory], version: int | None = None) -> dict[str, float]:
        """One update: each rank steps on its share (whole groups); the ranks' metrics merged."""
        shares = shard_groups(trajectories, len(self.ranks))
        if self.colocated_engines is not None:
            asyncio.run(self.colocated_engines.sleep())  # in the step's thread
        try:
            results = self._all(lambda rank, share: rank.step.remote([trajectories[i] for i in share], version), shares)
        finally:
            if self.colocated_engines is not None:
                asyncio.run(self.colocated_engines.wake_up())
        self.last_advantages = _in_order([a for _, a in results], shares, len(trajectories))
        return merge_rank_metrics([m for m, _ in results])

    def inference_weights(self, whole: bool = False) -> SharedWeights | BroadcastWeights:
        """The new weights for every engine: in the object store once (rank 0 put them there), or
        held by rank 0 for a broadcast (``weight_sync: broadcast``). Only the layers that changed
        since the last call go (the engines hold the rest), unless ``whole``."""
        if self.broadcaster is not None:
            spec = self._all(lambda r: r.inference_weights.remote(hold=True, whole=whole))[0]
            return BroadcastWeights(self.broadcaster, spec)
        refs = self._all(lambda r: r.inference_weights.remote(whole=whole))
        return SharedWeights(refs[0][0])

    def all_weights(self) -> SharedWeights:
        """Every weight, through the object store, whatever the engines hold (an export)."""
        return SharedWeights(self._all(lambda r: r.inference_weights.remote(whole=True))[0][0])

    def state_dict(self) -> dict[str, Any]:
        """Rank 0's trainer state (the same weights and optimizer on every rank), and every rank's RNG states."""
        states = self._all(lambda r: r.state_dict.remote())
        return {**states[0], "rank_rng": [s["rng"] for s in states]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` on every rank (each its own RNG states; a checkpoint of one
        process gives every rank its states)."""
        rngs = state.get("rank_rng") or [state["rng"]] * len(self.ranks)
        if len(rngs) != len(self.ranks):
            raise ValueError(
                f"the checkpoint was written by {len(rngs)} trainer ranks and this run has {len(self.ranks)}: "
                "resume with the same cluster.trainer_workers (or start a new run_dir)."
            )
        self._all(lambda r, rng: r.load_state_dict.remote({**state, "rng": rng}), rngs)

    def reference_nll(self, trajectories: Sequence[Trajectory]) -> float | None:
        return self._all(lambda r: r.reference_nll.remote(list(trajectories)))[0]

    def gradients(self) -> list[dict[str, torch.Tensor]]:
        """Every rank's gradients of the last step (for checks)."""
        return self._all(lambda r: r.gradients.remote())

    def locations(self) -> list[WorkerLocation]:
        return ray.get([r.location.remote() for r in self.ranks])

    def close(self) -> None:
        for rank in self.ranks:
            ray.kill(rank)

    def _all(self, call: Any, per_rank: Sequence[Any] | None = None) -> list[Any]:
        """``call(rank[, its item])`` on every rank; their results in rank order. A rank that died
        (its actor, or its node) ends the group: the others are killed, and :class:`TrainerLost` raised."""
        refs = [call(r) if per_rank is None else call(r, item) for r, item in zip(self.ranks, per_rank or self.ranks)]
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except RayActorError as e:
                rank = refs.index(done[0])
                self.close()
                raise TrainerLost(
                    f"trainer rank {rank} of {len(self.ranks)} died ({type(e).__name__}); the other ranks were stopped"
                ) from e
        return ray.get(refs)


def shard_groups(trajectories: Sequence[Trajectory], ranks: int) -> list[list[int]]:
    """Indices of ``trajectories`` for each of ``ranks`` ranks: whole groups (GRPO's baseline is a
    group's), each rank at least one, the ranks' token counts as even as largest-first allows."""
    groups: dict[str, list[int]] = {}
    for index, trajectory in enumerate(trajectories):
        groups.setdefault(trajectory.group_id, []).append(index)
    if len(groups) < ranks:
        raise ValueError(
            f"a batch of {len(groups)} groups cannot give each of {ranks} trainer ranks a whole group: "
            "raise groups_per_step to at least cluster.trainer_workers."
        )
    sizes = {g: sum(len(trajectories[i].token_ids) for i in rows) for g, rows in groups.items()}
    shares: list[list[int]] = [[] for _ in range(ranks)]
    load = [0] * ranks
    for group_id in sorted(groups, key=lambda g: -sizes[g]):
        rank = min(range(ranks), key=lambda r: (load[r], len(shares[r]), r))
        shares[rank] += groups[group_id]
        load[rank] += sizes[group_id]
    return [sorted(share) for share in shares]


SUMMED = {"train/trajectories", "train/generated_tokens", "train/unscored_trajectories", "perf/train_tokens_per_s"}
"""Rank metrics that count this rank's share: the batch's is their sum."""
WEIGHTED = {
    "train/reward_mean": "train/trajectories",
    "train/effective_group_fraction": "train/trajectories",
    "train/advantage_mean": "train/generated_tokens",
    "train/stale_token_fraction": "train/generated_tokens",
    "train/reference_nll": "train/generated_tokens",
}
"""Rank metrics that are means over this rank's share: the batch's is their mean, weighted by the count named."""


def merge_rank_metrics(metrics: Sequence[dict[str, float]]) -> dict[str, float]:
    """The batch's metrics from the ranks'. The loss terms, the gradient norm, the log-prob gaps and
    the learning rate are already the batch's on every rank (the Trainer sums them over ranks); the
    share counts are summed, the share means weighted, the oldest version is the least, and a
    step's time is the slowest rank's."""
    merged = dict(metrics[0])
    for name in merged:
        values = [m[name] for m in metrics]
        if name in SUMMED:
            merged[name] = sum(values)
        elif name in WEIGHTED:
            weights = [m.get(WEIGHTED[name], 1.0) for m in metrics]
            merged[name] = sum(v * w for v, w in zip(values, weights)) / max(sum(weights), 1e-12)
        elif name == "train/behaviour_version_min":
            merged[name] = min(values)
        elif name == "perf/time_train":
            merged[name] = max(values)
    return merged


def _in_order(parts: Sequence[torch.Tensor | None], shares: Sequence[list[int]], total: int) -> torch.Tensor | None:
    """The ranks' advantages ``[B_rank, T_rank]`` as one ``[B, T]`` tensor in the batch's order."""
    if any(p is None for p in parts):
        return None
    width = max(p.shape[1] for p in parts)  # type: ignore[union-attr]
    out = torch.zeros(total, width)
    for part, share in zip(parts, shares):
        out[share, : part.shape[1]] = part  # type: ignore[union-attr]
    return out
