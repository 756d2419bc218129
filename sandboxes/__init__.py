"""Isolated code execution: the Sandbox protocol, the Docker and bubblewrap backends, one warm pool.

See ``docs/sandboxes.md``; what each backend protects against is written at the top of
:mod:`agentrl.sandboxes.docker` and :mod:`agentrl.sandboxes.local`.
"""

from agentrl.sandboxes.base import ExecResult, Sandbox, SandboxError, SandboxLimits
from agentrl.sandboxes.docker import (
    DEFAULT_IMAGE,
    DockerSandbox,
    DockerUnavailable,
    docker_available,
    remove_leaked_containers,
)
from agentrl.sandboxes.local import LocalSandbox, bubblewrap_available
from agentrl.sandboxes.make import SandboxSpec, make_sandbox
from agentrl.sandboxes.pool import PoolStats, SandboxPool
from agentrl.sandboxes.shared import Lease, close_pools, shared_pool

__all__ = [
    "DEFAULT_IMAGE",
    "DockerSandbox",
    "DockerUnavailable",
    "ExecResult",
    "Lease",
    "LocalSandbox",
    "PoolStats",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxPool",
    "SandboxSpec",
    "bubblewrap_available",
    "close_pools",
    "docker_available",
    "make_sandbox",
    "remove_leaked_containers",
    "shared_pool",
]
