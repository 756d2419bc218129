"""Sandbox call latency and throughput: the warm exec server against ``docker exec`` and ``docker run``.

    python benchmarks/sandbox_latency.py            # full size: 500 warm calls, 16 sandboxes in parallel
    python benchmarks/sandbox_latency.py --quick    # smoke test, tiny sizes

Side by side in one run, each a trivial command (``true``, as argv: no shell) and timed from the
caller's side (``time.perf_counter`` around the call, all overheads included):

- ``DockerSandbox, warm server``: one call through the container's attached exec server (what
  agentrl does on every call);
- ``docker exec (SDK exec_run)``: the same container, the same command, through the engine's exec
  API (what a sandbox built on ``docker exec`` pays per call);
- ``docker run per call``: a new container per call (``containers.run(..., remove=True)``, with the
  same lockdown options), fewer iterations;
- ``LocalSandbox, warm server``: the bubblewrap backend's call (the same exec server, in bwrap);
- ``bwrap per call``: a new bwrap sandbox per call, the price of a local backend without a server;

then throughput with ``--parallel`` sandboxes of each backend driven at once from one event loop
(``aexec``), in calls per second. Targets (from the issue): warm p50 < 10 ms and at least 10x faster
than ``docker exec``. A backend that is absent here is left out with the reason. The figures are of
whatever else the machine is doing too; on a shared machine, run it twice.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from agentrl.sandboxes import DEFAULT_IMAGE, DockerSandbox, LocalSandbox, Sandbox, SandboxLimits, SandboxPool
from agentrl.sandboxes.docker import docker_available, docker_client
from agentrl.sandboxes.local import bubblewrap_problem, bwrap_argv

TARGET_P50_MS = 10.0
TARGET_SPEEDUP = 10.0


class Row(NamedTuple):
    """One line of the table."""

    mode: str
    calls: int
    p50_ms: float
    p99_ms: float
    per_s: float


def timed(call: Callable[[], Any], n: int) -> Row:
    """``n`` timed calls of ``call`` (after one untimed warm-up), as a table row without a name."""
    call()
    samples = []
    start = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    wall = time.perf_counter() - start
    ms = np.array(samples) * 1000
    return Row("", n, float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), n / wall)


def throughput(sandboxes: Sequence[Sandbox], calls_each: int) -> Row:
    """All ``sandboxes`` at once, each making ``calls_each`` warm calls in a row through ``aexec``."""

    async def drive(sb: Sandbox) -> list[float]:
        samples = []
        for _ in range(calls_each):
            t0 = time.perf_counter()
            result = await sb.aexec(["true"])
            samples.append(time.perf_counter() - t0)
            if not result.ok:
                raise RuntimeError(f"a throughput call failed: {result}")
        return samples

    async def main() -> tuple[list[list[float]], float]:
        start = time.perf_counter()
        results = await asyncio.gather(*(drive(sb) for sb in sandboxes))
        return results, time.perf_counter() - start

    per_sandbox, wall = asyncio.run(main())
    ms = np.concatenate(per_sandbox) * 1000
    total = len(sandboxes) * calls_each
    return Row("", total, float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), total / wall)


def bwrap_once() -> None:
    """One throw-away bubblewrap sandbox, set up as a LocalSandbox's, running ``true``."""
    subprocess.run(bwrap_argv(["/usr/bin/true"], SandboxLimits().disk_mb), check=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for the smoke test")
    parser.add_argument("--calls", type=int, default=500, help="warm calls per server row")
    parser.add_argument("--parallel", type=int, default=16, help="sandboxes in the throughput rows")
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="the Docker image")
    args = parser.parse_args(argv)
    calls = 20 if args.quick else args.calls
    exec_calls = max(5, calls // 5)
    run_calls = 2 if args.quick else 10
    parallel = 2 if args.quick else args.parallel
    calls_each = 5 if args.quick else 50

    rows: list[Row] = []
    notes: list[str] = []
    warm_docker = docker_exec = None

    if docker_available(args.image):
        sb = DockerSandbox(args.image)
        try:
            warm_docker = timed(lambda: sb.exec(["true"]), calls)._replace(mode="DockerSandbox, warm server")
            container = sb.container
            docker_exec = timed(lambda: container.exec_run(["true"], user="65534:65534"), exec_calls)._replace(
                mode="docker exec (SDK exec_run)"
            )
        finally:
            sb.close()
        rows += [warm_docker, docker_exec]
        client = docker_client()
        lockdown: dict[str, Any] = {
            "network_mode": "none",
            "user": "65534:65534",
            "read_only": True,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "mem_limit": "512m",
            "pids_limit": 128,
        }
        rows.append(
            timed(lambda: client.containers.run(args.image, ["true"], remove=True, **lockdown), run_calls)._replace(
                mode="docker run per call"
            )
        )
    else:
        notes.append(
            "docker rows left out: "
            + (
                "the engine does not answer"
                if not docker_available()
                else f"image {args.image} is absent (agentrl sandbox build-image)"
            )
        )

    problem = bubblewrap_problem()
    if problem is None:
        with LocalSandbox() as local:
            rows.append(timed(lambda: local.exec(["true"]), calls)._replace(mode="LocalSandbox, warm server"))
        rows.append(timed(bwrap_once, run_calls)._replace(mode="bwrap per call"))
    else:
        notes.append(f"local rows left out: {problem}")

    # The parallel sandboxes come from a pool: started together, all closed when it closes.
    if warm_docker is not None:
        with SandboxPool(parallel, lambda: DockerSandbox(args.image)) as pool:
            many = [pool.acquire() for _ in range(parallel)]
            rows.append(throughput(many, calls_each)._replace(mode=f"{parallel} DockerSandboxes in parallel"))
    if problem is None:
        with SandboxPool(parallel, LocalSandbox) as pool:
            many = [pool.acquire() for _ in range(parallel)]
            rows.append(throughput(many, calls_each)._replace(mode=f"{parallel} LocalSandboxes in parallel"))

    width = max(len(row.mode) for row in rows) if rows else 10
    print(f"{'mode':<{width}}  {'calls':>6}  {'p50 ms':>8}  {'p99 ms':>8}  {'calls/s':>8}")
    for row in rows:
        print(f"{row.mode:<{width}}  {row.calls:>6}  {row.p50_ms:>8.2f}  {row.p99_ms:>8.2f}  {row.per_s:>8.1f}")
    if warm_docker is not None and docker_exec is not None:
        speedup = docker_exec.p50_ms / warm_docker.p50_ms
        print(
            f"warm p50 {warm_docker.p50_ms:.2f} ms (target < {TARGET_P50_MS:g} ms: "
            f"{'met' if warm_docker.p50_ms < TARGET_P50_MS else 'MISSED'}); docker exec / warm server: "
            f"{speedup:.1f}x (target >= {TARGET_SPEEDUP:g}x: {'met' if speedup >= TARGET_SPEEDUP else 'MISSED'})"
        )
    for note in notes:
        print(note, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
