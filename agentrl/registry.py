"""Env registration, single- and multi-agent: thin wrappers over gymnasium's own registry.

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

Multi-agent envs are PettingZoo envs, which gymnasium's registry cannot make, so they have a small
registry of their own here with the same ids, the same entry points and the same errors
(:func:`register_multiagent`, :func:`make_multiagent`, :func:`multiagent_ids`), kept out of
:func:`registered_ids`::

    env = make_multiagent("agentrl/Negotiation-v0")              # a ParallelEnv
    aec = make_multiagent("agentrl/Negotiation-v0", api="aec")   # the same game as an AECEnv

An adapter over another package's envs can register a whole namespace lazily
(:func:`register_namespace`): its ids are registered the first time one of them is made or listed,
so ``import agentrl`` does not import that package (TextArena's games, ``textarena/<Game>``).

An unknown id, of either kind, gets one message (:func:`unknown_env_message`): the other kind's id
if it is one, else the closest ids.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, overload

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec, load_env_creator, parse_env_id
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import aec_to_parallel, parallel_to_aec

from agentrl.env import AgentEnv, MessagesSpace
from agentrl.suggest import did_you_mean

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
    if id not in gym.registry:
        _load_namespace(id.partition("/")[0], quiet=False)
    if id in gym.registry:
        return gym.registry[id]
    raise UnknownEnvError(unknown_env_message(id))


def registered_ids(namespace: str | None = None, *, message_envs_only: bool = True) -> list[str]:
    """The registered ids, sorted; by default only message envs (not gymnasium's CartPole & co).

    ``namespace="agentrl"`` lists the built-ins only; a lazy namespace (:func:`register_namespace`)
    is listed when named, or once one of its ids has been made.
    """
    load_plugins()
    if namespace in _NAMESPACE_LOADERS:
        _load_namespace(namespace, quiet=True)
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
    # Ids registered by agentrl.register carry these settings; gymnasium's built-ins do not.
    if env_spec.disable_env_checker and not env_spec.order_enforce:
        return True
    if env_spec.namespace is None:  # gymnasium's own envs (CartPole-v1, ...): not worth importing
        return False
    # Registered with plain gymnasium.register: a message env declares message spaces.
    entry_point = env_spec.entry_point
    try:
        target = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    except Exception:  # a broken entry point is reported when the env is made, not when listed
        return False
    if isinstance(target, type) and issubclass(target, AgentEnv):
        return True
    return isinstance(getattr(target, "observation_space", None), MessagesSpace)


# --- multi-agent (PettingZoo) envs ----------------------------------------------------------------

MultiAgentEnv: TypeAlias = ParallelEnv[str, Any, Any] | AECEnv[str, Any, Any]
"""A PettingZoo env speaking messages per agent (see :mod:`agentrl.multiagent`)."""


@dataclass(frozen=True)
class MultiAgentSpec:
    """What :func:`register_multiagent` stored for one id."""

    id: str
    entry_point: str | Callable[..., Any]
    """``"module:attr"`` (imported when first made) or a callable returning a PettingZoo env."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Default constructor arguments; ``make_multiagent`` keyword arguments override them."""


_MULTIAGENT: dict[str, MultiAgentSpec] = {}
_NAMESPACE_LOADERS: dict[str, Callable[[], None]] = {}
_loaded_namespaces: set[str] = set()


def register_namespace(namespace: str, loader: Callable[[], None]) -> None:
    """Let ``loader`` register the ids of ``namespace`` (single- or multi-agent) the first time one
    of them is made, checked or listed: an adapter over a package that is slow to import or may not
    be installed. ``loader`` raises ``ModuleNotFoundError`` (saying what to install) when it cannot;
    listing then skips the namespace, and making one of its ids raises that error.

    >>> register_namespace("textarena", register_games)  # doctest: +SKIP  (envs/textarena.py)
    """
    _NAMESPACE_LOADERS[namespace] = loader


def lazy_namespaces() -> list[str]:
    """The namespaces registered with :func:`register_namespace`, sorted."""
    return sorted(_NAMESPACE_LOADERS)


def _load_namespace(namespace: str, *, quiet: bool) -> None:
    if namespace in _loaded_namespaces or namespace not in _NAMESPACE_LOADERS:
        return
    try:
        _NAMESPACE_LOADERS[namespace]()
    except ModuleNotFoundError:
        if quiet:
            return
        raise
    _loaded_namespaces.add(namespace)


def register_multiagent(id: str, entry_point: str | Callable[..., Any], kwargs: dict[str, Any] | None = None) -> None:
    """Register a PettingZoo env under ``id`` (``namespace/Name-vN``), as :func:`register` does
    for single-agent envs. The entry point may build a ``ParallelEnv`` or an ``AECEnv``.

    >>> register_multiagent("mypkg/Debate-v0", "mypkg.debate:DebateEnv", {"rounds": 3})  # doctest: +SKIP
    """
    parse_env_id(id)  # raises gymnasium's own error for a malformed id
    if id in gym.registry:
        raise ValueError(f"{id!r} is already a single-agent env id in gymnasium's registry; pick another id.")
    if id in _MULTIAGENT:
        warnings.warn(f"Overriding multi-agent env {id!r}, already registered.", stacklevel=2)
    _MULTIAGENT[id] = MultiAgentSpec(id, entry_point, dict(kwargs or {}))


def multiagent_spec(id: str) -> MultiAgentSpec:
    """The spec registered under ``id``; unknown ids raise :class:`UnknownEnvError`."""
    load_plugins()
    if id not in _MULTIAGENT:
        _load_namespace(id.partition("/")[0], quiet=False)
    if id in _MULTIAGENT:
        return _MULTIAGENT[id]
    raise UnknownEnvError(unknown_env_message(id, multiagent=True))


def multiagent_ids(namespace: str | None = None) -> list[str]:
    """The registered multi-agent ids, sorted (``namespace="agentrl"`` for the built-ins only)."""
    load_plugins()
    for lazy in list(_NAMESPACE_LOADERS):
        if namespace in (None, lazy):
            _load_namespace(lazy, quiet=True)
    return sorted(i for i in _MULTIAGENT if namespace is None or i.startswith(f"{namespace}/"))


def is_multiagent(id: str) -> bool:
    """Is ``id`` a registered multi-agent env? (Loads only the namespace of ``id``.)"""
    load_plugins()
    _load_namespace(id.partition("/")[0], quiet=True)
    return id in _MULTIAGENT


@overload
def make_multiagent(id: str, *, api: Literal["parallel"], **kwargs: Any) -> ParallelEnv[str, Any, Any]: ...
@overload
def make_multiagent(id: str, *, api: Literal["aec"], **kwargs: Any) -> AECEnv[str, Any, Any]: ...
@overload
def make_multiagent(id: str, *, api: None = None, **kwargs: Any) -> MultiAgentEnv: ...
def make_multiagent(id: str, *, api: Literal["parallel", "aec"] | None = None, **kwargs: Any) -> MultiAgentEnv:
    """Make the multi-agent env registered under ``id``: as the class it is registered as
    (``api=None``), a ``ParallelEnv`` (``api="parallel"``) or an ``AECEnv`` (``api="aec"``),
    converting with PettingZoo's own wrappers when the registered class is the other kind.
    ``kwargs`` override the registered ones.

    >>> env = make_multiagent("agentrl/Negotiation-v0", split="test")
    >>> observations, infos = env.reset(seed=0)
    >>> sorted(observations)
    ['trader_0', 'trader_1']
    """
    if api not in (None, "parallel", "aec"):
        raise ValueError(f"api must be None (as registered), 'parallel' or 'aec', got {api!r}.")
    spec = multiagent_spec(id)
    entry_point = spec.entry_point
    creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    env = creator(**{**spec.kwargs, **kwargs})
    if isinstance(env, ParallelEnv):
        return env if api != "aec" else parallel_to_aec(env)
    if isinstance(env, AECEnv):
        if api != "parallel":
            return env
        if not env.metadata.get("is_parallelizable", False):
            raise ValueError(
                f"{id!r} is a turn-based AEC env not marked parallelizable "
                "(metadata['is_parallelizable']); make it with api='aec'."
            )
        return aec_to_parallel(env)
    raise TypeError(f"The entry point of {id!r} built a {type(env).__name__}, not a PettingZoo env.")


def takes_kwarg(id: str, name: str) -> bool:
    """Does the constructor of the env registered as ``id`` (single- or multi-agent) take a
    keyword argument ``name``? A registered default counts; a constructor whose signature cannot
    be read (a builtin) is assumed to, and left to say otherwise."""
    registered = multiagent_spec(id) if is_multiagent(id) else spec(id)
    if name in registered.kwargs:
        return True
    entry_point = registered.entry_point
    creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    try:
        parameters = inspect.signature(creator).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


# --- unknown ids -----------------------------------------------------------------------------------


def unknown_env_message(id: str, *, multiagent: bool = False) -> str:
    """What to tell a user who asked for ``id``, which is not registered as the kind they asked for
    (single-agent, or ``multiagent``): the other kind's maker if it is one, else the closest ids."""
    _load_namespace(id.partition("/")[0], quiet=True)
    if multiagent and id in gym.registry:
        return f"{id!r} is a single-agent env; make it with agentrl.make({id!r})."
    if not multiagent and id in _MULTIAGENT:
        return f"{id!r} is a multi-agent (PettingZoo) env; make it with agentrl.make_multiagent({id!r})."
    kind = "multi-agent env" if multiagent else "env"
    candidates = list(_MULTIAGENT) if multiagent else list(gym.registry)
    hint = did_you_mean(id, candidates) or (
        f"Registered multi-agent envs: {sorted(candidates)}."
        if multiagent
        else "Run `agentrl envs` to list the registered ids."
    )
    message = f"Unknown {kind} {id!r}. {hint}"
    if _failed_plugins:
        message += f" (Env plugins that failed to load: {sorted(_failed_plugins)}.)"
    return message
