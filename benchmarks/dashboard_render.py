"""How long the dashboard takes to draw a long run, in a real headless Chromium.

    python benchmarks/dashboard_render.py --quick    # 500 steps, a few seconds
    python benchmarks/dashboard_render.py            # 10,000 steps of 32 metrics, and 1,000 for comparison

A synthetic run directory gets ``metrics.jsonl`` with ``--steps`` records of ``--metrics`` metrics
each (the names of a real run: rollout/, train/, eval/ every 100 steps, perf/), written before the
page opens. Debian's ``chromium`` (driven by selenium through ``chromium-driver``) opens the page,
and the figures are, from navigation start: the page ready (every metric fetched and every chart
drawn: ``document.body.dataset.ready``), and the time to add 100 more steps live (the records
appended to the file, until the last chart holds them). Printed side by side for each size.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

from agentrl.dashboard import make_dashboard
from agentrl.server import ServerThread
from agentrl.testing import headless_chromium

SECTIONS = ("rollout", "train", "perf")


def write_metrics(path: Path, steps: range, metrics: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    names = [f"{SECTIONS[i % len(SECTIONS)]}/metric_{i:02d}" for i in range(metrics - 2)]
    with path.open("a") as f:
        for step in steps:
            record = {"step": step, **{n: math.sin(step / 50 + i) + rng.random() * 0.1 for i, n in enumerate(names)}}
            if step % 100 == 0:
                record["eval/success_rate"], record["eval/reward_mean"] = rng.random(), rng.random()
            f.write(json.dumps(record) + "\n")


def wait(driver, script: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not driver.execute_script(script):
        if time.monotonic() > deadline:
            raise TimeoutError(script)
        time.sleep(0.02)


def measure(steps: int, metrics: int) -> tuple[float, float, int]:
    """Seconds to ready, seconds to show 100 more steps live, charts drawn."""
    with tempfile.TemporaryDirectory() as folder:
        run = Path(folder) / "run"
        run.mkdir()
        write_metrics(run / "metrics.jsonl", range(1, steps + 1), metrics)
        driver = headless_chromium()
        try:
            with ServerThread(make_dashboard([run])) as url:
                driver.get(url + "/")
                wait(driver, "return document.body.dataset.ready")
                ready = driver.execute_script("return (performance.now()) / 1000")
                charts = driver.execute_script("return document.querySelectorAll('[data-metric]').length")
                last = "document.querySelector('[data-metric=\"perf/metric_29\"]') || document.querySelector('[data-metric]')"
                t0 = time.perf_counter()
                write_metrics(run / "metrics.jsonl", range(steps + 1, steps + 101), metrics, seed=1)
                wait(driver, f"return ({last}).data[0].x.length >= {steps + 100}")
                live = time.perf_counter() - t0
        finally:
            driver.quit()
    return ready, live, charts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test: 500 steps")
    parser.add_argument("--metrics", type=int, default=32)
    args = parser.parse_args(argv)
    sizes = [500] if args.quick else [1000, 10000]
    print(f"\n{'steps':>8}{'metrics':>9}{'charts':>8}{'page ready s':>15}{'+100 steps live s':>20}")
    for steps in sizes:
        ready, live, charts = measure(steps, args.metrics)
        print(f"{steps:>8}{args.metrics:>9}{charts:>8}{ready:>15.2f}{live:>20.2f}")
    print("(page ready: from navigation start until every chart is drawn; live: from the append until the last chart holds it; "
          "the stream polls every 0.5 s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
