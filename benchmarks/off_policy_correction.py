"""Learning with and without the off-policy correction when generation runs ahead of training.

    python benchmarks/off_policy_correction.py                        # 6 runs of the quickstart, about 45 minutes
    python benchmarks/off_policy_correction.py --runs 1:none,1:auto   # chosen runs, STALENESS:CORRECTION
    python benchmarks/off_policy_correction.py --quick                # smoke test: 2 steps each of 1:none, 1:auto

Each run is ``agentrl train examples/quickstart.yaml`` (the main job: SmolLM2 on vLLM, 8 steps,
64 held-out episodes before and after) in its own process, one after the other on the same
machine, with only ``max_staleness`` and ``trainer.correction`` changed; everything else (seeds,
prompts, learning rate) is the quickstart's. At ``max_staleness`` k a batch may hold tokens sampled
by policy versions up to k behind the weights being trained; ``none`` trains them as if they were
on-policy, ``tis`` multiplies each token's loss by ``min(exp(trainer - engine log-prob), is_cap)``,
``decoupled`` (AReaL) drops tokens whose weight exceeds the cap, and ``auto`` (the default) applies
``trainers.trainer.STALE_CORRECTION`` to batches with stale tokens.

Printed per run: held-out success before and after, the mean training reward of the last 4 steps,
the share of stale trained tokens, the policy-lag and engine log-prob gaps, the share of capped
weights and the wall time. One seed per run: the held-out figure's 95% interval over 64 episodes
is about +-10 points, so read differences below that as noise.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path
from typing import Any

from agentrl.metrics import eval_curve, read_metrics
from agentrl.testing import train_in_subprocess

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "quickstart.yaml"
DEFAULT_RUNS = "1:none,1:tis,1:decoupled,2:none,2:tis,2:decoupled"


def train(staleness: int, correction: str, run_dir: Path, extra: list[str]) -> dict[str, Any]:
    """One ``agentrl train`` of the quickstart; its metrics, summarised."""
    wall = train_in_subprocess(
        CONFIG, [f"max_staleness={staleness}", f"trainer.correction={correction}", *extra], run_dir
    )
    curve = eval_curve(run_dir)
    steps = [m for m in read_metrics(run_dir) if "train/reward_mean" in m]

    def mean(key: str, rows: list[dict[str, Any]]) -> float:
        values = [r[key] for r in rows if r.get(key) is not None]
        return sum(values) / len(values) if values else math.nan

    return {
        "staleness": staleness,
        "correction": correction,
        "success_before": curve[0]["success"],
        "success_after": curve[-1]["success"],
        "reward_last4": mean("train/reward_mean", steps[-4:]),
        "stale_tokens": mean("train/stale_token_fraction", steps),
        "lag_gap": mean("train/policy_lag_logprob_gap", steps),
        "engine_gap": mean("train/engine_logprob_gap", steps),
        "capped": mean("train/is_capped_fraction", steps),
        "corrected_steps": sum(r.get("train/corrected", 0.0) for r in steps),
        "steps": len(steps),
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default=DEFAULT_RUNS, help="comma-separated STALENESS:CORRECTION pairs")
    parser.add_argument("--quick", action="store_true", help="2 steps, 8 eval episodes, runs 1:none,1:auto")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    runs = "1:none,1:auto" if args.quick else args.runs
    extra = ["steps=2", "eval_episodes=8"] if args.quick else []
    results = []
    with tempfile.TemporaryDirectory(prefix="agentrl-offpolicy-") as tmp:
        for spec in runs.split(","):
            staleness, correction = spec.split(":")
            result = train(int(staleness), correction, Path(tmp) / spec.replace(":", "-"), extra)
            results.append(result)
            print(json.dumps(result), flush=True)
    header = (
        f"{'staleness':>9} {'correction':>10} {'success':>15} {'reward(last4)':>13} {'stale tok':>9} "
        f"{'lag gap':>8} {'engine gap':>10} {'capped':>7} {'wall s':>7}"
    )
    print("\n" + header)
    for r in results:
        print(
            f"{r['staleness']:>9} {r['correction']:>10} "
            f"{r['success_before']:>6.1%} -> {r['success_after']:>5.1%} {r['reward_last4']:>13.3f} "
            f"{r['stale_tokens']:>9.2f} {r['lag_gap']:>8.4f} {r['engine_gap']:>10.2e} {r['capped']:>7.4f} "
            f"{r['wall_s']:>7.0f}"
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
