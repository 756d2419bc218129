"""``agentrl waltz-table``: the WaltzRL evaluation table on the command line, and the Waltz metrics
that ``agentrl eval agentrl/Waltz-v0`` prints (:mod:`agentrl.envs.waltz.evaluate`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from agentrl.envs.waltz.evaluate import CONFIGURATIONS, records_of, waltz_metrics
from agentrl.types import Trajectory

COLUMNS = (
    ("asr", "ASR"),
    ("orr", "ORR"),
    ("ftr_harmful", "FTR harmful"),
    ("ftr_benign", "FTR benign"),
    ("label_accuracy", "label accuracy"),
    ("label_f1", "label F1"),
)
"""The metrics of the table, in order: key -> column title."""


def metrics_table(rows: Mapping[str, Mapping[str, Any]], title: str) -> Table:
    """One row per configuration, one column per metric (value, 95% interval, count)."""
    table = Table(title=title, title_justify="left")
    table.add_column("configuration")
    for _, name in COLUMNS:
        table.add_column(name, justify="right")
    table.add_column("failed", justify="right")
    for row, metrics in rows.items():
        failed = metrics.get("failed_episodes", 0) + metrics.get("judge_unparseable", 0)
        table.add_row(CONFIGURATIONS.get(row, row), *(str(metrics[key]) for key, _ in COLUMNS), str(failed))
    return table


def print_eval_metrics(trajectories: Sequence[Trajectory], console: Console, label: str) -> None:
    """The Waltz metrics of an ``agentrl eval`` run (one configuration), if it played Waltz."""
    records = records_of(trajectories)
    if records:
        console.print(metrics_table({label: waltz_metrics(records)}, "WaltzRL metrics (95% intervals)"))


def waltz_table_command(
    config: Annotated[str, typer.Argument(help="The WaltzRL training config, e.g. examples/waltzrl.yaml.")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Any TrainConfig field as key=value, as for agentrl train.")
    ] = None,
    episodes: Annotated[int, typer.Option(help="Held-out prompts played in each configuration.")] = 200,
    train_baseline: Annotated[
        bool, typer.Option(help="Train the single-model RL baseline first when <run_dir>-single has no model.")
    ] = True,
) -> None:
    """The WaltzRL table: ASR, ORR, FTR, label accuracy and F1 of five configurations side by side.

    Needs the adapters `agentrl train CONFIG` exported; trains the single-model RL baseline into
    <run_dir>-single first if it is not there. Writes <run_dir>/waltz_table.json, and every
    episode played to <run_dir>/waltz_table_episodes.jsonl.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from agentrl.config import load_config
    from agentrl.envs.waltz.evaluate import waltz_table
    from agentrl.train import TrainConfig  # torch: not for `agentrl --help`

    settings = load_config(TrainConfig, config, overrides or [])
    # wide enough for the seven columns, also when written to a file or a pipe (rich's default is 80)
    console, err = Console(highlight=False, width=max(Console().width, 200)), Console(stderr=True, highlight=False)
    table = waltz_table(
        settings, episodes, train_baseline=train_baseline, on_phase=lambda name: err.print(f"[bold]{name}[/]")
    )
    title = f"WaltzRL on {settings.rollout.env_id} · {settings.rollout.model} · {episodes} held-out prompts each"
    console.print(metrics_table(table, title))
    console.print(f"written to {settings.run_dir}/waltz_table.json (episodes: waltz_table_episodes.jsonl)")
