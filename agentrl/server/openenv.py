"""OpenEnv interoperability, both ways (OpenEnv: ``openenv-core`` on PyPI, meta-pytorch/OpenEnv).

**An OpenEnv env played as an agentrl env.** :class:`OpenEnvEnv` connects to any OpenEnv server
(``openenv.core.env_server.create_app``, in Docker or not) with OpenEnv's own client
(``GenericEnvClient``, over its ``/ws`` WebSocket, where a session keeps its env: OpenEnv's plain
HTTP ``/reset`` and ``/step`` make a fresh env per call) and speaks messages: the reply's text goes
into the action field ``action_field``, the observation's text field ``observation_field`` (or the
whole observation as JSON) comes back as a user message, ``reward`` and ``done`` as they are::

    agentrl.register("openenv/Echo-v0", "agentrl.server.openenv:OpenEnvEnv",
                     kwargs={"url": "http://127.0.0.1:8001", "action_field": "message",
                             "observation_field": "echoed_message"})

It needs ``pip install openenv-core`` (imported only when one is made).

**agentrl envs for OpenEnv clients.** :func:`add_openenv_routes` serves OpenEnv's WebSocket protocol
beside agentrl's own routes (``agentrl serve`` always adds them): a single-agent env ``ENV_ID`` is at
``ws://HOST:PORT/openenv/ENV_ID/ws``, so an OpenEnv client takes ``base_url=
"http://HOST:PORT/openenv/ENV_ID"``. Messages, one JSON text frame each::

    {"type": "reset", "data": {"seed": 0}}        -> {"type": "observation", "data": {"observation": OBS, "reward": 0.0, "done": false}}
    {"type": "step", "data": {"message": REPLY}}  -> {"type": "observation", "data": {"observation": OBS, "reward": R, "done": D}}
    {"type": "state"}                             -> {"type": "state", "data": {"episode_id": ..., "step_count": N}}
    {"type": "close"}                             -> the server closes the socket

where ``OBS`` is ``{"messages": [...], "info": {...}, "terminated": ..., "truncated": ...}`` and
``REPLY`` the reply's text (or an assistant message dict). Errors answer
``{"type": "error", "data": {"message": ..., "code": ...}}`` with OpenEnv's codes. A connection is a
session of the server's: it counts against ``max_sessions`` (``CAPACITY_REACHED`` past it), ends
after ``idle_timeout`` seconds without a message, and each call has the step limit. On a server
with tokens the handshake must carry ``Authorization: Bearer TOKEN`` (OpenEnv's client sends no
headers, so serve OpenEnv clients on loopback without a token, or give its connection the header).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, HTTPException, WebSocket, WebSocketDisconnect

from agentrl.env import AgentEnv, Feedback
from agentrl.server.app import _maker, _timed, authorized, play_reset, play_step
from agentrl.server.sessions import Full, Session, SessionStore
from agentrl.threads import ENV_THREADS
from agentrl.types import Message

# --- OpenEnv servers, as agentrl envs --------------------------------------------------------------


class OpenEnvEnv(AgentEnv):
    """An OpenEnv environment server played as an :class:`~agentrl.env.AgentEnv` (see the module docstring).

    ``reset(seed=...)`` passes the seed on; ``options`` go to OpenEnv's reset as keyword arguments.
    ``system_prompt``, when given, is the first observation's first message.
    """

    def __init__(
        self,
        url: str,
        *,
        action_field: str = "message",
        observation_field: str | None = None,
        system_prompt: str | None = None,
        max_turns: int | None = None,
        message_timeout: float = 60.0,
    ):
        super().__init__(max_turns=max_turns)
        from openenv.core.generic_client import GenericEnvClient  # noqa: PLC0415  (an optional, heavy dependency)

        self.url = url
        self.action_field = action_field
        self.observation_field = observation_field
        self.system_prompt = system_prompt
        self.client = GenericEnvClient(base_url=url, message_timeout_s=message_timeout).sync()
        self._seed: int | None = None
        self._connected = False

    @property
    def _env_name(self) -> str:
        return f"OpenEnvEnv({self.url})"

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # type: ignore[override]
        self._seed = seed
        return super().reset(seed=seed, options=options)

    def start(self, options: dict[str, Any] | None) -> list[Message]:
        if not self._connected:
            self.client.connect()
            self._connected = True
        kwargs = dict(options or {})
        if self._seed is not None:
            kwargs["seed"] = self._seed
        result = self.client.reset(**kwargs)
        messages = [Message("system", self.system_prompt)] if self.system_prompt else []
        return [*messages, Message("user", self._text(result.observation))]

    def respond(self, reply: Message) -> Feedback:
        result = self.client.step({self.action_field: reply.content})
        return Feedback(
            [Message("user", self._text(result.observation))],
            reward=float(result.reward or 0.0),
            terminated=bool(result.done),
        )

    def close(self) -> None:
        if self._connected:
            self.client.close()
            self._connected = False

    def _text(self, observation: Mapping[str, Any]) -> str:
        if self.observation_field is not None:
            if self.observation_field not in observation:
                raise KeyError(
                    f"The OpenEnv observation has no field {self.observation_field!r}; it has {sorted(observation)}. "
                    "Set observation_field to one of them (or None for the whole observation as JSON)."
                )
            return str(observation[self.observation_field])
        return json.dumps(dict(observation), ensure_ascii=False, sort_keys=True, default=str)


# --- agentrl envs, for OpenEnv clients -------------------------------------------------------------


def add_openenv_routes(app: FastAPI) -> FastAPI:
    """Serve OpenEnv's WebSocket protocol for the single-agent envs of ``app`` (a :func:`~agentrl.server.make_app`)."""
    store: SessionStore = app.state.store
    specs, limits, tokens, metrics = app.state.specs, app.state.limits, app.state.tokens, app.state.metrics

    @app.websocket("/openenv/{env_id:path}/ws")
    async def openenv_session(websocket: WebSocket, env_id: str) -> None:
        who = authorized(websocket.headers.get("authorization"), tokens)
        if who is None:
            await websocket.close(code=1008, reason="missing or wrong token (Authorization: Bearer TOKEN)")
            return
        await websocket.accept()
        env_spec = specs.get(env_id)
        if env_spec is None or env_spec.kind != "single":
            served = sorted(i for i, s in specs.items() if s.kind == "single")
            await _refuse(websocket, f"This server serves no single-agent env {env_id!r}; it serves {served}.",
                          "FACTORY_ERROR")  # fmt: skip
            return
        try:
            store.reserve()
        except Full as e:
            await _refuse(websocket, f"{e}; retry shortly.", "CAPACITY_REACHED")
            return
        try:
            make = _maker(env_id, "single", None, {})
            env = await _timed(lambda: ENV_THREADS.run(make), limits.step_timeout, "building the env", metrics)
        except BaseException as e:
            store.release()
            if isinstance(e, Exception):
                await _refuse(websocket, f"Building {env_id} failed: {_message(e)}", "FACTORY_ERROR")
                return
            raise
        session = store.add(env_id, "single", env, who, None)
        metrics.created.labels(env_id).inc()
        try:
            await _serve_messages(websocket, session, store, limits, metrics)
        except WebSocketDisconnect:
            pass
        finally:
            await store.close(session, "deleted")

    return app


async def _serve_messages(
    websocket: WebSocket, session: Session, store: SessionStore, limits: Any, metrics: Any
) -> None:
    while True:
        try:
            frame = await asyncio.wait_for(websocket.receive(), limits.idle_timeout)
        except TimeoutError:
            await websocket.close(code=1000, reason=f"idle for {limits.idle_timeout:g} s")
            return
        if frame["type"] == "websocket.disconnect":
            return
        text = frame.get("text")
        if text is None:  # a binary frame
            await _send_error(websocket, "Expected a text frame holding JSON.", "INVALID_JSON")
            continue
        if store.get(session.id, session.owner) is None:  # the reaper closed it meanwhile
            await _send_error(websocket, "This session expired; connect again.", "SESSION_ERROR")
            await websocket.close()
            return
        try:
            message = json.loads(text)
            kind, data = message["type"], message.get("data") or {}
            if not isinstance(data, dict):
                raise TypeError("data must be an object")
        except (ValueError, KeyError, TypeError) as e:
            await _send_error(websocket, f"Expected a JSON object with a 'type' (and 'data'): {e}", "INVALID_JSON")
            continue
        session.touch()
        try:
            if kind == "reset":
                reply = await _reset_message(session, data, limits, metrics)
            elif kind == "step":
                reply = await _step_message(session, data, limits, metrics)
            elif kind == "state":
                reply = {"type": "state", "data": {"episode_id": f"{session.id[:12]}-{session.episodes}",
                                                   "step_count": session.steps}}  # fmt: skip
            elif kind == "close":
                await websocket.close()
                return
            else:
                await _send_error(websocket, f"Unknown message type: {kind}", "UNKNOWN_TYPE")
                continue
        except HTTPException as e:
            code = "VALIDATION_ERROR" if e.status_code in (409, 422) else "EXECUTION_ERROR"
            await _send_error(websocket, str(e.detail), code)
            continue
        await websocket.send_text(json.dumps(reply, ensure_ascii=True))


async def _reset_message(session: Session, data: dict[str, Any], limits: Any, metrics: Any) -> dict[str, Any]:
    seed = data.get("seed")
    if seed is not None and (not isinstance(seed, int) or seed < 0):
        raise HTTPException(422, f"seed must be an integer >= 0, got {seed!r}.")
    result = await play_reset(session, seed, None, limits, metrics)
    observation = {**result, "terminated": False, "truncated": False}
    return {"type": "observation", "data": {"observation": {"messages": observation.pop("observation"), **observation},
                                            "reward": 0.0, "done": False}}  # fmt: skip


async def _step_message(session: Session, data: dict[str, Any], limits: Any, metrics: Any) -> dict[str, Any]:
    if session.episode != "running":
        raise HTTPException(409, "Reset first: no episode is running in this session.")
    reply = data.get("message")
    if isinstance(reply, dict):
        if reply.get("role") != "assistant":
            raise HTTPException(422, "A reply message must have role 'assistant'.")
        reply = Message.from_dict(reply)
    elif not isinstance(reply, str):
        raise HTTPException(422, f"A step's data is {{'message': REPLY_TEXT}}; got {sorted(data)}.")
    result, over = await play_step(session, reply, limits, metrics)
    observation = {"messages": result["observation"], "info": result["info"],
                   "terminated": result["terminated"], "truncated": result["truncated"]}  # fmt: skip
    return {"type": "observation", "data": {"observation": observation, "reward": result["reward"], "done": over}}


async def _refuse(websocket: WebSocket, message: str, code: str, linger: float = 10.0) -> None:
    """Answer the connection's messages with one error until it closes (or ``linger`` seconds pass):
    a client that connects and then sends learns why, instead of finding the socket closed."""
    await _send_error(websocket, message, code)
    try:
        while True:
            text = await asyncio.wait_for(websocket.receive_text(), linger)
            if '"close"' in text:
                break
            await _send_error(websocket, message, code)
    except (TimeoutError, WebSocketDisconnect):
        pass
    with contextlib.suppress(RuntimeError):  # closed by the client already
        await websocket.close()


async def _send_error(websocket: WebSocket, message: str, code: str) -> None:
    await websocket.send_text(json.dumps({"type": "error", "data": {"message": message, "code": code}}))


def _message(error: Exception) -> str:
    return str(error.detail) if isinstance(error, HTTPException) else f"{type(error).__name__}: {error}"
