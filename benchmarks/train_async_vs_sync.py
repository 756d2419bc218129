"""End-to-end training throughput: asynchronous (max_staleness > 0) against synchronous training.

    python benchmarks/train_async_vs_sync.py --quick      # smoke test on the hf backend, about a minute
    python benchmarks/train_async_vs_sync.py              # 10 steps per mode on vLLM, about 3 minutes
    python benchmarks/train_async_vs_sync.py --backend hf

Both runs go through ``agentrl.train.train`` with the same config except ``max_staleness``, one
after the other in this process, on the same hardware: the tiny model built here (no downloads),
an inference backend (``vllm`` by default, the real engine; ``hf`` starts in seconds but generates in
one thread that shares the GIL with the trainer, which bounds it), and a long-tail env. The env (``bench/LongTail-v0``) answers each reply after a heavy-tailed delay
(lognormal, median ``--latency`` seconds, sigma 1.0, at most 20x the median: a slow tool or a
sandbox run) and rewards replies made of the letter ``a`` (so the trainer has something to learn).

**sync** (``max_staleness: 0``): a batch's groups start after the previous update reached the
engine, and a step waits for its slowest episode; nothing is generated while the trainer works.
**async** (``max_staleness: 2``): up to two more batches are in flight while the trainer steps, and
whole groups are trained on in the order they complete, so a straggler waits in the buffer instead
of holding a step back (one that becomes too stale is dropped and counted).

Throughput is trained trajectories per second of wall time between the first and the last step's
metrics (engine start and evaluation excluded on both sides). Target: async at least 2x sync.

**Which episodes are trained on.** A group's episodes share the env seed, hence the env's delay:
each group has one length (its delay, in seconds), known from its number. For each run the script
compares the lengths of the groups *generated* (every group whose fate was decided: trained on or
dropped; groups still running when the run ends are left out) with those *trained on*: mean,
median, 90th percentile and the share of long groups (more than twice the median delay). With
``stragglers: drop`` a long group that finishes after its staleness bound is dropped, so trained
groups come out shorter than generated ones (the bias reported for other frameworks); with
``stragglers: wait`` (the default) a batch waits for a group at the end of its bound, and the two
distributions should agree. Modes: ``--modes sync,async1-drop,async1-wait,async2-drop,async2-wait,tail``.

**tail** is synchronous too (``max_staleness: 0``) with tail batching (RollPacker, ``tail_batching:
true``): a short round starts ``--tail-extra`` more groups than a batch needs, trains on the first
to finish and aborts the others, which a long round replays together once a batch's worth is
queued. Every trained token comes from the weights being trained, as in **sync**. Target: >= 1.8x
sync. With ``--delay group`` (the default) a group's delay follows from its seed, so a replayed
group is as slow as it was; with ``--delay episode`` each episode draws its own delay, as response
lengths drawn by sampling do (RollPacker's setting), and a replay is an ordinary group.
**tail-redundant** also starts ``--redundancy`` more episodes per group and keeps the first
``group_size`` to finish (RollPacker over-provisions responses per prompt as well as prompts);
**sync-redundant** is that alone, without the rounds.

    python benchmarks/train_async_vs_sync.py --modes sync,async1-wait,tail
    python benchmarks/train_async_vs_sync.py --delay episode --groups 8 --modes sync,sync-redundant,tail,tail-redundant,async1-wait
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import agentrl
from agentrl.env import AgentEnv, Feedback
from agentrl.rollout import group_env_seed
from agentrl.types import Message

ENV_ID = "bench/LongTail-v0"


_EPISODES = itertools.count()  # numbers the episodes whose delay is drawn afresh (--delay episode)


class LongTailEnv(AgentEnv):
    """One reply per episode, answered after a heavy-tailed delay; reward = share of 'a' in the reply.

    ``delay="group"``: the delay follows from the env seed, so a group's episodes (and a replay of
    the group) take equally long, as when the task itself is slow. ``"episode"``: each episode
    draws its own, as response lengths do when they come from sampling (RollPacker's long tail)."""

    def __init__(self, split: str = "train", latency: float = 0.3, max_turns: int = 1, delay: str = "group"):
        super().__init__(max_turns=max_turns)
        self.latency = latency
        self.delay = delay

    def start(self, options: dict[str, Any] | None) -> list[Message]:
        return [Message("user", "Say a")]

    def respond(self, reply: Message) -> Feedback:
        rng = self.np_random if self.delay == "group" else np.random.default_rng(10**9 + next(_EPISODES))
        delay = draw_delay(rng, self.latency)
        time.sleep(delay)  # the base class runs respond in a thread pool: other episodes go on
        share = reply.content.count("a") / max(len(reply.content), 1)
        return Feedback([], reward=share, terminated=True, info={"success": share >= 0.5})


def draw_delay(rng: np.random.Generator, latency: float) -> float:
    """The env's one delay per episode, the first draw after reset."""
    return min(float(rng.lognormal(0.0, 1.0)), 20.0) * latency


def group_delay(group: int, seed: int, latency: float) -> float:
    """The delay of every episode of group ``group`` (they reset with the same seed)."""
    return draw_delay(np.random.default_rng(group_env_seed(seed, group)), latency)


def lengths(groups: list[int], seed: int, latency: float) -> dict[str, float]:
    """Mean, median, 90th percentile and long share of the groups' delays."""
    delays = sorted(group_delay(g, seed, latency) for g in groups)
    long = 2 * latency  # the median delay is `latency` (lognormal with mu 0)
    return {
        "n": len(delays),
        "mean": statistics.fmean(delays),
        "p50": delays[len(delays) // 2],
        "p90": delays[int(0.9 * (len(delays) - 1))],
        "long": sum(d > long for d in delays) / len(delays),
    }


MODES = {"sync": (0, "wait"), "async1-drop": (1, "drop"), "async1-wait": (1, "wait"),
         "async2-drop": (2, "drop"), "async2-wait": (2, "wait"), "tail": (0, "wait"),
         "sync-redundant": (0, "wait"), "tail-redundant": (0, "wait")}  # fmt: skip
"""mode: (max_staleness, stragglers); ``tail`` is synchronous with tail batching (RollPacker); the
``-redundant`` modes start ``--redundancy`` more episodes per group and keep the first to finish."""


def run(mode: str, args: argparse.Namespace, model_dir: Path, root: Path) -> dict[str, Any]:
    staleness, stragglers = MODES[mode]
    from agentrl.config import load_config
    from agentrl.metrics import read_metrics
    from agentrl.train import TrainConfig, train

    config = load_config(
        TrainConfig,
        None,
        [
            f"rollout.env_id={ENV_ID}",
            f"rollout.model={model_dir}",
            f"rollout.backend={args.backend}",
            f"rollout.group_size={args.group_size}",
            "rollout.max_tokens=16",
            "rollout.max_length=256",
            "rollout.concurrency=256",
            "trainer.lr=1e-2",
            f"trainer.micro_batch_size={args.group_size * args.groups}",
            f"groups_per_step={args.groups}",
            f"steps={args.steps}",
            f"max_staleness={staleness}",
            f"stragglers={stragglers}",
            f"tail_batching={mode.startswith('tail')}",
            f"rollout.redundancy={args.redundancy if mode.endswith('-redundant') else 0}",
            f"tail_extra={args.tail_extra}",
            "eval_episodes=0",
            "checkpoint_every=0",
            "export=false",
            "torch_threads=1",
            f"run_dir={root / mode}",
        ],
    )
    train(config)
    steps = [m for m in read_metrics(root / mode) if "train/policy_version" in m]
    # The final checkpoint's run state: the groups trained on and the groups lost (dropped).
    saved = json.loads(sorted((root / mode / "checkpoints").iterdir())[-1].joinpath("controller.json").read_text())
    state = {**saved, **saved["lanes"]["default"]}  # the run and its one lane
    generated = state["trained_groups"] + state["lost_groups"] + state["tail_queue"]
    wall = steps[-1]["time"] - steps[0]["time"]
    trained = (len(steps) - 1) * args.groups * args.group_size
    return {
        "steps": len(steps),
        "wall": wall,
        "per_s": trained / wall,
        "train_s": sum(m["perf/time_train"] for m in steps[1:]),
        "stale": steps[-1].get("train/stale_groups", 0.0),
        "dropped": len(state["lost_groups"]),
        "staleness_max": max(m.get("train/staleness_max", 0.0) for m in steps),
        "reward_first": steps[0]["rollout/reward_mean"],
        "reward_last": steps[-1]["rollout/reward_mean"],
        "generated": lengths(generated, 0, args.latency),
        "trained": lengths(state["trained_groups"], 0, args.latency),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 steps of 2 groups: a smoke test")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--groups", type=int, default=4, help="groups per step")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--latency", type=float, default=0.5, help="median env latency in seconds")
    parser.add_argument("--backend", default=None, choices=["hf", "vllm"], help="default: vllm (hf with --quick)")
    parser.add_argument("--modes", default="sync,async2-wait", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--tail-extra", type=float, default=0.5, help="tail mode: extra groups a short round starts")
    parser.add_argument(
        "--delay", default="group", choices=["group", "episode"], help="one delay per group (the task) or per episode"
    )
    parser.add_argument("--redundancy", type=int, default=2, help="-redundant modes: extra episodes per group")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.groups, args.latency = 4, 2, 0.1
    args.backend = args.backend or ("hf" if args.quick else "vllm")

    from agentrl.testing import build_tiny_model

    agentrl.register(
        ENV_ID, entry_point=f"{__name__}:LongTailEnv", kwargs={"latency": args.latency, "delay": args.delay}
    )
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-") as tmp:
        root = Path(tmp)
        model_dir = build_tiny_model(root / "model")
        modes = args.modes.split(",")
        unknown = [m for m in modes if m not in MODES]
        if unknown:
            parser.error(f"unknown modes {unknown}; choose from {', '.join(MODES)}")
        results = {mode: run(mode, args, model_dir, root) for mode in modes}

    print(
        f"\n{args.steps} steps x {args.groups} groups x {args.group_size} episodes, env latency lognormal "
        f"median {args.latency}s sigma 1.0, one delay per {args.delay}, backend {args.backend}, tiny model"
    )
    print(
        f"{'mode':<13}{'wall s':>8}{'traj/s':>8}{'train s':>9}{'stale groups':>13}{'max staleness':>14}{'reward first→last':>20}"
    )
    for mode, r in results.items():
        print(
            f"{mode:<13}{r['wall']:>8.1f}{r['per_s']:>8.2f}{r['train_s']:>9.1f}{r['stale']:>13.0f}"
            f"{r['staleness_max']:>14.0f}{r['reward_first']:>11.3f} → {r['reward_last']:.3f}"
        )
    if args.delay == "group":  # a group's length is known from its number only when the task sets it
        print("\ngroup length (env delay, s): generated vs trained")
        print(f"{'mode':<13}{'groups gen/trained':>20}{'mean':>14}{'median':>14}{'p90':>14}{'long share':>16}")
    for mode, r in results.items() if args.delay == "group" else ():
        g, t = r["generated"], r["trained"]
        print(
            f"{mode:<13}{g['n']:>11}/{t['n']:<8}{g['mean']:>7.2f}/{t['mean']:<6.2f}{g['p50']:>7.2f}/{t['p50']:<6.2f}"
            f"{g['p90']:>7.2f}/{t['p90']:<6.2f}{g['long']:>8.0%}/{t['long']:<7.0%}"
        )
    if "sync" in results:
        for mode in (m for m in results if m != "sync"):
            ratio = results[mode]["per_s"] / results["sync"]["per_s"]
            # tail batching: RollPacker's target; async: the async loop's; sync-redundant: none
            target = 1.8 if mode.startswith("tail") else 2.0 if mode.startswith("async") else None
            verdict = "" if target is None else f" (target >= {target:g}x: {'met' if ratio >= target else 'MISSED'})"
            print(f"{mode} / sync: {ratio:.2f}x{verdict}")


if __name__ == "__main__":
    main()
