"""Backend specifics: the container's lockdown as the engine reports it, leaked-container cleanup,
make_sandbox's choice, and the ``agentrl sandbox`` commands."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from typing import Any

import docker
import pytest
from typer.testing import CliRunner

import agentrl.sandboxes.docker as docker_backend
from agentrl.cli import app
from agentrl.sandboxes import (
    DEFAULT_IMAGE,
    DockerSandbox,
    LocalSandbox,
    SandboxError,
    SandboxLimits,
    bubblewrap_available,
    make_sandbox,
    remove_leaked_containers,
)
from agentrl.sandboxes.docker import LABEL, OWNER_LABEL, docker_client, owner_alive, owner_label

pytestmark = pytest.mark.docker  # the sandboxes' Docker backend


def test_the_container_is_locked_down_as_configured(docker_ready):
    limits = SandboxLimits(memory_mb=300, cpus=0.5, pids=64, disk_mb=32)
    with DockerSandbox(limits=limits) as sb:
        sb.container.reload()
        host = sb.container.attrs["HostConfig"]
        assert host["NetworkMode"] == "none"
        assert host["Memory"] == host["MemorySwap"] == 300 * 1024 * 1024
        assert host["NanoCpus"] == 500_000_000
        assert host["PidsLimit"] == 64
        assert host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"]
        assert "no-new-privileges" in host["SecurityOpt"]
        assert host["Privileged"] is False
        assert set(host["Tmpfs"]) == {"/work", "/tmp"} and "size=32m" in host["Tmpfs"]["/work"]
        assert not host.get("Binds") and not sb.container.attrs.get("Mounts")
        config = sb.container.attrs["Config"]
        assert config["User"] == "65534:65534"
        assert config["Labels"][LABEL] == "1" and config["Labels"][OWNER_LABEL] == owner_label()
        status = sb.exec("grep -E '^(CapEff|NoNewPrivs)' /proc/self/status").stdout.split()
        assert status == ["CapEff:", "0000000000000000", "NoNewPrivs:", "1"]
        assert sb.exec("df -m /work | tail -1").stdout.split()[1] == "32"
        assert "64" in sb.exec("cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max").stdout


def test_the_local_sandbox_limits_every_process():
    """rlimits are the local backend's tool (Docker's cgroups are checked above)."""
    if not bubblewrap_available():
        pytest.skip("local backend: bubblewrap cannot run here")
    with LocalSandbox(SandboxLimits(memory_mb=300, pids=50, disk_mb=20, timeout=7)) as sandbox:
        # After a pause: the CPU limit is set on the command just after its spawn; cat inherits it.
        table = sandbox.exec("sleep 0.2; cat /proc/self/limits").stdout.splitlines()[1:]
        df = sandbox.exec("df -m /work | tail -1").stdout.split()
        status = sandbox.exec("grep -E '^(CapEff|Uid)' /proc/self/status").stdout.split()
    limits = {line[:26].strip(): line[26:].split()[0] for line in table}
    assert limits["Max address space"] == str(300 * 1024 * 1024)
    assert limits["Max processes"] == "50"
    assert limits["Max file size"] == str(21 * 1024 * 1024)
    assert limits["Max cpu time"] == "9"  # timeout + 2 s
    assert df[1] == "20"
    assert status[:2] == ["Uid:", "65534"] and status[-2:] == ["CapEff:", "0000000000000000"]


def test_a_warm_call_does_not_use_docker_exec(docker_ready):
    with DockerSandbox() as sb:
        for _ in range(5):
            assert sb.exec(["true"]).ok
        sb.container.reload()
        assert sb.container.attrs["ExecIDs"] is None  # every call went through the attached server


def dead_owner() -> str:
    """An owner label naming a process of this host that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return f"{socket.gethostname()}/{child.pid}/{docker_backend.process_start_time(child.pid) or '1'}"


def test_owner_labels_tell_live_from_dead_owners():
    assert owner_alive(owner_label())
    assert not owner_alive(dead_owner())
    assert owner_alive("some-other-host/1/1")  # not ours to judge
    assert not owner_alive("garbage")


def test_leaked_containers_of_dead_owners_are_removed_on_the_next_start(docker_ready):
    client = docker_client()
    labels = {LABEL: "1", OWNER_LABEL: dead_owner()}
    leaked = client.containers.create(DEFAULT_IMAGE, command=["true"], labels=labels, network_mode="none")
    foreign = client.containers.create(
        DEFAULT_IMAGE, command=["true"], labels={LABEL: "1", OWNER_LABEL: "some-other-host/1/1"}, network_mode="none"
    )
    try:
        with DockerSandbox() as alive:
            removed = remove_leaked_containers()
            assert leaked.name in removed
            assert foreign.name not in removed and alive.container.name not in removed
            assert alive.exec("echo still-mine").ok
        # And what "next start" means: the first DockerSandbox of a process cleans up by itself.
        again = client.containers.create(DEFAULT_IMAGE, command=["true"], labels=labels, network_mode="none")
        docker_backend._cleaned.clear()
        with DockerSandbox():
            names = [c.name for c in client.containers.list(all=True, filters={"label": f"{LABEL}=1"})]
            assert again.name not in names and foreign.name in names
    finally:
        foreign.remove(force=True)
        with contextlib.suppress(docker.errors.NotFound):  # removed by the code under test, as it should be
            leaked.remove(force=True)


def test_make_sandbox_picks_a_backend(docker_ready):
    sandbox = make_sandbox("auto")
    assert isinstance(sandbox, DockerSandbox)
    sandbox.close()
    if bubblewrap_available():
        fallback = make_sandbox("auto", image="agentrl/no-such-image:0")
        assert isinstance(fallback, LocalSandbox)
        fallback.close()
    with pytest.raises(SandboxError, match="agentrl sandbox build-image"):
        make_sandbox("docker", image="agentrl/no-such-image:0")
    with pytest.raises(ValueError, match="unknown sandbox backend 'podman'; expected one of docker, local, auto"):
        make_sandbox("podman")  # type: ignore[arg-type]


class NoPython(DockerSandbox):
    """The default image told to start its server with a python3 that is not there."""

    def server_argv(self, python: str, **config: Any) -> list[str]:
        return super().server_argv("/no/such/python3", **config)


def test_an_image_without_python_is_refused_clearly_and_leaves_nothing(docker_ready):
    with pytest.raises(SandboxError, match="python3"):
        NoPython()
    # The module's fixture checks that its half-made container was removed.


runner = CliRunner()


def test_the_sandbox_commands_have_help():
    result = runner.invoke(app, ["sandbox", "--help"])
    assert result.exit_code == 0
    for command in ("build-image", "check", "cleanup"):
        assert command in result.output
    build = runner.invoke(app, ["sandbox", "build-image", "--help"])
    assert build.exit_code == 0 and "--force" in build.output and "--tag" in build.output


def test_build_image_skips_an_image_that_is_present(docker_ready):
    result = runner.invoke(app, ["sandbox", "build-image", "--tag", DEFAULT_IMAGE])
    assert result.exit_code == 0, result.output
    assert "already present" in result.output and "--force" in result.output


def test_the_check_and_cleanup_commands_run(docker_ready):
    check = runner.invoke(app, ["sandbox", "check", "--backend", "docker", "--calls", "3"])
    assert check.exit_code == 0, check.output
    assert "DockerSandbox: started" in check.output and "python 3." in check.output
    cleanup = runner.invoke(app, ["sandbox", "cleanup"])
    assert cleanup.exit_code == 0 and "leaked sandbox container" in cleanup.output
    bad = runner.invoke(app, ["sandbox", "check", "--backend", "docker", "--image", "agentrl/no-such-image:0"])
    assert bad.exit_code == 1 and "build-image" in bad.output
