"""``agentrl waltz-table``: the WaltzRL evaluation table on the command line (:mod:`.evaluate`).

The recipe adds the command to ``agentrl`` through the ``agentrl.commands`` entry point group
(pyproject.toml); the core command line names no env or recipe."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer
from rich.console import Console

from agentrl.envs.waltz.metrics import REVISION_COLUMNS, metrics_table
from agentrl.recipes.waltzrl.evaluate import configuration_label


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
    compare: Annotated[
        list[str] | None,
        typer.Option(
            help="Another WaltzRL run as NAME=RUN_DIR (its adapters get a row 'WaltzRL (NAME)'): the recipe with "
            "and without its warm start, say. Repeat for more."
        ),
    ] = None,
) -> None:
    """The WaltzRL table: ASR, ORR, FTR, label accuracy and F1 of five configurations side by side.

    Needs the adapters `agentrl train CONFIG` exported; trains the single-model RL baseline into
    <run_dir>-single first if it is not there. One table per --prompts set (the built-in held-out
    prompts by default). Writes <run_dir>/waltz_table.json ({set: {configuration: metrics}}), and
    every episode played to <run_dir>/waltz_table_episodes.jsonl.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from agentrl.cli.progress import LineProgress  # agentrl.cli loads this module's commands: not at import
    from agentrl.config import load_config
    from agentrl.recipes.waltzrl.evaluate import waltz_table
    from agentrl.train import TrainConfig  # torch: not for `agentrl --help`

    settings = load_config(TrainConfig, config, overrides or [])
    others = {}
    for item in compare or []:
        name, sep, run_dir = item.partition("=")
        if not sep or not name.strip() or not run_dir.strip():
            raise typer.BadParameter(f"--compare takes NAME=RUN_DIR (e.g. no-warm-start=runs/waltzrl), got {item!r}.")
        others[name.strip()] = run_dir.strip()
    # wide enough for the seven columns, also when written to a file or a pipe (rich's default is 80)
    console, err = Console(highlight=False, width=max(Console().width, 200)), Console(stderr=True, highlight=False)
    with LineProgress(sys.stderr) as baseline:  # the baseline's training: a line per step, as agentrl train
        tables = waltz_table(
            settings,
            episodes,
            prompts=prompts or ["builtin"],
            train_baseline=train_baseline,
            compare=others,
            on_phase=lambda name: err.print(f"[bold]{name}[/]"),
            progress=baseline.hooks(),
        )
    for prompt_set, table in tables.items():
        title = (
            f"WaltzRL on {settings.rollout.env_id} ({prompt_set} prompts) · {settings.rollout.model} · "
            f"{episodes} held-out prompts each"
        )
        labels = {key: configuration_label(key) for key in table}
        console.print(metrics_table(table, title, labels))
        with_feedback = {
            key: row for key, row in table.items() if row["revise_flawed"].total + row["revise_fine"].total
        }
        console.print(metrics_table(with_feedback, "What the feedback asked for, and what its revisions did", labels,
                                    REVISION_COLUMNS))  # fmt: skip
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


def waltz_seeds_command(
    run_dirs: Annotated[
        list[str],
        typer.Argument(help="WaltzRL run directories, one per training seed, each with its waltz-table episodes."),
    ],
) -> None:
    """The WaltzRL tables of several training seeds side by side: each metric's mean and spread.

    Reads <run_dir>/waltz_table_episodes.jsonl of each run (`agentrl waltz-table CONFIG run_dir=...
    trainer.seed=K rollout.seed=K` writes it) and prints, per prompt set and configuration, the mean over
    the seeds and the smallest and largest seed's value of each metric, recomputed from the episodes;
    writes the summary to the first run's waltz_seeds.json.
    """
    import json
    from pathlib import Path

    from rich.table import Table

    from agentrl.envs.waltz.metrics import COLUMNS
    from agentrl.recipes.waltzrl.evaluate import seed_summary, tables_of_episodes

    paths = [Path(d) / "waltz_table_episodes.jsonl" for d in run_dirs]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise typer.BadParameter(
            f"no waltz_table_episodes.jsonl in {', '.join(missing)}: run agentrl waltz-table for each seed first."
        )
    summary = seed_summary([tables_of_episodes(p) for p in paths])
    console = Console(highlight=False, width=max(Console().width, 200))
    for prompt_set, rows in summary.items():
        for columns, title in (
            (COLUMNS, f"WaltzRL over {len(paths)} training seeds ({prompt_set} prompts): mean [lowest, highest seed]"),
            (REVISION_COLUMNS, "What the feedback asked for, and what its revisions did"),
        ):
            table = Table(title=title, title_justify="left")
            table.add_column("configuration")
            for _, name in columns:
                table.add_column(name, justify="right")
            for key, row in rows.items():
                cells = [row.get(metric) for metric, _ in columns]
                if columns is REVISION_COLUMNS and not any(cells):
                    continue  # no feedback in this configuration
                table.add_row(configuration_label(key), *(_spread(c, percent=m != "label_f1") for c, (m, _) in
                                                           zip(cells, columns)))  # fmt: skip
            console.print(table)
    out = Path(run_dirs[0]) / "waltz_seeds.json"
    out.write_text(json.dumps({"runs": run_dirs, "summary": summary}, indent=1))
    console.print(f"written to {out}")


def _spread(entry: dict[str, Any] | None, *, percent: bool) -> str:
    """One cell of the seeds' table: the mean, the lowest and highest seed, how many seeds."""
    if entry is None:
        return "-"
    low, mean, high = (f"{entry[k]:.1%}" if percent else f"{entry[k]:.2f}" for k in ("low", "mean", "high"))
    return f"{mean} [{low}, {high}] k={len(entry['values'])}"
