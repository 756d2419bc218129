"""The rollout's orchestration at scale, by simulation: Ray env workers and a simulated engine.

    python benchmarks/scale_sim.py            # 16, 1000, 4000 and 10000 episodes in flight, 8 env workers
    python benchmarks/scale_sim.py --quick    # 16 and 256 in flight, 2 env workers (the test suite's)

What a large run's rollout costs per turn, without the model: ``--workers`` env workers
(:class:`~agentrl.rollout.ray.EnvWorker`, Ray actors running agentrl's own rollout, as ``agentrl
train`` places them) play episodes of an instant env of ``--turns`` replies; every reply comes from
one :class:`~agentrl.policies.ray_actor.PolicyActor` hosting a simulated engine that answers each
request after ``--token-ms`` per generated token (``asyncio.sleep``: requests overlap, as a batching
engine's do), with precomputed token ids. Everything else is the real machinery: Ray's actor calls,
the workers' episode loops, chat templates and tokenisation, the controller
(:class:`~agentrl.rollout.ray.DistributedRollout`) streaming every finished episode back.

For each number of episodes in flight N (the rollout's concurrency, split over the workers), about
``--waves`` x N episodes (at least ``--min-episodes``) are played after a warm-up of one group per
worker, and the table prints, per turn (a reply and its step):

- **wall µs/turn**: wall time / turns (the ideal with infinite cores is ``turns x token latency``
  per episode over N at once);
- **controller CPU µs/turn**: the driver process's CPU (``DistributedRollout`` streaming the
  episodes) / turns;
- **workers CPU µs/turn**: the env workers' and the policy actor's CPU (``psutil``, their processes)
  / turns: the orchestration's own cost per turn, which is what should stay flat;
- the ratio of each to the 16-in-flight row (target: within 2x at 10k, issue 37).

All processes share this machine's cores (the Ray cluster is a local one with ``--workers`` + 2
logical CPUs), so wall time at large N is CPU-bound here; the CPU-per-turn columns are the figures
that transfer to a cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from agentrl import AgentEnv, Feedback, Message
from agentrl.env import ResetResult, StepResult
from agentrl.policies import Generation, Sampling
from agentrl.registry import register

ENV_ID = "bench/ScaleSim-v0"
TARGET = 2.0


class InstantEnv(AgentEnv):
    """Asks for ``turns`` replies, answering each at once ("Again."), then ends with reward 1."""

    def __init__(self, turns: int = 4, split: str = "train"):
        super().__init__()
        self.turns, self.split = turns, split

    def start(self, options: dict[str, Any] | None) -> list[Message]:
        return [Message("user", "Say ok.")]

    def respond(self, reply: Message) -> Feedback:
        done = self.turn >= self.turns
        return Feedback([Message("user", "Done." if done else "Again.")], float(done), done)

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        return self.reset(seed=seed, options=options)

    async def astep(self, action: Any) -> StepResult:
        return self.step(action)


class SimulatedEngine:
    """A :class:`~agentrl.policies.Policy` that answers every request after ``token_ms`` per token of
    its precomputed reply; requests overlap (an engine batching them all)."""

    def __init__(self, reply_ids: Sequence[int], token_ms: float):
        self.reply_ids, self.token_ms = list(reply_ids), token_ms
        self.logprobs = [-1.0] * len(self.reply_ids)
        self.version = 0

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        await asyncio.sleep(self.token_ms * len(self.reply_ids) / 1000)
        return Generation(self.reply_ids, self.logprobs, self.version, "stop")

    def update_weights(self, named_tensors: Any) -> int:
        return self.version

    def close(self) -> None:
        pass


register(ENV_ID, InstantEnv)


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (gone processes count 0)."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def run(in_flight: int, args: argparse.Namespace, policy: Any, tokenizer_dir: str) -> dict[str, float]:
    """Play about ``args.waves`` x ``in_flight`` episodes with ``in_flight`` at once; the per-turn figures."""
    import ray  # noqa: PLC0415

    from agentrl.rollout import EpisodeLimits, RolloutSettings  # noqa: PLC0415
    from agentrl.rollout.ray import DistributedRollout  # noqa: PLC0415

    per_worker = math.ceil(in_flight / args.workers)
    settings = RolloutSettings(
        ENV_ID,
        env_kwargs={"turns": args.turns},
        group_size=args.group,
        concurrency=per_worker,
        limits=EpisodeLimits(max_turns=args.turns + 1),
        sampling=Sampling(max_tokens=8),
    )
    episodes = max(args.min_episodes, args.waves * args.workers * per_worker)
    groups = max(args.workers, math.ceil(episodes / args.group))
    with DistributedRollout(
        policy, tokenizer_dir, settings, num_workers=args.workers, imports=["scale_sim"]
    ) as rollout:
        asyncio.run(rollout.collect(args.workers))  # warm-up: workers built, templates and actors warm
        actors = [w.handle for w in rollout.workers] + [policy]
        pids = [location.pid for location in ray.get([actor.location.remote() for actor in actors])]
        workers_before, driver_before = cpu_seconds(pids), time.process_time()
        started = time.perf_counter()
        trajectories = asyncio.run(rollout.collect(groups))
        wall = time.perf_counter() - started
        driver, workers = time.process_time() - driver_before, cpu_seconds(pids) - workers_before
    failed = [t.error for t in trajectories if t.error]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(trajectories)} episodes failed, e.g. {failed[0]}")
    turns = sum(t.turns for t in trajectories)
    return {
        "episodes": len(trajectories),
        "turns": turns,
        "wall_us": wall / turns * 1e6,
        "driver_us": driver / turns * 1e6,
        "workers_us": workers / turns * 1e6,
        "seconds": wall,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", default="16,1000,4000,10000", help="episodes in flight, comma-separated")
    parser.add_argument("--workers", type=int, default=8, help="env workers (Ray actors)")
    parser.add_argument("--turns", type=int, default=4, help="replies per episode")
    parser.add_argument("--group", type=int, default=8, help="episodes per group")
    parser.add_argument("--waves", type=float, default=2.0, help="episodes played per episode slot")
    parser.add_argument("--token-ms", type=float, default=2.0, help="the simulated engine's latency per token")
    parser.add_argument("--min-episodes", type=int, default=512, help="the fewest episodes a row plays")
    parser.add_argument("--quick", action="store_true", help="16 and 256 in flight on 2 workers")
    args = parser.parse_args(argv)
    if args.quick:
        args.in_flight, args.workers, args.waves, args.min_episodes = "16,256", 2, 1.0, 64
    counts = [int(n) for n in args.in_flight.split(",")]

    import ray  # noqa: PLC0415

    from agentrl.policies.ray_actor import PolicyActor  # noqa: PLC0415
    from agentrl.testing import build_tiny_model, build_tiny_tokenizer  # noqa: PLC0415

    here = str(Path(__file__).resolve().parent)
    ray.init(address="local", num_cpus=args.workers + 2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}})  # fmt: skip
    try:
        with tempfile.TemporaryDirectory(prefix="scale-sim-") as tokenizer_dir:
            build_tiny_model(Path(tokenizer_dir), layers=1, hidden=64)  # its config and tokenizer: what workers load
            tokenizer = build_tiny_tokenizer()
            reply = tokenizer.encode("ok", add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
            engine = functools.partial(SimulatedEngine, reply, args.token_ms)
            policy = PolicyActor.options(num_cpus=1, max_concurrency=max(counts) + 1000).remote(engine)
            print(f"\nscale simulation: {args.workers} env workers and one simulated engine ({args.token_ms:g} ms per "
                  f"token, {len(reply)} tokens per reply) on a local Ray; {args.turns} turns per episode; "
                  f"{os.cpu_count()} cores", flush=True)  # fmt: skip
            print(f"{'in flight':>10}{'episodes':>10}{'turns':>9}{'seconds':>9}{'wall µs/turn':>14}"
                  f"{'controller CPU':>16}{'workers CPU':>13}{'ratio ctl':>11}{'ratio wkr':>11}", flush=True)  # fmt: skip
            rows: dict[int, dict[str, float]] = {}
            for n in counts:  # each row as it is measured
                row = rows[n] = run(n, args, policy, tokenizer_dir)
                base = rows[counts[0]]
                print(f"{n:>10}{row['episodes']:>10.0f}{row['turns']:>9.0f}{row['seconds']:>9.1f}{row['wall_us']:>14.1f}"
                      f"{row['driver_us']:>16.1f}{row['workers_us']:>13.1f}{row['driver_us'] / base['driver_us']:>10.2f}x"
                      f"{row['workers_us'] / base['workers_us']:>10.2f}x", flush=True)  # fmt: skip
    finally:
        ray.shutdown()

    base = rows[counts[0]]
    last = rows[counts[-1]]
    worst = max(last["driver_us"] / base["driver_us"], last["workers_us"] / base["workers_us"])
    verdict = "met" if worst <= TARGET else "MISSED"
    print(f"at {counts[-1]} in flight: CPU per turn within {worst:.2f}x of {counts[0]} in flight "
          f"(target <= {TARGET}x: {verdict})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
