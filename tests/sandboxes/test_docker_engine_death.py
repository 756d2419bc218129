"""A dead Docker Engine: the code env's episodes fail with a clear cause, and the run goes on once it is back.

Episodes of ``agentrl/CodeSandbox-v0`` on the docker backend, played by the real rollout
with a scripted policy, while the test SIGKILLs ``dockerd`` in the middle of them and later starts
it again the way ``scripts/install.sh`` does. The episodes caught by the death, and those begun
while the engine is away, fail (counted, never raised, never hung) with a ``DockerUnavailable``
error that says how to bring the engine back; once it answers, episodes succeed again in fresh
containers, and none of the dead engine's containers is left or reused.

Slow, and it restarts the machine's Docker Engine: skipped unless ``dockerd`` runs here as a local
process with the flags of ``scripts/install.sh`` and this test may signal it.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.agents import ChatAgent
from agentrl.envs.codesandbox import PROBLEMS, CodeSandboxEnv, close_pools
from agentrl.policies.base import Sampling
from agentrl.rollout import EpisodeLimits, RolloutSettings, SingleAgentRollout
from agentrl.sandboxes.docker import DEFAULT_IMAGE, OWNER_LABEL, docker_available, docker_client, owner_label
from agentrl.testing import (
    DOCKERD_ARGV,
    ScriptedPolicy,
    build_tiny_tokenizer,
    dockerd_pid,
    engine_answers,
    kill_dockerd,
    start_dockerd,
)
from agentrl.tool_calls import format_tool_calls
from agentrl.types import ToolCall, Trajectory

pytestmark = pytest.mark.docker  # the sandboxes' Docker backend

INSTALL_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install.sh"
BATCH_LIMIT_S = 120.0  # no batch of two episodes may take longer: past it something hung


# --- the engine: kill it, start it again (agentrl.testing), as install.sh starts it -----------------


def install_argv() -> list[str]:
    """The ``dockerd`` command line that scripts/install.sh starts (its ``exec dockerd ...``)."""
    found = re.search(r"exec (dockerd[^>'\"]*?)\s*>>", INSTALL_SCRIPT.read_text())
    assert found is not None, f"no `exec dockerd ... >>` line in {INSTALL_SCRIPT}: update this test's install_argv"
    return found.group(1).split()


def test_the_engine_is_restarted_as_install_sh_starts_it():
    assert list(DOCKERD_ARGV) == install_argv()


def restartable_reason() -> str | None:
    """Why this test may not kill and restart the engine here, or None when it may."""
    if os.environ.get("DOCKER_HOST", "unix://").split("://")[0] != "unix":
        return f"DOCKER_HOST={os.environ['DOCKER_HOST']} is a remote engine, which this test cannot restart"
    if os.geteuid() != 0 or shutil.which("dockerd") is None or shutil.which("setsid") is None:
        return "restarting dockerd needs root, dockerd and setsid on this machine"
    pid = dockerd_pid()
    if pid is None or not docker_available(DEFAULT_IMAGE):
        return f"no local dockerd process answers with the image {DEFAULT_IMAGE} (scripts/install.sh starts one)"
    with open(f"/proc/{pid}/cmdline") as f:
        running = [arg for arg in f.read().split("\0") if arg]
    if [Path(running[0]).name, *running[1:]] != list(DOCKERD_ARGV):
        return f"dockerd runs as {running}, not as scripts/install.sh starts it ({DOCKERD_ARGV}); not restarting it"
    return None


@pytest.fixture
def restartable_engine() -> Iterator[None]:
    """The local engine, for a test that kills it; started again afterwards whatever happens."""
    reason = restartable_reason()
    if reason is not None:
        pytest.skip(reason)
    close_pools()
    try:
        yield
    finally:
        close_pools()
        start_dockerd()


# --- the episodes ------------------------------------------------------------------------------------


def call(name: str, **arguments: object) -> str:
    return format_tool_calls([ToolCall(name, dict(arguments))])


def our_container_ids() -> set[str]:
    """Ids of the sandbox containers this process owns on the engine, in any state."""
    found = docker_client().containers.list(all=True, filters={"label": f"{OWNER_LABEL}={owner_label()}"})
    return {container.id for container in found}


@pytest.mark.docker
def test_a_dead_engine_fails_episodes_clearly_and_the_run_goes_on_once_it_is_back(restartable_engine: None) -> None:
    tokenizer = build_tiny_tokenizer()
    kill_on_run = False

    def reply(prompt: str) -> str:
        """Write the reference solution, run a command, submit; optionally kill the engine first."""
        nonlocal kill_on_run
        turn = prompt.count("<|im_start|>assistant") - 1
        problem = next(p for p in PROBLEMS if p.signature in prompt)
        if turn == 1 and kill_on_run:
            kill_on_run = False
            kill_dockerd()  # the run below, and whatever the other episode does next, meet a dead engine
        script = [call("write_file", path="solution.py", content=problem.reference), call("run", command="echo hi")]
        return script[turn] if turn < len(script) else call("submit")

    def make_env() -> CodeSandboxEnv:
        return CodeSandboxEnv(backend="docker", max_turns=4, pool_size=2)

    env = make_env()
    agent = ChatAgent.from_env(tokenizer, env)
    env.close()
    policy = ScriptedPolicy(tokenizer, reply, end_of_turn_ids=agent.end_of_turn_ids)
    limits = EpisodeLimits(max_turns=4, max_length=8192, turn_timeout=60, episode_timeout=90)
    engine = SingleAgentRollout(
        make_env, agent, policy, RolloutSettings(sampling=Sampling(max_tokens=2048), limits=limits, concurrency=2)
    )

    def play(what: str) -> tuple[list[Trajectory], float]:
        started = time.monotonic()
        trajectories = asyncio.run(asyncio.wait_for(engine.collect(num_groups=2), BATCH_LIMIT_S))
        seconds = time.monotonic() - started
        assert len(trajectories) == 2, f"{what}: {len(trajectories)} trajectories"
        return trajectories, seconds

    def succeeded(trajectories: list[Trajectory]) -> bool:
        return all(t.error is None and t.reward == 1.0 for t in trajectories)

    try:
        before, _ = play("before")
        assert succeeded(before), [(t.error, t.reward) for t in before]
        old_containers = our_container_ids()
        assert old_containers

        kill_on_run = True
        caught, caught_s = play("caught by the death")
        assert not kill_on_run and not engine_answers()
        began, began_s = play("begun while the engine is away")
        for trajectory in caught + began:
            error = trajectory.error or ""
            assert error.startswith("DockerUnavailable: "), error
            assert "unix:///var/run/docker.sock does not answer" in error or "DOCKER_HOST" in os.environ, error
            assert "start it (dockerd" in error and "next episodes will use it" in error, error
        assert all(t.info["failed_during"] == "reset" for t in began), [t.info for t in began]
        assert caught_s < 30 and began_s < 10, f"failing took {caught_s:.1f} s and {began_s:.1f} s: something waited"

        start_dockerd()
        after, _ = play("after the engine came back")
        assert succeeded(after), [(t.error, t.reward) for t in after]
        assert succeeded(play("and the next ones")[0])
    finally:
        engine.close()
    assert engine.episodes == 10 and engine.failed_episodes == 4, (engine.episodes, engine.failed_episodes)
    # The dead engine's containers were neither revived nor left behind: the outage's leftovers went
    # when the engine answered again, and every sandbox made before it started afresh.
    assert not our_container_ids() & old_containers
