"""make_sandbox: one sandbox from a backend name, with ``auto`` choosing what this machine has.

:class:`SandboxSpec` is the same choice as a value (backend, image, limits): hashable, so the
pools of :mod:`agentrl.sandboxes.pool` are keyed by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from agentrl.sandboxes.base import Sandbox, SandboxError, SandboxLimits
from agentrl.sandboxes.docker import DEFAULT_IMAGE, DockerSandbox, docker_available
from agentrl.sandboxes.local import LocalSandbox, bubblewrap_problem
from agentrl.suggest import did_you_mean

Backend = Literal["auto", "docker", "local"]
BACKENDS: tuple[Backend, ...] = ("docker", "local", "auto")


def make_sandbox(backend: Backend = "auto", image: str = DEFAULT_IMAGE, limits: SandboxLimits | None = None) -> Sandbox:
    """A started sandbox of ``backend``.

    ``auto`` is Docker when the engine answers and ``image`` is present, else the local bubblewrap
    backend, else a :class:`SandboxError` that gives both reasons. The local backend runs the host's
    ``/usr`` read-only and ignores ``image``.

    >>> sb = make_sandbox("auto")                      # doctest: +SKIP
    >>> sb.exec("python3 -c 'print(1 + 1)'").stdout    # doctest: +SKIP
    '2\\n'
    """
    limits = limits or SandboxLimits()
    if backend == "docker":
        return DockerSandbox(image, limits)
    if backend == "local":
        return LocalSandbox(limits)
    if backend != "auto":
        hint = did_you_mean(backend, BACKENDS)
        expected = f"unknown sandbox backend {backend!r}; expected one of {', '.join(BACKENDS)}"
        raise ValueError(f"{expected}. {hint}" if hint else expected)
    if docker_available(image):
        return DockerSandbox(image, limits)
    problem = bubblewrap_problem()
    if problem is None:
        return LocalSandbox(limits)
    docker_reason = (
        f"the image {image!r} is not present (build it: agentrl sandbox build-image)"
        if docker_available()
        else "the Docker Engine does not answer"
    )
    raise SandboxError(f"no sandbox backend is usable here: docker: {docker_reason}; local: {problem}")


@dataclass(frozen=True)
class SandboxSpec:
    """What kind of sandbox to make: ``SandboxSpec("docker", limits=SandboxLimits(memory_mb=256)).make()``.

    Attributes:
        backend: ``docker``, ``local`` or ``auto`` (see :func:`make_sandbox`).
        image: The Docker image; None for :data:`~agentrl.sandboxes.DEFAULT_IMAGE`.
        limits: Each sandbox's limits.
    """

    backend: Backend = "auto"
    image: str | None = None
    limits: SandboxLimits = field(default_factory=SandboxLimits)

    def make(self) -> Sandbox:
        """A new, started sandbox of this spec (SandboxError saying what is missing if none can start)."""
        return make_sandbox(self.backend, self.image or DEFAULT_IMAGE, self.limits)
