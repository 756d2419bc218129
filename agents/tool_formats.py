"""Tool-call formats: how a completion's text becomes an assistant :class:`Message` with tool calls.

Two formats are understood:

- ``hermes`` (Hermes, Qwen 2/2.5/3, SmolLM2 and most ChatML models)::

      Let me compute that.
      <tool_call>
      {"name": "calculate", "arguments": {"expression": "2 + 3"}}
      </tool_call>

- ``json``: the whole reply is one JSON object ``{"name": ..., "arguments": {...}}`` (``parameters``
  is accepted for ``arguments``), a list of them, or either inside a ```` ```json ```` fence.

``auto`` (the default) picks ``hermes`` when the text holds a ``<tool_call>`` tag and tries ``json``
otherwise. Parsing never raises: a call that cannot be read becomes a :class:`ToolCall` with
``error`` set, which the environment answers with an error observation.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from agentrl.types import Message, ToolCall

ToolFormat = Literal["auto", "hermes", "json"]
TOOL_FORMATS: tuple[str, ...] = ("auto", "hermes", "json")

_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


def parse_reply(text: str, format: ToolFormat = "auto") -> Message:
    """Parse a completion into an assistant message; tool-call blocks are moved out of the content.

    >>> reply = parse_reply('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    >>> reply.tool_calls[0].name, reply.tool_calls[0].arguments
    ('f', {'x': 1})
    """
    if format not in TOOL_FORMATS:
        raise ValueError(f"Unknown tool-call format {format!r}; expected one of {TOOL_FORMATS}.")
    if not isinstance(text, str):
        raise TypeError(f"A completion must be a str, got {type(text).__name__}.")
    if format == "hermes" or (format == "auto" and "<tool_call>" in text):
        return _parse_hermes(text)
    if format == "json" or (format == "auto" and _looks_like_json(text)):
        calls = _parse_json_reply(text)
        if calls is not None:
            return Message("assistant", "", tool_calls=_number(calls))
        if format == "json":
            return Message("assistant", text, tool_calls=_number([_bad("the reply is not a JSON tool call")]))
    return Message("assistant", text)


def format_tool_calls(calls: list[ToolCall], format: ToolFormat = "hermes") -> str:
    """Write tool calls as text in the given format (the inverse of :func:`parse_reply`)."""
    payloads = [json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False) for c in calls]
    if format == "json":
        return payloads[0] if len(payloads) == 1 else "[" + ", ".join(payloads) + "]"
    return "\n".join(f"<tool_call>\n{p}\n</tool_call>" for p in payloads)


def _parse_hermes(text: str) -> Message:
    calls = []
    for match in _HERMES_BLOCK.finditer(text):
        body = match.group(1).strip()
        closed = match.group(0).endswith("</tool_call>")
        call = _call_from_json_text(body)
        if not closed and call.error is None:
            call = _bad("the <tool_call> block is not closed with </tool_call>", name=call.name)
        calls.append(call)
    content = _HERMES_BLOCK.sub("", text).strip()
    return Message("assistant", content, tool_calls=_number(calls))


def _looks_like_json(text: str) -> bool:
    stripped = text.strip()
    return stripped.startswith(("{", "[", "```"))


def _parse_json_reply(text: str) -> list[ToolCall] | None:
    """The calls in a bare-JSON reply, or None if the reply is not meant as a tool call."""
    stripped = text.strip()
    fence = _FENCE.match(stripped)
    if fence:
        stripped = fence.group(1)
    try:
        data = json.loads(stripped)
    except (ValueError, RecursionError):
        # Only an error if it clearly tried to be a call; otherwise it is plain prose.
        if '"name"' in stripped:
            return [_bad("the reply looks like a JSON tool call but is not valid JSON")]
        return None
    items = data if isinstance(data, list) else [data]
    if not items or not all(isinstance(i, dict) and "name" in i for i in items):
        return None
    return [_call_from_object(i) for i in items]


def _call_from_json_text(body: str) -> ToolCall:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:
        return _bad(f"the text inside <tool_call> is not valid JSON ({_short(e)})")
    return _call_from_object(data)


def _call_from_object(data: Any) -> ToolCall:
    if not isinstance(data, dict):
        return _bad(f"a tool call must be a JSON object with 'name' and 'arguments', got {type(data).__name__}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return _bad("a tool call needs a 'name' string")
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):  # some models double-encode the arguments
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError) as e:
            return _bad(f"'arguments' of {name} is a string that is not valid JSON ({_short(e)})", name=name)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return _bad(f"'arguments' of {name} must be a JSON object, got {type(arguments).__name__}", name=name)
    return ToolCall(name=name, arguments=arguments)


def _bad(reason: str, name: str = "") -> ToolCall:
    return ToolCall(name=name, arguments={}, error=reason)


def _number(calls: list[ToolCall]) -> list[ToolCall]:
    for i, call in enumerate(calls):
        call.id = f"call_{i}"
    return calls


def _short(error: Exception) -> str:
    return str(error).split("\n")[0][:120]
