"""Tools: typed Python callables that an environment offers to the agent.

:func:`tool` turns a function with type hints and a docstring into a :class:`Tool` with a JSON
schema (the shape ``tokenizer.apply_chat_template(tools=...)`` and OpenAI-style APIs expect).
:func:`call_tool` and :func:`acall_tool` run one parsed :class:`~agentrl.types.ToolCall` and never
raise: a malformed call, an unknown tool, wrong argument types, a tool that raises or runs past its
time limit all come back as a :class:`ToolResult` with ``error`` set, whose text tells the model
what went wrong so the episode can go on.

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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.types import Message, ToolCall

_JSON_TYPES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
# Tool threads that outlive their time limit cannot be killed in Python; they run out in this pool
# so a hung tool never blocks the caller. Envs that run untrusted or unbounded code should use a
# sandbox (agentrl.sandboxes), which can be killed.
_TOOL_THREADS = concurrent.futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="agentrl-tool")


class ToolSchemaError(TypeError):
    """A function cannot be turned into a tool (a parameter without a usable type hint, say)."""


@dataclass(frozen=True)
class Tool:
    """A callable the agent may call, with its JSON schema.

    ``fn`` may be a plain or an ``async`` function. Build one with :func:`tool`.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    timeout: float | None = None

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI / chat-template tool schema: ``{"type": "function", "function": {...}}``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


@dataclass(frozen=True)
class ToolResult:
    """What one tool call returned: the text for the model, and whether it was an error."""

    call: ToolCall
    content: str
    error: str | None = None
    timed_out: bool = False

    def to_message(self) -> Message:
        """The ``tool`` role message that answers the call."""
        return Message("tool", self.content, tool_call_id=self.call.id, name=self.call.name or None)


def tool(
    fn: Callable[..., Any] | None = None, *, name: str | None = None, timeout: float | None = None
) -> Any:
    """Make a :class:`Tool` from a typed function; usable as ``@tool`` or ``@tool(timeout=5)``.

    The description is the docstring's first paragraph; each parameter's description comes from a
    Google-style ``Args:`` section. Supported hints: ``str``, ``int``, ``float``, ``bool``,
    ``list[...]``, ``dict[str, ...]``, ``Literal[...]``, ``Enum`` subclasses and ``X | None``.
    Parameters with defaults are optional.
    """

    def build(f: Callable[..., Any]) -> Tool:
        description, arg_docs = _parse_docstring(inspect.getdoc(f) or "")
        return Tool(
            name=name or f.__name__,
            description=description,
            parameters=_parameters_schema(f, arg_docs),
            fn=f,
            timeout=timeout,
        )

    return build(fn) if fn is not None else build


def as_tool(obj: Tool | Callable[..., Any]) -> Tool:
    """Return ``obj`` if it is a :class:`Tool`, else build one from the callable."""
    return obj if isinstance(obj, Tool) else tool(obj)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    paragraphs = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)
    description = " ".join(paragraphs[0].split()) if paragraphs and paragraphs[0] else ""
    if description.lower().startswith(("args:", "arguments:", "parameters:")):
        description = ""
    arg_docs: dict[str, str] = {}
    section = re.search(r"^\s*(?:Args|Arguments|Parameters):\s*\n(.*?)(?:\n\s*\n|\n\S|\Z)", doc, re.S | re.M)
    if section:
        current = None
        for line in section.group(1).splitlines():
            match = re.match(r"\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)", line)
            if match:
                current = match.group(1)
                arg_docs[current] = match.group(2).strip()
            elif current and line.strip():
                arg_docs[current] += " " + line.strip()
    return description, arg_docs


def _parameters_schema(fn: Callable[..., Any], arg_docs: dict[str, str]) -> dict[str, Any]:
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:  # unresolvable forward references
        raise ToolSchemaError(f"Cannot read the type hints of tool {fn.__name__!r}: {e}") from e
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolSchemaError(
                f"Tool {fn.__name__!r} takes *{param.name}; tools need named, typed parameters."
            )
        if param.name not in hints:
            raise ToolSchemaError(
                f"Tool parameter {fn.__name__}({param.name}) has no type hint; add one, e.g. "
                f"'{param.name}: str', so the model knows what to pass."
            )
        schema = _type_schema(hints[param.name], where=f"{fn.__name__}({param.name})")
        if param.name in arg_docs:
            schema["description"] = arg_docs[param.name]
        if param.default is not param.empty:
            if isinstance(param.default, (str, int, float, bool)) or param.default is None:
                schema["default"] = param.default
        else:
            required.append(param.name)
        properties[param.name] = schema
    return {"type": "object", "properties": properties, "required": required}


def _type_schema(hint: Any, where: str) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    if hint is Any:
        return {}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"type": "string", "enum": [str(member.value) for member in hint]}
    if origin is typing.Literal:
        kinds = {_JSON_TYPES.get(type(a), "string") for a in args}
        return {"type": kinds.pop() if len(kinds) == 1 else sorted(kinds), "enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            schema = _type_schema(options[0], where)
            if len(options) < len(args):
                schema["nullable"] = True
            return schema
        return {"anyOf": [_type_schema(a, where) for a in options]}
    if hint in (list, tuple) or origin in (list, tuple, Sequence, typing.Sequence):
        item = args[0] if args else Any
        return {"type": "array", "items": _type_schema(item, where)}
    if hint is dict or origin is dict:
        schema: dict[str, Any] = {"type": "object"}
        if len(args) == 2:
            schema["additionalProperties"] = _type_schema(args[1], where)
        return schema
    raise ToolSchemaError(
        f"Tool parameter {where} has type {hint!r}, which has no JSON schema here; use str, int, "
        "float, bool, list[...], dict[str, ...], Literal[...], an Enum, or X | None."
    )


def check_arguments(tool_: Tool, arguments: Any) -> dict[str, Any] | str:
    """Validate and coerce ``arguments`` against the tool's schema.

    Returns the arguments to call with, or an error text for the model. Whole floats pass as
    integers and integers as floats; anything else of the wrong type is an error.
    """
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    properties = tool_.parameters.get("properties", {})
    unknown = sorted(set(arguments) - set(properties))
    if unknown:
        return f"unknown argument(s) {unknown}; {tool_.name} takes {sorted(properties)}"
    missing = [p for p in tool_.parameters.get("required", []) if p not in arguments]
    if missing:
        return f"missing required argument(s) {missing}"
    checked = {}
    for key, value in arguments.items():
        coerced = _check_value(properties[key], value)
        if isinstance(coerced, _Invalid):
            return f"argument {key!r}: {coerced.reason}"
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
        return _Invalid(f"{value!r:.60} matches none of the allowed types")
    if "enum" in schema:
        return value if value in schema["enum"] else _Invalid(f"must be one of {schema['enum']}, got {value!r:.60}")
    kind = schema.get("type")
    if kind is None:
        return value
    if kind == "string":
        return value if isinstance(value, str) else _Invalid(f"expected a string, got {value!r:.60}")
    if kind == "boolean":
        return value if isinstance(value, bool) else _Invalid(f"expected true or false, got {value!r:.60}")
    if kind == "integer":
        if isinstance(value, bool):
            return _Invalid(f"expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return _Invalid(f"expected an integer, got {value!r:.60}")
    if kind == "number":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value) if isinstance(value, int) else value
        return _Invalid(f"expected a number, got {value!r:.60}")
    if kind == "array":
        if not isinstance(value, list):
            return _Invalid(f"expected a list, got {value!r:.60}")
        items = [_check_value(schema.get("items", {}), v) for v in value]
        bad = next((i for i in items if isinstance(i, _Invalid)), None)
        return bad if bad is not None else items
    if kind == "object":
        if not isinstance(value, dict):
            return _Invalid(f"expected an object, got {value!r:.60}")
        inner = schema.get("additionalProperties")
        if inner is None:
            return value
        checked = {k: _check_value(inner, v) for k, v in value.items()}
        bad = next((v for v in checked.values() if isinstance(v, _Invalid)), None)
        return bad if bad is not None else checked
    return value


def _prepare(tools: dict[str, Tool], call: ToolCall) -> tuple[Tool, dict[str, Any]] | ToolResult:
    if call.error:
        return _error(call, f"could not parse the tool call: {call.error}")
    if call.name not in tools:
        known = ", ".join(sorted(tools)) or "none"
        return _error(call, f"unknown tool {call.name!r}; available tools: {known}")
    tool_ = tools[call.name]
    arguments = check_arguments(tool_, call.arguments)
    if isinstance(arguments, str):
        return _error(call, f"bad arguments for {call.name}: {arguments}")
    return tool_, arguments


def _error(call: ToolCall, reason: str, timed_out: bool = False) -> ToolResult:
    return ToolResult(call, f"Error: {reason}", error=reason, timed_out=timed_out)


def _format(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def call_tool(tools: dict[str, Tool], call: ToolCall, timeout: float | None = None) -> ToolResult:
    """Run one tool call synchronously; never raises (see the module docstring).

    ``timeout`` (seconds) applies unless the tool sets its own. A timed-out tool keeps running in a
    background thread; its result is discarded.
    """
    prepared = _prepare(tools, call)
    if isinstance(prepared, ToolResult):
        return prepared
    tool_, arguments = prepared
    limit = tool_.timeout if tool_.timeout is not None else timeout

    def run() -> Any:
        result = tool_.fn(**arguments)
        if inspect.isawaitable(result):
            return asyncio.run(_awaited(result))
        return result

    future = _TOOL_THREADS.submit(run)
    try:
        value = future.result(timeout=limit)
    except concurrent.futures.TimeoutError:
        return _error(call, f"{call.name} ran longer than its limit of {limit:g} s and was abandoned", True)
    except Exception as e:
        return _error(call, f"{call.name} raised {type(e).__name__}: {e}")
    return ToolResult(call, _format(value))


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


async def acall_tool(tools: dict[str, Tool], call: ToolCall, timeout: float | None = None) -> ToolResult:
    """Run one tool call without blocking the event loop; never raises.

    ``async`` tools are awaited (and cancelled at the time limit); plain functions run in a thread.
    """
    prepared = _prepare(tools, call)
    if isinstance(prepared, ToolResult):
        return prepared
    tool_, arguments = prepared
    limit = tool_.timeout if tool_.timeout is not None else timeout
    try:
        if inspect.iscoroutinefunction(tool_.fn):
            value = await asyncio.wait_for(tool_.fn(**arguments), timeout=limit)
        else:
            loop = asyncio.get_running_loop()
            future = loop.run_in_executor(_TOOL_THREADS, lambda: tool_.fn(**arguments))
            value = await asyncio.wait_for(future, timeout=limit)
            if inspect.isawaitable(value):
                value = await asyncio.wait_for(_awaited(value), timeout=limit)
    except asyncio.TimeoutError:
        return _error(call, f"{call.name} ran longer than its limit of {limit:g} s and was abandoned", True)
    except Exception as e:
        return _error(call, f"{call.name} raised {type(e).__name__}: {e}")
    return ToolResult(call, _format(value))
