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
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any, NoReturn

import gymnasium as gym

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
