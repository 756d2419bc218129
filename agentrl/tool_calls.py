"""Tool-call formats: how a completion's text becomes an assistant :class:`Message` with tool calls.

Part of the env contract: an env declares its ``tool_format``, and :class:`~agentrl.env.AgentEnv`
parses a raw reply with :func:`parse_reply`; the agent layer (:class:`~agentrl.agents.ChatAgent`)
parses completions with the same function, so both read a reply alike.

Two formats are understood:

- ``hermes`` (Hermes, Qwen 2/2.5/3, SmolLM2 and most ChatML models)::

      Let me compute that.
      <tool_call>
      {"name": "calculate", "arguments": {"expression": "2 + 3"}}
      </tool_call>

- ``json``: the whole reply is one JSON object ``{"name": ..., "arguments": {...}}`` (``parameters``
  is accepted for ``arguments``, and an OpenAI-style ``{"function": {...}}`` wrapper is unwrapped),
  a list of them, or either inside a ```` ```json ```` fence.

Which format reads a reply:

- ``hermes`` reads ``<tool_call>`` blocks only; any other text is the message's content.
- ``json`` reads a reply that starts with ``{``, ``[`` or a fence as calls, and reports one that is
  not a valid call as an error; a prose reply is the message's content (a final answer).
- ``auto`` (the default) reads ``hermes`` when the text holds a ``<tool_call>`` tag. Otherwise a
  JSON reply is a call only if it has the shape of one (``name`` plus ``arguments`` or
  ``parameters``, no other keys), so a JSON *answer* such as ``{"name": "Ada", "age": 36}`` stays
  content; broken JSON is an error only if it mentions both ``"name"`` and ``"arguments"``.

Parsing never raises (except for a bad ``format`` or a non-``str`` text, which are programming
errors): a call that cannot be read becomes a :class:`ToolCall` with ``error`` set, which the
environment answers with an error observation. Calls get ids ``call_0``, ``call_1``, ... in order.

A block left open at the very end of a reply is read as a call if its JSON is complete: inference
servers drop a ``</tool_call>`` stop string from the text they return. A block left open before
another ``<tool_call>`` is an error.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from agentrl.types import Message, ToolCall

ToolFormat = Literal["auto", "hermes", "json"]
TOOL_FORMATS: tuple[str, ...] = ("auto", "hermes", "json")

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
# A block runs to its closing tag, to the next opening tag, or to the end of the text. The lazy body
# checks three fixed alternatives per character, so matching stays linear on any input.
_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|(?=<tool_call>)|\Z)", re.S)
_CALL_KEYS = frozenset({"name", "arguments", "parameters", "id", "type"})
# A JSON escape like "\ud800" decodes to a lone surrogate, which is not valid Unicode: tokenizers
# refuse it and UTF-8 files cannot hold it, so one in a model's call must not reach an observation.
_SURROGATE = re.compile("[\ud800-\udfff]")
_MAYBE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")


def parse_reply(text: str, format: ToolFormat = "auto") -> Message:
    """Parse a completion into an assistant message; tool-call blocks are moved out of the content.

    >>> reply = parse_reply('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    >>> reply.tool_calls[0].name, reply.tool_calls[0].arguments, reply.tool_calls[0].id
    ('f', {'x': 1}, 'call_0')
    >>> parse_reply('{"name": "Ada", "age": 36}').tool_calls
    []
    """
    if format not in TOOL_FORMATS:
        raise ValueError(f"Unknown tool-call format {format!r}; expected one of {TOOL_FORMATS}.")
    if not isinstance(text, str):
        raise TypeError(f"A completion must be a str, got {type(text).__name__}.")
    if format == "hermes" or (format == "auto" and _OPEN in text):
        return _parse_hermes(text)
    stripped = text.strip()
    if not stripped.startswith(("{", "[", "```")):
        return Message("assistant", text)
    calls = _parse_json_reply(stripped, strict=format == "json")
    if calls is None:
        return Message("assistant", text)
    # An unreadable reply keeps its text, so the conversation shows what the model wrote.
    content = text if any(c.error for c in calls) else ""
    return Message("assistant", content, tool_calls=_number(calls))


def format_tool_calls(calls: list[ToolCall], format: ToolFormat = "hermes") -> str:
    """Write tool calls as text in the given format (the inverse of :func:`parse_reply`).

    ``auto`` writes ``hermes``. A literal ``<tool_call>`` or ``</tool_call>`` inside a name or an
    argument is written with ``<`` escaped as ``\\u003c`` (still the same JSON), so the text parses
    back to the same calls.

    >>> format_tool_calls([ToolCall("f", {"x": 1})])
    '<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>'
    """
    if format not in TOOL_FORMATS:
        raise ValueError(f"Unknown tool-call format {format!r}; expected one of {TOOL_FORMATS}.")
    payloads = [_escape_tags(json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)) for c in calls]
    if format == "json":
        return payloads[0] if len(payloads) == 1 else ("[" + ", ".join(payloads) + "]" if payloads else "")
    return "\n".join(f"{_OPEN}\n{p}\n{_CLOSE}" for p in payloads)


def _escape_tags(payload: str) -> str:
    # The tags can only occur inside JSON strings here, where \u003c is the same character.
    return payload.replace(_OPEN, "\\u003ctool_call>").replace(_CLOSE, "\\u003c/tool_call>")


def _parse_hermes(text: str) -> Message:
    calls = []
    for match in _HERMES_BLOCK.finditer(text):
        body = match.group(1).strip()
        closed = match.group(2) == _CLOSE
        at_end = not text[match.end() :].strip()
        call = _call_from_json_text(body)
        if not closed and call.error is None and not at_end:
            call = _bad(f"the {_OPEN} block is not closed with {_CLOSE} before the next {_OPEN}", name=call.name)
        elif not closed and call.error is not None:
            call.error += f"; the block is not closed with {_CLOSE} (was the reply cut off?)"
        calls.append(call)
    if not calls:
        return Message("assistant", text)
    content = _HERMES_BLOCK.sub("", text).strip()
    return Message("assistant", content, tool_calls=_number(calls))


def _unfence(text: str) -> str:
    """The inside of a ```` ```json ```` fence (closed or not); written without a regex, since
    a lazy fence pattern backtracks for minutes over a long run of whitespace."""
    if not text.startswith("```"):
        return text
    body = text[3:]
    if body[:4].lower() == "json":
        body = body[4:]
    body = body.strip()
    body = body.removesuffix("```")
    return body.strip()


def _parse_json_reply(text: str, strict: bool) -> list[ToolCall] | None:
    """The calls in a bare-JSON reply, or None if the reply is not meant as a tool call.

    ``strict`` (the ``json`` format) reads any JSON-looking reply as calls; otherwise (``auto``)
    only replies that have the shape of calls are, and broken JSON only if it clearly tried to be one.
    """
    body = _unfence(text)
    try:
        data = _loads(body)
    except (ValueError, RecursionError) as e:
        if strict or ('"name"' in body and ('"arguments"' in body or '"parameters"' in body)):
            return [_bad(f"the reply looks like a JSON tool call but is not valid JSON ({_short(e)})")]
        return None
    items = data if isinstance(data, list) else [data]
    if not strict and not (items and all(_has_call_shape(i) for i in items)):
        return None
    if not items:
        return [_bad("the reply is an empty JSON list, not a tool call")]
    return [_call_from_object(i) for i in items]


def _has_call_shape(item: Any) -> bool:
    if isinstance(item, dict) and "name" not in item and set(item) <= {"id", "type", "function"}:
        item = item.get("function")  # OpenAI-style {"type": "function", "function": {...}}
    return (
        isinstance(item, dict)
        and "name" in item
        and ("arguments" in item or "parameters" in item)
        and set(item) <= _CALL_KEYS
    )


def _loads(text: str) -> Any:
    """``json.loads``, with lone surrogates in the result replaced by U+FFFD."""
    data = json.loads(text)
    if _MAYBE_SURROGATE.search(text):
        dumped = json.dumps(data, ensure_ascii=False)
        if _SURROGATE.search(dumped):
            data = json.loads(_SURROGATE.sub("\ufffd", dumped))
    return data


def _call_from_json_text(body: str) -> ToolCall:
    try:
        data = _loads(body)
    except (ValueError, RecursionError) as e:
        return _bad(f"the text inside {_OPEN} is not valid JSON ({_short(e)})")
    return _call_from_object(data)


def _call_from_object(data: Any) -> ToolCall:
    if not isinstance(data, dict):
        return _bad(f"a tool call must be a JSON object with 'name' and 'arguments', got {_json_type(data)}")
    if "name" not in data and isinstance(data.get("function"), dict):  # OpenAI-style wrapper
        data = data["function"]
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return _bad(f"a tool call needs a 'name' string, got {_json_type(name) if 'name' in data else 'none'}")
    arguments = data["arguments"] if "arguments" in data else data.get("parameters")
    if isinstance(arguments, str):  # some models double-encode the arguments
        try:
            arguments = _loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError) as e:
            return _bad(f"'arguments' of {name} is a string that is not valid JSON ({_short(e)})", name=name)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return _bad(f"'arguments' of {name} must be a JSON object, got {_json_type(arguments)}", name=name)
    return ToolCall(name=name, arguments=arguments)


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _bad(reason: str, name: str = "") -> ToolCall:
    return ToolCall(name=name, arguments={}, error=reason)


def _number(calls: list[ToolCall]) -> list[ToolCall]:
    for i, call in enumerate(calls):
        call.id = f"call_{i}"
    return calls


def _short(error: Exception) -> str:
    return str(error).split("\n")[0][:120]
