"""What every ``agentrl`` command shares: the one rule that turns errors into exit codes
(:class:`CleanErrors`), the consoles, and the helpers a command uses to read env arguments and show
messages (:func:`parse_kwargs`, :func:`make_env_or_exit`, :func:`print_message`)."""

from __future__ import annotations

import json
import os
import signal
from typing import Annotated, Any, NoReturn, TextIO

import click
import gymnasium as gym
import typer
import typer.core
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

import agentrl
from agentrl.config import ConfigError
from agentrl.faults import RunFailed
from agentrl.types import Message

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

USAGE_ERRORS: tuple[type[Exception], ...] = (
    agentrl.UnknownEnvError,  # a typo in an env id; the message says "Did you mean ...?"
    ConfigError,  # a config file that cannot be read, an unknown field, a wrong type, a malformed override
    ValueError,  # a cross-field rule of a config (__post_init__), a plot of a directory without metrics
    FileNotFoundError,  # a model directory that is not there
    ImportError,  # a module named in imports:, or an optional dependency a backend needs
)
"""Exceptions that mean the command was given something wrong: one message, exit code 2."""
RUN_ERRORS: tuple[type[Exception], ...] = (ConnectionError, RunFailed)  # a server that does not answer; a fault
"""Exceptions that mean the run could not go on through no fault of the command: one message, exit 1."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's kill, ``timeout``, ``kill PID``), raised in the main thread as Ctrl-C
    is, so that every ``finally`` runs: the inference engines' processes and the containers a command
    started stop with it instead of living on (:func:`stop_on_sigterm`)."""


def stop_on_sigterm() -> None:
    """Make SIGTERM raise :class:`Terminated` in the main thread (exit code 143, as a shell reports it)."""

    def terminated(signum: int, frame: Any) -> None:
        raise Terminated()

    signal.signal(signal.SIGTERM, terminated)


class CleanErrors(typer.core.TyperGroup):
    """The one place where errors become exit codes, for every command and sub-command.

    :data:`USAGE_ERRORS` print their message and exit 2, :data:`RUN_ERRORS` exit 1, Ctrl-C exits
    130 and SIGTERM 143 (both after every ``finally`` ran); anything else is a bug and keeps its traceback. ``AGENTRL_TRACEBACK=1`` re-raises usage
    errors too, for the traceback.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Terminated:
            err_console.print("[yellow]terminated (SIGTERM)[/]")
            raise typer.Exit(143) from None
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted[/]")
            raise typer.Exit(130) from None
        except (*USAGE_ERRORS, *RUN_ERRORS) as e:
            if os.environ.get("AGENTRL_TRACEBACK"):
                raise
            message = error_message(e)
            if not isinstance(e, (agentrl.UnknownEnvError, ConfigError, RunFailed)):  # RunFailed names its log
                # A ValueError may also come from a bug deep in a run: say how to see where it was raised.
                message += " (AGENTRL_TRACEBACK=1 shows where it was raised.)"
            fail(message, code=2 if isinstance(e, USAGE_ERRORS) else 1)


def error_message(error: BaseException) -> str:
    """The text to show for an error: its own message, which the raiser wrote for a person.

    A bare ``No module named 'x'`` gains what to do; an error without a message shows its type.
    """
    message = str(error).strip()
    if isinstance(error, ModuleNotFoundError) and error.name and message == f"No module named {error.name!r}":
        return f"{message}: install the package that provides it (see the README's install section)."
    return message or type(error).__name__


ROLE_STYLES: dict[str, str] = {"system": "magenta", "user": "cyan", "assistant": "green", "tool": "yellow"}

KwargOption = Annotated[
    list[str],
    typer.Option(
        "--kwarg",
        "-k",
        help="Env constructor argument as key=value (repeatable); the value is read as JSON if it "
        "parses, else as a string.",
    ),
]


def parse_kwargs(pairs: list[str]) -> dict[str, Any]:
    """Parse ``["key=value", ...]`` into a dict, reading each value as JSON when it parses.

    >>> parse_kwargs(["max_turns=4", "split=test", "flag=true"])
    {'max_turns': 4, 'split': 'test', 'flag': True}

    Raises ``typer.BadParameter`` (a usage error, exit code 2) for anything but ``key=value``.
    """
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise typer.BadParameter(
                f"expected key=value with a Python identifier as the key (e.g. max_turns=4), got {pair!r}.",
                param_hint="'--kwarg'",
            )
        try:
            kwargs[key] = json.loads(raw)
        except json.JSONDecodeError:
            kwargs[key] = raw
    return kwargs


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``message`` in red on stderr and exit with ``code``."""
    err_console.print(Text(message, style="bold red"), soft_wrap=True)  # unwrapped: greppable
    raise typer.Exit(code)


def make_env_or_exit(env_id: str, kwargs: dict[str, Any]) -> gym.Env[Any, Any]:
    """``agentrl.make(env_id, **kwargs)``, turning the usual mistakes into exit code 2.

    An unknown id prints the registry's "did you mean" message (through :class:`CleanErrors`);
    constructor arguments the env rejects print the env's own error, saying which env and
    arguments. Neither shows a traceback.
    """
    try:
        return agentrl.make(env_id, **kwargs)
    except (TypeError, ValueError) as e:  # TypeError is a usage error only here: the env's arguments
        fail(f"Could not make {env_id!r} with {kwargs}: {type(e).__name__}: {e}", code=2)


def print_message(message: Message, out: Console | None = None) -> None:
    """Print one chat message as a panel coloured by its role, tool calls listed under the text."""
    out = out or console
    body = Text(message.content)
    for call in message.tool_calls:
        if body:
            body.append("\n")
        if call.error:
            body.append(f"x malformed tool call: {call.error}", style="red")
        else:
            body.append(f"-> {call.name}({json.dumps(call.arguments, ensure_ascii=False)})", style="bold")
    title = message.role if message.name is None else f"{message.role} ({message.name})"
    if message.tool_call_id is not None:
        title += f" | {message.tool_call_id}"
    out.print(Panel(body, title=escape(title), title_align="left", border_style=ROLE_STYLES.get(message.role, "white")))


def read_reply(stream: TextIO, out: Console | None = None) -> str | None:
    """Read one multi-line reply: the lines up to the first empty line; ``None`` at end of input.

    Empty lines before any text are skipped. At end of input (Ctrl-D) the text typed so far is
    the reply; if nothing was typed, the result is ``None``.
    """
    out = out or console
    out.print("[bold green]you>[/] [dim](end with an empty line; Ctrl-D quits)[/]")
    lines: list[str] = []
    while True:
        line = stream.readline()
        if not line:  # end of input
            return "\n".join(lines) if lines else None
        line = line.rstrip("\r\n")
        if not line.strip():
            if lines:
                return "\n".join(lines)
            continue
        lines.append(line)
