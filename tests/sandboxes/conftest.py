"""Fixtures of the sandbox tests: both backends against the real thing (a Docker Engine, bwrap).

A backend is skipped only when it is truly absent here, with the reason; CI (``.ci/run``) installs
both, starts the engine and builds the image, so there nothing is skipped. One sandbox per backend is
shared by a test module and reset before each test that uses it (that every test starts clean is
itself part of what is tested); the tests that break a sandbox on purpose make their own.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator

import pytest

from agentrl.sandboxes import DEFAULT_IMAGE, DockerSandbox, LocalSandbox, Sandbox, SandboxLimits
from agentrl.sandboxes.docker import LABEL, OWNER_LABEL, docker_available, docker_client
from agentrl.sandboxes.local import bubblewrap_problem

BACKENDS = ("docker", "local")


def backend_skip_reason(backend: str) -> str | None:
    """Why ``backend`` cannot run here, or None."""
    if backend == "docker":
        if not docker_available():
            return "no Docker Engine answers here (scripts/install.sh starts one)"
        if not docker_available(DEFAULT_IMAGE):
            return f"the image {DEFAULT_IMAGE} is absent (agentrl sandbox build-image)"
        return None
    return bubblewrap_problem()


def make(backend: str, limits: SandboxLimits | None = None) -> Sandbox:
    """A fresh sandbox of ``backend``, skipping the test when the backend is absent."""
    reason = backend_skip_reason(backend)
    if reason is not None:
        pytest.skip(f"{backend} backend: {reason}")
    if backend == "docker":
        return DockerSandbox(DEFAULT_IMAGE, limits)
    return LocalSandbox(limits)


def our_containers() -> list[str]:
    """Names of the sandbox containers this test process owns on the engine (any state)."""
    if not docker_available():
        return []
    prefix = f"{socket.gethostname()}/{os.getpid()}/"
    containers = docker_client().containers.list(all=True, filters={"label": f"{LABEL}=1"})
    return [c.name for c in containers if c.labels.get(OWNER_LABEL, "").startswith(prefix)]


@pytest.fixture(scope="module", params=BACKENDS)
def shared(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """One sandbox per backend for the whole module, closed (container removed) at its end."""
    sandbox = make(request.param)
    yield sandbox
    sandbox.close()


@pytest.fixture
def sb(shared: Sandbox) -> Sandbox:
    """The module's sandbox of the current backend, reset: no processes, empty work dir and /tmp."""
    shared.reset()
    return shared


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """A backend name, for tests that make their own sandboxes; skipped when absent here."""
    reason = backend_skip_reason(request.param)
    if reason is not None:
        pytest.skip(f"{request.param} backend: {reason}")
    return str(request.param)


@pytest.fixture
def docker_ready() -> None:
    """Skip the test unless the Docker Engine answers and the default image is present."""
    reason = backend_skip_reason("docker")
    if reason is not None:
        pytest.skip(f"docker backend: {reason}")


@pytest.fixture
def fresh(backend: str) -> Iterator[Callable[..., Sandbox]]:
    """A factory of new sandboxes of the current backend (``fresh(limits)``); all closed at the end."""
    made: list[Sandbox] = []

    def factory(limits: SandboxLimits | None = None) -> Sandbox:
        sandbox = make(backend, limits)
        made.append(sandbox)
        return sandbox

    yield factory
    for sandbox in made:
        sandbox.close()


@pytest.fixture(scope="module", autouse=True)
def no_container_left_behind() -> Iterator[None]:
    """After each test module (its shared sandboxes closed), none of the sandbox containers it made
    may remain on the engine, whatever its tests did to them. Set up first, so torn down last."""
    before = set(our_containers())
    yield
    left = sorted(set(our_containers()) - before)
    assert not left, f"sandbox containers left behind by this test module: {left}"
