"""The ``agentrl`` command line: list, check and play message environments.

::

    agentrl envs                                   # the registered env ids, one line each
    agentrl check agentrl/Calculator-v0            # run agentrl.check_env on one env
    agentrl check agentrl/Negotiation-v0           # agentrl.check_multiagent_env on a multi-agent one
    agentrl play agentrl/Calculator-v0             # play it yourself in the terminal
    agentrl play agentrl/Countdown-v0 --agent random --episodes 3 --seed 0
    agentrl train examples/quickstart.yaml         # train the default model; held-out success before/after
    agentrl plot runs/calc                         # draw a run's metrics into runs/calc/curves.png
    agentrl serve agentrl/Calculator-v0            # serve envs over HTTP on 127.0.0.1:8000 (RemoteEnv)
    agentrl dashboard runs/quickstart              # the live dashboard of a run on 127.0.0.1:8765

Every command that makes an env takes ``--kwarg key=value`` (repeatable) for the env's constructor
arguments; values are read as JSON when they parse (``max_turns=4``, ``words=["a","b"]``) and as
plain strings otherwise (``split=test``).

Exit codes, the same on every command: 0 success; 1 the env or the run failed (a check, an error
while playing, a model server that cannot be reached); 2 a usage error, printed as one message
without a traceback (an unknown env id or option, a malformed ``--kwarg`` or ``key=value``
override, an unknown config field or a bad value, a config file or model directory that does not
exist, a module in ``imports:`` that cannot be imported); 130 interrupted. The rule lives in one
place, :class:`CleanErrors`; set ``AGENTRL_TRACEBACK=1`` to see the traceback of a usage error.

One module per command group: :mod:`.envs` (envs, check, play), :mod:`.rollout` (rollout, eval),
:mod:`.train` (train, plot), :mod:`.serve` (serve, dashboard), ``agentrl sandbox``
(:mod:`agentrl.sandboxes.cli`); what they share is :mod:`.common` and :mod:`.progress`. A command
is a plain function registered below; another package adds its own through the
``agentrl.commands`` entry point group (:mod:`.plugins`), as the WaltzRL recipe adds
``agentrl waltz-table``.
"""

from __future__ import annotations

import sys
import warnings
from typing import Annotated, TextIO

import typer
from rich.text import Text

import agentrl
from agentrl.cli import envs, plugins, rollout, serve, train
from agentrl.cli.common import CleanErrors, console, err_console, stop_on_sigterm
from agentrl.sandboxes.cli import sandbox_app

app = typer.Typer(
    name="agentrl",
    help="Train LLM agents with reinforcement learning: list, check and play message environments.",
    cls=CleanErrors,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version_callback(value: bool) -> None:
    if value:
        console.print(f"agentrl {agentrl.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", callback=_version_callback, is_eager=True),
    ] = False,
) -> None:
    """Train LLM agents with reinforcement learning: list, check and play message environments."""


app.command("envs")(envs.envs_command)
app.command("check")(envs.check_command)
app.command("play")(envs.play_command)
app.command("rollout")(rollout.rollout_command)
app.command("eval")(rollout.eval_command)
app.command("train")(train.train_command)
app.command("plot")(train.plot_command)
app.command("serve")(serve.serve_command)
app.command("dashboard")(serve.dashboard_command)
app.add_typer(sandbox_app, name="sandbox")
plugins.add_commands(app)  # agentrl waltz-table, and any other package's


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    # A command-line user needs the warning's text, not the source line that raised it.
    err_console.print(Text(f"warning: {message}", style="yellow"), soft_wrap=True)


def main() -> None:
    """Entry point of the ``agentrl`` console script."""
    warnings.showwarning = _show_warning
    stop_on_sigterm()  # a killed command stops the engines and containers it started
    for stream in (sys.stdout, sys.stderr):  # env text may hold characters the terminal cannot show
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    app(prog_name="agentrl")
