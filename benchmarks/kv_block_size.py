"""The main job's rollouts on vLLM at two KV-cache block sizes, alternated, each in a fresh engine.

    python benchmarks/kv_block_size.py                          # 128 against 32 tokens, 4 groups, 2 rounds
    python benchmarks/kv_block_size.py --sizes 128,64,32 --groups 8 --rounds 3

vLLM's prefix cache reuses whole KV blocks only, so the block size decides how much of a multi-turn
conversation (and of a GRPO group's shared prompt) a later request finds already computed. Each
round plays ``--groups`` groups of the train split with the settings of ``--config`` (sampling,
limits, group size) once per block size, in a child process of its own (a fresh engine, started
before the clock starts), and prints the seconds and tokens/s: generated tokens and all tokens (the
lengths differ between runs: the engine's seeded sampler draws differently in each). On the CPU,
``VLLMPolicy`` uses 32 (``agentrl.policies.vllm``); this is how that was chosen (issue 17).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time


def play(config_path: str, block_size: int, groups: int) -> dict[str, float]:
    """``groups`` groups played on a new engine with ``block_size``-token blocks; seconds and token counts."""
    from agentrl.build import build_rollout, model_path, policy_options, rollout_settings
    from agentrl.config import load_config
    from agentrl.policies.vllm import VLLMPolicy
    from agentrl.train import TrainConfig

    config = load_config(TrainConfig, config_path, [])
    policy = VLLMPolicy(model_path(config.rollout), **policy_options(config.rollout), block_size=block_size)
    try:
        engine = build_rollout(rollout_settings(config.rollout, env_kwargs={"split": "train"}), policy)
        asyncio.run(engine.collect(1))  # first-call costs out of the timing
        started = time.perf_counter()
        trajectories = asyncio.run(engine.collect(groups))
        seconds = time.perf_counter() - started
        engine.close()
    finally:
        policy.close()
    return {
        "seconds": seconds,
        "episodes": len(trajectories),
        "generated": sum(t.num_generated for t in trajectories),
        "tokens": sum(len(t.token_ids) for t in trajectories),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="examples/quickstart.yaml")
    parser.add_argument("--sizes", default="128,32", help="block sizes, comma-separated (multiples of 32 on the CPU)")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)  # one size, in a fresh process
    args = parser.parse_args()
    if args.child:
        print(json.dumps(play(args.config, args.child, args.groups)))
        return
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    print(f"{'round':<7}{'block':>6}{'episodes':>10}{'seconds':>9}{'generated':>11}{'gen tok/s':>11}{'all tok/s':>11}")
    for round_ in range(1, args.rounds + 1):
        for size in (int(s) for s in args.sizes.split(",")):
            command = [sys.executable, __file__, "--config", args.config, "--groups", str(args.groups)]
            child = subprocess.run([*command, "--child", str(size)], capture_output=True, text=True, check=True)
            run = json.loads(child.stdout.strip().splitlines()[-1])
            print(
                f"{round_:<7}{size:>6}{run['episodes']:>10}{run['seconds']:>9.2f}{run['generated']:>11}"
                f"{run['generated'] / run['seconds']:>11.1f}{run['tokens'] / run['seconds']:>11.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
