"""``agentrl rollout`` and ``agentrl eval``: play episodes of an env with a model and print what they
scored; after them, the reports that envs add through the ``agentrl.eval_reports`` entry point
(:mod:`agentrl.cli.plugins`)."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import agentrl
from agentrl.cli.common import (
    console,
)
from agentrl.cli.plugins import eval_reports
from agentrl.cli.progress import LineProgress, progress_bars
from agentrl.config import RolloutConfig, load_config
from agentrl.registry import is_multiagent


def rollout_command(
    env_id: Annotated[str, typer.Argument(help="The env id, e.g. agentrl/Calculator-v0.")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Any RolloutConfig field as key=value, e.g. temperature=0.7.")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="default (SmolLM2-135M-Instruct), a checkpoint dir, or a hub id.")
    ] = None,
    backend: Annotated[str | None, typer.Option(help="vllm, hf or openai.")] = None,
    episodes: Annotated[int | None, typer.Option(help="Episodes to play (a multiple of --group-size).")] = None,
    group_size: Annotated[int | None, typer.Option(help="Episodes per task, sharing a group id.")] = None,
    out: Annotated[str | None, typer.Option(help="Write trajectories here, one JSON object per line.")] = None,
    config: Annotated[str | None, typer.Option(help="A YAML file of RolloutConfig fields.")] = None,
) -> None:
    """Play episodes of an env with a model; print a summary table; write trajectories as JSONL."""
    _run_rollout(
        env_id, overrides or [], config, model=model, backend=backend, episodes=episodes, group_size=group_size, out=out
    )


def eval_command(
    env_id: Annotated[str, typer.Argument(help="The env id, e.g. agentrl/Calculator-v0.")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Any RolloutConfig field as key=value, e.g. temperature=0.")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="default (SmolLM2-135M-Instruct), a checkpoint dir, or a hub id.")
    ] = None,
    backend: Annotated[str | None, typer.Option(help="vllm, hf or openai.")] = None,
    episodes: Annotated[int | None, typer.Option(help="Episodes to play.")] = None,
    out: Annotated[str | None, typer.Option(help="Write trajectories here, one JSON object per line.")] = None,
    config: Annotated[str | None, typer.Option(help="A YAML file of RolloutConfig fields.")] = None,
) -> None:
    """Evaluate a model on an env's held-out split (split=test) and print the summary table."""
    _run_rollout(
        env_id, ["split=test", *(overrides or [])], config, model=model, backend=backend, episodes=episodes, out=out
    )


def _run_rollout(env_id: str, overrides: list[str], config_path: str | None, **options: Any) -> None:
    # vLLM logs every engine step at INFO, and at WARNING its build choices (eager mode, no Triton on
    # the CPU, LD_PRELOAD advice); the progress bar and the table are what a person reads. A user
    # who wants them sets VLLM_LOGGING_LEVEL.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    given = [f"{k}={v}" for k, v in options.items() if v is not None]
    config = load_config(RolloutConfig, config_path, [f"env_id={env_id}", *given, *overrides])
    if not is_multiagent(config.env_id):  # a multi-agent env plays with one shared policy (mapping "all")
        agentrl.spec(config.env_id)  # an unknown env fails now, in half a second, before torch is imported
    from agentrl.run import rollout  # torch and transformers: not for `agentrl --help` or a typo

    total = config.episodes + config.redundancy * (config.episodes // config.group_size)
    played = failed = retried = 0

    def count(episode: list[Any]) -> str:
        nonlocal played, failed, retried
        played += 1
        failed += any(t.error is not None for t in episode)
        retried += bool(episode) and bool(episode[0].info.get("retried"))  # every agent's trajectory says so
        return f"failed {failed}"

    if not sys.stdout.isatty():  # a file, a pipe, CI: a line at the start and at every tenth
        lines = LineProgress()
        lines.line(f"{config.env_id} ({config.backend}): starting the engine, then {total} episodes")
        every = max(total // 10, 1)

        def advance(episode: list[Any], stats: Any) -> None:
            status = count(episode)
            if played % every == 0 or played == total:
                summary = stats.summary()
                lines.line(f"episodes {played}/{total}  success {summary['rollout/success_rate']:.0%}  {status}")

        trajectories, stats = rollout(config, on_episode=advance)  # no model, no server: CleanErrors
    else:
        with progress_bars() as progress:
            task = progress.add_task(f"{config.env_id} ({config.backend})", total=total, status="starting the engine")

            def advance(episode: list[Any], stats: Any) -> None:  # one tick per episode, whatever its agents
                status = f"success {stats.summary()['rollout/success_rate']:.0%}  {count(episode)}"
                progress.update(task, advance=1, status=status)

            trajectories, stats = rollout(config, on_episode=advance)  # no model, no server: CleanErrors
    _print_rollout_summary(config, stats, played, failed, retried)
    if any(t.reference_ids for t in trajectories):  # an env graded by likelihood: how likely the model finds them
        _print_reference_scores(config, trajectories)
    for report in eval_reports(config.env_id, trajectories):  # what the env's package adds (Waltz: ASR, ORR, ...)
        Console(highlight=False, width=max(console.width, 200)).print(report)
    if config.out:
        console.print(f"wrote {len(trajectories)} trajectories to {escape(config.out)}")


def _print_rollout_summary(config: Any, stats: Any, episodes: int, failed: int, retried: int) -> None:
    """The table of a rollout: ``episodes`` played (``failed`` of them with an error in the end,
    ``retried`` of them played again after an infrastructure fault, ``episode_retries`` times at
    most); the rest is over trajectories, of which a multi-agent episode has one per agent."""
    summary = stats.summary()
    table = Table(
        title=f"{config.env_id} · {config.model} · {config.backend} · split {config.split}", title_justify="left"
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("episodes", str(episodes))
    if stats.episodes != episodes:  # several agents: their trajectories
        table.add_row("agent trajectories", str(stats.episodes))
    table.add_row("success rate", f"{summary['rollout/success_rate']:.1%}")
    table.add_row("mean reward", f"{summary['rollout/reward_mean']:.3f}")
    table.add_row("mean turns", f"{summary['rollout/turns_mean']:.2f}")
    table.add_row("truncated", str(stats.truncated))
    causes = ", ".join(f"{cause} {n}" for cause, n in stats.failure_causes.most_common()) or "none"
    table.add_row("failures", f"{failed} ({causes})")
    table.add_row("played again after a fault", str(retried))
    table.add_row("generated tokens", str(stats.generated_tokens))
    table.add_row("tokens/s", f"{summary['perf/rollout_tokens_per_s']:.1f}")
    table.add_row("seconds", f"{stats.seconds:.1f}")
    console.print(table)


def _print_reference_scores(config: Any, trajectories: list[Any]) -> None:
    from agentrl.build import load_tokenizer
    from agentrl.model_paths import resolve_model
    from agentrl.trainers.models import load_reference_model, pad_token_id, score_references

    path = resolve_model(config.model)
    scores = score_references(
        load_reference_model(path, dtype=config.dtype), trajectories, pad_token_id(load_tokenizer(path))
    )
    if scores is None:  # every episode with a reference failed
        return
    table = Table(title="reference answers (info['reference']), scored by the model", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("scored episodes", str(scores.trajectories))
    table.add_row("NLL per token after the episode", f"{scores.nll:.4f}")
    table.add_row(f"multi-sample bound NLL per token (groups of {config.group_size})", f"{scores.bound_nll:.4f}")
    console.print(table)
