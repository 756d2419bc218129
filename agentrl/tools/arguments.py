"""Checking a model's arguments against a tool's schema, and quoting what was wrong.

:func:`check_arguments` validates and coerces the JSON arguments of one call: it returns the
keyword arguments to call the tool with, or an error text for the model. The quoting helpers
(:func:`preview`, :func:`quoted_name`, :func:`exception_text`, :func:`signature_hint`) keep every
error text short and never raise, whatever the model wrote or the tool raised;
:mod:`agentrl.tools.call` words its errors with them too.

>>> from agentrl.tools.schema import tool
>>> @tool
... def scale(x: float, times: int = 2) -> float:
...     return x * times
>>> check_arguments(scale, {"x": 3, "times": 2.0})
{'x': 3.0, 'times': 2}
>>> print(check_arguments(scale, {"x": "3"}))
argument 'x': expected a number, got "3"
"""

from __future__ import annotations

import json
import reprlib
from dataclasses import dataclass
from typing import Any

from agentrl.tools.schema import Tool

# Error texts quote at most this much of a bad value or an exception message.
_PREVIEW = reprlib.Repr()
_PREVIEW.maxstring, _PREVIEW.maxother, _PREVIEW.maxlevel = 60, 60, 3
_PREVIEW.maxlist = _PREVIEW.maxdict = _PREVIEW.maxtuple = _PREVIEW.maxset = 4
_MAX_EXCEPTION_TEXT = 300


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
                return f"argument {key!r}: {preview(value)} cannot be converted ({exception_text(e)})"
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
        return _Invalid(f"{preview(value)} matches none of the allowed types")
    if "enum" in schema:
        # Compare within a JSON kind only, so `true` does not pass for 1 nor 1 for `true`.
        for option in schema["enum"]:
            if _same_kind(option, value) and option == value:
                return option
        return _Invalid(f"must be one of {preview(schema['enum'])}, got {preview(value)}")
    kind = schema.get("type")
    if isinstance(kind, list):
        for option in kind:
            result = _check_value({**schema, "type": option}, value)
            if not isinstance(result, _Invalid):
                return result
        return _Invalid(f"expected one of the types {kind}, got {preview(value)}")
    if kind is None:
        return value
    if kind == "null":
        return value if value is None else _Invalid(f"expected null, got {preview(value)}")
    if kind == "string":
        return value if isinstance(value, str) else _Invalid(f"expected a string, got {preview(value)}")
    if kind == "boolean":
        return value if isinstance(value, bool) else _Invalid(f"expected true or false, got {preview(value)}")
    if kind == "integer":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return _Invalid(f"expected an integer, got {preview(value)}")
    if kind == "number":
        if isinstance(value, float):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # a 400-digit integer is valid JSON but no float
                return _Invalid(f"the number {preview(value)} is too large")
        return _Invalid(f"expected a number, got {preview(value)}")
    if kind == "array":
        return _check_array(schema, value)
    if kind == "object":
        if not isinstance(value, dict):
            return _Invalid(f"expected an object, got {preview(value)}")
        inner = schema.get("additionalProperties")
        if not isinstance(inner, dict):
            return value
        checked = {}
        for k, v in value.items():
            result = _check_value(inner, v)
            if isinstance(result, _Invalid):
                return _Invalid(f"key {quoted_name(k)}: {result.reason}")
            checked[k] = result
        return checked
    return value


def _check_array(schema: dict[str, Any], value: Any) -> Any:
    if not isinstance(value, list):
        return _Invalid(f"expected a list, got {preview(value)}")
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


def preview(value: Any) -> str:
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


def quoted_name(name: Any) -> str:
    """A name the model wrote (a tool's, an argument's), quoted and cut short for an error text."""
    return repr(name if len(name) <= 60 else name[:57] + "...") if isinstance(name, str) else preview(name)


def exception_text(error: BaseException) -> str:
    """An exception's message on one line, cut short; empty if its ``__str__`` raises."""
    try:
        text = str(error)
    except Exception:
        text = ""
    text = " ".join(text.split())
    return text if len(text) <= _MAX_EXCEPTION_TEXT else text[: _MAX_EXCEPTION_TEXT - 3] + "..."


def signature_hint(tool_: Tool) -> str:
    """What the tool takes, for advice: ``"a (integer), b (number, optional)"``."""
    properties = tool_.parameters.get("properties", {})
    required = set(tool_.parameters.get("required", []))
    parts = []
    for key, schema in properties.items():
        kind = schema.get("type", "any") if isinstance(schema, dict) else "any"
        kind = "/".join(kind) if isinstance(kind, list) else kind
        parts.append(f"{key} ({kind}{'' if key in required else ', optional'})")
    return ", ".join(parts) or "no arguments"
