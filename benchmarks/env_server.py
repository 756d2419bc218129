"""What serving an env over HTTP costs: RemoteEnv against the same env in process, on loopback.

    python benchmarks/env_server.py --quick    # smoke test, about 15 s
    python benchmarks/env_server.py            # 2000 timed steps, 256 sessions x 20 steps

The env is ``agentrl/Calculator-v0`` and every reply is one calculator tool call, so each step does
the same work in both columns (parse the call, run the tool, answer with a tool message); the
difference is the HTTP round trip: the request's JSON, uvicorn, FastAPI's validation, the session
lookup and lock, the answer's JSON. The server is ``agentrl serve`` in a process of its own
(uvicorn with its defaults: uvloop and httptools where installed), as a user runs it.

Printed side by side:

- **latency**: one step at a time: ``RemoteEnv.step`` (sync) against ``env.step`` in process, and
  ``RemoteEnv.astep`` (async, what the rollout calls) against ``await env.astep`` in process; each
  remote step over the session's WebSocket (the default) and over HTTP (``websocket=False``: httpx
  for sync, aiohttp for async, kept-alive connections), side by side; p50 / p90 / p99 in
  milliseconds and the added p50 (target: <= 0.5 ms added at p50 on both clients);
- **throughput**: ``--sessions`` episodes at once, ``--steps`` steps each, through
  ``RemoteEnv.astep`` (one async client, pooled connections) against the same episodes on
  in-process envs' ``astep``; steps per second, and every step's answer checked (lost: 0).

Both sides share this machine's cores with each other; on 2 cores the server and the client take
one each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import sys
import time

import agentrl
from agentrl.server import EnvClient, RemoteEnv
from agentrl.testing import serve_in_subprocess

ENV_ID = "agentrl/Calculator-v0"
CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "6*7"}}</tool_call>'


def step_latencies(env: agentrl.AgentEnv, n: int) -> list[float]:
    """Seconds of each of ``n`` steps (resets when an episode ends are not timed)."""
    env.reset(seed=0)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(CALL)
        times.append(time.perf_counter() - t0)
        if terminated or truncated:
            env.reset(seed=len(times))
    return times


async def astep_latencies(env: agentrl.AgentEnv, n: int) -> list[float]:
    """:func:`step_latencies` through ``areset`` / ``astep``, as the rollout calls an env."""
    await env.areset(seed=0)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        _, _, terminated, truncated, _ = await env.astep(CALL)
        times.append(time.perf_counter() - t0)
        if terminated or truncated:
            await env.areset(seed=len(times))
    return times


async def throughput(make_env, sessions: int, steps: int) -> tuple[float, int]:
    """Steps per second of ``sessions`` concurrent episodes of ``steps`` steps; and steps lost."""

    async def episode(i: int) -> int:
        env = make_env()
        await env.areset(seed=i)
        answered = 0
        for _ in range(steps):
            observation, _, terminated, truncated, _ = await env.astep(CALL)
            answered += bool(observation) and "42" in observation[0].content
            if terminated or truncated:
                await env.areset(seed=i)
        if isinstance(env, RemoteEnv):
            await env.client.arequest("DELETE", f"/sessions/{env.session_id}")
        return answered

    t0 = time.perf_counter()
    answered = await asyncio.gather(*(episode(i) for i in range(sessions)))
    seconds = time.perf_counter() - t0
    return sessions * steps / seconds, sessions * steps - sum(answered)


def percentiles(times: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(times, n=100)
    return q[49] * 1e3, q[89] * 1e3, q[98] * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test: few steps and sessions")
    parser.add_argument("--latency-steps", type=int, default=2000)
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    if args.quick:
        args.latency_steps, args.sessions, args.steps = 200, 32, 5
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = serve_in_subprocess([ENV_ID], port)
    try:
        local_env = agentrl.as_agent_env(agentrl.make(ENV_ID, split="test"))
        remote_env = RemoteEnv(url, ENV_ID, split="test")
        http_env = RemoteEnv(url, ENV_ID, split="test", client=EnvClient(url, websocket=False))
        envs = (local_env, remote_env, http_env)
        for env in envs:
            step_latencies(env, 50)  # warm each
        local, remote, http = (step_latencies(env, args.latency_steps) for env in envs)

        async def all_async() -> list[list[float]]:
            for env in envs:
                await astep_latencies(env, 50)
            return [await astep_latencies(env, args.latency_steps) for env in envs]

        alocal, aremote, ahttp = asyncio.run(all_async())
        remote_env.close()
        http_env.close()
        client = EnvClient(url)
        spec = client.env_spec(ENV_ID)
        remote_rate, remote_lost = asyncio.run(
            throughput(
                lambda: RemoteEnv(url, ENV_ID, split="test", client=client, spec=spec), args.sessions, args.steps
            )
        )
        local_rate, local_lost = asyncio.run(
            throughput(lambda: agentrl.as_agent_env(agentrl.make(ENV_ID, split="test")), args.sessions, args.steps)
        )
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)

    print(f"\n{ENV_ID}, one calculator call per step, server: agentrl serve on {url} (its own process)\n")
    print(f"{'step latency (ms)':<44}{'p50':>9}{'p90':>9}{'p99':>9}   steps")
    rows = [("in process, env.step", local), ("RemoteEnv.step, WebSocket (sync)", remote),
            ("RemoteEnv.step, HTTP (httpx, sync)", http), ("in process, await env.astep", alocal),
            ("RemoteEnv.astep, WebSocket (async)", aremote), ("RemoteEnv.astep, HTTP (aiohttp, async)", ahttp)]  # fmt: skip
    p50 = {}
    for name, times in rows:
        p50[name], p90, p99 = percentiles(times)
        print(f"{name:<44}{p50[name]:>9.3f}{p90:>9.3f}{p99:>9.3f}   {len(times)}")
    added_sync = p50["RemoteEnv.step, WebSocket (sync)"] - p50["in process, env.step"]
    added = p50["RemoteEnv.astep, WebSocket (async)"] - p50["in process, await env.astep"]
    http_sync = p50["RemoteEnv.step, HTTP (httpx, sync)"] - p50["in process, env.step"]
    http_async = p50["RemoteEnv.astep, HTTP (aiohttp, async)"] - p50["in process, await env.astep"]
    verdict = "met" if max(added, added_sync) <= 0.5 else "PROBLEM: missed"
    print(
        f"added at p50: {added:.3f} ms async (as the rollout steps), {added_sync:.3f} ms sync "
        f"(target <= 0.5 ms on both: {verdict}); over HTTP: {http_async:.3f} ms async, {http_sync:.3f} ms sync\n"
    )
    print(f"{'throughput':<34}{'steps/s':>9}   lost   ({args.sessions} sessions x {args.steps} steps)")
    print(f"{'in process (astep)':<34}{local_rate:>9.0f}   {local_lost:>4}")
    print(f"{'RemoteEnv.astep (WebSocket)':<34}{remote_rate:>9.0f}   {remote_lost:>4}")
    print(f"remote / in process: {remote_rate / local_rate:.2f}x")
    if remote_lost or local_lost:
        print("PROBLEM: steps were lost")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
