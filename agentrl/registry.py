"""Env registration: thin wrappers over gymnasium's own registry.

``agentrl.register`` is ``gymnasium.register`` with the settings message envs need (no gymnasium
wrappers, which would hide ``astep``; agentrl's own checker instead of gymnasium's passive one), and
``agentrl.make`` is ``gymnasium.make`` with a "did you mean" error for unknown ids. Ids follow
gymnasium's ``namespace/Name-vN`` form; built-ins live under ``agentrl/``.

Installed packages register envs through the entry-point group ``agentrl.envs``: each entry point
names a module (importing it registers its envs) or a function (called with no arguments). They are
loaded the first time an id is looked up, so ``agentrl.make("mypkg/Maze-v0")`` works without
importing ``mypkg``::

    # pyproject.toml of the third-party package
    [project.entry-points."agentrl.envs"]
    mypkg = "mypkg.envs"
"""

from __future__ import annotations

import difflib
import importlib.metadata
import logging
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "agentrl.envs"
_plugins_loaded = False
_failed_plugins: dict[str, str] = {}


class UnknownEnvError(gym.error.UnregisteredEnv):
    """No env is registered under the requested id."""


def register(
    id: str,
    entry_point: str | Callable[..., gym.Env],
    *,
    kwargs: dict[str, Any] | None = None,
    nondeterministic: bool = False,
    **spec_fields: Any,
) -> None:
    """Register an env class under ``id`` (e.g. ``"mypkg/Maze-v0"``) in gymnasium's registry.

    ``entry_point`` is ``"module:Class"`` (imported only when the env is made) or a callable.
    ``kwargs`` are the default constructor arguments, e.g. ``{"max_turns": 8}``.
    """
    if spec_fields.get("max_episode_steps") is not None:
        raise ValueError(
            "Pass max_turns=N in kwargs instead of max_episode_steps: gymnasium's TimeLimit wrapper "
            "would hide the env's awaitable methods."
        )
    gym.register(
        id=id,
        entry_point=entry_point,
        kwargs=kwargs or {},
        nondeterministic=nondeterministic,
        order_enforce=False,
        disable_env_checker=True,
        **spec_fields,
    )


def make(id: str, **kwargs: Any) -> gym.Env:
    """Make the env registered under ``id``; ``kwargs`` override the registered ones.

    >>> env = make("agentrl/Calculator-v0", split="test")  # doctest: +SKIP
    """
    return gym.make(spec(id).id, **kwargs)


def spec(id: str) -> EnvSpec:
    """The ``EnvSpec`` registered under ``id``; unknown ids raise :class:`UnknownEnvError`."""
    load_plugins()
    if id in gym.registry:
        return gym.registry[id]
    raise UnknownEnvError(_unknown_message(id))


def registered_ids(namespace: str | None = None, *, message_envs_only: bool = True) -> list[str]:
    """The registered ids, sorted; by default only message envs (not gymnasium's CartPole & co).

    ``namespace="agentrl"`` lists the built-ins only.
    """
    load_plugins()
    ids = []
    for env_id, env_spec in gym.registry.items():
        if namespace is not None and env_spec.namespace != namespace:
            continue
        if message_envs_only and not _is_message_env(env_spec):
            continue
        ids.append(env_id)
    return sorted(ids)


def describe(id: str) -> str:
    """A one-line description of an env: the first line of its class docstring."""
    entry_point = spec(id).entry_point
    target = gym.envs.registration.load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    doc = (getattr(target, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


def load_plugins(reload: bool = False) -> dict[str, str]:
    """Load the ``agentrl.envs`` entry points of installed packages (once; again with ``reload``).

    A plugin that fails to load is logged and skipped, never fatal; the returned dict maps each
    failed plugin to its error.
    """
    global _plugins_loaded
    if _plugins_loaded and not reload:
        return dict(_failed_plugins)
    _plugins_loaded = True
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = entry_point.load()
            if callable(loaded):
                loaded()
        except Exception as e:  # a broken third-party package must not break agentrl
            _failed_plugins[entry_point.name] = f"{type(e).__name__}: {e}"
            warnings.warn(
                f"Could not load agentrl env plugin {entry_point.name!r} ({entry_point.value}): "
                f"{type(e).__name__}: {e}",
                stacklevel=2,
            )
    return dict(_failed_plugins)


def _is_message_env(env_spec: EnvSpec) -> bool:
    if env_spec.namespace == "agentrl":
        return True
    entry_point = env_spec.entry_point
    if not isinstance(entry_point, str):
        return isinstance(entry_point, type) and _subclasses_agent_env(entry_point)
    # Ids registered by agentrl.register carry these settings; gymnasium's built-ins do not.
    return env_spec.disable_env_checker and not env_spec.order_enforce


def _subclasses_agent_env(cls: type) -> bool:
    from agentrl.env import AgentEnv

    return issubclass(cls, AgentEnv)


def _unknown_message(id: str) -> str:
    from agentrl.multiagent import multiagent_ids

    if id in multiagent_ids():
        return f"{id!r} is a multi-agent (PettingZoo) env; make it with agentrl.make_multiagent({id!r})."
    candidates = list(gym.registry)
    close = difflib.get_close_matches(id, candidates, n=3, cutoff=0.6)
    if not close:
        # Compare without version and case too: "calculator" should find "agentrl/Calculator-v0".
        lowered = {c.lower(): c for c in candidates}
        close = [lowered[c] for c in difflib.get_close_matches(id.lower(), list(lowered), n=3, cutoff=0.5)]
    message = f"Unknown env {id!r}."
    if close:
        message += " Did you mean " + " or ".join(repr(c) for c in close) + "?"
    else:
        message += " Run `agentrl envs` to list the registered ids."
    if _failed_plugins:
        message += f" (Env plugins that failed to load: {sorted(_failed_plugins)}.)"
    return message
