"""Rollout, evaluation and training on an env server (``rollout.env_url``): the same token ids as in
process, and a server killed with ``kill -9`` mid-run fails only the episodes it held."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agentrl.build import build_rollout
from agentrl.config import RolloutConfig
from agentrl.policies import Sampling
from agentrl.rollout import EpisodeLimits, RolloutSettings
from agentrl.run import rollout
from agentrl.server import ServerThread, make_app
from agentrl.testing import ScriptedPolicy, serve_in_subprocess

ROOT = Path(__file__).resolve().parents[2]
CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "6*7"}}</tool_call>'


@pytest.mark.parametrize("env_id", ["agentrl/Calculator-v0", "agentrl/ToolArithmetic-v0"])
def test_a_remote_rollout_gives_the_same_token_ids_as_a_local_one(tiny_model_dir, env_id):
    config = dict(env_id=env_id, model=str(tiny_model_dir), backend="hf", episodes=4, group_size=2,
                  temperature=0.0, max_tokens=24, max_turns=3, split="test")  # fmt: skip
    local, local_stats = rollout(RolloutConfig(**config))
    with ServerThread(make_app([env_id])) as url:
        remote, remote_stats = rollout(RolloutConfig(**config, env_url=url))
    key = lambda t: (t.group_id, t.token_ids)  # noqa: E731
    assert [key(t) for t in sorted(remote, key=key)] == [key(t) for t in sorted(local, key=key)]
    assert [t.messages for t in sorted(remote, key=key)] == [t.messages for t in sorted(local, key=key)]
    assert remote_stats.failed == 0 and remote_stats.reward_sum == local_stats.reward_sum


@pytest.mark.e2e
def test_agentrl_train_and_eval_run_on_an_env_server(tiny_model_dir, tmp_path):
    with ServerThread(make_app(["agentrl/ToolArithmetic-v0"])) as url:
        small = [
            f"rollout.env_url={url}",
            f"rollout.model={tiny_model_dir}",
            "rollout.backend=hf",
            "rollout.group_size=2",
            "rollout.max_tokens=16",
            "groups_per_step=1",
            "steps=2",
            "eval_episodes=2",
            "trainer.micro_batch_size=2",
            "trainer.trainable_layers=1",
            "curriculum.max_filtered=1",  # the tiny model's groups all score 0: one replaced a step
            f"run_dir={tmp_path / 'run'}",
        ]
        command = [sys.executable, "-m", "agentrl.cli", "train", str(ROOT / "examples" / "quickstart.yaml"), *small]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        metrics = httpx.get(f"{url}/metrics").text
        evaluated = subprocess.run(
            [sys.executable, "-m", "agentrl.cli", "eval", "agentrl/ToolArithmetic-v0", f"env_url={url}",
             f"model={tiny_model_dir}", "backend=hf", "episodes=2", "max_tokens=16"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert evaluated.returncode == 0, evaluated.stdout[-2000:] + evaluated.stderr[-2000:]
    steps = [line for line in metrics.splitlines() if line.startswith("agentrl_server_steps_total{")]
    assert steps and float(steps[0].split()[-1]) >= 4  # 2 steps x 2 episodes, the evaluations besides


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(port: int) -> subprocess.Popen:
    return serve_in_subprocess(["agentrl/Calculator-v0"], port)


def test_a_server_killed_mid_run_fails_only_the_episodes_it_held_and_the_run_goes_on(tiny_tokenizer):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = _start_server(port)
    try:
        policy = ScriptedPolicy(tiny_tokenizer, CALL, delay=0.15)
        engine = build_rollout(RolloutSettings("agentrl/Calculator-v0", env_kwargs={"split": "test"}, env_url=url, limits=EpisodeLimits(max_turns=4), sampling=Sampling(max_tokens=64), concurrency=8, episode_retries=0), policy)  # fmt: skip

        async def run() -> list:
            collecting = asyncio.create_task(engine.collect(num_groups=48))
            await asyncio.sleep(1.0)
            os.killpg(server.pid, signal.SIGKILL)  # mid-run: 8 episodes hold sessions
            server.wait()
            await asyncio.sleep(1.0)
            return [await asyncio.to_thread(_start_server, port), await collecting]

        server, trajectories = asyncio.run(run())
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
    failed = [t for t in trajectories if t.error is not None]
    assert len(trajectories) == 48
    assert 1 <= len(failed) <= 8, [t.error for t in failed]
    assert all(t.error.startswith("EnvServerError") for t in failed)
    assert engine.stats.failure_causes == {"EnvServerError": len(failed)}
    assert sum(t.error is None and t.turns == 4 for t in trajectories) == 48 - len(failed)
