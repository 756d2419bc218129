"""``agentrl sandbox ...``: build the sandbox image, check a backend, clean up leaked containers.

::

    agentrl sandbox build-image                 # agentrl/sandbox-python:0, skipped when present
    agentrl sandbox build-image --force --tag my/sandbox:1
    agentrl sandbox check --backend auto        # start one sandbox, run a command, time it
    agentrl sandbox cleanup                     # remove containers whose owner process is gone

Exit codes: 0 success, 1 the sandbox or the build failed (the message says why and what to do), 2 a usage
error such as an unknown backend.
"""

from __future__ import annotations

import statistics
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from agentrl.sandboxes.base import SandboxError
from agentrl.sandboxes.docker import DEFAULT_IMAGE, remove_leaked_containers
from agentrl.sandboxes.image import build_image
from agentrl.sandboxes.make import make_sandbox

sandbox_app = typer.Typer(
    name="sandbox",
    help="Isolated code execution: build the offline sandbox image, check a backend, clean up.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


@sandbox_app.command("build-image")
def build_image_command(
    tag: Annotated[str, typer.Option(help="Tag of the image to build.")] = DEFAULT_IMAGE,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even when the image is present.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not print debootstrap's progress.")] = False,
) -> None:
    """Build the default Python sandbox image offline (debootstrap + docker import); skip if present."""
    try:
        result = build_image(tag, force=force, log=(lambda line: None) if quiet else console.out)
    except SandboxError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from exc
    if result.built:
        console.print(
            f"built {result.tag} ({result.size_mb:.0f} MB) in {result.seconds:.0f} s: {result.image_id}", soft_wrap=True
        )
    else:
        console.print(
            f"{result.tag} is already present ({result.size_mb:.0f} MB, {result.image_id}); --force rebuilds it",
            soft_wrap=True,
        )


@sandbox_app.command("check")
def check_command(
    backend: Annotated[str, typer.Option(help="docker, local or auto.")] = "auto",
    image: Annotated[str, typer.Option(help="Image of the docker backend.")] = DEFAULT_IMAGE,
    calls: Annotated[int, typer.Option(help="Warm calls to time.")] = 20,
) -> None:
    """Start one sandbox, run a Python command in it, and time warm calls."""
    start = time.perf_counter()
    try:
        sandbox = make_sandbox(backend, image)  # type: ignore[arg-type]
    except SandboxError as exc:  # a bad backend name (ValueError) is a usage error: exit 2, by agentrl's CLI
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from exc
    started = time.perf_counter() - start
    try:
        result = sandbox.exec(["python3", "-c", "import sys; print(sys.version.split()[0])"])
        timings = []
        for _ in range(max(1, calls)):
            t0 = time.perf_counter()
            sandbox.exec(["true"])
            timings.append(time.perf_counter() - t0)
    except SandboxError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from exc
    finally:
        sandbox.close()
    if not result.ok:
        err_console.print(f"[red]error:[/red] python3 failed in the sandbox: {escape(str(result))}", soft_wrap=True)
        raise typer.Exit(1)
    console.print(
        f"{type(sandbox).__name__}: started in {started:.2f} s, python {result.stdout.strip()}, "
        f"warm call p50 {statistics.median(timings) * 1000:.1f} ms over {len(timings)} calls",
        soft_wrap=True,
    )


@sandbox_app.command("cleanup")
def cleanup_command() -> None:
    """Remove sandbox containers whose owner process is gone (left by a crashed run)."""
    try:
        removed = remove_leaked_containers()
    except SandboxError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from exc
    console.print(
        f"removed {len(removed)} leaked sandbox container(s)" + (f": {', '.join(removed)}" if removed else ""),
        soft_wrap=True,
    )
