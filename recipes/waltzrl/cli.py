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


def waltz_warm_start_command(
    config: Annotated[str, typer.Argument(help="The WaltzRL training config, e.g. recipes/waltzrl/waltzrl.yaml.")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Any TrainConfig field as key=value, as for agentrl train.")
    ] = None,
    episodes: Annotated[
        int, typer.Option(help="Training prompts whose first answers the verdicts are written for.")
    ] = 160,
    epochs: Annotated[int, typer.Option(help="Passes over the verdicts.")] = 2,
    batch_size: Annotated[int, typer.Option(help="Verdicts per supervised step.")] = 32,
    eval_episodes: Annotated[
        int, typer.Option(help="Held-out prompts on which the feedback agent is measured before and after (0: none).")
    ] = 128,
    out: Annotated[
        str | None, typer.Option(help="Where the adapter goes (default <run_dir>-warm-start/feedback).")
    ] = None,
) -> None:
    """The WaltzRL feedback agent's supervised warm start: the exact judge's verdicts as targets.

    Plays training prompts with the untrained model in both roles, writes the verdict the exact judge
    gives each first answer (labels, and feedback quoting the public fact or saying not to reveal),
    trains the feedback adapter on them and saves it. Start the RL run from it with
    policies.feedback.init_from=<the adapter's directory> (docs/waltzrl.md, "The warm start").
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from agentrl.config import load_config
    from agentrl.recipes.waltzrl.warm_start import warm_start
    from agentrl.train import TrainConfig  # torch: not for `agentrl --help`

    settings = load_config(TrainConfig, config, overrides or [])
    err = Console(stderr=True, highlight=False)
    report = warm_start(
        settings,
        episodes=episodes,
        epochs=epochs,
        batch_size=batch_size,
        eval_episodes=eval_episodes,
        out=out,
        on_phase=lambda name: err.print(f"[bold]{name}[/]"),
    )
    console = Console(highlight=False)
    verdicts = ", ".join(f"{name} {n}" for name, n in report["verdicts"].items())
    nll = report["nll"]
    console.print(f"{report['demonstrations']} verdicts ({verdicts}); loss {nll[0]:.3f} -> {nll[-1]:.3f} per token")
    for when in ("before", "after"):
        if when in report:
            m = report[when]
            console.print(
                f"{when}: label accuracy {m['label_accuracy']['value']:.1%}, label F1 {m['label_f1']['value']:.2f}, "
                f"FTR harmful {m['ftr_harmful']['value']:.1%}, FTR benign {m['ftr_benign']['value']:.1%}"
            )
    console.print(f"adapter: {report['adapter']}; train from it with policies.feedback.init_from={report['adapter']}")
