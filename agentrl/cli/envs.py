"""``agentrl envs``, ``agentrl check`` and ``agentrl play``: list the registered envs, check one against
the env contract, play one in the terminal."""

from __future__ import annotations

import contextlib
import enum
import io
import json
import sys
from dataclasses import dataclass
from typing import Annotated, Any

import gymnasium as gym
import typer
from pettingzoo import ParallelEnv
from rich.markup import escape
from rich.table import Table
from rich.text import Text

import agentrl
from agentrl.cli.common import (
    KwargOption,
    console,
    err_console,
    fail,
    make_env_or_exit,
    parse_kwargs,
    print_message,
    read_reply,
)
from agentrl.env import as_agent_env
from agentrl.registry import is_multiagent, lazy_namespaces, load_plugins
from agentrl.suggest import did_you_mean
from agentrl.types import Message

DEFAULT_RANDOM_MAX_TURNS = 20
"""How many turns a random agent plays when neither ``--max-turns`` nor the env sets a limit."""


class AgentKind(enum.StrEnum):
    """Who plays in ``agentrl play``."""

    human = "human"
    random = "random"


class Split(enum.StrEnum):
    """The task split an env draws from (passed to the env as ``split=``)."""

    train = "train"
    test = "test"


def envs_command(
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Only ids in this namespace, e.g. agentrl.")
    ] = None,
) -> None:
    """List the registered message envs with a one-line description each, multi-agent ones with
    their agents."""
    # A hub's namespace (textarena/: hundreds of games) is listed when asked for by name.
    hubs = [] if namespace else lazy_namespaces()
    ids = [i for i in agentrl.registered_ids(namespace) if i.partition("/")[0] not in hubs]
    table = Table(title="agentrl environments", title_justify="left")
    table.add_column("id", style="bold cyan", no_wrap=True)
    table.add_column("description")
    for env_id in ids:
        try:
            description = Text(agentrl.describe(env_id))
        except Exception as e:  # noqa: BLE001 - one broken env must not hide the others
            description = Text(f"could not load: {type(e).__name__}: {e}", style="red")
        table.add_row(env_id, description)
    if ids or not namespace:
        console.print(table)
    multiagent = [i for i in agentrl.multiagent_ids(namespace) if i.partition("/")[0] not in hubs]
    if multiagent:
        _print_multiagent_envs(multiagent)
    for hub in hubs:
        single, multi = len(agentrl.registered_ids(hub)), len(agentrl.multiagent_ids(hub))
        count = single + multi
        kind = "multi-agent " if not single else "" if not multi else "single- and multi-agent "
        console.print(
            f"{hub}/: {count} more {kind}env{'s' if count > 1 else ''}: agentrl envs -n {hub}"
            if count
            else f"{hub}/: none here (its package is not installed: docs/ecosystem.md)"
        )
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
            with contextlib.redirect_stdout(io.StringIO()):  # a game that prints as it is made (TextArena's)
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
