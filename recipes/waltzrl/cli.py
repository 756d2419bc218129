"""``agentrl waltz-table``: the WaltzRL evaluation table on the command line (:mod:`.evaluate`).

The recipe adds the command to ``agentrl`` through the ``agentrl.commands`` entry point group
(pyproject.toml); the core command line names no env or recipe."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.console import Console

from agentrl.envs.waltz.metrics import metrics_table
from agentrl.recipes.waltzrl.evaluate import CONFIGURATIONS


def waltz_table_command(
    config: Annotated[str, typer.Argument(help="The WaltzRL training config, e.g. recipes/waltzrl/waltzrl.yaml.")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Any TrainConfig field as key=value, as for agentrl train.")
    ] = None,
    episodes: Annotated[int, typer.Option(help="Held-out prompts played in each configuration.")] = 200,
    prompts: Annotated[
        list[str] | None,
        typer.Option(
            help="An evaluation set: builtin, a public set (strongreject, harmbench, advbench, donotanswer, "
            "overrefusal), several joined by + (strongreject+overrefusal), or a JSONL file; repeat for one "
            "table per set. Public sets are judged by the refusal judge."
        ),
    ] = None,
    train_baseline: Annotated[
        bool, typer.Option(help="Train the single-model RL baseline first when <run_dir>-single has no model.")
    ] = True,
) -> None:
    """The WaltzRL table: ASR, ORR, FTR, label accuracy and F1 of five configurations side by side.

    Needs the adapters `agentrl train CONFIG` exported; trains the single-model RL baseline into
    <run_dir>-single first if it is not there. One table per --prompts set (the built-in held-out
    prompts by default). Writes <run_dir>/waltz_table.json ({set: {configuration: metrics}}), and
    every episode played to <run_dir>/waltz_table_episodes.jsonl.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from agentrl.config import load_config
    from agentrl.recipes.waltzrl.evaluate import waltz_table
    from agentrl.train import TrainConfig  # torch: not for `agentrl --help`

    settings = load_config(TrainConfig, config, overrides or [])
    # wide enough for the seven columns, also when written to a file or a pipe (rich's default is 80)
    console, err = Console(highlight=False, width=max(Console().width, 200)), Console(stderr=True, highlight=False)
    tables = waltz_table(
        settings,
        episodes,
        prompts=prompts or ["builtin"],
        train_baseline=train_baseline,
        on_phase=lambda name: err.print(f"[bold]{name}[/]"),
    )
    for prompt_set, table in tables.items():
        title = (
            f"WaltzRL on {settings.rollout.env_id} ({prompt_set} prompts) · {settings.rollout.model} · "
            f"{episodes} held-out prompts each"
        )
        console.print(metrics_table(table, title, CONFIGURATIONS))
    console.print(f"written to {settings.run_dir}/waltz_table.json (episodes: waltz_table_episodes.jsonl)")
