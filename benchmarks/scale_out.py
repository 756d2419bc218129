"""Scale-out on Ray (``cluster:``): rollouts on 1 and 2 engines, trainer steps on 1 and 2 ranks, weight syncs.

    python benchmarks/scale_out.py --quick       # the tiny model, hf engines: a smoke run (the test suite's)
    python benchmarks/scale_out.py               # the default model (SmolLM2-135M) on vLLM, the main job's settings

Three tables, each side by side in one run on a local Ray (or ``RAY_ADDRESS``'s cluster):

1. **Rollout**: ``--groups`` groups of the train split of ``--config`` played through the router on 1
   engine and then on 2 (Ray actors placed as ``agentrl train`` places them: CPU vLLM engines on one
   node get disjoint cores); generated tokens/s and the scaling efficiency (tokens/s with 2 over
   twice that with 1).
2. **Trainer step**: the same batch (the groups just played, whole groups) stepped by 1 rank and by
   2 ranks (``TrainerGroup``, DDP, one torch thread each); seconds a step (median of ``--steps`` after
   a warm-up step) and the speed-up.
3. **Weight sync**: rank 0 puts the weights in the object store once and every engine loads them
   (``RouterPolicy.aupdate_weights``), and, with vLLM, rank 0 broadcasts them into the engines'
   workers (``cluster.weight_sync: broadcast``), for the model and for copies of it cut to its first
   ``--layers`` decoder layers, on 1 and 2 engines: seconds and MB/s; and, on 2 engines, the sync that
   follows a training step, which sends only the layers the step changed.

Each actor asks Ray for half a CPU (a 2-core machine holds two engines and a rank at once), or
``--gpu-share`` of a GPU with ``--device cuda``. On a 2-core machine the engines, the ranks and the
driver share the same two cores: the figures say what the machinery costs and how it scales when the
cores are there, not what more hardware gives (``benchmarks/gpu_check.sh`` runs this on GPUs).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import torch
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _needs(device: str, gpu_share: float) -> dict[str, float]:
    """What each engine and rank asks Ray for: half a CPU (so that a 2-core machine holds the
    largest set alive at once, two engines and a rank), or a share of a GPU."""
    return {"CPU": 0.5, **({"GPU": gpu_share} if device == "cuda" else {})}


def _engines(n: int, config: Any, model: str, needs: dict[str, float]) -> tuple[Any, Any]:
    """A router over ``n`` engine actors placed as ``agentrl train`` places them; and their placement group."""
    from agentrl.build import load_tokenizer, policy_options
    from agentrl.policies.ray_actor import RemotePolicy
    from agentrl.policies.router import RouterPolicy
    from agentrl.train.placement import start_engines

    group = placement_group([needs] * n, strategy="PACK")
    ray.get(group.ready())
    options = policy_options(config.rollout)
    actors = start_engines(
        group, range(n), config.rollout.backend, model, options, needs, name=f"bench-{time.monotonic_ns()}"
    )
    ray.get([a.ping.remote() for a in actors])
    tokenizer = load_tokenizer(model)
    return RouterPolicy([RemotePolicy(a, tokenizer, owns_actor=True) for a in actors]), group


def rollout(config: Any, router: Any, groups: int) -> tuple[dict[str, float], list[Any]]:
    """``groups`` groups of the train split played through ``router``; the figures and the trajectories."""
    from agentrl.build import build_rollout, rollout_settings

    engine = build_rollout(rollout_settings(config.rollout, env_kwargs={"split": "train"}), router)
    asyncio.run(engine.collect(1))  # first-call costs out of the timing
    started = time.perf_counter()
    trajectories = asyncio.run(engine.collect(groups))
    seconds = time.perf_counter() - started
    engine.close()
    generated = sum(t.num_generated for t in trajectories)
    return {"seconds": seconds, "generated": generated, "tokens_per_s": generated / seconds}, trajectories


def start_ranks(config: Any, model: str, ranks: int, needs: dict[str, float], device: str) -> tuple[Any, Any]:
    """A :class:`~agentrl.trainers.ranks.TrainerGroup` of ``ranks`` DDP ranks (one torch thread each); its placement group."""
    from agentrl.trainers.ranks import TrainerGroup

    group = placement_group([needs] * ranks, strategy="PACK")
    ray.get(group.ready())
    trainer = TrainerGroup.start(
        model,
        config.trainer_settings(),
        bundles=[(group, i) for i in range(ranks)],
        resources=needs,
        device=device,
        dtype=config.rollout.dtype,
        strategy="ddp",
        torch_threads=1,
        seed=0,
        name=f"bench-{ranks}-{time.monotonic_ns()}",
    )
    return trainer, group


def step_seconds(trainer: Any, batch: list[Any], steps: int) -> float:
    """Median seconds of ``steps`` steps on ``batch`` after a warm-up step."""
    trainer.step(batch, version=0)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        trainer.step(batch, version=0)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def sync(router: Any, trainer: Any, repeats: int, via: str = "store") -> tuple[float, float]:
    """Median seconds of publishing ``trainer``'s weights once and loading them into every engine
    (after one untimed sync: a broadcast forms its group then); the MB sent. ``via`` is
    ``cluster.weight_sync``: the object store, or rank 0's broadcast into the vLLM workers."""
    from agentrl.policies.weight_sync import WeightBroadcaster

    megabytes = sum(t.numel() * t.element_size() for _, t in trainer.all_weights()) / 1e6
    trainer.broadcaster = WeightBroadcaster(trainer.ranks[0]) if via == "broadcast" else None
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        asyncio.run(router.aupdate_weights(trainer.inference_weights(whole=True)))
        times.append(time.perf_counter() - started)
    if trainer.broadcaster is not None and trainer.broadcaster.fallbacks:
        raise RuntimeError("a broadcast failed and went through the object store; its times would mislead")
    trainer.broadcaster = None
    return statistics.median(times[1:]), megabytes


def sync_after_step(router: Any, trainer: Any, batch: list[Any], via: str) -> tuple[float, float]:
    """Seconds of the sync that follows a training step, as ``agentrl train`` makes it: only the
    decoder layers the step changed go (the quickstart trains 8 of SmolLM2's 30); the MB sent."""
    from agentrl.policies.weight_sync import WeightBroadcaster

    trainer.broadcaster = WeightBroadcaster(trainer.ranks[0]) if via == "broadcast" else None
    asyncio.run(router.aupdate_weights(trainer.inference_weights()))  # everything, once: the engines hold it
    trainer.step(batch, version=0)
    started = time.perf_counter()
    weights = trainer.inference_weights()
    asyncio.run(router.aupdate_weights(weights))
    seconds = time.perf_counter() - started
    spec = getattr(weights, "spec", None)
    sizes = (
        [math.prod(t.shape) * getattr(torch, t.dtype).itemsize for t in spec]
        if spec is not None
        else [t.numel() * t.element_size() for _, t in weights]
    )
    trainer.broadcaster = None
    return seconds, sum(sizes) / 1e6


def cut_model(model: str, layers: int, out: Path) -> str:
    """A copy of ``model`` with its first ``layers`` decoder layers (same shapes, its weights), for sync sizes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    full = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    full.model.layers = full.model.layers[:layers]
    full.config.num_hidden_layers = layers
    full.save_pretrained(out)
    AutoTokenizer.from_pretrained(model).save_pretrained(out)
    return str(out)


def _close(*parts: Any) -> None:
    """Close routers and trainer groups, then remove the placement groups among ``parts``."""
    for part in parts:
        if isinstance(part, PlacementGroup):
            remove_placement_group(part)
        else:
            part.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="examples/quickstart.yaml")
    parser.add_argument("--groups", type=int, default=8, help="groups played per engine count")
    parser.add_argument("--steps", type=int, default=3, help="timed trainer steps (and syncs) per count")
    parser.add_argument("--layers", default="10,20", help="decoder layers of the cut copies for the sync table")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--gpu-share", type=float, default=1.0, help="GPUs per engine and per rank (cuda)")
    parser.add_argument("--ranks", default="1,2", help="rank counts of the trainer-step table (2 ranks need 2 GPUs)")
    parser.add_argument("--quick", action="store_true", help="the tiny model on hf engines, 2 groups, 1 step")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_args(argv)

    from agentrl.config import load_config
    from agentrl.model_paths import resolve_model
    from agentrl.train import TrainConfig

    work = Path(tempfile.mkdtemp(prefix="scale-out-"))
    overrides = [f"device={args.device}", *args.overrides]
    if args.quick:
        from agentrl.testing import build_tiny_model

        model = str(build_tiny_model(work / "tiny"))
        overrides += [
            f"rollout.model={model}",
            "rollout.backend=hf",
            "rollout.max_tokens=8",
            "trainer.trainable_layers=0",
        ]
        args.groups, args.steps, args.layers = 2, 1, "1"
    config = load_config(TrainConfig, args.config, overrides)
    model = resolve_model(config.rollout.model)
    needs = _needs(args.device, args.gpu_share)
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    own_ray = not ray.is_initialized()
    if own_ray:
        ray.init(address=os.environ.get("RAY_ADDRESS", "local"), include_dashboard=False)
    played: dict[int, dict[str, float]] = {}
    steps: dict[int, float] = {}
    syncs: dict[tuple[str, int, str], tuple[float, float]] = {}
    # a broadcast needs vLLM, and (NCCL) rank 0 and the engines on GPUs of their own
    ways = ["store", "broadcast"] if config.rollout.backend == "vllm" and needs.get("GPU", 1) >= 1 else ["store"]
    batch: list[Any] = []
    try:
        print(
            f"model {model}, backend {config.rollout.backend}, {os.cpu_count()} CPUs, device {args.device}", flush=True
        )
        one_rank = start_ranks(config, model, 1, needs, args.device)
        for engines in (1, 2):
            router = _engines(engines, config, model, needs)
            played[engines], trajectories = rollout(config, router[0], args.groups)
            batch = batch or trajectories
            for via in ways:
                syncs[(model, engines, via)] = sync(router[0], one_rank[0], args.steps, via)
            if engines == 2:
                for via in ways:
                    syncs[("changed layers after a step", engines, via)] = sync_after_step(
                        router[0], one_rank[0], trajectories[: 2 * config.rollout.group_size], via
                    )
            _close(*router)
            print(f"  played and synced on {engines} engine(s)", flush=True)
        per_step = 2 * config.rollout.group_size  # whole groups, an even number of them (one share per rank)
        batch = batch[: per_step * max(1, len(batch) // per_step)]
        steps[1] = step_seconds(one_rank[0], batch, args.steps)
        _close(*one_rank)
        for ranks in [int(n) for n in args.ranks.split(",") if int(n) > 1]:
            group = start_ranks(config, model, ranks, needs, args.device)
            steps[ranks] = step_seconds(group[0], batch, args.steps)
            _close(*group)
        print(f"  stepped on {', '.join(map(str, steps))} rank(s)", flush=True)
        for layers in [int(n) for n in args.layers.split(",") if n]:
            cut = cut_model(model, layers, work / f"layers-{layers}")
            ranks = start_ranks(config, cut, 1, needs, args.device)
            for engines in (1, 2):
                router = _engines(engines, config, cut, needs)
                for via in ways:
                    syncs[(cut, engines, via)] = sync(router[0], ranks[0], args.steps, via)
                _close(*router)
            _close(*ranks)
    finally:
        if own_ray:
            ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)

    print("\nrollout            seconds  generated  tokens/s")
    for engines, row in played.items():
        print(f"  {engines} engine(s)      {row['seconds']:7.1f}  {row['generated']:9.0f}  {row['tokens_per_s']:8.1f}")
    efficiency = played[2]["tokens_per_s"] / (2 * played[1]["tokens_per_s"])
    print(f"  scaling efficiency (2 engines / twice 1): {efficiency:.0%}")
    print(f"\ntrainer step ({len(batch)} trajectories)   seconds")
    for ranks, seconds in steps.items():
        print(f"  {ranks} rank(s)                     {seconds:7.2f}")
    for ranks in [r for r in steps if r > 1]:
        print(f"  speed-up with {ranks} ranks: {steps[1] / steps[ranks]:.2f}x")
    print("\nweight sync                       MB  engines  via        seconds    MB/s")
    for (path, engines, via), (seconds, megabytes) in syncs.items():
        print(
            f"  {Path(path).name[:28]:28s} {megabytes:7.1f}  {engines:7d}  {via:9s}  {seconds:7.2f}  "
            f"{megabytes / seconds:6.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
