"""Where one training step of the main job goes: a profile of ``Trainer.step`` on real quickstart batches.

    python benchmarks/profile_step.py                              # examples/quickstart.yaml, 3 steps
    python benchmarks/profile_step.py --steps 5 --config examples/quickstart.yaml

First the quickstart's own rollout plays ``groups_per_step`` groups on vLLM (the default model, the
config's sampling and limits), so the batch has the quickstart's real lengths and turns; the engine
is then closed. The trainer is built from the same config (``trainer_settings()``: trainable
layers, micro-batch size, threads) and steps ``--steps`` times on that batch after one warm-up
step. Printed, per step (median): the wall time split into collation, the forward passes
(``generated_logprobs``), the backward passes, gradient clipping, the optimizer step and the rest
(advantages, loss arithmetic, metrics); the padding (tokens computed against tokens that exist);
and the ten costliest operators of one step by torch's profiler (self CPU time).

The trainer runs rows in length buckets, each only as long as its longest row
(``agentrl.trainers.models.forward_plan``); the baseline, stepped alternately with it in the same
run, runs each shared-prompt set as one pass padded to the batch's width (what the trainer did
before). Feeds docs/performance.md (issue 17).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any


def timed(totals: dict[str, float], name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, adding its wall time to ``totals[name]`` at each call."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - started

    return wrapper


@contextlib.contextmanager
def phases(trainer: Any, totals: dict[str, float]) -> Iterator[None]:
    """Time the phases of ``trainer.step`` into ``totals`` while inside."""
    import torch

    from agentrl.trainers import trainer as module

    saved = (module.collate, module.generated_logprobs, torch.Tensor.backward, trainer._finish_gradients)
    saved_step = trainer.optimizer.step
    module.collate = timed(totals, "collate", module.collate)
    module.generated_logprobs = timed(totals, "forward", module.generated_logprobs)
    torch.Tensor.backward = timed(totals, "backward", torch.Tensor.backward)
    trainer._finish_gradients = timed(totals, "clip", trainer._finish_gradients)
    trainer.optimizer.step = timed(totals, "optimizer", saved_step)
    try:
        yield
    finally:
        module.collate, module.generated_logprobs, torch.Tensor.backward, trainer._finish_gradients = saved
        trainer.optimizer.step = saved_step


@contextlib.contextmanager
def one_padded_pass(baseline: bool) -> Iterator[None]:
    """While inside with ``baseline``, the trainer runs each shared-prompt set as one pass padded to
    the batch's width, as it did before length buckets."""
    from agentrl.trainers import models

    saved = models.forward_plan

    def padded(input_ids: Any, *args: Any) -> list[Any]:
        width = input_ids.shape[1]
        return [s._replace(buckets=[(s.rows, width)]) for s in saved(input_ids, *args)]

    if baseline:
        models.forward_plan = padded
    try:
        yield
    finally:
        models.forward_plan = saved


def planned_tokens(batch: Any, micro_batch_size: int) -> int:
    """Token positions the trainer's forward passes compute over ``batch``, micro-batch by micro-batch."""
    from agentrl.trainers import models

    return sum(
        models.computed_tokens(models.forward_plan(m.input_ids, m.attention_mask, m.loss_mask, m.group_index))
        for m in batch.split(micro_batch_size)
    )


def play_batch(config: Any) -> tuple[list[Any], Any]:
    """``config.groups_per_step`` groups of the train split, played on vLLM as the quickstart plays them."""
    from agentrl.build import build_engine, engine_settings, make_policy

    policy = make_policy(config.rollout)
    try:
        engine = build_engine(
            config.rollout.env_id,
            policy,
            env_kwargs={**config.rollout.env_kwargs, "split": "train"},
            **engine_settings(config.rollout),
        )
        trajectories = asyncio.run(engine.collect(config.groups_per_step))
        engine.close()
    finally:
        policy.close()
    return trajectories, policy.tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="examples/quickstart.yaml")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import torch

    from agentrl.build import build_trainer
    from agentrl.config import load_config
    from agentrl.model_paths import resolve_model
    from agentrl.train import TrainConfig
    from agentrl.trainers import models
    from agentrl.trainers.batch import collate

    config = load_config(TrainConfig, args.config, [])
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    trajectories, tokenizer = play_batch(config)
    settings = config.trainer_settings()
    trainer = build_trainer(resolve_model(config.rollout.model), settings, tokenizer, dtype=config.rollout.dtype)
    batch = collate(trajectories, trainer.pad_token_id)
    real = int(batch.attention_mask.sum())
    generated = int(batch.loss_mask.sum())
    saved_cost, models.BUCKET_COST = models.BUCKET_COST, 0  # every length its own pass: nothing padded
    unique = planned_tokens(batch, settings.micro_batch_size)  # tokens that exist, a shared prompt once
    models.BUCKET_COST = saved_cost

    trainer.step(trajectories)  # warm-up
    rows: dict[str, list[dict[str, float]]] = {"buckets": [], "baseline": []}
    computed: dict[str, int] = {}
    for _ in range(args.steps):
        for name in rows:  # alternated, so that both see the same machine
            with one_padded_pass(name == "baseline"):
                computed[name] = planned_tokens(batch, settings.micro_batch_size)
                totals: dict[str, float] = collections.defaultdict(float)
                started = time.perf_counter()
                with phases(trainer, totals):
                    trainer.step(trajectories)
            totals["total"] = time.perf_counter() - started
            totals["rest"] = totals["total"] - sum(v for k, v in totals.items() if k != "total")
            rows[name].append(dict(totals))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        trainer.step(trajectories)

    print(
        f"{args.config}: {len(trajectories)} trajectories, {batch.input_ids.shape[1]} padded length, "
        f"{settings.micro_batch_size} per micro-batch, trainable layers {settings.trainable_layers}, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(f"tokens: {real} real ({generated} generated); computed with a shared prompt counted once:")
    for name, count in computed.items():
        print(f"  {name:<9} {count:6d} computed ({max(count - unique, 0) / count:.1%} padding)")
    print(f"{'phase':<10} {'buckets s':>10} {'share':>7} {'baseline s':>11}   (medians of {args.steps} steps each)")
    total = statistics.median(r["total"] for r in rows["buckets"])
    for name in ("collate", "forward", "backward", "clip", "optimizer", "rest", "total"):
        value, base = (statistics.median(r.get(name, 0.0) for r in rows[k]) for k in ("buckets", "baseline"))
        print(f"{name:<10} {value:10.2f} {value / total:7.1%} {base:11.2f}")
    baseline = statistics.median(r["total"] for r in rows["baseline"])
    print(
        f"step: {total:.2f} s with length buckets, {baseline:.2f} s padded to the batch width ({baseline / total:.2f}x)"
    )
    print("costliest operators of one step (self CPU time):")
    print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=40))


if __name__ == "__main__":
    main()
