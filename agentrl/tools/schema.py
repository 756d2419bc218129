"""Building tools: a typed Python function becomes a :class:`Tool` with a JSON schema.

:func:`tool` reads the function's type hints and its docstring and writes the schema that
``tokenizer.apply_chat_template(tools=...)`` and OpenAI-style APIs expect; each parameter's
converter turns a checked JSON value back into what the hint promises (an ``Enum`` member, a tuple).

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

import enum
import functools
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

_JSON_TYPES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
# The tool-name rule of the OpenAI API, which most chat templates and servers follow.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


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


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, timeout: float | None = None) -> Any:
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
    header = next(
        (i for i, line in enumerate(lines) if re.match(r"^\s*(Args|Arguments|Parameters|Params):\s*$", line)), None
    )
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
            _type_schema(options[0], where)
            if len(options) == 1
            else {"anyOf": [_type_schema(a, where) for a in options]}
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
            raise ToolSchemaError(
                f"Tool parameter {where} is {hint!r}; JSON object keys are strings, use dict[str, ...]."
            )
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
