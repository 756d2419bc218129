"""JEPO against supervised fine-tuning and against RL on a soft-match reward, on answers that cannot be verified.

    python benchmarks/jepo_vs_sft.py                      # the three methods and the untrained model, about 40 minutes here
    python benchmarks/jepo_vs_sft.py --methods jepo,sft --steps 4
    python benchmarks/jepo_vs_sft.py --quick              # smoke test: 1 step each, 4 held-out prompts

The task is ``agentrl/Explain-v0``: word problems whose reference answers are explanations of two
or three sentences. Each method trains SmolLM2-135M-Instruct (the default model) for the same
number of steps on the same training prompts, with the same optimizer settings
(``examples/explain.yaml``'s trainer: lr 3e-5, the top 8 layers), one process after the other:

- ``jepo``: ``agentrl train examples/explain.yaml`` (4 prompts a step, 4 chains of thought each;
  the reward is the log-likelihood of the reference after each, the multi-sample bound);
- ``sft``: the same trainer on the references themselves, each straight after the question (4 a
  step; ``reference_trajectory`` and the supervised term alone);
- ``soft_match``: ``agentrl train examples/explain.yaml trainer.algorithm=grpo
  rollout.env_kwargs.reward=soft_match`` (the model answers straight away; reward ROUGE-L F1
  against the reference).

Then every model, and the untrained one, is measured the same way on held-out prompts (the test
split, seeds as ``agentrl train``'s evaluations), each in a process of its own:

- ``after CoT``: negative log-likelihood per token of the reference after the model's own chain
  of thought (``--samples`` of them per prompt, temperature 1): ``-E_z log pi(y*|x,z)``, the
  single-sample bound JEPO climbs, and ``bound``, the multi-sample one ``-log mean_z pi(y*|x,z)``;
- ``direct``: the same straight after the question (``-log pi(y*|x)``), what SFT trains;
- ``rouge_l``: ROUGE-L F1 of an answer the model writes straight away (one per prompt, temperature
  1), what soft-match RL trains.

Lower NLL is better. With ``--prompts 32`` each NLL averages about 1,600 reference tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "explain.yaml"
ENV_ID = "agentrl/Explain-v0"


def train_rl(method: str, steps: int, run_dir: Path) -> dict[str, Any]:
    """``agentrl train examples/explain.yaml`` with JEPO or soft-match GRPO; the model is exported."""
    from agentrl.metrics import read_metrics
    from agentrl.testing import train_in_subprocess

    overrides = [f"steps={steps}", "eval_episodes=0"]
    if method == "soft_match":
        overrides += ["trainer.algorithm=grpo", "rollout.env_kwargs.reward=soft_match"]
    wall = train_in_subprocess(CONFIG, overrides, run_dir, export=True)
    steps = [m for m in read_metrics(run_dir) if "perf/time_step" in m]
    train_s = sum(m["perf/time_step"] for m in steps)  # the steps alone, as SFT's figure
    return {"method": method, "train_s": train_s, "wall_s": wall, "model": str(run_dir / "model")}


def train_sft(steps: int, out: Path) -> dict[str, Any]:
    """Supervised fine-tuning on the references of the RL runs' training prompts (in this process)."""
    import torch

    import agentrl
    from agentrl.agents import ChatAgent, reference_trajectory
    from agentrl.build import build_trainer, load_tokenizer
    from agentrl.config import load_config
    from agentrl.model_paths import resolve_model
    from agentrl.rollout.scheduler import group_env_seed
    from agentrl.train import TrainConfig
    from agentrl.trainers.models import save_pretrained

    config = load_config(TrainConfig, str(CONFIG), [f"steps={steps}"])
    torch.set_num_threads(config.torch_threads)
    torch.manual_seed(config.trainer.seed)
    path = resolve_model(config.rollout.model)
    tokenizer = load_tokenizer(config.rollout.model)
    settings = config.trainer_settings()
    trainer = build_trainer(path, settings, tokenizer, dtype=config.rollout.dtype)
    env = agentrl.make(ENV_ID, split="train")
    agent = ChatAgent(tokenizer)
    started = time.perf_counter()
    losses = []
    for step in range(steps):
        examples = []
        for group in range(step * config.groups_per_step, (step + 1) * config.groups_per_step):
            env.reset(seed=group_env_seed(config.rollout.seed, group))  # the RL runs' prompt for this group
            examples.append(
                reference_trajectory(agent, env.unwrapped.direct_prompt(), env.unwrapped.reference, group_id=str(group))
            )
        losses.append(trainer.step(examples)["train/reference_loss"])
    wall = time.perf_counter() - started
    save_pretrained(trainer.model, tokenizer, out)
    return {"method": "sft", "train_s": wall, "model": str(out), "losses": losses}


def evaluate(model: str, prompts: int, samples: int) -> dict[str, Any]:
    """The three held-out measures of one model (see the module docstring)."""
    import agentrl
    from agentrl.agents import ChatAgent, reference_trajectory
    from agentrl.build import build_rollout, load_tokenizer, make_policy
    from agentrl.config import EngineConfig, load_config
    from agentrl.model_paths import resolve_model
    from agentrl.policies.base import Sampling
    from agentrl.rollout import RolloutSettings
    from agentrl.rollout.scheduler import group_env_seed
    from agentrl.train import EVAL_SEED_OFFSET, TrainConfig
    from agentrl.trainers.models import load_reference_model, pad_token_id, score_references

    rollout = load_config(TrainConfig, str(CONFIG), []).rollout
    seed = EVAL_SEED_OFFSET + rollout.seed
    policy = make_policy(EngineConfig(model=model, backend="vllm", dtype=rollout.dtype))
    try:
        engines = {
            reward: build_rollout(
                RolloutSettings(
                    ENV_ID,
                    env_kwargs={"split": "test", "reward": reward},
                    sampling=Sampling(max_tokens=rollout.max_tokens, temperature=1.0, seed=seed),
                    group_size=group_size,
                    seed=seed,
                ),
                policy,
            )
            for reward, group_size in (("likelihood", samples), ("soft_match", 1))
        }
        played = {reward: asyncio.run(engine.collect(prompts)) for reward, engine in engines.items()}
    finally:
        policy.close()
    path = resolve_model(model)
    tokenizer = load_tokenizer(path)
    scorer = load_reference_model(path)
    after = score_references(scorer, played["likelihood"], pad_token_id(tokenizer))
    env, agent = agentrl.make(ENV_ID, split="test"), ChatAgent(tokenizer)
    direct = []
    for group in range(prompts):
        env.reset(seed=group_env_seed(seed, group))
        direct.append(
            reference_trajectory(agent, env.unwrapped.direct_prompt(), env.unwrapped.reference, group_id=str(group))
        )
    straight = score_references(scorer, direct, pad_token_id(tokenizer))
    assert after is not None and straight is not None
    answers = [t for t in played["soft_match"] if not t.error]
    return {
        "after_cot_nll": after.nll,
        "after_cot_bound_nll": after.bound_nll,
        "direct_nll": straight.nll,
        "rouge_l": sum(t.reward for t in answers) / max(len(answers), 1),
        "scored": after.trajectories,
    }


def in_subprocess(*args: str) -> dict[str, Any]:
    """This script with ``args`` in a process of its own; its last printed line, as JSON."""
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="jepo,sft,soft_match")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=32, help="held-out prompts")
    parser.add_argument("--samples", type=int, default=4, help="chains of thought per held-out prompt")
    parser.add_argument("--quick", action="store_true", help="1 step each, 4 held-out prompts x 2 samples")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--evaluate", metavar="MODEL", help=argparse.SUPPRESS)  # one model, then exit
    parser.add_argument("--sft", metavar="OUT", help=argparse.SUPPRESS)  # train SFT into OUT, then exit
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.prompts, args.samples = 1, 4, 2
    if args.evaluate:
        print(json.dumps(evaluate(args.evaluate, args.prompts, args.samples)), flush=True)
        return
    if args.sft:
        print(json.dumps(train_sft(args.steps, Path(args.sft))), flush=True)
        return
    measure = ["--prompts", str(args.prompts), "--samples", str(args.samples)]
    results = []
    with tempfile.TemporaryDirectory(prefix="agentrl-jepo-") as tmp:
        base = {"method": "untrained", "train_s": 0.0, "model": "default"}
        base.update(in_subprocess("--evaluate", "default", *measure))
        print(json.dumps(base), flush=True)
        results.append(base)
        for method in args.methods.split(","):
            if method == "sft":
                trained = in_subprocess("--sft", str(Path(tmp) / "sft"), "--steps", str(args.steps))
            else:
                trained = train_rl(method, args.steps, Path(tmp) / method)
            trained.update(in_subprocess("--evaluate", trained["model"], *measure))
            del trained["model"]
            print(json.dumps(trained), flush=True)
            results.append(trained)
    print(
        f"\n{args.steps} steps; {args.prompts} held-out prompts ({args.samples} chains of thought each); NLL per token"
    )
    print(f"{'method':<11} {'after CoT':>10} {'bound':>8} {'direct':>8} {'ROUGE-L':>8} {'train s':>8}")
    for r in results:
        print(
            f"{r['method']:<11} {r['after_cot_nll']:>10.4f} {r['after_cot_bound_nll']:>8.4f} {r['direct_nll']:>8.4f} "
            f"{r['rouge_l']:>8.3f} {r['train_s']:>8.0f}"
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
