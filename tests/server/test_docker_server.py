"""Env servers in containers: reached over a Unix socket, no network, labelled and reaped like sandboxes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import agentrl
from agentrl.sandboxes import DEFAULT_IMAGE, remove_leaked_containers
from agentrl.sandboxes.docker import LABEL, docker_available, docker_client
from agentrl.server import RemoteEnv
from agentrl.server.docker import SERVER_LABEL, DockerEnvServer

pytestmark = [
    pytest.mark.skipif(
        not docker_available(DEFAULT_IMAGE), reason="no Docker Engine with the sandbox image here (scripts/install.sh)"
    ),
    pytest.mark.docker,
]


def server_containers() -> list:
    return docker_client().containers.list(all=True, filters={"label": SERVER_LABEL})


def test_a_containerised_server_serves_over_its_socket_without_a_network(tmp_path):
    with DockerEnvServer(["agentrl/Calculator-v0", "agentrl/Countdown-v0"], socket_dir=tmp_path) as url:
        assert url == f"unix://{tmp_path}/server.sock"
        env = RemoteEnv(url, "agentrl/Calculator-v0", split="test")
        agentrl.check_env(env)
        local = agentrl.make("agentrl/Calculator-v0", split="test")
        assert env.reset(seed=7).observation == local.reset(seed=7)[0]
        (container,) = server_containers()
        attrs = container.attrs
        assert attrs["HostConfig"]["NetworkMode"] == "none" and attrs["HostConfig"]["ReadonlyRootfs"]
        assert attrs["HostConfig"]["CapDrop"] == ["ALL"]
        assert container.labels[LABEL] == "1" and container.labels[SERVER_LABEL].startswith("agentrl/Calculator-v0")
        interfaces = container.exec_run(["cat", "/proc/net/dev"]).output.decode()
        assert [line.split(":")[0].strip() for line in interfaces.splitlines()[2:]] == ["lo"]
    assert server_containers() == []


def test_agentrl_serve_docker_runs_until_stopped_and_a_killed_one_is_reaped_like_a_sandbox(tmp_path):
    command = [sys.executable, "-m", "agentrl.cli", "serve", "--docker", "agentrl/Calculator-v0",
               "--uds", str(tmp_path / "server.sock"), "--log-level", "warning"]  # fmt: skip
    for stop in (signal.SIGTERM, signal.SIGKILL):
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = process.stdout.readline()  # printed once the server answers
        assert "serving agentrl/Calculator-v0 in container" in line, line + process.stdout.read()
        assert RemoteEnv(f"unix://{tmp_path}/server.sock", "agentrl/Calculator-v0").reset(seed=0).observation
        os.kill(process.pid, stop)
        process.wait(timeout=60)
        if stop == signal.SIGTERM:  # the command removes its container on the way out
            assert server_containers() == []
        else:  # nobody did: the leak is found by its dead owner, as for sandboxes
            time.sleep(0.5)
            (leaked,) = server_containers()
            assert leaked.name in remove_leaked_containers()
            assert server_containers() == []
