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

New commands are plain functions decorated with ``@app.command()``; the helpers here
(:func:`parse_kwargs`, :func:`make_env_or_exit`, :func:`print_message`) are meant for them.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import json
import os
import signal
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn, TextIO

import click
import gymnasium as gym
import typer
import typer.core
from pettingzoo import ParallelEnv
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

import agentrl
from agentrl.config import ConfigError, load_config
from agentrl.env import as_agent_env
from agentrl.envs.waltz.cli import waltz_table_command
from agentrl.faults import (
    RunFailed,
    failure_message,
    native_stderr_to,
    resume_command,
    vllm_logs_to,
    write_traceback,
)
from agentrl.metrics import policy_metric
from agentrl.registry import is_multiagent, load_plugins
from agentrl.sandboxes.cli import sandbox_app
from agentrl.suggest import did_you_mean
from agentrl.types import Message

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


class CleanErrors(typer.core.TyperGroup):
    """The one place where errors become exit codes, for every command and sub-command.

    :data:`USAGE_ERRORS` print their message and exit 2, :data:`RUN_ERRORS` exit 1, Ctrl-C exits
    130; anything else is a bug and keeps its traceback. ``AGENTRL_TRACEBACK=1`` re-raises usage
    errors too, for the traceback.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
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


app = typer.Typer(
    name="agentrl",
    help="Train LLM agents with reinforcement learning: list, check and play message environments.",
    cls=CleanErrors,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
WALTZ = "agentrl/Waltz-v0"

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)
app.add_typer(sandbox_app, name="sandbox")

ROLE_STYLES: dict[str, str] = {"system": "magenta", "user": "cyan", "assistant": "green", "tool": "yellow"}
DEFAULT_RANDOM_MAX_TURNS = 20
"""How many turns a random agent plays when neither ``--max-turns`` nor the env sets a limit."""

KwargOption = Annotated[
    list[str],
    typer.Option(
        "--kwarg",
        "-k",
        help="Env constructor argument as key=value (repeatable); the value is read as JSON if it "
        "parses, else as a string.",
    ),
]


class AgentKind(enum.StrEnum):
    """Who plays in ``agentrl play``."""

    human = "human"
    random = "random"


class Split(enum.StrEnum):
    """The task split an env draws from (passed to the env as ``split=``)."""

    train = "train"
    test = "test"


# --- helpers for commands ---------------------------------------------------------------------


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


# --- commands ---------------------------------------------------------------------------------


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


@app.command("envs")
def envs_command(
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Only ids in this namespace, e.g. agentrl.")
    ] = None,
) -> None:
    """List the registered message envs with a one-line description each, multi-agent ones with
    their agents."""
    ids = agentrl.registered_ids(namespace)
    table = Table(title="agentrl environments", title_justify="left")
    table.add_column("id", style="bold cyan", no_wrap=True)
    table.add_column("description")
    for env_id in ids:
        try:
            description = Text(agentrl.describe(env_id))
        except Exception as e:  # noqa: BLE001 - one broken env must not hide the others
            description = Text(f"could not load: {type(e).__name__}: {e}", style="red")
        table.add_row(env_id, description)
    console.print(table)
    multiagent = agentrl.multiagent_ids(namespace)
    if multiagent:
        _print_multiagent_envs(multiagent)
    if not ids and not multiagent:
        known = {i.split("/")[0] for i in [*agentrl.registered_ids(), *agentrl.multiagent_ids()] if "/" in i}
        hint = did_you_mean(namespace, sorted(known)) if namespace else ""
        console.print(
            "No message envs are registered"
            + (f" in namespace {namespace!r}." if namespace else ".")
            + (f" {hint}" if hint else "")
        )
    failed = load_plugins()  # already loaded above; each failure was warned about then
    if failed:
        err_console.print(Text(f"{len(failed)} env plugin(s) failed to load: {sorted(failed)}", style="yellow"))


def _print_multiagent_envs(ids: list[str]) -> None:
    table = Table(title="agentrl multi-agent environments (PettingZoo)", title_justify="left")
    table.add_column("id", style="bold cyan", no_wrap=True)
    table.add_column("agents", style="bold")
    table.add_column("description")
    for env_id in ids:
        try:
            env = agentrl.make_multiagent(env_id)
        except Exception as e:  # noqa: BLE001 - one broken env must not hide the others
            table.add_row(env_id, "", Text(f"could not load: {type(e).__name__}: {e}", style="red"))
            continue
        try:
            agents = ", ".join(map(str, env.possible_agents))
            doc = (type(env.unwrapped).__doc__ or "").strip()
        finally:
            env.close()
        table.add_row(env_id, agents, Text(doc.splitlines()[0] if doc else ""))
    console.print(table)


@app.command("check")
def check_command(
    env_id: Annotated[str, typer.Argument(help="The env id, e.g. agentrl/Calculator-v0.")],
    seed: Annotated[int, typer.Option(help="Seed for the checker's resets.")] = 0,
    kwarg: KwargOption = [],  # noqa: B006 (typer reads the default; it is never mutated)
) -> None:
    """Run agentrl.check_env (or agentrl.check_multiagent_env on a multi-agent id) on one env:
    exit 0 if it passes, 1 with the reason if not."""
    kwargs = parse_kwargs(kwarg)
    if is_multiagent(env_id):
        _check_multiagent(env_id, kwargs, seed)
        return
    env = make_env_or_exit(env_id, kwargs)
    try:
        agentrl.check_env(env, seed=seed)
    except Exception as e:  # noqa: BLE001 - EnvCheckError, or the env itself raising inside the checker
        kind = "" if isinstance(e, agentrl.EnvCheckError) else f"{type(e).__name__}: "
        fail(f"{env_id} failed the check: {kind}{e}")
    finally:
        env.close()
    console.print(f"[bold green]passed[/]: {escape(env_id)} follows the agentrl env contract.")


def _check_multiagent(env_id: str, kwargs: dict[str, Any], seed: int) -> None:
    """``agentrl check`` on a multi-agent id: the env as registered and, for a ``ParallelEnv``,
    also as the ``AECEnv`` that ``make_multiagent(id, api="aec")`` makes of it."""
    try:
        env = agentrl.make_multiagent(env_id, **kwargs)
    except (TypeError, ValueError) as e:  # the env's arguments, as in make_env_or_exit
        fail(f"Could not make {env_id!r} with {kwargs}: {type(e).__name__}: {e}", code=2)
    agents = ", ".join(map(str, env.possible_agents))
    env.close()
    forms: list[tuple[Any, str]] = [(None, "a ParallelEnv" if isinstance(env, ParallelEnv) else "an AECEnv")]
    if isinstance(env, ParallelEnv):
        forms.append(("aec", "an AECEnv (api='aec')"))
    for api, form in forms:
        try:
            agentrl.check_multiagent_env(lambda api=api: agentrl.make_multiagent(env_id, api=api, **kwargs), seed=seed)
        except Exception as e:  # noqa: BLE001 - EnvCheckError, or the env itself raising inside the checker
            prefix = "" if isinstance(e, agentrl.EnvCheckError) else f"{type(e).__name__}: "
            fail(f"{env_id} failed the check as {form}: {prefix}{e}")
        tests = "parallel_api_test, parallel_seed_test" if "Parallel" in form else "api_test, seed_test"
        console.print(f"[green]ok[/]: as {escape(form)}: PettingZoo's {tests} and agentrl's rules")
    console.print(
        f"[bold green]passed[/]: {escape(env_id)} (agents {escape(agents)}) follows the agentrl multi-agent "
        "env contract: message observations in their spaces, ReplySpace actions, finite rewards, JSON infos, "
        "episodes that end, seeded resets."
    )


@dataclass
class EpisodeSummary:
    """One played episode, as the summary table shows it."""

    seed: int | None
    turns: int = 0
    reward: float = 0.0
    ended_by: str = ""


@app.command("play")
def play_command(
    env_id: Annotated[str, typer.Argument(help="The env id, e.g. agentrl/Calculator-v0.")],
    agent: Annotated[
        AgentKind, typer.Option(help="human: you type the replies; random: env.action_space.sample().")
    ] = AgentKind.human,
    seed: Annotated[int | None, typer.Option(help="Seed of the first episode; episode i uses seed + i.")] = None,
    episodes: Annotated[int, typer.Option(min=1, help="How many episodes to play.")] = 1,
    split: Annotated[Split | None, typer.Option(help="Task split, passed to the env as split=.")] = None,
    max_turns: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=f"Stop an episode after this many replies. Default: the env's own limit; for the "
            f"random agent at most {DEFAULT_RANDOM_MAX_TURNS}.",
        ),
    ] = None,
    kwarg: KwargOption = [],  # noqa: B006
) -> None:
    """Play an env in the terminal, as yourself or as a random agent.

    Type each reply over one or more lines and end it with an empty line.

    Call a tool with <tool_call>{"name": ..., "arguments": {...}}</tool_call> or with that JSON
    object alone.

    End of input (Ctrl-D, or the end of piped stdin) sends what was typed and ends the session.
    """
    kwargs = parse_kwargs(kwarg)
    if split is not None:
        kwargs["split"] = split.value
    env = as_agent_env(make_env_or_exit(env_id, kwargs))  # a plain gymnasium env plays as an AgentEnv
    turn_cap = max_turns
    if turn_cap is None and agent is AgentKind.random and getattr(env.unwrapped, "max_turns", None) is None:
        turn_cap = DEFAULT_RANDOM_MAX_TURNS  # a random agent may never finish an episode by itself
    if agent is AgentKind.human:
        _print_tools(env)
    summaries: list[EpisodeSummary] = []
    try:
        for episode in range(episodes):
            episode_seed = None if seed is None else seed + episode
            console.rule(
                f"{escape(env_id)} | episode {episode + 1}/{episodes}"
                + ("" if episode_seed is None else f" | seed {episode_seed}")
            )
            summary = _play_episode(env, agent, episode_seed, turn_cap)
            summaries.append(summary)
            if summary.ended_by == "end of input":
                break
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        _print_summary(summaries)
        raise typer.Exit(130) from None
    except Exception as e:  # noqa: BLE001 - the env raised: show it plainly, it is the env's bug to fix
        _print_summary(summaries)
        fail(f"{env_id} raised while playing: {type(e).__name__}: {e}")
    finally:
        env.close()
    _print_summary(summaries)


def _play_episode(env: gym.Env[Any, Any], agent: AgentKind, seed: int | None, turn_cap: int | None) -> EpisodeSummary:
    summary = EpisodeSummary(seed=seed)
    observation, info = env.reset(seed=seed)
    for message in observation:
        print_message(message)
    if info:
        console.print(Text(f"info {info}", style="dim"))
    while True:
        if turn_cap is not None and summary.turns >= turn_cap:
            summary.ended_by = f"turn cap ({turn_cap})"
            console.print(f"[yellow]stopped after {turn_cap} turns[/] (the turn cap; see --max-turns)")
            return summary
        if agent is AgentKind.random:
            action = env.action_space.sample()
            print_message(Message("assistant", action))
        else:
            action = read_reply(sys.stdin)
            if action is None:
                summary.ended_by = "end of input"
                console.print("[yellow]end of input: episode ended[/]")
                return summary
            if not sys.stdin.isatty():  # piped replies are not on the screen yet
                parse = getattr(env.unwrapped, "parse_reply", None)
                print_message(parse(action) if parse else Message("assistant", action))
        observation, reward, terminated, truncated, info = env.step(action)
        summary.turns += 1
        summary.reward += float(reward)
        for message in observation:
            print_message(message)
        _print_step(float(reward), bool(terminated), bool(truncated), info)
        if terminated or truncated:
            summary.ended_by = "terminated" if terminated else "truncated"
            return summary


def _print_tools(env: gym.Env[Any, Any]) -> None:
    tools = list(getattr(env.unwrapped, "tools", []) or [])
    if not tools:
        return
    table = Table(title="tools you can call", title_justify="left", show_header=True)
    table.add_column("name", style="bold yellow", no_wrap=True)
    table.add_column("parameters")
    table.add_column("description")
    for t in tools:
        params = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in t.parameters.get("properties", {}).items())
        table.add_row(t.name, params, t.description.splitlines()[0] if t.description else "")
    console.print(table)
    example = json.dumps(
        {"name": tools[0].name, "arguments": {k: "..." for k in tools[0].parameters.get("properties", {})}}
    )
    console.print(Text(f"Call one as <tool_call>{example}</tool_call>, or as the JSON object alone.", style="dim"))


def _print_step(reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> None:
    line = Text()
    line.append(f"reward {reward:g}", style="bold green" if reward > 0 else "bold red" if reward < 0 else "bold")
    line.append(f"  terminated {terminated}  truncated {truncated}")
    if info:
        line.append(f"  info {info}", style="dim")
    console.print(line)


def _print_summary(summaries: list[EpisodeSummary]) -> None:
    if not summaries:
        return
    table = Table(title="summary", title_justify="left")
    for column in ("episode", "seed", "turns", "return", "ended by"):
        table.add_column(column, justify="right" if column in ("episode", "turns", "return") else "left")
    for i, s in enumerate(summaries, start=1):
        table.add_row(str(i), "-" if s.seed is None else str(s.seed), str(s.turns), f"{s.reward:g}", s.ended_by)
    console.print(table)
    mean = sum(s.reward for s in summaries) / len(summaries)
    console.print(f"mean return {mean:g} over {len(summaries)} episode(s)")


@app.command("rollout")
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


@app.command("eval")
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
    from agentrl.run import RolloutConfig, rollout  # torch and transformers: not for `agentrl --help`

    given = [f"{k}={v}" for k, v in options.items() if v is not None]
    config = load_config(RolloutConfig, config_path, [f"env_id={env_id}", *given, *overrides])
    if not is_multiagent(config.env_id):  # a multi-agent env plays with one shared policy (mapping "all")
        agentrl.spec(config.env_id)  # an unknown env fails now, before the engine starts
    total = config.episodes + config.redundancy * (config.episodes // config.group_size)
    played = failed = 0

    def count(episode: list[Any]) -> str:
        nonlocal played, failed
        played += 1
        failed += any(t.error is not None for t in episode)
        return f"failed {failed}"

    if not sys.stdout.isatty():  # a file, a pipe, CI: a line at the start and at every tenth
        lines = _LineProgress()
        lines.line(f"{config.env_id} ({config.backend}): starting the engine, then {total} episodes")
        every = max(total // 10, 1)

        def advance(episode: list[Any], stats: Any) -> None:
            status = count(episode)
            if played % every == 0 or played == total:
                summary = stats.summary()
                lines.line(f"episodes {played}/{total}  success {summary['rollout/success_rate']:.0%}  {status}")

        trajectories, stats = rollout(config, on_episode=advance)  # no model, no server: CleanErrors
    else:
        with _bars() as progress:
            task = progress.add_task(f"{config.env_id} ({config.backend})", total=total, status="starting the engine")

            def advance(episode: list[Any], stats: Any) -> None:  # one tick per episode, whatever its agents
                status = f"success {stats.summary()['rollout/success_rate']:.0%}  {count(episode)}"
                progress.update(task, advance=1, status=status)

            trajectories, stats = rollout(config, on_episode=advance)  # no model, no server: CleanErrors
    _print_rollout_summary(config, stats, played, failed)
    if any(t.reference_ids for t in trajectories):  # an env graded by likelihood: how likely the model finds them
        _print_reference_scores(config, trajectories)
    if config.env_id == WALTZ:  # the safety metrics of WaltzRL (ASR, ORR, FTR, labels)
        from agentrl.envs.waltz.cli import print_eval_metrics

        print_eval_metrics(
            trajectories, Console(highlight=False, width=max(console.width, 200)), "one model, both roles"
        )
    if config.out:
        console.print(f"wrote {len(trajectories)} trajectories to {escape(config.out)}")


@app.command("train")
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
        progress = stack.enter_context(_train_progress())
        try:
            result = train(settings, progress.hooks())  # no model, no server: CleanErrors
        except USAGE_ERRORS:
            raise
        except Exception as e:  # a fault ended the run: one message, the traceback in the run's log
            write_traceback(e, settings.run_dir)
            arguments = [*([config] if config is not None else []), *(overrides or [])]
            raise RunFailed(failure_message(e, settings.run_dir, resume_command(arguments, settings.resume))) from e
    _print_train_summary(settings, result)


def _bars() -> Any:
    """Rich progress bars on stderr: description, bar, count, status, elapsed time."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
    )
    return Progress(*columns, console=err_console, transient=False)


def _train_progress() -> _TrainProgress | _LineProgress:
    """Progress bars on a terminal; plain lines when stdout is not one (a file, a pipe, CI)."""
    return _TrainProgress() if sys.stdout.isatty() else _LineProgress()


class _TrainProgress:
    """Progress bars for ``agentrl train``: one per phase (engine start, evaluations, training)."""

    def __init__(self) -> None:
        self.progress = _bars()
        self.task: Any = None

    def __enter__(self) -> _TrainProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def hooks(self) -> Any:
        from agentrl.train import Progress  # see train_command

        def on_phase(name: str, total: int) -> None:
            if self.task is not None:  # the phase before ended: its bar full, its clock stopped
                done = self.progress.tasks[self.task].completed
                self.progress.update(self.task, total=done or 1, completed=done or 1, status="done")
                self.progress.stop_task(self.task)
            self.task = self.progress.add_task(name, total=total or None, status="")

        def on_advance(info: dict[str, Any]) -> None:
            status = ""
            if "rollout/reward_mean" in info:
                status = f"reward {info['rollout/reward_mean']:.3f}  success {info['rollout/success_rate']:.0%}"
            self.progress.update(self.task, advance=1, status=status)

        return Progress(on_phase=on_phase, on_advance=on_advance)


class _LineProgress:
    """``agentrl train``'s progress as lines on stdout, each flushed: one when a phase starts and
    when it ends, one per training step (reward, success, seconds per step, time left) and one per
    evaluation (held-out success). For a log file, a pipe or CI, where bars would show nothing
    until the end."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out: TextIO | None = out or sys.stdout
        self.started = time.monotonic()
        self.phase: str | None = None
        self.phase_started = self.started
        self.total = self.done = 0

    def __enter__(self) -> _LineProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self._end_phase()

    def line(self, text: str) -> None:
        if self.out is None:
            return
        try:
            print(f"[{_clock(time.monotonic() - self.started)}] {text}", file=self.out, flush=True)
        except BrokenPipeError:  # the reader went away (`| head`): the run goes on without its lines
            if self.out is sys.stdout:  # and Python's own flush at exit must not fail either
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)
            self.out = None

    def _end_phase(self) -> None:
        if self.phase is not None:
            self.line(f"{self.phase}: done in {_clock(time.monotonic() - self.phase_started)}")
        self.phase = None

    def hooks(self) -> Any:
        from agentrl.train import Progress  # see train_command

        def on_phase(name: str, total: int) -> None:
            self._end_phase()
            self.phase, self.total, self.done, self.phase_started = name, total, 0, time.monotonic()
            unit = "steps" if name == "training" else "episodes"
            self.line(f"{name}" + (f" ({total} {unit})" if total else ""))

        def on_advance(info: dict[str, Any]) -> None:
            self.done += 1
            if "rollout/reward_mean" not in info:  # an evaluation's episode: the phase's end says it
                return
            per_step = (time.monotonic() - self.phase_started) / self.done
            left = f"  eta {_clock(per_step * (self.total - self.done))}" if self.total else ""
            self.line(
                f"step {self.done}/{self.total or '?'}  reward {info['rollout/reward_mean']:.3f}  "
                f"success {info['rollout/success_rate']:.0%}  {per_step:.1f} s/step{left}"
            )

        def on_result(metrics: dict[str, Any]) -> None:
            rates = {  # eval/success_rate, or eval/<policy>/success_rate per policy
                k.removeprefix("eval/").removesuffix("success_rate").rstrip("/"): v
                for k, v in metrics.items()
                if k.endswith("success_rate") and "vs_base" not in k
            }
            self.line("held-out " + "  ".join(f"{f'{p} ' if p else ''}success {v:.1%}" for p, v in rates.items()))

        return Progress(on_phase=on_phase, on_advance=on_advance, on_result=on_result)


def _clock(seconds: float) -> str:
    """``h:mm:ss``, as the progress bars show elapsed time."""
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


_EVAL_ROWS = (
    ("eval/success_rate", "success rate", "{:.1%}"),
    ("eval/reward_mean", "mean reward", "{:.3f}"),
    ("eval/episodes", "episodes", "{:.0f}"),
    ("eval/failed", "failed", "{:.0f}"),
    ("eval/reference_nll", "reference NLL per token", "{:.3f}"),
)
"""The held-out rows of ``agentrl train``'s summary: metric, label, format."""
_OPTIONAL_EVAL_ROWS = ("eval/reference_nll",)
"""Rows shown only by runs that log them (envs with reference answers)."""


def _print_train_summary(config: Any, result: Any) -> None:
    title = f"{config.rollout.env_id} · {config.rollout.model} · {config.trainer.algorithm} · {result.steps} steps"
    if result.eval_before is None and result.eval_after is None:  # eval_episodes 0: nothing to compare
        console.print(f"{escape(title)}\nheld-out evaluation: off (eval_episodes 0)")
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
    console.print(table)
    _print_run_files(result)


def _print_run_files(result: Any) -> None:
    console.print(f"run dir: {escape(str(result.run_dir))}")
    if result.model_dir is not None:
        console.print(f"trained model: {escape(str(result.model_dir))}")
    if result.plot is not None:
        console.print(f"curves: {escape(str(result.plot))}")


def _print_rollout_summary(config: Any, stats: Any, episodes: int, failed: int) -> None:
    """The table of a rollout: ``episodes`` played (``failed`` of them with an error); the rest is
    over trajectories, of which a multi-agent episode has one per agent."""
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


app.command("waltz-table")(waltz_table_command)


@app.command("serve")
def serve_command(
    env_ids: Annotated[list[str], typer.Argument(metavar="ENV_ID...", help="Registered env ids to serve.")],
    host: Annotated[str, typer.Option(help="Address to bind; other than loopback only with a token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8000,
    uds: Annotated[
        str | None, typer.Option(metavar="PATH", help="Serve on this Unix socket instead of host:port.")
    ] = None,
    token_file: Annotated[
        str | None, typer.Option(metavar="FILE", help="Bearer tokens, one per line (default: $AGENTRL_SERVER_TOKEN).")
    ] = None,
    allow_kwarg: Annotated[
        list[str] | None, typer.Option(metavar="NAME", help="An env kwarg a session may set (repeatable).")
    ] = None,
    max_sessions: Annotated[int, typer.Option(min=1, help="Most live sessions; past it 503.")] = 1024,
    idle_timeout: Annotated[float, typer.Option(help="Seconds before an unused session is closed.")] = 600.0,
    step_timeout: Annotated[float, typer.Option(help="Seconds one reset or step may take; past it 504.")] = 60.0,
    max_body: Annotated[int, typer.Option(metavar="BYTES", help="Largest request body; past it 413.")] = 1 << 20,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "info",
    docker: Annotated[bool, typer.Option("--docker", help="Run the server in a container, on a Unix socket.")] = False,
    image: Annotated[
        str | None,
        typer.Option(
            help="--docker: an image holding agentrl and the envs (default: this install in the sandbox image)."
        ),
    ] = None,
) -> None:
    """Serve envs over HTTP (FastAPI + uvicorn) for RemoteEnv and `rollout.env_url=` (docs/env-server.md)."""
    from agentrl.server import ServerLimits, load_tokens, serve  # FastAPI and uvicorn load only for this command

    limits = ServerLimits(max_sessions, idle_timeout, step_timeout, max_body)
    tokens = load_tokens(token_file)
    if docker:
        args = [
            f"--max-sessions={max_sessions}",
            f"--idle-timeout={idle_timeout}",
            f"--step-timeout={step_timeout}",
            f"--max-body={max_body}",
            f"--log-level={log_level}",
            *(f"--allow-kwarg={k}" for k in allow_kwarg or ()),
        ]
        _serve_in_docker(env_ids, image, uds, args, tokens)
        return
    serve(env_ids, host=host, port=port, uds=uds, tokens=tokens, limits=limits, allow_kwargs=allow_kwarg or (),
          log_level=log_level)  # fmt: skip


def _serve_in_docker(
    env_ids: list[str], image: str | None, uds: str | None, args: list[str], tokens: list[str]
) -> None:
    from agentrl.server.docker import DockerEnvServer

    server = DockerEnvServer(env_ids, image=image, socket_dir=os.path.dirname(uds) if uds else None,
                             serve_args=args, tokens=tokens)  # fmt: skip
    if uds and os.path.basename(uds) != "server.sock":
        fail(f"--docker serves on DIR/server.sock; pass --uds DIR/server.sock (got {uds}).", code=2)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the container goes with us (finally below)
    url = server.start()
    console.print(
        f"serving {', '.join(env_ids)} in container {server.container.name} at {url} (Ctrl-C stops it)", soft_wrap=True
    )
    try:
        code = server.wait()
        fail(f"the env server container exited with code {code}:\n{server.logs()}")
    finally:
        server.stop()


@app.command("dashboard")
def dashboard_command(
    sources: Annotated[
        list[str], typer.Argument(metavar="RUN_DIR...", help="Run directories (or trajectory .jsonl files) to show.")
    ],
    host: Annotated[str, typer.Option(help="Address to bind; other than loopback only with a token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8765,
    token_file: Annotated[
        str | None, typer.Option(metavar="FILE", help="Tokens, one per line (default: $AGENTRL_SERVER_TOKEN).")
    ] = None,
    tokenizer: Annotated[
        str | None, typer.Option(help="Decode token ids of trajectory files written without token texts (a model).")
    ] = None,
) -> None:
    """Serve the live dashboard of runs (curves, per-policy panels, trajectories) on 127.0.0.1."""
    import uvicorn

    from agentrl.dashboard import make_dashboard
    from agentrl.server import load_tokens
    from agentrl.server.run import check_bind

    tokens = load_tokens(token_file)
    check_bind(host, None, tokens)
    app = make_dashboard(sources, tokens=tokens, tokenizer=_load_tokenizer(tokenizer) if tokenizer else None)
    address = f"http://{host}:{port}/" + (f"?token={tokens[0]}" if tokens else "")
    console.print(f"dashboard of {', '.join(sources)}: {address}", soft_wrap=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


def _load_tokenizer(model: str) -> Any:
    from agentrl.build import load_tokenizer

    return load_tokenizer(model)


@app.command("plot")
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
    for stream in (sys.stdout, sys.stderr):  # env text may hold characters the terminal cannot show
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    app(prog_name="agentrl")


if __name__ == "__main__":
    main()
