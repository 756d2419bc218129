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
- ``auto`` (the default) reads ``hermes`` when the text holds a ``<tool_call>`` tag outside
  reasoning. Otherwise a
  JSON reply is a call only if it has the shape of one (``name`` plus ``arguments`` or
  ``parameters``, no other keys), so a JSON *answer* such as ``{"name": "Ada", "age": 36}`` stays
  content; broken JSON is an error only if it mentions both ``"name"`` and ``"arguments"``.

Parsing never raises (except for a bad ``format`` or a non-``str`` text, which are programming
errors): a call that cannot be read becomes a :class:`ToolCall` with ``error`` set, which the
environment answers with an error observation. Calls get ids ``call_0``, ``call_1``, ... in order.

A block left open at the very end of a reply is read as a call if its JSON is complete: inference
servers drop a ``</tool_call>`` stop string from the text they return. A block left open before
another ``<tool_call>`` is an error.

Reasoning blocks: each format declares the reasoning tags of the models that write it
(:attr:`ToolCallFormat.reasoning_tags`; ``<think>`` ... ``</think>`` for all three, as Qwen3,
QwQ and the DeepSeek-R1 distills write). Text inside a reasoning block is the model thinking, so
calls are read only from the text outside such blocks, and a reply whose only calls are inside
reasoning is a plain reply. Nothing is taken out for reasoning: it stays in the message's content
as written (and the trajectory keeps the generated tokens, whatever the parse). The tags are found
left to right:

- a block ends at the first closing tag after its opening tag, as vLLM's and SGLang's reasoning
  parsers and Qwen3's chat template read it: an opening tag inside reasoning (the model musing
  about the tag) is text, so it cannot swallow the rest of the reply;
- a block without its closing tag runs to the end of the reply (the model was cut off thinking);
- a closing tag outside a block is text, and so is a reasoning tag inside a ``<tool_call>`` block
  (part of the call's JSON);
- every block is reasoning, not only the first (vLLM's parsers look at the first only), for models
  that think again between calls.

The ``json`` reader takes the text outside reasoning blocks as the reply: in
``<think>...</think>{"name": ...}`` the JSON is a call, and the message's content is the reasoning.

The parser sees the completion only: where the *prompt* opens the block (templates that end the
generation prompt with ``<think>``), the completion shows only ``</think>``, and :func:`parse_reply`
alone would read calls before it. :meth:`agentrl.agents.ChatAgent.parse` knows its template: it
reads such a completion as starting inside the block (``ChatAgent.opens_reasoning``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from agentrl.types import Message, ToolCall

ToolFormat = Literal["auto", "hermes", "json"]
ReasoningTags = tuple[tuple[str, str], ...]
"""``(opening, closing)`` tag pairs of reasoning blocks."""

THINK_TAGS: tuple[str, str] = ("<think>", "</think>")
"""The reasoning tags of Qwen3, QwQ, DeepSeek-R1 and its distills."""


@dataclass(frozen=True)
class ToolCallFormat:
    """A tool-call format, as :func:`parse_reply` reads it.

    >>> TOOL_CALL_FORMATS["hermes"].reasoning_tags
    (('<think>', '</think>'),)
    """

    name: str
    """What envs and agents give as ``tool_format``."""
    reasoning_tags: ReasoningTags = ()
    """The ``(opening, closing)`` tags of the reasoning blocks of the models that write this format;
    calls inside such a block are not read (see the module's docstring for how blocks are found)."""


TOOL_CALL_FORMATS: dict[str, ToolCallFormat] = {
    # Why json has them too: the tags are the model's, not the call syntax's. A thinking model asked
    # for bare-JSON calls (an R1 distill of Llama, say) writes `<think>...</think>{"name": ...}`;
    # without the tags that reply starts with `<` and reads as prose. A reply that holds no
    # reasoning tag reads exactly as it did without them.
    "auto": ToolCallFormat("auto", (THINK_TAGS,)),
    "hermes": ToolCallFormat("hermes", (THINK_TAGS,)),
    "json": ToolCallFormat("json", (THINK_TAGS,)),
}
TOOL_FORMATS: tuple[str, ...] = tuple(TOOL_CALL_FORMATS)

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
# Tags format_tool_calls escapes inside names and arguments, so its text reads back in any format.
_ESCAPED_TAGS = tuple(
    dict.fromkeys([_OPEN, _CLOSE, *(t for f in TOOL_CALL_FORMATS.values() for pair in f.reasoning_tags for t in pair)])
)
_CALL_KEYS = frozenset({"name", "arguments", "parameters", "id", "type"})
# A JSON escape like "\ud800" decodes to a lone surrogate, which is not valid Unicode: tokenizers
# refuse it and UTF-8 files cannot hold it, so one in a model's call must not reach an observation.
_SURROGATE = re.compile("[\ud800-\udfff]")
_MAYBE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")


def parse_reply(
    text: str, format: ToolFormat = "auto", *, reasoning_tags: Sequence[tuple[str, str]] | None = None
) -> Message:
    """Parse a completion into an assistant message; tool-call blocks are moved out of the content.

    Calls inside reasoning blocks are not read, and the reasoning stays in the content as written.
    ``reasoning_tags`` overrides the format's :attr:`ToolCallFormat.reasoning_tags` (``()`` reads
    calls everywhere).

    >>> reply = parse_reply('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    >>> reply.tool_calls[0].name, reply.tool_calls[0].arguments, reply.tool_calls[0].id
    ('f', {'x': 1}, 'call_0')
    >>> parse_reply('{"name": "Ada", "age": 36}').tool_calls
    []
    >>> text = '<think>Call f? <tool_call>{"name": "f", "arguments": {}}</tool_call> No.</think>It is 5.'
    >>> reply = parse_reply(text)
    >>> reply.tool_calls, reply.content == text
    ([], True)
    """
    if format not in TOOL_FORMATS:
        raise ValueError(f"Unknown tool-call format {format!r}; expected one of {TOOL_FORMATS}.")
    if not isinstance(text, str):
        raise TypeError(f"A completion must be a str, got {type(text).__name__}.")
    tags = TOOL_CALL_FORMATS[format].reasoning_tags if reasoning_tags is None else _checked(reasoning_tags)
    scan = _scan(text, tags, read_calls=format != "json")
    if scan.blocks:
        return _hermes_reply(text, scan.blocks)
    if format == "hermes":
        return Message("assistant", text)
    # Without blocks, the reasoning found is the same whether <tool_call> tags were looked for or not.
    answer = _outside(text, scan.reasoning)
    stripped = answer.strip()
    if not stripped.startswith(("{", "[", "```")):
        return Message("assistant", text)
    calls = _parse_json_reply(stripped, strict=format == "json")
    if calls is None:
        return Message("assistant", text)
    # An unreadable reply keeps its text, so the conversation shows what the model wrote.
    content = text if any(c.error for c in calls) else "".join(text[a:b] for a, b in scan.reasoning).strip()
    return Message("assistant", content, tool_calls=_number(calls))


def format_tool_calls(calls: list[ToolCall], format: ToolFormat = "hermes") -> str:
    """Write tool calls as text in the given format (the inverse of :func:`parse_reply`).

    ``auto`` writes ``hermes``. A literal ``<tool_call>``, ``</tool_call>`` or reasoning tag inside a
    name or an argument is written with ``<`` escaped as ``\\u003c`` (still the same JSON), so the
    text parses back to the same calls.

    >>> format_tool_calls([ToolCall("f", {"x": 1})])
    '<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>'
    """
    if format not in TOOL_FORMATS:
        raise ValueError(f"Unknown tool-call format {format!r}; expected one of {TOOL_FORMATS}.")
    payloads = [_escape_tags(json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)) for c in calls]
    if format == "json":
        return payloads[0] if len(payloads) == 1 else ("[" + ", ".join(payloads) + "]" if payloads else "")
    return "\n".join(f"{_OPEN}\n{p}\n{_CLOSE}" for p in payloads)


def _checked(reasoning_tags: Sequence[tuple[str, str]]) -> ReasoningTags:
    pairs = []
    for pair in reasoning_tags:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(t, str) and t for t in pair)):
            raise ValueError(
                f"reasoning_tags must be (opening, closing) pairs of non-empty strings, such as {THINK_TAGS}; "
                f"got {pair!r}."
            )
        pairs.append((pair[0], pair[1]))
    return tuple(pairs)


def _escape_tags(payload: str) -> str:
    # The tags can only occur inside JSON strings here, where \u003c is the same character.
    for tag in _ESCAPED_TAGS:
        payload = payload.replace(tag, "\\u003c" + tag[1:])
    return payload


class _Block(NamedTuple):
    """A ``<tool_call>`` block outside reasoning, ``text[start:end]``; its JSON body ends at ``body_end``."""

    start: int
    body_end: int
    end: int
    closed: bool


class _Scan(NamedTuple):
    blocks: list[_Block]
    reasoning: list[tuple[int, int]]
    """``(start, end)`` of each reasoning block, tags included."""


def _scan(text: str, tags: ReasoningTags, read_calls: bool) -> _Scan:
    """The tool-call blocks outside reasoning and the reasoning blocks of ``text``, in one pass.

    A ``<tool_call>`` block runs to its closing tag, to the next opening tag, or to the end of the
    text; a reasoning block to its first closing tag or to the end. The tags are found by one
    alternation of fixed strings, so the pass stays linear on any input."""
    closing_of = dict(tags)
    blocks: list[_Block] = []
    reasoning: list[tuple[int, int]] = []
    call_at = -1  # start of the open <tool_call> block, if any
    closing, reasoning_at = "", -1  # the tag that ends the open reasoning block, if any
    for match in _tag_pattern(tags, read_calls).finditer(text):
        tag, at = match.group(), match.start()
        if reasoning_at >= 0:
            if tag == closing:
                reasoning.append((reasoning_at, match.end()))
                reasoning_at = -1
        elif call_at >= 0:  # reasoning tags in a block are part of its JSON
            if tag == _CLOSE:
                blocks.append(_Block(call_at, at, match.end(), True))
                call_at = -1
            elif tag == _OPEN:
                blocks.append(_Block(call_at, at, at, False))
                call_at = at
        elif tag == _OPEN and read_calls:
            call_at = at
        elif tag in closing_of:
            closing, reasoning_at = closing_of[tag], at
    if call_at >= 0:
        blocks.append(_Block(call_at, len(text), len(text), False))
    if reasoning_at >= 0:
        reasoning.append((reasoning_at, len(text)))
    return _Scan(blocks, reasoning)


@functools.lru_cache(maxsize=64)
def _tag_pattern(tags: ReasoningTags, read_calls: bool) -> re.Pattern[str]:
    strings = {t for pair in tags for t in pair} | ({_OPEN, _CLOSE} if read_calls else set())
    # Longest first, so a tag that starts another is not found in its place.
    return re.compile("|".join(re.escape(t) for t in sorted(strings, key=lambda t: (-len(t), t))) or "(?!)")


def _outside(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` without the ``spans``."""
    if not spans:
        return text
    kept, at = [], 0
    for start, end in spans:
        kept.append(text[at:start])
        at = end
    kept.append(text[at:])
    return "".join(kept)


def _hermes_reply(text: str, blocks: list[_Block]) -> Message:
    calls = []
    for block in blocks:
        body = text[block.start + len(_OPEN) : block.body_end].strip()
        at_end = not text[block.end :].strip()
        call = _call_from_json_text(body)
        if not block.closed and call.error is None and not at_end:
            call = _bad(f"the {_OPEN} block is not closed with {_CLOSE} before the next {_OPEN}", name=call.name)
        elif not block.closed and call.error is not None:
            call.error += f"; the block is not closed with {_CLOSE} (was the reply cut off?)"
        calls.append(call)
    content = _outside(text, [(b.start, b.end) for b in blocks]).strip()
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
