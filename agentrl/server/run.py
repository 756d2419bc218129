"""Running the env server: :func:`serve` (what ``agentrl serve`` calls), :func:`load_tokens` and
:class:`ServerThread` (a server in a background thread, for tests, benchmarks and notebooks)."""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from agentrl.server.app import make_app
from agentrl.server.openenv import add_openenv_routes
from agentrl.server.remote import TOKEN_ENV
from agentrl.server.sessions import ServerLimits


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``localhost`` counts)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_tokens(token_file: str | Path | None = None) -> list[str]:
    """The server's bearer tokens: one per non-empty line of ``token_file``, else ``$AGENTRL_SERVER_TOKEN``."""
    if token_file is not None:
        tokens = [line.strip() for line in Path(token_file).read_text().splitlines() if line.strip()]
        if not tokens:
            raise ValueError(f"The token file {token_file} holds no token (one per line).")
        return tokens
    token = os.environ.get(TOKEN_ENV, "").strip()
    return [token] if token else []


def check_bind(host: str, uds: str | None, tokens: Collection[str]) -> None:
    """Refuse a non-loopback address without a token (a Unix socket is reached only through its
    file, which :func:`serve` makes its owner's alone)."""
    if uds is None and not is_loopback(host) and not tokens:
        raise ValueError(
            f"Refusing to serve envs on {host} without a token: anyone who can reach it could run them. "
            f"Set {TOKEN_ENV} or pass --token-file, or bind 127.0.0.1."
        )


def serve(
    env_ids: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    uds: str | None = None,
    tokens: Collection[str] = (),
    limits: ServerLimits = ServerLimits(),
    allow_kwargs: Collection[str] = (),
    log_level: str = "info",
) -> None:
    """Serve ``env_ids`` with uvicorn until interrupted (on a Unix socket when ``uds`` is given),
    with agentrl's routes and OpenEnv's WebSocket protocol (:mod:`agentrl.server.openenv`)."""
    check_bind(host, uds, tokens)
    app = add_openenv_routes(make_app(env_ids, limits=limits, tokens=tokens, allow_kwargs=allow_kwargs))
    # No proxy-header rewriting (nothing sits in front by default) and no access log below info:
    # both cost time on every request.
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5,
                            ws_max_size=limits.max_body_bytes,
                            proxy_headers=False, access_log=log_level in ("debug", "trace", "info"))  # fmt: skip
    server = uvicorn.Server(config)
    if uds is None:
        server.run()
        return
    server.run(sockets=[private_unix_socket(uds)])


def private_unix_socket(path: str) -> socket.socket:
    """A listening Unix socket at ``path`` that only its owner may connect to (mode 0600):
    uvicorn's own ``uds=`` makes it 0666, which lets every local user in without a token."""
    if os.path.exists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(2048)
    return sock


class ServerThread:
    """A uvicorn server of ``app`` in a daemon thread, on a free loopback port unless told.

    >>> with ServerThread(make_app(["agentrl/Calculator-v0"])) as url:  # doctest: +SKIP
    ...     env = RemoteEnv(url, "agentrl/Calculator-v0")
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, uds: str | None = None, **config: Any):
        config.setdefault("log_level", "warning")
        config.setdefault("timeout_graceful_shutdown", 2)  # an open event stream never ends by itself
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, uds=uds, **config))
        self.uds = uds
        self.thread = threading.Thread(target=self.server.run, name="agentrl-env-server", daemon=True)

    def start(self, timeout: float = 30.0) -> str:
        """Start serving; the URL once it accepts connections."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("The env server did not start (see its log above).")
            time.sleep(0.01)
        return self.url

    @property
    def url(self) -> str:
        if self.uds is not None:
            return f"unix://{self.uds}"
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
