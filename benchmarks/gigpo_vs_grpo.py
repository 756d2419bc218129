"""GiGPO's turn-level credit against GRPO's episode-level credit on a multi-turn walk with repeated states.

    python benchmarks/gigpo_vs_grpo.py                      # both on examples/hallway.yaml, about 20 minutes
    python benchmarks/gigpo_vs_grpo.py --steps 12 --eval-every 4
    python benchmarks/gigpo_vs_grpo.py --quick              # smoke test: 1 step each, 8 eval episodes

Each run is ``agentrl train examples/hallway.yaml`` (SmolLM2 on vLLM, ``agentrl/Hallway-v0``: walk
to the exit room, 8 moves at most, reward 1 at the exit) in its own process, one after the other on
the same machine, with only ``trainer.algorithm`` changed (``gigpo`` with the example's ``gamma``
0.9 and ``step_weight`` 1, or ``grpo``); seeds, prompts and learning rate are the same. Held-out
success (64 episodes of the test split) is measured every ``--eval-every`` steps.

Printed per run: held-out success at each evaluation with the training minutes before it
(wall time from the first evaluation's end, other evaluations taken out), the training episodes'
success and mean moves per step, and the whole command's wall time. One seed per run: over 64
episodes a held-out figure's 95% interval is about +-10 points.
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


def train(algorithm: str, run_dir: Path, extra: list[str]) -> dict[str, Any]:
    """One ``agentrl train`` of the hallway example; its learning curve."""
    wall = train_in_subprocess(CONFIG, [f"trainer.algorithm={algorithm}", *extra], run_dir)
    steps = [m for m in read_metrics(run_dir) if "rollout/success_rate" in m and m["step"] > 0]
    return {
        "algorithm": algorithm,
        "eval": eval_curve(run_dir),
        "train_success": [round(m["rollout/success_rate"], 3) for m in steps],
        "train_moves": [round(m["rollout/turns_mean"], 2) for m in steps],
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", default="grpo,gigpo")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="1 step each, 8 eval episodes")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    extra = [f"steps={args.steps}", f"eval_every={args.eval_every}"]
    if args.quick:
        extra = ["steps=1", "eval_every=0", "eval_episodes=8"]
    results = []
    with tempfile.TemporaryDirectory(prefix="agentrl-gigpo-") as tmp:
        for algorithm in args.algorithms.split(","):
            result = train(algorithm, Path(tmp) / algorithm, extra)
            results.append(result)
            print(json.dumps(result), flush=True)
    print(f"\n{'algorithm':>9}  held-out success at step (training minutes)")
    for r in results:
        points = "  ".join(f"{e['step']:.0f}: {e['success']:.1%} ({e['minutes']:.1f})" for e in r["eval"])
        print(f"{r['algorithm']:>9}  {points}   [wall {r['wall_s'] / 60:.1f} min]")
    print(f"\n{'algorithm':>9}  training success per step / mean moves per step")
    for r in results:
        print(f"{r['algorithm']:>9}  {r['train_success']}  {r['train_moves']}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
