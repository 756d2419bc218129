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
"""

from __future__ import annotations

import inspect
import random
import string
from collections.abc import Sequence
from typing import Any, NamedTuple, SupportsFloat

import gymnasium as gym
import numpy as np

from agentrl.threads import ENV_THREADS
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

    def __init__(self, tools: Sequence[Tool] = (), max_length: int = 100_000, seed: int | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)
        self.tools = list(tools)
        self.max_length = max_length

    def contains(self, x: Any) -> bool:
        if isinstance(x, Message):
            return x.role == "assistant"
        return isinstance(x, str) and len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        from agentrl.agents.tool_formats import format_tool_calls

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

    Subclasses implement :meth:`start` and :meth:`respond` (and may override :meth:`answer_tools`), and may set the class attributes
    ``tools`` (callables or :class:`~agentrl.tools.Tool`), ``tool_format`` and ``tool_timeout``.
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
        self.tools = [as_tool(self._bound(t)) for t in type(self).tools]
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
        super().reset(seed=seed)
        if seed is not None:
            self.action_space.seed(seed)
        self.turn = 0
        self._episode_over = ""
        observation = list(self.start(options))
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
        free (and a hung env never blocks shutdown, see :mod:`agentrl.threads`)."""
        return await ENV_THREADS.run(lambda: self.reset(seed=seed, options=options))

    async def astep(self, action: Action) -> StepResult:
        """Awaitable :meth:`step`. Tool calls run without blocking the loop (``async`` tools are
        awaited, plain ones run in threads); :meth:`respond` runs in a thread."""
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
        from agentrl.agents.tool_formats import parse_reply

        if isinstance(action, Message):
            if action.role != "assistant":
                raise ValueError(f"An action Message must have role 'assistant', got {action.role!r}.")
            return action
        if isinstance(action, str):
            return parse_reply(action, self.tool_format)  # type: ignore[arg-type]
        raise TypeError(
            f"{type(self).__name__}.step expects the reply as a str or an assistant Message, "
            f"got {type(action).__name__}."
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

    def _bound(self, entry: Tool | Any) -> Tool | Any:
        # A function written in a class body is a method: bind it (a subclass's override wins, as
        # for any method). A module-level function or a Tool is taken as it is.
        if inspect.isfunction(entry) and any(vars(k).get(entry.__name__) is entry for k in type(self).__mro__):
            return getattr(self, entry.__name__)
        return entry

    @property
    def _tools_by_name(self) -> dict[str, Tool]:
        return {t.name: t for t in self.tools}

    def _begin_step(self, action: Action) -> Message:
        if self._episode_over is None:
            raise RuntimeError(f"{type(self).__name__}.step was called before reset(); call reset() first.")
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
            raise TypeError(
                f"{type(self).__name__}.respond must return a Feedback, got {type(feedback).__name__}."
            )
        observation = list(feedback.messages)
        self.messages.extend([reply, *observation])
        truncated = (
            not feedback.terminated and self.max_turns is not None and self.turn >= self.max_turns
        )
        info = {"turn": self.turn, **feedback.info}  # a copy: Feedback's default info is shared
        if truncated:
            info.setdefault("success", False)
            self._episode_over = "truncated at max_turns"
        elif feedback.terminated:
            self._episode_over = "terminated"
        return StepResult(observation, float(feedback.reward), bool(feedback.terminated), truncated, info)

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
