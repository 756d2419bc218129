"""``check_env``: does an env keep the message-env contract?

Run it on every env you write (``agentrl check ENV_ID`` does it from the shell). It plays a few
short episodes with garbage and random replies and raises :class:`EnvCheckError`, saying what was
expected and what came, at the first breach. It takes an env of either style: an
:class:`~agentrl.env.AgentEnv` (``start`` / ``respond``, or ``reset`` / ``step`` overridden the
gymnasium way) or a plain ``gymnasium.Env`` speaking messages, wrapped or not; the checks run on
what :func:`~agentrl.env.as_agent_env` makes of it, as the rollout does. What it checks:

- the env is one of those, and its ``__init__`` ran ``AgentEnv.__init__``;
- the spaces are message spaces and the declared tools have valid schemas;
- ``reset`` returns ``(list[Message], dict)`` with at least one message, and the same seed gives
  the same observation (the task is drawn from ``self.np_random``);
- ``step`` returns ``(list[Message], float, bool, bool, dict)`` for garbage replies (empty, random
  text, malformed tool calls, wrong tool arguments, a huge reply) and never raises on them;
- ``areset`` / ``astep`` agree with ``reset`` / ``step`` on the same seed and replies;
- ``close`` works.

:func:`check_multiagent_env` does the same for a multi-agent env (a PettingZoo ``ParallelEnv`` or
``AECEnv`` speaking messages per agent, :mod:`agentrl.multiagent`): PettingZoo's own conformance
tests, then agentrl's rules (its docstring lists them); ``agentrl check`` runs it on multi-agent ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import math
import traceback
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import gymnasium as gym
from pettingzoo import AECEnv, ParallelEnv

from agentrl.env import AgentEnv, GymnasiumAdapter, MessagesSpace, ReplySpace, as_agent_env
from agentrl.tools import Tool
from agentrl.types import ROLES, Message

GARBAGE_REPLIES: tuple[str, ...] = (
    "",
    "   ",
    "asdf qwer zxcv 12 + ) (",
    "<tool_call>{not json</tool_call>",
    '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
    "<tool_call>",
    '{"name": 3, "arguments": []}',
    "\x00\ud800 ☃ 🎲",
    "x" * 20_000,
)


class EnvCheckError(AssertionError):
    """An env broke the message-env contract; the message says what was expected and what came."""


def check_env(env: gym.Env[Any, Any], seed: int = 0, episodes: int = 3, max_steps: int = 12) -> None:
    """Check ``env`` against the message-env contract; raise :class:`EnvCheckError` on a breach.

    ``env`` is an :class:`~agentrl.env.AgentEnv` or a ``gymnasium.Env`` speaking messages, wrapped
    or not; the checks run on ``as_agent_env(env)``. ``episodes`` episodes of at most
    ``max_steps`` steps are played with garbage replies and with ``env.action_space.sample()``.

    >>> import agentrl
    >>> agentrl.check_env(agentrl.make("agentrl/Calculator-v0"))  # doctest: +SKIP
    """
    try:
        base = as_agent_env(env)
    except TypeError as e:
        raise EnvCheckError(str(e)) from e
    adapted = isinstance(base, GymnasiumAdapter)
    name = base._env_name
    # AgentEnv.__init__ sets _episode_over, whatever else a subclass's __init__ does.
    if not hasattr(base, "_episode_over"):
        _fail(
            f"{name}.__init__ to call super().__init__() (AgentEnv sets up its tools, spaces and turn count there)",
            "an instance without them",
        )
    if not isinstance(base.observation_space, MessagesSpace):
        _fail(f"{name}.observation_space must be a MessagesSpace", repr(base.observation_space))
    if not isinstance(base.action_space, ReplySpace):
        _fail(f"{name}.action_space must be a ReplySpace", repr(base.action_space))
    _check_tools(name, base.tools)

    result = base.reset(seed=seed)
    if adapted:
        _check_speaks_messages(name, result)
    first = _check_reset(name, result, "reset(seed)")
    again = _check_reset(name, base.reset(seed=seed), "reset(seed)")
    # [0], not .observation: a reset overridden the gymnasium way returns a plain tuple.
    if first[0] != again[0]:
        _fail(
            f"{name}.reset(seed={seed}) to give the same observation twice (draw the task from "
            "self.np_random, which reset seeds)",
            f"{_show(first[0])} and then {_show(again[0])}",
        )

    for reply in GARBAGE_REPLIES + tuple(_bad_tool_calls(base.tools)):
        base.reset(seed=seed)
        _check_step(name, base, reply, adapted)

    for episode in range(episodes):
        base.reset(seed=seed + 1 + episode)
        for _ in range(max_steps):
            step = _check_step(name, base, base.action_space.sample(), adapted)
            if step[2] or step[3]:
                break

    replies = [GARBAGE_REPLIES[2], *(_bad_tool_calls(base.tools)[:1]), GARBAGE_REPLIES[0]]
    sync_run = _play(base, seed, replies)
    async_run = asyncio.run(_aplay(base, seed, replies))
    if sync_run != async_run:
        _fail(
            f"{name}.areset/astep to agree with reset/step on the same seed and replies",
            f"sync {_show(sync_run)} but async {_show(async_run)}",
        )

    try:
        base.close()
    except Exception as e:
        _fail(f"{name}.close() to succeed", f"{type(e).__name__}: {e}")


MultiAgentEnv = ParallelEnv[Any, Any, Any] | AECEnv[Any, Any, Any]

PETTINGZOO_RECOMMENDATIONS: tuple[str, ...] = (
    r"(Observation|Action) space for each agent probably should be gymnasium\.spaces\.box",
    r"Observation is not a NumPy array",
    # LLM games name their agents by role ("conversation", "feedback"), not "player_0".
    r"We recommend agents to be named in the format",
)
"""PettingZoo test warnings silenced by :func:`check_multiagent_env`: advice for numpy envs that
message envs do not follow by design. Every other PettingZoo warning is shown."""


def check_multiagent_env(
    env_or_factory: MultiAgentEnv | Callable[[], MultiAgentEnv], seed: int = 0, cycles: int = 50
) -> None:
    """Check a multi-agent message env; raise :class:`EnvCheckError` on a breach.

    ``env_or_factory`` is a PettingZoo ``ParallelEnv`` or ``AECEnv``, or a function of no arguments
    making one (``lambda: agentrl.make_multiagent(id)``); PettingZoo's seed test needs the function,
    so it runs only when given one. What it checks, in this order:

    - PettingZoo's own conformance tests: ``parallel_api_test`` or ``api_test``, then
      ``parallel_seed_test`` or ``seed_test``, for ``cycles`` cycles, with the warnings of
      :data:`PETTINGZOO_RECOMMENDATIONS` silenced. A failure is re-raised with the env's name (and,
      when one of the rules below sees what went wrong, that clearer message instead);
    - ``possible_agents`` is listed, each observation space is a ``MessagesSpace`` and each action
      space a ``ReplySpace`` (the agent layer reads its ``tools`` and ``reply_prefix``);
    - every observation an agent gets is a list of :class:`~agentrl.types.Message` (a
      :class:`~agentrl.multiagent.MessageList`) lying in its observation space;
    - rewards are finite floats, terminations and truncations bools, infos dicts that
      ``json.dumps`` can write (trajectories are written as JSON);
    - an episode played with the action spaces' ``sample()`` replies ends within ``cycles`` cycles
      (a cycle is one step of a ``ParallelEnv``, one turn of each agent of an ``AECEnv``);
    - ``reset(seed=seed)`` twice gives the same first observations;
    - ``close`` works.

    >>> import agentrl
    >>> agentrl.check_multiagent_env(lambda: agentrl.make_multiagent("agentrl/Negotiation-v0"))  # doctest: +SKIP
    """
    is_env = isinstance(env_or_factory, (ParallelEnv, AECEnv)) or not callable(env_or_factory)
    factory = None if is_env else env_or_factory
    env = env_or_factory if factory is None else factory()
    if not isinstance(env, (ParallelEnv, AECEnv)):
        _fail(
            "a pettingzoo.ParallelEnv or pettingzoo.AECEnv, or a function of no arguments making one "
            "(for a single-agent env, use agentrl.check_env)",
            _show(env),
        )
    name = _multiagent_name(env)
    try:
        _pettingzoo_tests(env, factory, cycles)
    except Exception as e:  # noqa: BLE001 - re-raised below, with the env's name and a hint
        test, where = _pettingzoo_failure(e)
        try:  # the rules below often say more plainly what the PettingZoo test tripped on
            _check_message_rules(name, env, seed, cycles)
        except EnvCheckError as clearer:
            raise EnvCheckError(f"{clearer} (PettingZoo's {test} failed too: {where})") from e
        except Exception:  # noqa: BLE001, S110 - no clearer message; PettingZoo's own is raised below
            pass
        rerun = f"run pettingzoo.test.{test}(env) to see the traceback"
        if isinstance(e, AssertionError):
            raise EnvCheckError(
                f"{name} failed PettingZoo's {test}: {where}. This is one of PettingZoo's API rules "
                f"(https://pettingzoo.farama.org/api/); {rerun}."
            ) from e
        raise EnvCheckError(f"{name} raised {where} inside PettingZoo's {test}; {rerun}.{_pettingzoo_hint(e)}") from e
    _check_message_rules(name, env, seed, cycles)
    try:
        env.close()
    except Exception as e:
        _fail(f"{name}.close() to succeed", f"{type(e).__name__}: {e}")


def _multiagent_name(env: MultiAgentEnv) -> str:
    name = type(env.unwrapped).__name__
    if isinstance(env, AECEnv) and isinstance(env.unwrapped, ParallelEnv):
        return f"{name} (as an AECEnv)"
    if isinstance(env, ParallelEnv) and isinstance(env.unwrapped, AECEnv):
        return f"{name} (as a ParallelEnv)"
    return name


def _pettingzoo_tests(env: MultiAgentEnv, factory: Callable[[], MultiAgentEnv] | None, cycles: int) -> None:
    # Imported here: pettingzoo.test imports pytest and PettingZoo's example envs when they are
    # installed, a cost only a check should pay, not every `import agentrl`.
    from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test, seed_test

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):  # "Passed API test"
        for pattern in PETTINGZOO_RECOMMENDATIONS:
            warnings.filterwarnings("ignore", message=pattern)
        if isinstance(env, ParallelEnv):
            parallel_api_test(env, num_cycles=cycles)
            if factory is not None:
                parallel_seed_test(factory, num_cycles=cycles)
        else:
            api_test(env, num_cycles=cycles)
            if factory is not None:
                seed_test(factory, num_cycles=cycles)


def _pettingzoo_failure(error: Exception) -> tuple[str, str]:
    """Which PettingZoo test failed, and what it said (its source line when it said nothing)."""
    frames = traceback.extract_tb(error.__traceback__)
    test = "api_test"
    for frame in frames:
        if frame.name in ("api_test", "parallel_api_test", "seed_test", "parallel_seed_test"):
            test = frame.name
    said = str(error) or (f"`{frames[-1].line}` failed" if frames else repr(error))
    where = said if isinstance(error, AssertionError) else f"{type(error).__name__}: {said}"
    return test, where


def _pettingzoo_hint(error: Exception) -> str:
    if isinstance(error, AttributeError) and "dtype" in str(error):
        return (
            " PettingZoo compares each observation's dtype with its space's: return observations as "
            "agentrl.multiagent.MessageList, a list of messages with the dtype it looks for."
        )
    return ""


def _check_message_rules(name: str, env: MultiAgentEnv, seed: int, cycles: int) -> None:
    agents = getattr(env, "possible_agents", None)
    if not agents:
        _fail(f"{name}.possible_agents to list every agent (the rollout gives each one a trajectory)", _show(agents))
    for agent in agents:
        if not isinstance(env.observation_space(agent), MessagesSpace):
            _fail(
                f"{name}.observation_space({agent!r}) to be an agentrl.MessagesSpace",
                _show(env.observation_space(agent)),
            )
        if not isinstance(env.action_space(agent), ReplySpace):
            _fail(
                f"{name}.action_space({agent!r}) to be an agentrl.ReplySpace (the agent layer reads its "
                "tools and reply_prefix; pass them to ReplySpace(tools=..., reply_prefix=...))",
                _show(env.action_space(agent)),
            )
    first = _first_observations(name, env, seed)
    again = _first_observations(name, env, seed)
    if first != again:
        _fail(
            f"{name}.reset(seed={seed}) to give the same first observations twice (draw the task from "
            "a generator seeded by reset, e.g. gymnasium.utils.seeding.np_random(seed))",
            f"{_show(first)} and then {_show(again)}",
        )
    for episode in range(2):
        if isinstance(env, ParallelEnv):
            _play_parallel(name, env, seed + 1 + episode, cycles)
        else:
            _play_aec(name, env, seed + 1 + episode, cycles)


def _first_observations(name: str, env: MultiAgentEnv, seed: int) -> Any:
    call = f"reset(seed={seed})"
    if isinstance(env, ParallelEnv):
        result = env.reset(seed=seed)
        if not (isinstance(result, tuple) and len(result) == 2 and all(isinstance(d, dict) for d in result)):
            _fail(f"{name}.{call} to return (observations, infos), two dicts keyed by agent", _show(result))
        observations, infos = result
        for agent in env.agents:
            if agent not in observations:
                _fail(f"{name}.{call} to give every live agent an observation", f"none for {agent!r}")
        for agent, observation in observations.items():
            _check_agent_observation(name, env, call, agent, observation)
        for agent, info in infos.items():
            _check_info(name, call, agent, info)
        return list(env.agents), observations
    result = env.reset(seed=seed)
    if result is not None:
        _fail(f"{name}.{call} of an AECEnv to return None (agents read env.observe(agent))", _show(result))
    observations = {agent: env.observe(agent) for agent in env.agents}
    for agent, observation in observations.items():
        _check_agent_observation(name, env, f"observe({agent!r}) after {call}", agent, observation)
    for agent in env.agents:
        _check_info(name, call, agent, env.infos[agent])
    return list(env.agents), env.agent_selection, observations


def _play_parallel(name: str, env: ParallelEnv[Any, Any, Any], seed: int, cycles: int) -> None:
    env.reset(seed=seed)
    _seed_action_spaces(env, seed)
    for step in range(cycles):
        if not env.agents:
            return
        actions = {agent: env.action_space(agent).sample() for agent in env.agents}
        call = f"step(actions) #{step + 1} after reset(seed={seed})"
        result = env.step(actions)
        if not (isinstance(result, tuple) and len(result) == 5 and all(isinstance(d, dict) for d in result)):
            _fail(
                f"{name}.{call} to return (observations, rewards, terminations, truncations, infos), "
                "five dicts keyed by agent",
                _show(result),
            )
        observations, rewards, terminations, truncations, infos = result
        for agent, observation in observations.items():
            _check_agent_observation(name, env, call, agent, observation)
        for agent in actions:
            _check_outcome(name, call, agent, rewards, terminations, truncations, infos)
    if env.agents:
        _never_ends(name, cycles, "steps", env.agents)


def _play_aec(name: str, env: AECEnv[Any, Any, Any], seed: int, cycles: int) -> None:
    env.reset(seed=seed)
    _seed_action_spaces(env, seed)
    limit = cycles * len(env.possible_agents)
    for turn, agent in enumerate(env.agent_iter(limit)):
        call = f"last() at turn {turn + 1} ({agent!r}) after reset(seed={seed})"
        observation, reward, terminated, truncated, info = env.last()
        _check_agent_observation(name, env, call, agent, observation)
        _check_outcome(name, call, agent, {agent: reward}, {agent: terminated}, {agent: truncated}, {agent: info})
        env.step(None if terminated or truncated else env.action_space(agent).sample())
        after = f"step at turn {turn + 1} ({agent!r}) after reset(seed={seed})"
        for other in env.agents:
            _check_outcome(name, after, other, env.rewards, env.terminations, env.truncations, env.infos)
    if env.agents:
        _never_ends(name, limit, "turns", env.agents)


def _seed_action_spaces(env: MultiAgentEnv, seed: int) -> None:
    for i, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(seed + i)


def _never_ends(name: str, limit: int, unit: str, live: list[Any]) -> None:
    _fail(
        f"an episode of {name} played with the action spaces' sample() replies to end within {limit} {unit} "
        "(end it with a turn or round limit: terminations for a rule of the game, truncations for a cut)",
        f"agents {_show(list(live))} still live after {limit} {unit}",
    )


def _check_agent_observation(name: str, env: MultiAgentEnv, call: str, agent: Any, observation: Any) -> None:
    if not (isinstance(observation, list) and all(isinstance(m, Message) for m in observation)):
        _fail(
            f"{name}.{call} to give {agent!r} a list of agentrl.Message as observation (the new messages "
            "since its last turn, as an agentrl.multiagent.MessageList)",
            _show(observation),
        )
    _check_messages(name, f"{call} for {agent!r}", observation)
    space = env.observation_space(agent)
    if not space.contains(observation):
        _fail(
            f"{agent!r}'s observation from {name}.{call} to lie in its observation space {space!r}", _show(observation)
        )


def _check_outcome(
    name: str,
    call: str,
    agent: Any,
    rewards: dict[Any, Any],
    terminations: dict[Any, Any],
    truncations: dict[Any, Any],
    infos: dict[Any, Any],
) -> None:
    for label, table in (("reward", rewards), ("termination", terminations), ("truncation", truncations)):
        if agent not in table:
            _fail(f"{name}.{call} to give {agent!r}, who acted, a {label}", f"{label}s for {_show(list(table))}")
    reward = rewards[agent]
    if not isinstance(reward, (int, float)) or isinstance(reward, bool) or not math.isfinite(reward):
        _fail(f"{name}.{call} to give {agent!r} a finite float reward", _show(reward))
    for label, flag in (("termination", terminations[agent]), ("truncation", truncations[agent])):
        if not isinstance(flag, bool):
            _fail(f"{name}.{call} to give {agent!r} a bool {label}", _show(flag))
    if agent in infos:
        _check_info(name, call, agent, infos[agent])


def _check_info(name: str, call: str, agent: Any, info: Any) -> None:
    if not isinstance(info, dict):
        _fail(f"{name}.{call} to give {agent!r} an info dict", _show(info))
    try:
        json.dumps(info)
    except (TypeError, ValueError) as e:
        _fail(
            f"{name}.{call} to give {agent!r} an info that json.dumps can write (trajectories are written "
            "as JSON; keep infos to str, numbers, bools, None, lists and dicts)",
            f"{_show(info)}, which fails with {type(e).__name__}: {e}",
        )


def _check_tools(name: str, tools: Sequence[Any]) -> None:
    names = set()
    for t in tools:
        if not isinstance(t, Tool):
            _fail(f"{name}.tools to hold agentrl.Tool objects (use @agentrl.tool)", repr(t))
        params = t.parameters
        if not t.name or params.get("type") != "object" or not isinstance(params.get("properties"), dict):
            _fail(f"tool {t.name!r} of {name} to have a name and an object schema", repr(params))
        if t.name in names:
            _fail(f"tool names of {name} to be unique", f"{t.name!r} twice")
        names.add(t.name)


def _check_reset(name: str, result: Any, call: str) -> Any:
    if not (isinstance(result, tuple) and len(result) == 2):
        _fail(f"{name}.{call} to return (observation, info)", _show(result))
    observation, info = result
    _check_messages(name, call, observation)
    if not observation:
        _fail(f"{name}.{call} to return at least one message (the task)", "an empty list")
    if not isinstance(info, dict):
        _fail(f"{name}.{call} to return an info dict", _show(info))
    return result


def _check_speaks_messages(name: str, result: Any) -> None:
    observation = result[0] if isinstance(result, tuple) and len(result) == 2 else result
    if not (isinstance(observation, list) and all(isinstance(m, Message) for m in observation)):
        _fail(
            f"{name}, a gymnasium.Env, to speak messages: reset and step return a list of "
            "agentrl.Message as observation (subclass agentrl.AgentEnv to get the spaces and tool "
            "calls for free)",
            f"the observation {_show(observation)} from reset(seed)",
        )


def _check_step(name: str, env: AgentEnv, reply: str, adapted: bool = False) -> tuple[Any, ...]:
    call = f"step({_show(reply)})"
    try:
        result = env.step(reply)
    except Exception as e:
        hint = ""
        if adapted and isinstance(e, (AttributeError, TypeError)):  # as if the reply were a str
            hint = " (a gymnasium env's step gets the reply as an assistant agentrl.Message; its text is .content)"
        raise EnvCheckError(
            f"Expected {name}.{call} to answer a bad reply with an observation, but it raised "
            f"{type(e).__name__}: {e}{hint}. Answer bad replies with a message telling the model "
            "what was wrong."
        ) from e
    if not (isinstance(result, tuple) and len(result) == 5):
        _fail(f"{name}.{call} to return (observation, reward, terminated, truncated, info)", _show(result))
    observation, reward, terminated, truncated, info = result
    _check_messages(name, call, observation)
    if not isinstance(reward, (int, float)) or isinstance(reward, bool) or not math.isfinite(reward):
        _fail(f"{name}.{call} to return a finite float reward", _show(reward))
    for label, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, bool):
            _fail(f"{name}.{call} to return a bool {label}", _show(flag))
    if not isinstance(info, dict):
        _fail(f"{name}.{call} to return an info dict", _show(info))
    return tuple(result)


def _check_messages(name: str, call: str, observation: Any) -> None:
    if not isinstance(observation, list):
        _fail(f"{name}.{call} to return a list of Message as observation", _show(observation))
    for message in observation:
        if not isinstance(message, Message):
            _fail(f"{name}.{call} to return only agentrl.Message objects", _show(message))
        if message.role not in ROLES or not isinstance(message.content, str):
            _fail(f"{name}.{call} to return messages with a role in {ROLES} and str content", _show(message))
        if message.role == "assistant":
            _fail(f"{name}.{call} not to speak as the assistant (that is the agent's role)", _show(message))


def _bad_tool_calls(tools: Sequence[Tool]) -> list[str]:
    replies = []
    for t in tools:
        replies.append(f'<tool_call>{{"name": "{t.name}", "arguments": {{"no_such_arg": [1, 2]}}}}</tool_call>')
        replies.append(f'<tool_call>{{"name": "{t.name}", "arguments": "not an object"}}</tool_call>')
    return replies


def _play(env: AgentEnv, seed: int, replies: list[str]) -> list[Any]:
    record: list[Any] = [env.reset(seed=seed)[0]]
    for reply in replies:
        observation, reward, terminated, truncated, _ = env.step(reply)
        record.append((observation, reward, terminated, truncated))
        if terminated or truncated:
            break
    return record


async def _aplay(env: AgentEnv, seed: int, replies: list[str]) -> list[Any]:
    record: list[Any] = [(await env.areset(seed=seed))[0]]
    for reply in replies:
        observation, reward, terminated, truncated, _ = await env.astep(reply)
        record.append((observation, reward, terminated, truncated))
        if terminated or truncated:
            break
    return record


def _fail(expected: str, got: str) -> NoReturn:
    raise EnvCheckError(f"Expected {expected}; got {got}.")


def _show(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
