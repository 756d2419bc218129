"""Where one training step of the main job goes: a profile of ``Trainer.step`` on real quickstart batches.

    python benchmarks/profile_step.py                              # examples/quickstart.yaml, 3 steps
    python benchmarks/profile_step.py --steps 5 --config examples/quickstart.yaml
    python benchmarks/profile_step.py --equal-groups 1 --baseline every-row   # rows without gradient skipped or not

First the quickstart's own rollout plays ``groups_per_step`` groups on vLLM (the default model, the
config's sampling and limits), so the batch has the quickstart's real lengths and turns; the engine
is then closed. The trainer is built from the same config (``trainer_settings()``: trainable
layers, micro-batch size, threads) and steps ``--steps`` times on that batch after one warm-up
step. Printed, per step (median): the wall time split into collation, the forward passes
(``generated_logprobs``), the backward passes, gradient clipping, the optimizer step and the rest
(advantages, loss arithmetic, metrics); the padding (tokens computed against tokens that exist);
and the ten costliest operators of one step by torch's profiler (self CPU time).

The trainer as it is ("now") is stepped alternately with a baseline in the same run. ``--baseline
padded`` (the default): each shared-prompt set runs as one pass padded to the batch's width, what
the trainer did before it ran rows in length buckets, each only as long as its longest row
(``agentrl.trainers.models.forward_plan``). ``--baseline every-row``: every row is computed, also
those whose advantages are all 0 (``Trainer._rows_with_gradient`` skips them); ``--equal-groups N``
rewards the first N played groups' episodes all 1 (as a group that always succeeded) and the other
groups' half 1, half 0, so that exactly N groups have nothing to learn from. Feeds docs/performance.md (issue 17).
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


@contextlib.contextmanager
def every_row(baseline: bool) -> Iterator[None]:
    """While inside with ``baseline``, the trainer computes every row, those without gradient too."""
    import torch

    from agentrl.trainers import Trainer

    saved = Trainer._rows_with_gradient
    if baseline:
        Trainer._rows_with_gradient = lambda self, mini: torch.arange(len(mini))  # type: ignore[method-assign]
    try:
        yield
    finally:
        Trainer._rows_with_gradient = saved  # type: ignore[method-assign]


def with_equal_rewards(trajectories: list[Any], groups: int) -> list[Any]:
    """``trajectories`` rewarded anew (when ``groups`` > 0): every episode of the first ``groups``
    groups 1 (a group solved every time), the episodes of the others 0 and 1 in turn (half solved),
    so that exactly those groups have no GRPO signal; the tokens stay as played."""
    import dataclasses

    if not groups:
        return trajectories
    order = list(dict.fromkeys(t.group_id for t in trajectories))
    seen: dict[str, int] = {}
    rewarded = []
    for t in trajectories:
        index = seen[t.group_id] = seen.get(t.group_id, -1) + 1
        reward = 1.0 if order.index(t.group_id) < groups else float(index % 2)
        rewarded.append(
            dataclasses.replace(t, reward=reward, turn_rewards=[0.0] * (len(t.turn_rewards) - 1) + [reward])
        )
    return rewarded


def planned_tokens(batch: Any, micro_batch_size: int) -> int:
    """Token positions the trainer's forward passes compute over ``batch``, micro-batch by micro-batch."""
    from agentrl.trainers import models

    return sum(
        models.computed_tokens(models.forward_plan(m.input_ids, m.attention_mask, m.loss_mask, m.group_index))
        for m in batch.split(micro_batch_size)
    )


def play_batch(config: Any) -> tuple[list[Any], Any]:
    """``config.groups_per_step`` groups of the train split, played on vLLM as the quickstart plays them."""
    from agentrl.build import build_rollout, make_policy, rollout_settings

    policy = make_policy(config.rollout)
    try:
        settings = rollout_settings(config.rollout, env_kwargs={**config.rollout.env_kwargs, "split": "train"})
        engine = build_rollout(settings, policy)
        trajectories = asyncio.run(engine.collect(config.groups_per_step))
        engine.close()
    finally:
        policy.close()
    return trajectories, policy.tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="examples/quickstart.yaml")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--baseline", choices=("padded", "every-row"), default="padded", help="what to compare with")
    parser.add_argument("--equal-groups", type=int, default=0, help="give the first N groups equal rewards")
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
    trajectories = with_equal_rewards(trajectories, args.equal_groups)
    settings = config.trainer_settings()
    trainer = build_trainer(resolve_model(config.rollout.model), settings, tokenizer, dtype=config.rollout.dtype)
    batch = collate(trajectories, trainer.pad_token_id)
    real = int(batch.attention_mask.sum())
    generated = int(batch.loss_mask.sum())
    saved_cost, models.BUCKET_COST = models.BUCKET_COST, 0  # every length its own pass: nothing padded
    unique = planned_tokens(batch, settings.micro_batch_size)  # tokens that exist, a shared prompt once
    models.BUCKET_COST = saved_cost

    trainer.step(trajectories)  # warm-up
    rows: dict[str, list[dict[str, float]]] = {"now": [], args.baseline: []}
    computed: dict[str, int] = {}
    baseline = one_padded_pass if args.baseline == "padded" else every_row
    fractions: dict[str, float] = {}
    for _ in range(args.steps):
        for name in rows:  # alternated, so that both see the same machine
            with baseline(name != "now"):
                computed[name] = planned_tokens(batch, settings.micro_batch_size)
                totals: dict[str, float] = collections.defaultdict(float)
                started = time.perf_counter()
                with phases(trainer, totals):
                    fractions[name] = trainer.step(trajectories)["train/computed_fraction"]
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
    rows_computed = ", ".join(f"{name} {fraction:.0%}" for name, fraction in fractions.items())
    print(f"groups with equal rewards: {args.equal_groups}; rows computed: {rows_computed}")
    print(f"{'phase':<10} {'now s':>10} {'share':>7} {args.baseline + ' s':>11}   (medians of {args.steps} steps each)")
    total = statistics.median(r["total"] for r in rows["now"])
    for name in ("collate", "forward", "backward", "clip", "optimizer", "rest", "total"):
        value, base = (statistics.median(r.get(name, 0.0) for r in rows[k]) for k in ("now", args.baseline))
        print(f"{name:<10} {value:10.2f} {value / total:7.1%} {base:11.2f}")
    slower = statistics.median(r["total"] for r in rows[args.baseline])
    print(f"step: {total:.2f} s now, {slower:.2f} s {args.baseline} ({slower / total:.2f}x)")
    print("costliest operators of one step (self CPU time):")
    print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=40))


if __name__ == "__main__":
    main()
