"""The env server's sessions: one live env each, bounded, reaped when idle, bound to a token.

A :class:`Session` holds one env (single-agent :class:`~agentrl.env.AgentEnv`, or a PettingZoo
``ParallelEnv`` / ``AECEnv``) and what the server knows of it: who made it (a digest of the
bearer token), when it was last used, whether its episode is over, and whether it is *broken* (a
step ran past the time limit, so the env may still be busy in an abandoned thread and is never
used again). :class:`SessionStore` keeps them under :class:`ServerLimits`:

- at most ``max_sessions`` live at once; :meth:`SessionStore.add` past that raises
  :class:`Full`, which the app answers with 503 and ``Retry-After``;
- a session idle for more than ``idle_timeout`` seconds is closed by :meth:`SessionStore.reap`,
  which the app runs every ``reap_interval`` seconds for as long as it serves (there is no way to
  turn it off: leaked sessions are what fills a server);
- a lookup with another token's digest finds nothing, exactly as an unknown id does.

Session ids are ``secrets.token_urlsafe(32)``: 256 random bits, 43 URL-safe characters.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.rollout import close_quietly
from agentrl.threads import ENV_THREADS

EnvKind = Literal["single", "parallel", "aec"]

SESSION_ID = re.compile(r"[A-Za-z0-9_-]{43}")
"""What :func:`new_session_id` makes; anything else is not a session id (a path, say)."""


@dataclass(frozen=True)
class ServerLimits:
    """The env server's limits; each is on by default.

    >>> ServerLimits(max_sessions=64, step_timeout=5.0)  # doctest: +ELLIPSIS
    ServerLimits(max_sessions=64, ...)
    """

    max_sessions: int = 1024
    """Most live sessions; one more gets 503 with ``Retry-After``."""
    idle_timeout: float = 600.0
    """Seconds a session may sit unused before the reaper closes it."""
    step_timeout: float = 60.0
    """Seconds one ``reset`` or ``step`` (or an env's construction) may take; past it: 504, session broken."""
    max_body_bytes: int = 1 << 20
    """Largest request body; a larger one gets 413."""
    reap_interval: float | None = None
    """Seconds between reaper passes (default: a tenth of ``idle_timeout``, at most 10)."""
    retry_after: int = 1
    """The ``Retry-After`` (seconds) of a 503."""

    def __post_init__(self) -> None:
        for name in ("max_sessions", "idle_timeout", "step_timeout", "max_body_bytes", "retry_after"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ServerLimits.{name} must be positive, got {getattr(self, name)!r}.")
        if self.reap_interval is not None and not self.reap_interval > 0:
            raise ValueError(f"ServerLimits.reap_interval must be positive or None, got {self.reap_interval!r}.")

    @property
    def reap_every(self) -> float:
        """Seconds between reaper passes."""
        return self.reap_interval if self.reap_interval is not None else min(self.idle_timeout / 10, 10.0)


class Full(Exception):
    """The server holds ``max_sessions`` sessions already."""


def new_session_id() -> str:
    """256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


def token_digest(token: str | None) -> str:
    """What a session keeps of the token that made it (``""`` for an anonymous loopback client)."""
    return "" if token is None else hashlib.sha256(token.encode()).hexdigest()


@dataclass
class Session:
    """One live env on the server (see the module docstring)."""

    id: str
    env_id: str
    kind: EnvKind
    env: Any
    owner: str
    split: str | None = None
    seed: int | None = None
    """The seed of a reset that gives none (set when the session is created)."""
    created: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    previous_use: float = field(default_factory=time.monotonic)
    """When the session was used before the current request (what ``GET /sessions/{id}`` reports)."""
    steps: int = 0
    episodes: int = 0
    episode: Literal["not started", "running", "over"] = "not started"
    broken: str | None = None
    """Why this session can no longer be used (its env is not touched again), or ``None``."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def touch(self) -> None:
        self.previous_use, self.last_used = self.last_used, time.monotonic()

    def idle_seconds(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.last_used


class SessionStore:
    """The live sessions, under :class:`ServerLimits` (see the module docstring)."""

    def __init__(self, limits: ServerLimits, on_close: Callable[[Session, str], None] = lambda s, why: None):
        self.limits = limits
        self.on_close = on_close
        """Called with each session closed and why (``deleted``, ``idle``, ``shutdown``)."""
        self._sessions: dict[str, Session] = {}
        self._reserved = 0  # sessions being built: they count against max_sessions already

    def __len__(self) -> int:
        return len(self._sessions)

    def reserve(self) -> None:
        """Claim room for one session about to be built; raise :class:`Full` if there is none."""
        if len(self._sessions) + self._reserved >= self.limits.max_sessions:
            raise Full(f"the server holds its maximum of {self.limits.max_sessions} sessions")
        self._reserved += 1

    def add(self, env_id: str, kind: EnvKind, env: Any, owner: str, split: str | None) -> Session:
        """Store a session built after :meth:`reserve`."""
        self._reserved -= 1
        session = Session(new_session_id(), env_id, kind, env, owner, split)
        self._sessions[session.id] = session
        return session

    def release(self) -> None:
        """Give back a reservation whose env could not be built."""
        self._reserved -= 1

    def get(self, session_id: str, owner: str) -> Session | None:
        """The session ``session_id`` if it exists and ``owner`` made it, else ``None``."""
        if not SESSION_ID.fullmatch(session_id):
            return None
        session = self._sessions.get(session_id)
        if session is None or not hmac.compare_digest(session.owner, owner):
            return None
        return session

    async def close(self, session: Session, why: str) -> None:
        """Forget ``session`` and close its env: once a call still running on it has ended (it
        holds the session's lock, at most the step limit), in a thread, with the step limit. A
        broken env is closed from a thread of its own, not waited for."""
        if self._sessions.pop(session.id, None) is None:
            return
        self.on_close(session, why)
        if session.broken is not None:
            # Its env may still be busy in an abandoned thread: close it from another one, without
            # waiting, so what it holds (a sandbox, say) is freed even if that call never returns.
            ENV_THREADS.submit(lambda: close_quietly(session.env))
            return
        try:
            async with asyncio.timeout(2 * self.limits.step_timeout):
                async with session.lock:  # no call can start on it now: it is out of the store
                    await ENV_THREADS.run(lambda: close_quietly(session.env))
        except TimeoutError:
            pass

    async def reap(self) -> int:
        """Close every session idle past ``idle_timeout`` and not in a call; return how many.
        Each is checked again right before it is closed: closing an earlier one awaits, and a
        request may have used the next one meanwhile."""
        closed = 0
        for session in list(self._sessions.values()):
            if session.idle_seconds() > self.limits.idle_timeout and not session.lock.locked():
                await self.close(session, "idle")
                closed += 1
        return closed

    async def run_reaper(self) -> None:
        """Reap forever, every ``limits.reap_every`` seconds (the app runs it while it serves)."""
        while True:
            await asyncio.sleep(self.limits.reap_every)
            await self.reap()

    async def close_all(self) -> None:
        for session in list(self._sessions.values()):
            await self.close(session, "shutdown")

    def sessions(self) -> list[Session]:
        return list(self._sessions.values())
