"""Typed configs: dataclasses filled from YAML files and ``key=value`` overrides.

Every component has one config dataclass whose fields carry a one-line doc (the string right under
the field). :func:`load_config` reads a YAML mapping, applies command-line overrides, checks every
key and type, and builds the dataclass, whose ``__post_init__`` checks the cross-field rules::

    config = load_config(RolloutConfig, "examples/rollout.yaml", ["episodes=64", "backend=hf"])

A field whose type is itself a config dataclass is a section: a nested mapping in YAML, and a
dotted key on the command line (``trainer.lr=1e-5``).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override is malformed; the message says what was expected."""


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> T:
    """Build ``cls`` from the YAML file at ``path`` (optional) and ``key=value`` overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"Cannot read config {path}: {e}") from e
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"Config {path} must be a YAML mapping of field: value, got {type(loaded).__name__}.")
        data.update(loaded or {})
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"Override {item!r} must look like key=value, e.g. episodes=64.")
        *sections, name = key.strip().split(".")
        target = data
        for section in sections:
            if not isinstance(target.get(section, {}), dict):
                raise ConfigError(f"Override {item!r}: {section!r} is a value, not a section.")
            target = target.setdefault(section, {})
        target[name] = yaml.safe_load(raw) if raw.strip() else ""
    return from_dict(cls, data, source=str(path) if path else "overrides")


def from_dict(cls: type[T], data: dict[str, Any], source: str = "config") -> T:
    """Build ``cls`` from a plain dict, checking keys and value types."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else f" Known fields: {', '.join(sorted(fields))}."
            raise ConfigError(f"Unknown field {key!r} in {source} for {cls.__name__}.{hint}")
        if dataclasses.is_dataclass(hints[key]):
            if not isinstance(value, dict):
                raise ConfigError(f"{cls.__name__}.{key} is a section: give a mapping of its fields, got {value!r}.")
            values[key] = from_dict(hints[key], value, source)
            continue
        values[key] = _coerce(value, hints[key], f"{cls.__name__}.{key}")
    try:
        return cls(**values)
    except TypeError as e:
        raise ConfigError(f"{cls.__name__}: {e}") from e


def to_dict(config: Any) -> dict[str, Any]:
    """The config as a plain dict (for logs and saved runs)."""
    return dataclasses.asdict(config)


def field_docs(cls: type) -> dict[str, str]:
    """The one-line doc of each field (the string literal right under it in the source)."""
    import ast
    import inspect

    docs: dict[str, str] = {}
    body = ast.parse(inspect.getsource(cls)).body[0].body  # type: ignore[attr-defined]
    for node, following in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
                docs[node.target.id] = str(following.value.value)
    return docs


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, option, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where} cannot be {value!r}.")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where} must be one of {list(args)}, got {value!r}.")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}.")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}.")
        return value
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-5" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}.")
        return float(value)
    if hint is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{where} must be a string, got {value!r}.")
        return str(value)
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}.")
        return value
    if origin in (list, tuple) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}.")
        return type(value)(value) if origin is None else (list if origin is list else tuple)(value)
    return value
