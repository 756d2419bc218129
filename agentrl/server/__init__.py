"""Envs as a service: the FastAPI env server (:mod:`.app`, :mod:`.sessions`, :mod:`.run`) and
:class:`RemoteEnv`, the client that is itself an :class:`~agentrl.env.AgentEnv` (:mod:`.remote`).
``docs/env-server.md`` is the guide."""

from agentrl.server.app import make_app
from agentrl.server.openenv import OpenEnvEnv, OpenEnvError, add_openenv_routes
from agentrl.server.remote import EnvClient, EnvServerError, RemoteEnv, remote_env_factory
from agentrl.server.run import ServerThread, load_tokens, serve
from agentrl.server.sessions import ServerLimits

__all__ = [
    "EnvClient",
    "EnvServerError",
    "OpenEnvEnv",
    "OpenEnvError",
    "RemoteEnv",
    "ServerLimits",
    "ServerThread",
    "add_openenv_routes",
    "load_tokens",
    "make_app",
    "remote_env_factory",
    "serve",
]
