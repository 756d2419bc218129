"""Which prompts to train on: uniform sampling, PCL's value model, and rollout-based filtering.

    python benchmarks/prompt_selection.py                         # three runs on examples/hallway.yaml, about 30 minutes
    python benchmarks/prompt_selection.py --selections uniform,pcl --steps 12
    python benchmarks/prompt_selection.py --config examples/quickstart.yaml --eval-every 0   # the main job's task
    python benchmarks/prompt_selection.py --quick                 # smoke test: 1 step of 1 group, 8 eval episodes
    python benchmarks/prompt_selection.py --quick --set rollout.model=DIR --set trainer.trainable_layers=1

Each run is ``agentrl train examples/hallway.yaml trainer.algorithm=grpo`` (SmolLM2 on vLLM,
``agentrl/Hallway-v0``, whose exits lie 1 to 6 rooms away: prompts of varied difficulty) in its own
process, one after the other on the same machine, with only ``curriculum.selection`` changed:

- ``uniform``: the next seeds in order (what every other run does);
- ``pcl``: Prompt Curriculum Learning; a value model (a copy of the policy with a scalar head)
  scores ``curriculum.pool`` candidate prompts per group and the groups predicted closest to 0.5
  success are played; it is regressed on each batch's group success rates after the step;
- ``filter``: DAPO's dynamic sampling; groups are played, those whose rewards are all equal are
  dropped (GRPO gets no signal from them) and others played in their place.

Printed per run: the effective ratio (share of trained groups with unequal rewards, mean over
steps), the selection's cost (PCL: seconds spent scoring and updating the value model; filter:
groups played and thrown away, and their episodes), held-out success (64 episodes of the test
split) at each evaluation with the training minutes before it, and the command's wall time. One
seed per run: over 64 episodes a held-out figure's 95% interval is about +-10 points.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from agentrl.metrics import eval_curve, read_metrics
from agentrl.testing import train_in_subprocess

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "hallway.yaml"
GROUP_SIZE = 8  # rollout.group_size of examples/hallway.yaml and examples/quickstart.yaml


def train(config: Path, selection: str, run_dir: Path, extra: list[str]) -> dict[str, Any]:
    """One ``agentrl train`` of ``config`` with GRPO and this prompt selection."""
    overrides = ["trainer.algorithm=grpo", f"curriculum.selection={selection}", *extra]
    wall = train_in_subprocess(config, overrides, run_dir)
    steps = [m for m in read_metrics(run_dir) if "train/effective_group_fraction" in m]
    filtered = sum(m.get("train/filtered_groups", 0.0) for m in steps)
    return {
        "selection": selection,
        "effective_ratio": sum(m["train/effective_group_fraction"] for m in steps) / len(steps),
        "select_seconds": sum(m.get("perf/time_select", 0.0) for m in steps),
        "filtered_groups": filtered,
        "filtered_episodes": filtered * GROUP_SIZE,
        "train_success": [round(m["rollout/success_rate"], 3) for m in steps],
        "eval": eval_curve(run_dir),
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--config", type=Path, default=CONFIG, help="the training config (default: the hallway example)"
    )
    parser.add_argument("--selections", default="uniform,pcl,filter")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--pcl-lr", type=float, default=1e-4, help="the value model's learning rate")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config override for every run (repeatable)"
    )
    parser.add_argument("--quick", action="store_true", help="1 step of 1 group each, 8 eval episodes, 4 turns")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    extra = [f"steps={args.steps}", f"eval_every={args.eval_every}", f"curriculum.lr={args.pcl_lr}"]
    if args.quick:
        extra = ["steps=1", "eval_every=0", "eval_episodes=8", "groups_per_step=1", "rollout.max_turns=4"]
        extra.append(f"curriculum.lr={args.pcl_lr}")
    extra += args.set
    results = []
    with tempfile.TemporaryDirectory(prefix="agentrl-selection-") as tmp:
        for selection in args.selections.split(","):
            result = train(args.config, selection, Path(tmp) / selection, extra)
            results.append(result)
            print(json.dumps(result), flush=True)
    print(
        f"\n{'selection':>9} {'effective':>9} {'select s':>8} {'filtered':>8}  held-out success at step (training minutes)"
    )
    for r in results:
        points = "  ".join(f"{e['step']:.0f}: {e['success']:.1%} ({e['minutes']:.1f})" for e in r["eval"])
        print(
            f"{r['selection']:>9} {r['effective_ratio']:>9.2f} {r['select_seconds']:>8.1f} "
            f"{r['filtered_groups']:>8.0f}  {points}   [wall {r['wall_s'] / 60:.1f} min]"
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
