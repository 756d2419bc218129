"""``agentrl train`` and ``agentrl plot``: a training run with its progress on screen and its
held-out summary, and the picture of a run's curves."""

from __future__ import annotations

import contextlib
import importlib
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

import agentrl
from agentrl.cli.common import (
    USAGE_ERRORS,
    console,
)
from agentrl.cli.progress import train_progress
from agentrl.config import ConfigError, load_config
from agentrl.faults import RunFailed, failure_message, native_stderr_to, resume_command, vllm_logs_to, write_traceback
from agentrl.metrics import METRICS_FILE, policy_metric, read_metrics
from agentrl.registry import is_multiagent


def train_command(
    config: Annotated[
        str | None, typer.Argument(help="A YAML file of TrainConfig fields, e.g. examples/quickstart.yaml.")
    ] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="Any TrainConfig field as key=value; sections with dots: trainer.lr=1e-5."),
    ] = None,
) -> None:
    """Train a policy on an env: rollouts on the inference engine, PPO/GRPO steps, weights back to the engine.

    Prints held-out success before and after training; writes metrics, checkpoints, the trained model
    and the curves into run_dir.
    """
    from agentrl.train import TrainConfig, train  # torch and transformers: not for `agentrl --help`

    if config is not None and "=" in config and not config.endswith((".yaml", ".yml")):
        overrides, config = [config, *(overrides or [])], None  # only overrides were given
    settings = load_config(TrainConfig, config, list(overrides or []))
    for module in settings.imports:  # first: they may register the env named below
        try:
            importlib.import_module(module)
        except ImportError as e:  # say which entry of imports: failed; CleanErrors makes it exit 2
            raise ConfigError(
                f"imports: cannot import {module!r} ({type(e).__name__}: {e}). Install the package "
                "that provides it, or remove it from imports."
            ) from e
    if settings.rollout.env_url is None and not is_multiagent(settings.rollout.env_id):
        agentrl.spec(settings.rollout.env_id)  # an unknown env fails now, before the engine starts
    # vLLM's log goes to RUN_DIR/train.log (VLLM_LOGGING_LEVEL=INFO shows it on the screen instead).
    # An engine killed mid-run leaves shared memory that multiprocessing's resource tracker frees at
    # exit, with a warning printed after the run's message: that warning is silenced.
    quiet_tracker = "ignore::UserWarning:multiprocessing.resource_tracker"
    if quiet_tracker not in os.environ.get("PYTHONWARNINGS", ""):
        os.environ["PYTHONWARNINGS"] = ",".join(w for w in (os.environ.get("PYTHONWARNINGS"), quiet_tracker) if w)
    # The engines' own output (Triton and torch notices, weight-loading bars) goes to the same log,
    # and so do transformers' weight-loading bars: the screen shows the run's progress.
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    with contextlib.ExitStack() as stack:
        run_log = stack.enter_context(vllm_logs_to(settings.run_dir))
        if "VLLM_LOGGING_LEVEL" not in os.environ:  # set: the user asked for the engines' log on the screen
            stack.enter_context(native_stderr_to(run_log))
        progress = stack.enter_context(train_progress())
        try:
            result = train(settings, progress.hooks())  # no model, no server: CleanErrors
        except USAGE_ERRORS:
            raise
        except Exception as e:  # a fault ended the run: one message, the traceback in the run's log
            written = write_traceback(e, settings.run_dir) is not None
            arguments = [*([config] if config is not None else []), *(overrides or [])]
            resume = resume_command(arguments, settings.resume)
            raise RunFailed(failure_message(e, settings.run_dir, resume, traceback_written=written)) from e
    _print_train_summary(settings, result)


_EVAL_ROWS = (
    ("eval/success_rate", "success rate", "{:.1%}"),
    ("eval/reward_mean", "mean reward", "{:.3f}"),
    ("eval/episodes", "episodes", "{:.0f}"),
    ("eval/failed", "failed", "{:.0f}"),
    ("eval/reference_nll", "reference NLL per token", "{:.3f}"),
    ("eval/vs_base_success_rate", "success against the base model", "{:.1%}"),
)
"""The held-out rows of ``agentrl train``'s summary: metric, label, format."""
_OPTIONAL_EVAL_ROWS = ("eval/reference_nll", "eval/vs_base_success_rate")
"""Rows shown only by runs that log them (envs with reference answers)."""


def _print_train_summary(config: Any, result: Any) -> None:
    title = f"{config.rollout.env_id} · {config.rollout.model} · {config.trainer.algorithm} · {result.steps} steps"
    if result.eval_before is None and result.eval_after is None:  # eval_episodes 0: nothing to compare
        console.print(f"{escape(title)}\nheld-out evaluation: off (eval_episodes 0)")
        _print_reported(config, result)
        _print_faults(result)
        _print_run_files(result)
        return
    table = Table(title=title, title_justify="left")
    table.add_column("held-out (split test)")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    before, after = result.eval_before or {}, result.eval_after or {}
    # A multi-policy run evaluates each policy under eval/<policy>/...: one block of rows per policy.
    # getattr: a TrainResult without the field is a single-policy run's.
    policies = getattr(result, "policies", None) or [None]
    for index, policy in enumerate(policies):
        if index:
            table.add_section()
        for name, label, fmt in _EVAL_ROWS:
            metric = name if policy is None else policy_metric(name, policy)
            if name in _OPTIONAL_EVAL_ROWS and metric not in before and metric not in after:
                continue
            table.add_row(
                label if policy is None else f"{policy} {label}",
                fmt.format(before[metric]) if metric in before else "-",
                fmt.format(after[metric]) if metric in after else "-",
            )
        held_out = f"env/{config.rollout.env_id}/" + ("" if policy is None else f"{policy}/") + "held_out/"
        for metric in dict.fromkeys(n for n in (*before, *after) if n.startswith(held_out)):
            name = metric[len(held_out) :] if policy is None else f"{policy} {metric[len(held_out) :]}"
            table.add_row(
                escape(name),
                f"{before[metric]:.3g}" if metric in before else "-",
                f"{after[metric]:.3g}" if metric in after else "-",
            )
    console.print(table)
    _print_reported(config, result)
    _print_faults(result)
    _print_run_files(result)


def _print_reported(config: Any, result: Any) -> None:
    """What the run's ``metrics_fn`` reported (``env/<env id>/...``), at each name's first and last
    step: how the training batches changed, in the env's own words (its reports of the held-out
    episodes, ``.../held_out/...``, are rows of the held-out table)."""
    if not getattr(config, "metrics_fn", None):
        return
    entries = read_metrics(Path(result.run_dir))
    prefix = f"env/{config.rollout.env_id}/"
    names = list(dict.fromkeys(n for entry in entries for n in entry if n.startswith(prefix) and "/held_out/" not in n))
    if not names:
        return
    table = Table(title=f"training batches, as {config.metrics_fn} reports them", title_justify="left")
    for column in ("metric", "first step", "last step"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for name in names:
        logged = [(entry["step"], entry[name]) for entry in entries if entry.get(name) is not None]
        if logged:
            (first_step, first), (last_step, last) = logged[0], logged[-1]
            table.add_row(
                escape(name[len(prefix) :]), f"{first:.3g} (step {first_step})", f"{last:.3g} (step {last_step})"
            )
    console.print(table)


_FAULTS = (
    ("fault/engine_restarts", "inference engines replaced"),
    ("fault/engines_lost", "engines lost, the others serving on"),
    ("fault/env_workers_replaced", "Ray env workers replaced"),
    ("fault/episodes_retried", "episodes played again after a fault"),
    ("fault/groups_replaced", "groups replaced (failed past their retries)"),
    ("rollout/failed", "episodes failed (counted, never trained on)"),
)
"""The faults the end of ``agentrl train`` reports: metric, label. ``rollout/...`` is per step, the
``fault/...`` counts are the run's so far."""


def faults_survived(entries: list[dict[str, Any]], policies: list[str]) -> list[tuple[str, str]]:
    """What the run's faults were, from its metrics records: (label, count) for each kind that
    happened, the counts per policy for a run of several (``[]``: none happened)."""
    rows = []
    for name, label in _FAULTS:
        counts = {}
        for policy in policies or [None]:
            metric = name if policy is None else policy_metric(name, policy)
            values = [entry[metric] for entry in entries if entry.get(metric) is not None]
            counts[policy] = sum(values) if name.startswith("rollout/") else max(values, default=0.0)
        if any(counts.values()):
            rows.append((label, ", ".join(f"{p} {n:.0f}" if p else f"{n:.0f}" for p, n in counts.items())))
    return rows


def _print_faults(result: Any) -> None:
    if not (Path(result.run_dir) / METRICS_FILE).exists():  # nothing recorded, nothing to say
        return
    rows = faults_survived(read_metrics(Path(result.run_dir)), getattr(result, "policies", None) or [])
    if not rows:
        console.print("faults the run survived: none")
        return
    table = Table(title="faults the run survived", title_justify="left")
    table.add_column("fault")
    table.add_column("count", justify="right")
    for label, count in rows:
        table.add_row(label, escape(count))
    console.print(table)


def _print_run_files(result: Any) -> None:
    console.print(f"run dir: {escape(str(result.run_dir))}")
    if result.model_dir is not None:
        console.print(f"trained model: {escape(str(result.model_dir))}")
    if result.plot is not None:
        console.print(f"curves: {escape(str(result.plot))}")


def plot_command(
    run_dir: Annotated[str, typer.Argument(metavar="RUN_DIR", help="A run directory holding metrics.jsonl.")],
    out: Annotated[
        str | None, typer.Option(metavar="FILE", help="Where to write the picture (default RUN_DIR/curves.png).")
    ] = None,
) -> None:
    """Draw a run's training curves from RUN_DIR/metrics.jsonl into one picture; print its path."""
    from agentrl.plot import plot_run  # matplotlib takes a second to import; only this command needs it

    path = plot_run(run_dir, out)  # no metrics.jsonl, an empty one, nothing to draw: ValueError, exit 2
    console.print(escape(str(path)), soft_wrap=True)
