"""Tools: typed Python callables that an environment offers to the agent.

:func:`tool` turns a function with type hints and a docstring into a :class:`Tool` with a JSON
schema (the shape ``tokenizer.apply_chat_template(tools=...)`` and OpenAI-style APIs expect).
:func:`call_tool` and :func:`acall_tool` run one parsed :class:`~agentrl.types.ToolCall` and never
raise: a malformed call, an unknown tool, wrong argument types, a tool that raises or runs past its
time limit all come back as a :class:`ToolResult` with ``error`` set, whose text starts with
``Error:`` and tells the model what went wrong and what to do, so the episode can go on.

>>> @tool
... def add(a: int, b: int) -> int:
...     '''Add two integers.
...
...     Args:
...         a: The first addend.
...         b: The second addend.
...     '''
...     return a + b
>>> add.schema["function"]["parameters"]["required"]
['a', 'b']
>>> print(call_tool({"add": add}, ToolCall("add", {"a": 2, "b": "3"})).content)
Error: bad arguments for add: argument 'b': expected an integer, got "3". add takes a (integer), b (integer); fix the arguments and call it again.

Limits, said plainly: a plain function that runs past its time limit cannot be killed in Python. It
is abandoned in a daemon thread (which never delays interpreter exit) and its result is dropped.
An ``async`` tool is cancelled at its limit, but one that blocks the event loop cannot be, and one
that raises ``SystemExit`` stops the loop, as asyncio does for any task (a plain function's
``SystemExit`` is caught). Tools that run untrusted or unbounded code belong in a sandbox
(:mod:`agentrl.sandboxes`), which can be killed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import difflib
import enum
import functools
import inspect
import json
import re
import reprlib
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.threads import TOOL_THREADS
from agentrl.types import Message, ToolCall



_JSON_TYPES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
# The tool-name rule of the OpenAI API, which most chat templates and servers follow.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Error texts quote at most this much of a bad value or an exception message.
_PREVIEW = reprlib.Repr()
_PREVIEW.maxstring, _PREVIEW.maxother, _PREVIEW.maxlevel = 60, 60, 3
_PREVIEW.maxlist = _PREVIEW.maxdict = _PREVIEW.maxtuple = _PREVIEW.maxset = 4
_MAX_EXCEPTION_TEXT = 300
# Lone surrogates are not valid Unicode: tokenizers refuse them and UTF-8 files cannot hold them.
_SURROGATE = re.compile("[\ud800-\udfff]")
# A cancelled async tool gets this long to clean up before it is abandoned.
_CANCEL_GRACE_S = 1.0


class ToolSchemaError(TypeError):
    """A function cannot be turned into a tool (a parameter without a usable type hint, say)."""


@dataclass(frozen=True)
class Tool:
    """A callable the agent may call, with its JSON schema.

    ``fn`` may be a plain or an ``async`` function. Build one with :func:`tool`. ``converters`` map
    a parameter's checked JSON value to what ``fn`` expects (an ``Enum`` member, a tuple).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    timeout: float | None = None
    converters: dict[str, Callable[[Any], Any]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI / chat-template tool schema: ``{"type": "function", "function": {...}}``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


ErrorKind = typing.Literal["parse", "unknown_tool", "bad_arguments", "raised", "timeout", "too_many_calls"]


@dataclass(frozen=True)
class ToolResult:
    """What one tool call returned: the text for the model, and what went wrong if anything.

    ``error`` is the reason (``content`` is ``"Error: " + reason`` plus advice); ``error_kind`` is
    one of ``parse``, ``unknown_tool``, ``bad_arguments``, ``raised``, ``timeout`` (for metrics).
    """

    call: ToolCall
    content: str
    error: str | None = None
    timed_out: bool = False
    error_kind: ErrorKind | None = None

    def to_message(self) -> Message:
        """The ``tool`` role message that answers the call."""
        return Message("tool", self.content, tool_call_id=self.call.id, name=self.call.name or None)


# --- building tools ---------------------------------------------------------------------------


def tool(
    fn: Callable[..., Any] | None = None, *, name: str | None = None, timeout: float | None = None
) -> Any:
    """Make a :class:`Tool` from a typed function; usable as ``@tool`` or ``@tool(timeout=5)``.

    The description is the docstring's first paragraph; each parameter's description comes from a
    Google-style ``Args:`` section (or ``Annotated[T, "description"]``). Supported hints: ``str``,
    ``int``, ``float``, ``bool``, ``list[...]``, ``tuple[...]``, ``dict[str, ...]``,
    ``Literal[...]``, ``Enum`` subclasses, unions and ``X | None``, ``Any``. Parameters with
    defaults are optional. Raises :class:`ToolSchemaError` when a parameter cannot be described.
    """
    if timeout is not None and not timeout > 0:
        raise ValueError(f"A tool's timeout must be a positive number of seconds or None, got {timeout!r}.")

    def build(f: Callable[..., Any]) -> Tool:
        inner = f.func if isinstance(f, functools.partial) else f
        tool_name = name or getattr(inner, "__name__", None) or type(inner).__name__
        if not _NAME.match(tool_name):
            raise ToolSchemaError(
                f"Tool name {tool_name!r} is not allowed: names are 1-64 letters, digits, '_' or '-'. "
                "Pass one with @tool(name=...)."
            )
        description, arg_docs = _parse_docstring(inspect.getdoc(f) or "")
        parameters, converters = _parameters_schema(f, tool_name, arg_docs)
        return Tool(tool_name, description, parameters, f, timeout, converters)

    return build(fn) if fn is not None else build


def as_tool(obj: Tool | Callable[..., Any]) -> Tool:
    """Return ``obj`` if it is a :class:`Tool`, else build one from the callable."""
    return obj if isinstance(obj, Tool) else tool(obj)


_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Returns|Return|Yields|Raises|Examples?|Notes?|"
    r"Attributes|See Also|Warnings?|Todo):\s*$"
)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The first paragraph (up to any section header), and the ``Args:`` descriptions by name."""
    lines = doc.strip().splitlines()
    first: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line.strip()):
            break
        first.append(line.strip())
    arg_docs: dict[str, str] = {}
    header = next((i for i, line in enumerate(lines) if re.match(r"^\s*(Args|Arguments|Parameters|Params):\s*$", line)), None)
    if header is not None:
        base = len(lines[header]) - len(lines[header].lstrip())
        entry_indent: int | None = None
        current: str | None = None
        for line in lines[header + 1 :]:
            if not line.strip():
                continue
            indent = len(line) - len(line.lstrip())
            if indent <= base:  # the section ended (e.g. at "Returns:")
                break
            entry_indent = indent if entry_indent is None else entry_indent
            match = re.match(r"\s*\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)", line)
            if indent == entry_indent and match:
                current = match.group(1)
                arg_docs[current] = match.group(2).strip()
            elif current is not None:  # a continuation line, indented deeper than the entries
                arg_docs[current] = (arg_docs[current] + " " + line.strip()).strip()
    return " ".join(first), arg_docs


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    # partials and callable objects keep their hints on the wrapped function or on __call__.
    target: Any = fn
    if isinstance(fn, functools.partial):
        target = fn.func
    elif not (inspect.isfunction(fn) or inspect.ismethod(fn)) and callable(fn):
        target = type(fn).__call__
    return typing.get_type_hints(target, include_extras=True)


def _parameters_schema(
    fn: Callable[..., Any], name: str, arg_docs: dict[str, str]
) -> tuple[dict[str, Any], dict[str, Callable[[Any], Any]]]:
    try:
        hints = _type_hints(fn)
        signature = inspect.signature(fn)
    except Exception as e:  # unresolvable forward references, builtins without a signature
        raise ToolSchemaError(f"Cannot read the type hints of tool {name!r}: {type(e).__name__}: {e}") from e
    properties: dict[str, Any] = {}
    required: list[str] = []
    converters: dict[str, Callable[[Any], Any]] = {}
    for param in signature.parameters.values():
        where = f"{name}({param.name})"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            stars = "*" if param.kind == param.VAR_POSITIONAL else "**"
            raise ToolSchemaError(f"Tool {name!r} takes {stars}{param.name}; tools need named, typed parameters.")
        if param.kind == param.POSITIONAL_ONLY:
            raise ToolSchemaError(f"Tool parameter {where} is positional-only; tools are called by keyword.")
        if param.name not in hints:
            raise ToolSchemaError(
                f"Tool parameter {where} has no type hint; add one, e.g. '{param.name}: str', so the "
                "model knows what to pass."
            )
        hint, note = _unannotate(hints[param.name])
        schema = _type_schema(hint, where)
        if param.name in arg_docs or note:
            schema["description"] = arg_docs.get(param.name) or note
        if param.default is param.empty:
            required.append(param.name)
        else:
            default = param.default
            if isinstance(default, enum.Enum):  # written as the model would write it: value or name
                default = default.value if default.value in schema.get("enum", ()) else default.name
            if default is None:  # `x: int = None` means the model may pass null
                schema["nullable"] = True
            try:  # a default JSON cannot hold is left out; a tuple is written as the list it becomes
                schema["default"] = json.loads(json.dumps(default, allow_nan=False))
            except (TypeError, ValueError, RecursionError):
                pass
        properties[param.name] = schema
        converter = _converter(hint)
        if converter is not None:
            converters[param.name] = converter
    return {"type": "object", "properties": properties, "required": required}, converters


def _unannotate(hint: Any) -> tuple[Any, str]:
    if typing.get_origin(hint) is typing.Annotated:
        notes = [m for m in hint.__metadata__ if isinstance(m, str)]
        return hint.__origin__, (notes[0] if notes else "")
    return hint, ""


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    return _JSON_TYPES.get(type(value), "string")


def _type_schema(hint: Any, where: str) -> dict[str, Any]:
    hint, _ = _unannotate(hint)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if isinstance(hint, type) and hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    if hint is Any:
        return {}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        values = [m.value for m in hint]
        if not values:
            raise ToolSchemaError(f"Tool parameter {where} is the Enum {hint.__name__}, which has no members.")
        if not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in values):
            values = [m.name for m in hint]  # values JSON cannot hold: the model picks by name
        return _enum_schema(values)
    if origin is typing.Literal:
        if not all(a is None or type(a) in _JSON_TYPES for a in args):
            raise ToolSchemaError(f"Tool parameter {where}: Literal values must be str, int, float, bool or None.")
        return _enum_schema(list(args))
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        union: dict[str, Any] = (
            _type_schema(options[0], where) if len(options) == 1 else {"anyOf": [_type_schema(a, where) for a in options]}
        )
        if len(options) < len(args):
            union["nullable"] = True  # the spelling transformers' get_json_schema uses for X | None
        return union
    if hint in (list, tuple, Sequence, typing.Sequence) or origin in (list, Sequence):
        return {"type": "array", "items": _type_schema(args[0] if args else Any, where)}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _type_schema(args[0], where)}
        items = [_type_schema(a, where) for a in args]
        return {"type": "array", "prefixItems": items, "minItems": len(items), "maxItems": len(items)}
    if hint is dict or origin is dict:
        if args and args[0] is not str:
            raise ToolSchemaError(f"Tool parameter {where} is {hint!r}; JSON object keys are strings, use dict[str, ...].")
        mapping: dict[str, Any] = {"type": "object"}
        if len(args) == 2:
            mapping["additionalProperties"] = _type_schema(args[1], where)
        return mapping
    raise ToolSchemaError(
        f"Tool parameter {where} has type {hint!r}, which has no JSON schema here; use str, int, "
        "float, bool, list[...], tuple[...], dict[str, ...], Literal[...], an Enum, or X | None."
    )


def _enum_schema(values: list[Any]) -> dict[str, Any]:
    kinds = sorted({_json_kind(v) for v in values})
    return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": values}


def _converter(hint: Any) -> Callable[[Any], Any] | None:
    """How to turn a checked JSON value into what the annotation promises, or None if it already is."""
    hint, _ = _unannotate(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        by_value = {m.value: m for m in hint}
        return lambda v: by_value[v] if _hashable(v) and v in by_value else hint[v]
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        inner = _converter(options[0]) if len(options) == 1 else None
        return None if inner is None else (lambda v: None if v is None else inner(v))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = _converter(args[0]) or (lambda v: v)
            return lambda v: tuple(item(i) for i in v)
        parts = [_converter(a) or (lambda v: v) for a in args]
        return lambda v: tuple(c(i) for c, i in zip(parts, v))
    if hint is tuple:
        return tuple
    if origin in (list, Sequence) and args:
        item_converter = _converter(args[0])
        return None if item_converter is None else (lambda v: [item_converter(i) for i in v])
    if origin is dict and len(args) == 2:
        value_converter = _converter(args[1])
        return None if value_converter is None else (lambda v: {k: value_converter(i) for k, i in v.items()})
    return None


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


# --- checking arguments -----------------------------------------------------------------------


def check_arguments(tool_: Tool, arguments: Any) -> dict[str, Any] | str:
    """Validate and coerce ``arguments`` against the tool's schema.

    Returns the keyword arguments to call ``tool_.fn`` with, or an error text for the model. Whole
    floats pass as integers (``2.0`` -> ``2``) and integers as floats; strings are never turned into
    numbers, and ``true``/``false`` are not numbers. Enum values become the Enum's members.
    """
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    properties = tool_.parameters.get("properties", {})
    unknown = sorted((str(k) for k in arguments if k not in properties), key=str)
    if unknown:
        return f"unknown argument(s) {unknown}; {tool_.name} takes {sorted(properties) or 'no arguments'}"
    missing = [p for p in tool_.parameters.get("required", []) if p not in arguments]
    if missing:
        return f"missing required argument(s) {missing}"
    checked = {}
    for key, value in arguments.items():
        coerced = _check_value(properties[key], value)
        if isinstance(coerced, _Invalid):
            return f"argument {key!r}: {coerced.reason}"
        converter = tool_.converters.get(key)
        if converter is not None:
            try:
                coerced = converter(coerced)
            except (KeyError, TypeError, ValueError) as e:
                return f"argument {key!r}: {_preview(value)} cannot be converted ({_exception_text(e)})"
        checked[key] = coerced
    return checked


@dataclass(frozen=True)
class _Invalid:
    reason: str


def _check_value(schema: dict[str, Any], value: Any) -> Any:
    if value is None and schema.get("nullable"):
        return None
    if "anyOf" in schema:
        for option in schema["anyOf"]:
            result = _check_value(option, value)
            if not isinstance(result, _Invalid):
                return result
        return _Invalid(f"{_preview(value)} matches none of the allowed types")
    if "enum" in schema:
        # Compare within a JSON kind only, so `true` does not pass for 1 nor 1 for `true`.
        for option in schema["enum"]:
            if _same_kind(option, value) and option == value:
                return option
        return _Invalid(f"must be one of {_preview(schema['enum'])}, got {_preview(value)}")
    kind = schema.get("type")
    if isinstance(kind, list):
        for option in kind:
            result = _check_value({**schema, "type": option}, value)
            if not isinstance(result, _Invalid):
                return result
        return _Invalid(f"expected one of the types {kind}, got {_preview(value)}")
    if kind is None:
        return value
    if kind == "null":
        return value if value is None else _Invalid(f"expected null, got {_preview(value)}")
    if kind == "string":
        return value if isinstance(value, str) else _Invalid(f"expected a string, got {_preview(value)}")
    if kind == "boolean":
        return value if isinstance(value, bool) else _Invalid(f"expected true or false, got {_preview(value)}")
    if kind == "integer":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return _Invalid(f"expected an integer, got {_preview(value)}")
    if kind == "number":
        if isinstance(value, float):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # a 400-digit integer is valid JSON but no float
                return _Invalid(f"the number {_preview(value)} is too large")
        return _Invalid(f"expected a number, got {_preview(value)}")
    if kind == "array":
        return _check_array(schema, value)
    if kind == "object":
        if not isinstance(value, dict):
            return _Invalid(f"expected an object, got {_preview(value)}")
        inner = schema.get("additionalProperties")
        if not isinstance(inner, dict):
            return value
        checked = {}
        for k, v in value.items():
            result = _check_value(inner, v)
            if isinstance(result, _Invalid):
                return _Invalid(f"key {_name(k)}: {result.reason}")
            checked[k] = result
        return checked
    return value


def _check_array(schema: dict[str, Any], value: Any) -> Any:
    if not isinstance(value, list):
        return _Invalid(f"expected a list, got {_preview(value)}")
    if "prefixItems" in schema and len(value) != len(schema["prefixItems"]):
        return _Invalid(f"expected a list of exactly {len(schema['prefixItems'])} items, got {len(value)}")
    item_schemas = schema.get("prefixItems") or [schema.get("items", {})] * len(value)
    checked = []
    for index, (item_schema, item) in enumerate(zip(item_schemas, value)):
        result = _check_value(item_schema, item)
        if isinstance(result, _Invalid):
            return _Invalid(f"item {index}: {result.reason}")
        checked.append(result)
    return checked


def _same_kind(a: Any, b: Any) -> bool:
    number = (int, float)
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool)
    if isinstance(a, number) or isinstance(b, number):
        return isinstance(a, number) and isinstance(b, number)
    return type(a) is type(b)


def _preview(value: Any) -> str:
    """A short repr for error texts; never raises (huge ints, deep nesting, a broken __repr__)."""
    try:
        if isinstance(value, str):  # scalars as JSON, the language the model wrote them in
            return json.dumps(value if len(value) <= 60 else value[:57] + "...", ensure_ascii=False)
        if value is None or isinstance(value, (bool, float)):
            return json.dumps(value)
        return _PREVIEW.repr(value)
    except ValueError:  # int.__repr__ refuses more than sys.get_int_max_str_digits() digits
        return "an integer with thousands of digits" if isinstance(value, int) else f"a {type(value).__name__}"
    except Exception:
        return f"a {type(value).__name__}"


def _name(name: Any) -> str:
    return repr(name if len(name) <= 60 else name[:57] + "...") if isinstance(name, str) else _preview(name)


def _exception_text(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:
        text = ""
    text = " ".join(text.split())
    return text if len(text) <= _MAX_EXCEPTION_TEXT else text[: _MAX_EXCEPTION_TEXT - 3] + "..."


def _signature_hint(tool_: Tool) -> str:
    properties = tool_.parameters.get("properties", {})
    required = set(tool_.parameters.get("required", []))
    parts = []
    for key, schema in properties.items():
        kind = schema.get("type", "any") if isinstance(schema, dict) else "any"
        kind = "/".join(kind) if isinstance(kind, list) else kind
        parts.append(f"{key} ({kind}{'' if key in required else ', optional'})")
    return ", ".join(parts) or "no arguments"


# --- running calls ----------------------------------------------------------------------------


def _prepare(tools: dict[str, Tool], call: ToolCall) -> tuple[Tool, dict[str, Any]] | ToolResult:
    if call.error:
        return _error(
            call,
            "parse",
            f"could not parse the tool call: {call.error}",
            'Write each call as a JSON object {"name": "<tool name>", "arguments": {...}} and try again.',
        )
    if not isinstance(call.name, str) or call.name not in tools:
        known = ", ".join(sorted(tools)) or "none"
        # Suggest a near name for a typo; long garbage names are not worth the comparison.
        close = difflib.get_close_matches(call.name, list(tools), n=1) if isinstance(call.name, str) and len(call.name) <= 100 else []
        advice = f"Did you mean {close[0]!r}?" if close else "Call one of them by its exact name."
        return _error(call, "unknown_tool", f"unknown tool {_name(call.name)}; available tools: {known}", advice)
    tool_ = tools[call.name]
    arguments = check_arguments(tool_, call.arguments)
    if isinstance(arguments, str):
        return _error(
            call,
            "bad_arguments",
            f"bad arguments for {call.name}: {arguments}",
            f"{call.name} takes {_signature_hint(tool_)}; fix the arguments and call it again.",
        )
    return tool_, arguments


def _error(call: ToolCall, kind: ErrorKind, reason: str, advice: str) -> ToolResult:
    reason = _valid_unicode(reason)
    return ToolResult(call, f"Error: {reason}. {advice}", error=reason, timed_out=kind == "timeout", error_kind=kind)


def _valid_unicode(text: str) -> str:
    """``text`` with lone surrogates (from a tool, or quoted from a call) replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def _raised(call: ToolCall, error: BaseException) -> ToolResult:
    return _error(
        call,
        "raised",
        f"{call.name} raised {type(error).__name__}: {_exception_text(error)}",
        "Check the arguments, or try a different approach.",
    )


def _timed_out(call: ToolCall, limit: float) -> ToolResult:
    return _error(
        call,
        "timeout",
        f"{call.name} ran longer than its limit of {limit:g} s and was stopped",
        "Try a smaller input or a different approach.",
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        try:
            return sorted(value)
        except TypeError:
            return list(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def _format(value: Any) -> str:
    """The tool's return value as text for the model; never raises."""
    if isinstance(value, str):
        return _valid_unicode(value)
    try:
        if not isinstance(value, (dict, list, tuple, int, float, bool, type(None))):
            value = _jsonable(value)  # a bare object reads better as its str than as a quoted one
            if isinstance(value, str):
                return _valid_unicode(value)
        return _valid_unicode(json.dumps(value, ensure_ascii=False, default=_jsonable))
    except Exception:  # a 5000-digit int, deep nesting, a cycle, a broken __str__
        pass
    try:
        return _valid_unicode(str(value))
    except Exception:
        return _valid_unicode(_preview(value))


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _run_sync(fn: Callable[..., Any], arguments: dict[str, Any], limit: float | None) -> Any:
    """Call ``fn``; if it hands back an awaitable, run that in a private loop.

    The private loop cancels the awaitable a grace period after ``limit``: the caller has given up
    by then, and this frees the thread. A ``TimeoutError`` out of here is therefore the tool's own.
    """
    result = fn(**arguments)
    if inspect.isawaitable(result):
        cancel_after = None if limit is None else limit + _CANCEL_GRACE_S
        return asyncio.run(asyncio.wait_for(_awaited(result), cancel_after))
    return result


async def _awaited(awaitable: Any) -> Any:
    return await awaitable




def call_tool(tools: dict[str, Tool], call: ToolCall, timeout: float | None = None) -> ToolResult:
    """Run one tool call synchronously; never raises (see the module docstring).

    ``timeout`` (seconds) applies unless the tool sets its own. With a limit the tool runs in a
    daemon thread and is abandoned when the limit passes; with none, a plain function runs in the
    calling thread. ``async`` tools run in a private event loop and are cancelled at the limit.
    """
    prepared = _prepare(tools, call)
    if isinstance(prepared, ToolResult):
        return prepared
    tool_, arguments = prepared
    limit = tool_.timeout if tool_.timeout is not None else timeout
    try:
        if limit is None and not _is_async(tool_.fn):
            value = _run_sync(tool_.fn, arguments, None)
        else:
            future = TOOL_THREADS.submit(lambda: _run_sync(tool_.fn, arguments, limit))
            done, _ = concurrent.futures.wait([future], timeout=limit)
            if not done:
                TOOL_THREADS.abandon(future)
                return _timed_out(call, limit)  # type: ignore[arg-type]
            value = future.result()
    except (Exception, SystemExit) as e:  # KeyboardInterrupt still stops the program
        return _raised(call, e)
    return ToolResult(call, _format(value))


async def acall_tool(tools: dict[str, Tool], call: ToolCall, timeout: float | None = None) -> ToolResult:
    """Run one tool call without blocking the event loop; never raises.

    ``async`` tools are awaited and cancelled at the time limit; plain functions run in a daemon
    thread and are abandoned at it. Cancelling the caller cancels an ``async`` tool too.
    """
    prepared = _prepare(tools, call)
    if isinstance(prepared, ToolResult):
        return prepared
    tool_, arguments = prepared
    limit = tool_.timeout if tool_.timeout is not None else timeout
    if _is_async(tool_.fn):
        try:
            task = asyncio.ensure_future(tool_.fn(**arguments))
        except Exception as e:
            return _raised(call, e)
        try:
            done, _ = await asyncio.wait({task}, timeout=limit)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=_CANCEL_GRACE_S)  # let it clean up, but not forever
            return _timed_out(call, limit)  # type: ignore[arg-type]
        outcome: concurrent.futures.Future[Any] | asyncio.Future[Any] = task
    else:
        future = TOOL_THREADS.submit(lambda: _run_sync(tool_.fn, arguments, limit))
        wrapped = asyncio.wrap_future(future)
        try:
            done, _ = await asyncio.wait({wrapped}, timeout=limit)
        except asyncio.CancelledError:
            TOOL_THREADS.abandon(future)
            wrapped.cancel()
            raise
        if not done:
            TOOL_THREADS.abandon(future)
            wrapped.cancel()  # so the late result is not posted to this loop, which may be closed by then
            return _timed_out(call, limit)  # type: ignore[arg-type]
        outcome = wrapped
    try:
        value = outcome.result()
    except asyncio.CancelledError as e:  # the tool cancelled itself
        return _raised(call, e)
    except (Exception, SystemExit) as e:
        return _raised(call, e)
    return ToolResult(call, _format(value))
