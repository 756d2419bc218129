"""``agentrl serve`` and ``agentrl dashboard``: the env server (FastAPI + uvicorn, on the host or in a
container) and the live dashboard of runs."""

from __future__ import annotations

import importlib
import os
import signal
import sys
from typing import Annotated, Any

import typer

from agentrl.cli.common import (
    console,
    fail,
)


def serve_command(
    env_ids: Annotated[list[str], typer.Argument(metavar="ENV_ID...", help="Registered env ids to serve.")],
    host: Annotated[str, typer.Option(help="Address to bind; other than loopback only with a token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8000,
    uds: Annotated[
        str | None, typer.Option(metavar="PATH", help="Serve on this Unix socket instead of host:port.")
    ] = None,
    token_file: Annotated[
        str | None, typer.Option(metavar="FILE", help="Bearer tokens, one per line (default: $AGENTRL_SERVER_TOKEN).")
    ] = None,
    allow_kwarg: Annotated[
        list[str] | None, typer.Option(metavar="NAME", help="An env kwarg a session may set (repeatable).")
    ] = None,
    imports: Annotated[
        list[str] | None,
        typer.Option(
            "--import",
            metavar="MODULE",
            help="A module to import first, e.g. one that registers the envs (repeatable).",
        ),
    ] = None,
    max_sessions: Annotated[int, typer.Option(min=1, help="Most live sessions; past it 503.")] = 1024,
    idle_timeout: Annotated[float, typer.Option(help="Seconds before an unused session is closed.")] = 600.0,
    step_timeout: Annotated[float, typer.Option(help="Seconds one reset or step may take; past it 504.")] = 60.0,
    max_body: Annotated[int, typer.Option(metavar="BYTES", help="Largest request body; past it 413.")] = 1 << 20,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "info",
    docker: Annotated[bool, typer.Option("--docker", help="Run the server in a container, on a Unix socket.")] = False,
    image: Annotated[
        str | None,
        typer.Option(
            help="--docker: an image holding agentrl and the envs (default: this install in the sandbox image)."
        ),
    ] = None,
) -> None:
    """Serve envs over HTTP (FastAPI + uvicorn) for RemoteEnv and `rollout.env_url=` (docs/env-server.md)."""
    from agentrl.server import ServerLimits, load_tokens, serve  # FastAPI and uvicorn load only for this command

    for module in imports or ():  # a user's envs, registered on import (train's `imports:` does the same)
        try:
            importlib.import_module(module)
        except ImportError as e:
            fail(f"--import {module}: {e}. Give a module importable here (on PYTHONPATH or installed).", 2)
    limits = ServerLimits(max_sessions, idle_timeout, step_timeout, max_body)
    tokens = load_tokens(token_file)
    if docker:
        args = [
            f"--max-sessions={max_sessions}",
            f"--idle-timeout={idle_timeout}",
            f"--step-timeout={step_timeout}",
            f"--max-body={max_body}",
            f"--log-level={log_level}",
            *(f"--allow-kwarg={k}" for k in allow_kwarg or ()),
            *(f"--import={m}" for m in imports or ()),
        ]
        _serve_in_docker(env_ids, image, uds, args, tokens)
        return
    serve(env_ids, host=host, port=port, uds=uds, tokens=tokens, limits=limits, allow_kwargs=allow_kwarg or (),
          log_level=log_level)  # fmt: skip


def _serve_in_docker(
    env_ids: list[str], image: str | None, uds: str | None, args: list[str], tokens: list[str]
) -> None:
    from agentrl.server.docker import DockerEnvServer

    server = DockerEnvServer(env_ids, image=image, socket_dir=os.path.dirname(uds) if uds else None,
                             serve_args=args, tokens=tokens)  # fmt: skip
    if uds and os.path.basename(uds) != "server.sock":
        fail(f"--docker serves on DIR/server.sock; pass --uds DIR/server.sock (got {uds}).", code=2)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the container goes with us (finally below)
    url = server.start()
    console.print(
        f"serving {', '.join(env_ids)} in container {server.container.name} at {url} (Ctrl-C stops it)", soft_wrap=True
    )
    try:
        code = server.wait()
        fail(f"the env server container exited with code {code}:\n{server.logs()}")
    finally:
        server.stop()


def dashboard_command(
    sources: Annotated[
        list[str], typer.Argument(metavar="RUN_DIR...", help="Run directories (or trajectory .jsonl files) to show.")
    ],
    host: Annotated[str, typer.Option(help="Address to bind; other than loopback only with a token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8765,
    token_file: Annotated[
        str | None, typer.Option(metavar="FILE", help="Tokens, one per line (default: $AGENTRL_SERVER_TOKEN).")
    ] = None,
    tokenizer: Annotated[
        str | None, typer.Option(help="Decode token ids of trajectory files written without token texts (a model).")
    ] = None,
) -> None:
    """Serve the live dashboard of runs (curves, per-policy panels, trajectories) on 127.0.0.1."""
    import uvicorn

    from agentrl.dashboard import make_dashboard
    from agentrl.server import load_tokens
    from agentrl.server.run import check_bind

    tokens = load_tokens(token_file)
    check_bind(host, None, tokens)
    app = make_dashboard(sources, tokens=tokens, tokenizer=_load_tokenizer(tokenizer) if tokenizer else None)
    address = f"http://{host}:{port}/" + (f"?token={tokens[0]}" if tokens else "")
    console.print(f"dashboard of {', '.join(sources)}: {address}", soft_wrap=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


def _load_tokenizer(model: str) -> Any:
    from agentrl.build import load_tokenizer

    return load_tokenizer(model)
