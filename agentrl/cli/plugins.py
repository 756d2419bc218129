"""What other packages add to ``agentrl`` through entry points, as envs add themselves to the registry
(``agentrl.envs``, :func:`agentrl.registry.load_plugins`):

- ``agentrl.commands``: a command, by name; the value is a typer command function
  (``waltz-table = "agentrl.recipes.waltzrl.cli:waltz_table_command"``);
- ``agentrl.eval_reports``: a function ``(env_id, trajectories) -> renderable | None`` whose result
  ``agentrl eval`` and ``agentrl rollout`` print after their table (``None``: not this env's run).

A plugin that fails to load is reported on stderr and left out; the other commands still work.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Sequence
from typing import Any

import typer
from rich.text import Text

from agentrl.cli.common import err_console
from agentrl.types import Trajectory

COMMANDS = "agentrl.commands"
EVAL_REPORTS = "agentrl.eval_reports"


def add_commands(app: typer.Typer) -> None:
    """Add every ``agentrl.commands`` entry point to ``app`` under its name; a name the command line
    already has is refused (a built-in command is never replaced)."""
    taken = {command.name for command in app.registered_commands} | {group.name for group in app.registered_groups}
    for entry_point in importlib.metadata.entry_points(group=COMMANDS):
        if entry_point.name in taken:
            _warn(f"the {COMMANDS} entry point {entry_point.name!r} ({entry_point.value}) names a command agentrl has")
            continue
        command = _load(entry_point)
        if command is not None:
            app.command(entry_point.name)(command)
            taken.add(entry_point.name)


def eval_reports(env_id: str, trajectories: Sequence[Trajectory]) -> list[Any]:
    """The reports the ``agentrl.eval_reports`` entry points give for these episodes of ``env_id``."""
    reports = []
    for entry_point in importlib.metadata.entry_points(group=EVAL_REPORTS):
        report_of = _load(entry_point)
        if report_of is None:
            continue
        try:
            report = report_of(env_id, trajectories)
        except Exception as e:  # noqa: BLE001 - one broken report must not hide the run's own table
            _warn(f"the eval report {entry_point.name!r} ({entry_point.value}) failed: {type(e).__name__}: {e}")
            continue
        if report is not None:
            reports.append(report)
    return reports


def _load(entry_point: importlib.metadata.EntryPoint) -> Callable[..., Any] | None:
    try:
        return entry_point.load()  # type: ignore[no-any-return]
    except Exception as e:  # noqa: BLE001 - a broken plugin is reported, the command line still works
        _warn(f"could not load the {entry_point.group} entry point {entry_point.name!r} ({entry_point.value}): "
              f"{type(e).__name__}: {e}; reinstall or remove the package that declares it")  # fmt: skip
        return None


def _warn(message: str) -> None:
    err_console.print(Text(f"warning: {message}", style="yellow"), soft_wrap=True)
