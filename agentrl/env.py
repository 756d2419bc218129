"""The single-agent environment contract: :class:`AgentEnv`, a ``gymnasium.Env`` that talks in messages.

An observation is the list of *new* messages since the agent last acted: the system and user
messages at ``reset``, then the tool results or the user's feedback after each ``step``. An action
is the agent's reply, either its raw text (parsed for tool calls here) or an already parsed
assistant :class:`~agentrl.types.Message`.

A subclass writes two methods and may declare tools::

    class Echo(AgentEnv):
        '''Say the word you are given.'''

        def start(self, options):
            self.word = ["apple", "pear"][int(self.np_random.integers(2))]
            return [Message("user", f"Say {self.word}.")]

        def respond(self, reply):
            won = reply.content.strip() == self.word
            return Feedback([Message("user", "Right." if won else "Wrong.")], reward=float(won), terminated=True)

A reply with tool calls never reaches ``respond``: the base class runs the calls (without blocking
the event loop in ``astep``) and answers with one ``tool`` message per call, through
:meth:`AgentEnv.answer_tools`, which an env may override (to end the episode on a ``submit`` tool,
say). ``reset`` seeds ``self.np_random`` exactly as gymnasium does, so an env that draws its task
from ``self.np_random`` is deterministic under a seed.

``start`` / ``respond`` is the recommended way, but envs written the gymnasium way work too:

- an :class:`AgentEnv` subclass may override ``reset`` (calling ``super().reset(seed=seed)`` to
  seed ``self.np_random``) and ``step`` (returning the five-tuple; :meth:`AgentEnv.parse_reply`
  turns the action into a Message). ``areset`` / ``astep`` then play those overrides in a thread.
  Such a ``step`` answers its own tool calls and applies ``max_turns`` itself, if it wants to;
- a plain ``gymnasium.Env`` whose observations are lists of Message is made an :class:`AgentEnv`
  by :func:`as_agent_env` (see :class:`GymnasiumAdapter`), which the checker, the rollout and
  the trainer apply to every env they are given.
"""

from __future__ import annotations

import functools
import inspect
import random
import string
from collections.abc import Sequence
from typing import Any, NamedTuple, SupportsFloat

import gymnasium as gym
import numpy as np

from agentrl.threads import ENV_THREADS
from agentrl.tool_calls import format_tool_calls, parse_reply
from agentrl.tools import Tool, ToolResult, acall_tool, as_tool, call_tool
from agentrl.types import Message, ToolCall

Observation = list[Message]
Action = str | Message


class ResetResult(NamedTuple):
    """What ``reset`` returns; unpacks as gymnasium's ``(observation, info)``."""

    observation: Observation
    info: dict[str, Any]


class StepResult(NamedTuple):
    """What ``step`` returns; unpacks as gymnasium's five-tuple."""

    observation: Observation
    reward: SupportsFloat
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class Feedback(NamedTuple):
    """What :meth:`AgentEnv.respond` returns: the env's answer to one reply."""

    messages: Observation
    reward: float = 0.0
    terminated: bool = False
    info: dict[str, Any] = {}


class MessagesSpace(gym.Space[Observation]):
    """The observation space: a list of :class:`~agentrl.types.Message`."""

    def __init__(self, seed: int | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(isinstance(m, Message) for m in x)

    def sample(self, mask: Any = None, probability: Any = None) -> Observation:
        return [Message("user", _random_text(self.np_random, 12))]

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessagesSpace)


class ReplySpace(gym.Space[str]):
    """The action space: the agent's reply text, at most ``max_length`` characters.

    ``sample()`` is a random agent that knows the env's tools: it writes random text, well-formed
    calls with random arguments, and malformed calls, so ``agentrl play --agent random`` exercises
    the tool paths of an env before any model is involved.
    """

    def __init__(
        self, tools: Sequence[Tool] = (), max_length: int = 100_000, seed: int | None = None, reply_prefix: str = ""
    ):
        super().__init__(shape=None, dtype=None, seed=seed)
        self.tools = list(tools)
        self.max_length = max_length
        self.reply_prefix = reply_prefix
        """Text every reply starts with, written into the agent's prompt (a prefill); the agent
        layer (:class:`~agentrl.agents.ChatAgent`) puts it there and back in front of the reply."""

    def contains(self, x: Any) -> bool:
        if isinstance(x, Message):
            return x.role == "assistant"
        return isinstance(x, str) and len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        rng = self.np_random
        kind = rng.integers(4) if self.tools else 0
        if kind == 0:
            return _random_text(rng, int(rng.integers(1, 12)))
        if kind == 3:
            return "<tool_call>{" + _random_text(rng, 3) + "</tool_call>"
        tool_ = self.tools[int(rng.integers(len(self.tools)))]
        properties = tool_.parameters.get("properties", {})
        arguments = {k: _random_value(rng, v) for k, v in properties.items()}
        return format_tool_calls([ToolCall(tool_.name, arguments)])

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReplySpace) and other.max_length == self.max_length


class AgentEnv(gym.Env[Observation, Action]):
    """A gymnasium environment whose observations are messages and whose actions are replies.

    Subclasses implement :meth:`start` and :meth:`respond` (and may override :meth:`answer_tools`),
    or override ``reset`` / ``step`` the gymnasium way (see the module docstring). They may set the
    class attributes ``tools`` (callables or :class:`~agentrl.tools.Tool`), ``tool_format`` and
    ``tool_timeout``.
    A plain method of the class listed in ``tools`` (``tools = (run,)`` after ``def run(self, ...)``
    in the class body) becomes a tool bound to each instance, so it can reach the instance's own
    state, such as its sandbox.
    ``max_turns`` (a constructor argument) truncates an episode after that many replies.
    I/O-bound envs may override :meth:`areset` / :meth:`astep` with native ``async`` versions.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"]}
    tools: Sequence[Tool | Any] = ()
    tool_format: str = "auto"
    tool_timeout: float | None = 10.0
    max_tool_calls: int = 16
    """Most tool calls run per reply; the rest get one error message (a reply can hold thousands)."""

    def __init__(self, max_turns: int | None = None, render_mode: str | None = None):
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be a positive int or None, got {max_turns}.")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}.")
        self.max_turns = max_turns
        self.render_mode = render_mode
        self.tools = [as_tool(_bind_tool(self, t)) for t in type(self).tools]
        self.observation_space = MessagesSpace()
        self.action_space = ReplySpace(self.tools)
        self.messages: list[Message] = []
        self.turn = 0
        # None before the first reset, "" during an episode, why it ended after it.
        self._episode_over: str | None = None

    # --- what a subclass writes -------------------------------------------------------------

    def start(self, options: dict[str, Any] | None) -> Observation:
        """Begin an episode (``self.np_random`` is already seeded); return the first messages."""
        raise NotImplementedError(f"{type(self).__name__} must implement start(options).")

    def respond(self, reply: Message) -> Feedback:
        """Answer a reply without tool calls. The default ends the episode with reward 0."""
        return Feedback([], reward=0.0, terminated=True)

    def answer_tools(self, reply: Message, results: list[ToolResult]) -> Feedback:
        """Answer a reply whose tool calls have run. The default sends one ``tool`` message per
        call and goes on; ``info["tool_errors"]`` counts the calls that failed."""
        errors = sum(r.error is not None for r in results)
        return Feedback([r.to_message() for r in results], info={"tool_errors": errors})

    # --- the gymnasium contract -------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        """Seed ``self.np_random``, start the turn count and return :meth:`start`'s messages.

        A subclass that overrides ``reset`` the gymnasium way and calls ``super().reset(seed=seed)``
        without writing ``start`` gets the seeding and an empty observation (its own ``reset``
        makes the real one).
        """
        if not hasattr(self, "_episode_over"):
            raise TypeError(
                f"{type(self).__name__}.__init__ must call super().__init__() (AgentEnv sets up its "
                "tools, spaces and turn count there)."
            )
        super().reset(seed=seed)
        if seed is not None:
            self.action_space.seed(seed)
        self.turn = 0
        self._episode_over = ""
        if _defined_in(type(self), "start") is not AgentEnv:
            observation = list(self.start(options))
        elif _defined_in(type(self), "reset") is not AgentEnv:
            observation = []
        else:
            raise NotImplementedError(
                f"{type(self).__name__} must implement start(options) and respond(reply) (recommended: "
                "tool calls are answered for you), or override reset and step the gymnasium way."
            )
        self.messages = list(observation)
        return ResetResult(observation, {"turn": 0})

    def step(self, action: Action) -> StepResult:
        reply = self._begin_step(action)
        if reply.tool_calls:
            calls, overflow = self._split_calls(reply)
            results = [call_tool(self._tools_by_name, c, self.tool_timeout) for c in calls]
            return self._finish_step(reply, self.answer_tools(reply, results + overflow))
        return self._finish_step(reply, self.respond(reply))

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        """Awaitable :meth:`reset`; by default runs it on a daemon thread so the event loop stays
        free (and a hung env never blocks shutdown, see :mod:`agentrl.threads`). An overriding
        ``reset`` that returns a plain ``(observation, info)`` tuple comes back named."""
        result = await ENV_THREADS.run(lambda: self.reset(seed=seed, options=options))
        return _named(ResetResult, result, f"{self._env_name}.reset")

    async def astep(self, action: Action) -> StepResult:
        """Awaitable :meth:`step`. Tool calls run without blocking the loop (``async`` tools are
        awaited, plain ones run in threads); :meth:`respond` runs in a thread.

        A subclass that overrides ``step`` (below any ``astep`` of its own) gets that ``step`` run
        in a thread, whatever the reply, so the async path plays exactly what the sync one does."""
        if _step_overrides_astep(type(self)):
            result = await ENV_THREADS.run(lambda: self.step(action))
            return _named(StepResult, result, f"{self._env_name}.step")
        reply = self.parse_reply(action)
        if not reply.tool_calls:
            return await ENV_THREADS.run(lambda: self.step(reply))
        self._begin_step(reply)
        calls, overflow = self._split_calls(reply)
        results = [await acall_tool(self._tools_by_name, c, self.tool_timeout) for c in calls]
        return self._finish_step(reply, self.answer_tools(reply, results + overflow))

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n".join(f"[{m.role}] {m.content}" for m in self.messages)

    # --- helpers for subclasses -------------------------------------------------------------

    def parse_reply(self, action: Action) -> Message:
        """Turn an action into an assistant message, parsing tool calls out of raw text."""
        if isinstance(action, Message):
            if action.role != "assistant":
                raise ValueError(f"An action Message must have role 'assistant', got {action.role!r}.")
            return action
        if isinstance(action, str):
            return parse_reply(action, self.tool_format)  # type: ignore[arg-type]
        raise TypeError(
            f"{self._env_name}.step expects the reply as a str or an assistant Message, got {type(action).__name__}."
        )

    def _split_calls(self, reply: Message) -> tuple[list[ToolCall], list[ToolResult]]:
        calls = reply.tool_calls[: self.max_tool_calls]
        extra = reply.tool_calls[self.max_tool_calls :]
        if not extra:
            return calls, []
        reason = (
            f"too many tool calls in one reply ({len(reply.tool_calls)}); only the first "
            f"{self.max_tool_calls} were run. Make at most {self.max_tool_calls} calls per reply."
        )
        return calls, [ToolResult(extra[0], f"Error: {reason}", error=reason, error_kind="too_many_calls")]

    @property
    def _env_name(self) -> str:
        """The env's class name, for messages (an adapter names the env it adapts)."""
        return type(self).__name__

    @property
    def _tools_by_name(self) -> dict[str, Tool]:
        return {t.name: t for t in self.tools}

    def _begin_step(self, action: Action) -> Message:
        if self._episode_over is None:
            hint = ""
            if _defined_in(type(self), "reset") is not AgentEnv:
                hint = " (an overriding reset must call super().reset(seed=seed))"
            raise RuntimeError(f"{type(self).__name__}.step was called before reset(); call reset() first{hint}.")
        if self._episode_over:
            raise RuntimeError(
                f"{type(self).__name__}.step was called after the episode ended "
                f"({self._episode_over}); call reset() to start a new one."
            )
        reply = self.parse_reply(action)
        self.turn += 1
        return reply

    def _finish_step(self, reply: Message, feedback: Feedback) -> StepResult:
        if not isinstance(feedback, Feedback):
            raise TypeError(f"{type(self).__name__}.respond must return a Feedback, got {type(feedback).__name__}.")
        observation = list(feedback.messages)
        self.messages.extend([reply, *observation])
        truncated = not feedback.terminated and self.max_turns is not None and self.turn >= self.max_turns
        info = {"turn": self.turn, **feedback.info}  # a copy: Feedback's default info is shared
        if truncated:
            info.setdefault("success", False)
            self._episode_over = "truncated at max_turns"
        elif feedback.terminated:
            self._episode_over = "terminated"
        return StepResult(observation, float(feedback.reward), bool(feedback.terminated), truncated, info)


# --- gymnasium envs that speak messages ----------------------------------------------------------

# What gymnasium.make adds by itself to an id registered with plain gymnasium.register: they check
# call order and spaces, which an AgentEnv and check_env do better, and they hide astep.
_GYMNASIUM_CHECKS = (gym.wrappers.OrderEnforcing, gym.wrappers.PassiveEnvChecker)


def as_agent_env(env: Any) -> AgentEnv:
    """``env`` with the :class:`AgentEnv` surface the checker, the rollout and the trainer use.

    - An :class:`AgentEnv` comes back unchanged (also one written the gymnasium way, overriding
      ``reset`` / ``step``).
    - An :class:`AgentEnv` inside gymnasium's own checking wrappers only (``gymnasium.make`` of an
      id registered with plain ``gymnasium.register``) comes back unwrapped.
    - Any other ``gymnasium.Env`` (wrapped or not) whose observations are lists of
      :class:`~agentrl.types.Message` comes back as a :class:`GymnasiumAdapter`.

    Anything else raises ``TypeError``.

    >>> agent_env = as_agent_env(gymnasium.make("mypkg/Maze-v0"))  # doctest: +SKIP
    """
    if isinstance(env, AgentEnv):
        return env
    if isinstance(env, gym.Env):
        if isinstance(env.unwrapped, AgentEnv) and _only_checks(env):
            return env.unwrapped
        return GymnasiumAdapter(env)
    raise TypeError(_not_an_env(env))


class GymnasiumAdapter(AgentEnv):
    """A plain ``gymnasium.Env`` that speaks messages, seen as an :class:`AgentEnv` (made by
    :func:`as_agent_env`).

    The env's ``reset`` must return ``(list[Message], info)`` and its ``step`` the gymnasium
    five-tuple with a ``list[Message]`` observation. ``step`` hands the env the reply as an
    assistant :class:`~agentrl.types.Message` (its tool calls parsed with the env's
    ``tool_format``), both in a rollout and under :func:`~agentrl.checker.check_env`, so the env
    sees one kind of action wherever it runs. The env answers its own tool calls; the optional
    attributes ``tools`` (:class:`~agentrl.tools.Tool` objects or typed callables; functions of
    its class body are bound to it) and ``tool_format`` tell the agent what it may call and how.
    ``areset`` / ``astep`` run ``reset`` / ``step`` in :data:`~agentrl.threads.ENV_THREADS`.
    Calls go through the wrappers around the env, if any; :attr:`env` is what was adapted.
    """

    def __init__(self, env: gym.Env[Any, Any]):
        if not isinstance(env, gym.Env):
            raise TypeError(_not_an_env(env))
        self.env = env
        super().__init__()
        base = env.unwrapped
        self.tools = [as_tool(_bind_tool(base, t)) for t in _wrapper_attr(env, "tools", ())]
        self.tool_format = _wrapper_attr(env, "tool_format", AgentEnv.tool_format)
        self.max_turns = _wrapper_attr(env, "max_turns", None)
        self.render_mode = env.render_mode
        self.metadata = env.metadata
        self.spec = env.spec
        self.action_space = ReplySpace(self.tools)

    @property
    def _env_name(self) -> str:
        return type(self.env.unwrapped).__name__

    @property
    def np_random(self) -> np.random.Generator:  # type: ignore[override]
        """The adapted env's generator (seeded by its own ``reset``)."""
        return self.env.np_random

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self.env.np_random = value

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        super().reset(seed=seed)  # seeds the action space's sampler, starts the turn count
        result = self.env.reset(seed=seed, options=options)
        return _named(ResetResult, result)

    def step(self, action: Action) -> StepResult:
        reply = self.parse_reply(action)
        self.turn += 1
        return _named(StepResult, self.env.step(reply))

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    def __str__(self) -> str:
        return f"<{type(self).__name__}{self.env}>"


def _named(kind: type[Any], result: Any, strict: str | None = None) -> Any:
    """``result`` as the NamedTuple ``kind`` when it is a tuple of the right length. Anything else
    goes through unchanged for :func:`~agentrl.checker.check_env` to describe, unless ``strict``
    names the call: then it raises (the rollout reads the result by field name)."""
    if isinstance(result, kind):
        return result
    if isinstance(result, tuple) and len(result) == len(kind._fields):
        return kind(*result)
    if strict is None:
        return result
    raise TypeError(
        f"Expected {strict} to return ({', '.join(kind._fields)}); got {result!r:.160}. "
        "Run agentrl.check_env on the env to see what else it breaks."
    )


@functools.cache
def _defined_in(cls: type, name: str) -> type:
    """The class in ``cls``'s MRO that defines attribute ``name``."""
    return next(k for k in cls.__mro__ if name in vars(k))


def _step_overrides_astep(cls: type) -> bool:
    """Whether ``cls`` overrides ``step`` below the class whose ``astep`` it inherits: then the
    inherited ``astep`` must play that ``step``. A class that writes both (an async tool path plus
    a ``step`` that wraps ``super().step``, as CodeSandbox does) keeps the base's native path."""
    step_owner, astep_owner = _defined_in(cls, "step"), _defined_in(cls, "astep")
    return step_owner is not astep_owner and issubclass(step_owner, astep_owner)


def _bind_tool(owner: object, entry: Tool | Any) -> Tool | Any:
    # A function written in a class body is a method: bind it (a subclass's override wins, as
    # for any method). A module-level function or a Tool is taken as it is.
    if inspect.isfunction(entry) and any(vars(k).get(entry.__name__) is entry for k in type(owner).__mro__):
        return getattr(owner, entry.__name__)
    return entry


def _wrapper_attr(env: gym.Env[Any, Any], name: str, default: Any) -> Any:
    return env.get_wrapper_attr(name) if env.has_wrapper_attr(name) else default


def _only_checks(env: gym.Env[Any, Any]) -> bool:
    while isinstance(env, gym.Wrapper):
        if not isinstance(env, _GYMNASIUM_CHECKS):
            return False
        env = env.env
    return True


def _not_an_env(env: Any) -> str:
    got = f"a {type(env).__module__}.{type(env).__qualname__}"
    if isinstance(env, type):
        got = f"the class {env.__module__}.{env.__qualname__}"
        todo = f"pass an instance, {env.__name__}(...), not the class itself."
    elif hasattr(env, "possible_agents"):
        todo = "this looks like a multi-agent (PettingZoo) env; make it with agentrl.make_multiagent."
    else:
        todo = (
            "subclass agentrl.AgentEnv and write start/respond (recommended), or subclass "
            "gymnasium.Env and write reset/step returning list[agentrl.Message] observations."
        )
    return (
        "Expected an agentrl.AgentEnv, or a gymnasium.Env whose observations are lists of "
        f"agentrl.Message; got {got}: {todo}"
    )


def _random_text(rng: np.random.Generator, words: int) -> str:
    alphabet = string.ascii_letters + string.digits + " +-*/()=.,?!{}[]<>\"':"
    seed = int(rng.integers(2**31))
    local = random.Random(seed)
    return " ".join("".join(local.choices(alphabet, k=local.randint(1, 8))) for _ in range(words))


def _random_value(rng: np.random.Generator, schema: dict[str, Any]) -> Any:
    if "enum" in schema:
        return schema["enum"][int(rng.integers(len(schema["enum"])))]
    kind = schema.get("type")
    if kind == "integer":
        return int(rng.integers(-100, 100))
    if kind == "number":
        return float(np.round(rng.normal() * 10, 2))
    if kind == "boolean":
        return bool(rng.integers(2))
    if kind == "array":
        return [_random_value(rng, schema.get("items", {})) for _ in range(int(rng.integers(3)))]
    if rng.integers(5) == 0:  # now and then, the wrong type
        return int(rng.integers(100))
    return _random_text(rng, int(rng.integers(1, 4)))
