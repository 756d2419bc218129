"""OpenEnv interoperability, both ways (OpenEnv: the ``openenv`` package, 0.10; meta-pytorch/OpenEnv).

**An OpenEnv env played as an agentrl env.** :class:`OpenEnvEnv` connects to any OpenEnv server
(``openenv.core.env_server.create_app``: in Docker, a Hugging Face Space, or a local process) over
OpenEnv's WebSocket protocol at ``URL/ws``, where one connection is one session that keeps its env
(OpenEnv's plain HTTP ``/reset`` and ``/step`` make a fresh env per call). It speaks messages:

- a text env: the reply's text goes into the action field ``action_field``; the observation's field
  ``observation_field`` (a dotted path such as ``"metadata.question"``, or the whole observation as
  JSON) comes back as a user message; ``reward`` and ``done`` as they are;
- an MCP env (``tools=True``; OpenEnv's ``MCPEnvironment``, whose actions are ``list_tools`` and
  ``call_tool``): the server's tools, listed once when the env is made, are the env's tools, so the
  policy sees them in its chat template and its tool calls run on the server, one ``call_tool``
  step each, answered by ``tool`` messages; a call's ``reward`` and ``done`` are the step's. A reply
  without a tool call is told to call one (reward 0, the episode goes on).

::

    agentrl.register("openenv/Echo-v0", "agentrl.server.openenv:OpenEnvEnv",
                     kwargs={"url": "http://127.0.0.1:8001", "action_field": "message",
                             "observation_field": "echoed_message"})

It needs no OpenEnv package: the protocol is spoken here with ``websockets``, so the env servers run
wherever their own dependencies live (``openenv`` 0.4-0.10 pins ``fastmcp<4``, hence ``mcp<2``, and
cannot be installed beside vLLM 0.32, which needs ``mcp>=2``). ``headers`` (or ``token``, for
``Authorization: Bearer TOKEN``) go with the handshake: a private Space or a server behind a token.
An error frame raises :class:`OpenEnvError` with the server's message and code.

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
after ``idle_timeout`` seconds without a message, and each call has the step limit.
OpenEnv's own client (``GenericEnvClient``, in its own environment) plays them, with
``headers={"Authorization": "Bearer TOKEN"}`` on a server with tokens (without one, the handshake
is refused: close code 1008).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, HTTPException, WebSocket, WebSocketDisconnect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from agentrl.env import AgentEnv, Feedback, ReplySpace
from agentrl.server.app import _maker, _timed, authorized, play_reset, play_step
from agentrl.server.sessions import Full, Session, SessionStore
from agentrl.threads import ENV_THREADS
from agentrl.tools import Tool, ToolResult
from agentrl.types import Message

# --- OpenEnv servers, as agentrl envs --------------------------------------------------------------


class OpenEnvError(RuntimeError):
    """An OpenEnv server answered with an error frame, refused the connection, or closed it."""

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.code = code


class OpenEnvEnv(AgentEnv):
    """An OpenEnv environment server played as an :class:`~agentrl.env.AgentEnv` (see the module docstring).

    ``reset(seed=...)`` passes the seed on; ``options`` go to OpenEnv's reset as keyword arguments.
    ``system_prompt``, when given, is the first observation's first message. ``message_timeout``
    bounds each answer (a late one drops the connection: its frames can no longer be paired).
    """

    tool_timeout = None  # a call's time limit is message_timeout, on the socket

    def __init__(
        self,
        url: str,
        *,
        action_field: str = "message",
        observation_field: str | None = None,
        system_prompt: str | None = None,
        tools: bool = False,
        headers: Mapping[str, str] | None = None,
        token: str | None = None,
        max_turns: int | None = None,
        message_timeout: float = 60.0,
    ):
        super().__init__(max_turns=max_turns)
        self.url = url.rstrip("/")
        self.action_field = action_field
        self.observation_field = observation_field
        self.system_prompt = system_prompt
        self.message_timeout = message_timeout
        self.headers = dict(headers or {})
        if token is not None:
            self.headers["Authorization"] = f"Bearer {token}"
        self._socket: ClientConnection | None = None
        self._lock = threading.Lock()  # one request in flight per connection
        self._seed: int | None = None
        self._outcomes: list[tuple[float, bool]] = []  # (reward, done) of this reply's tool calls
        if tools:
            try:
                listed = self._request("step", {"type": "list_tools"}).get("observation") or {}
            except OpenEnvError as e:
                listed = {"metadata": {"error": str(e)}}
            if not listed.get("tools"):
                error = (listed.get("metadata") or {}).get("error", "it listed none")
                raise OpenEnvError(f"{self.url} lists no MCP tools ({error}); is it an MCPEnvironment? "
                                   "Play a text env with tools=False and action_field.")  # fmt: skip
            self.tools = [self._server_tool(spec) for spec in listed["tools"]]
            self.action_space = ReplySpace(self.tools)

    @property
    def _env_name(self) -> str:
        return f"OpenEnvEnv({self.url})"

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # type: ignore[override]
        self._seed = seed
        return super().reset(seed=seed, options=options)

    def start(self, options: dict[str, Any] | None) -> list[Message]:
        data = dict(options or {})
        if self._seed is not None:
            data["seed"] = self._seed
        result = self._request("reset", data)
        messages = [Message("system", self.system_prompt)] if self.system_prompt else []
        return [*messages, Message("user", self._text(result["observation"]))]

    def respond(self, reply: Message) -> Feedback:
        if self.tools:
            names = ", ".join(t.name for t in self.tools)
            return Feedback([Message("user", f"This env acts through its tools only: call one of {names}.")])
        # JSON cannot carry a lone surrogate (a garbled reply may hold one): it becomes "?".
        text = reply.content.encode("utf-8", "replace").decode("utf-8")
        result = self._request("step", {self.action_field: text})
        return Feedback(
            [Message("user", self._text(result["observation"]))],
            reward=float(result.get("reward") or 0.0),
            terminated=bool(result.get("done")),
        )

    def answer_tools(self, reply: Message, results: list[ToolResult]) -> Feedback:
        outcomes, self._outcomes = self._outcomes, []
        feedback = super().answer_tools(reply, results)
        return feedback._replace(
            reward=sum(reward for reward, _ in outcomes), terminated=any(done for _, done in outcomes)
        )

    def close(self) -> None:
        with self._lock:
            if self._socket is not None:
                with contextlib.suppress(Exception):
                    self._socket.send(json.dumps({"type": "close"}))
                self._socket.close()
                self._socket = None

    # --- the protocol ------------------------------------------------------------------------

    def _request(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            socket = self._connected()
            try:
                socket.send(json.dumps({"type": kind, "data": data}))
                answer = json.loads(socket.recv(timeout=self.message_timeout))
            except TimeoutError:
                self._drop()
                raise TimeoutError(
                    f"{self.url} sent no answer to {kind!r} within {self.message_timeout:g} s."
                ) from None
            except ConnectionClosed as e:
                self._drop()
                reason = e.rcvd.reason if e.rcvd is not None else "no reason given"
                raise OpenEnvError(f"{self.url} closed the connection during {kind!r}: {reason}.") from None
        if answer.get("type") == "error":
            error = answer.get("data") or {}
            code = str(error.get("code", ""))
            raise OpenEnvError(f"{self.url} answered {kind!r} with {code}: {error.get('message', '')}", code)
        return answer.get("data") or {}

    def _connected(self) -> ClientConnection:
        if self._socket is None:
            scheme, rest = self.url.split("://", 1) if "://" in self.url else ("http", self.url)
            ws_url = f"{'wss' if scheme in ('https', 'wss') else 'ws'}://{rest}/ws"
            try:
                # connect() is its own context manager: entered here, the socket closed by close().
                self._socket = connect(ws_url, additional_headers=self.headers, open_timeout=self.message_timeout,
                                       max_size=None, proxy=None).__enter__()  # fmt: skip
            except InvalidStatus as e:
                raise OpenEnvError(f"{ws_url} refused the connection: HTTP {e.response.status_code} "
                                   "(a wrong path, or a missing token: pass token= or headers=).") from None  # fmt: skip
            except OSError as e:
                raise OpenEnvError(f"Cannot reach the OpenEnv server at {ws_url}: {e}. Is it running?") from None
        return self._socket

    def _drop(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def _server_tool(self, spec: Mapping[str, Any]) -> Tool:
        name = spec["name"]

        def runs_on_the_server(**arguments: Any) -> str:
            result = self._request("step", {"type": "call_tool", "tool_name": name, "arguments": arguments})
            self._outcomes.append((float(result.get("reward") or 0.0), bool(result.get("done"))))
            observation = result.get("observation") or {}
            if observation.get("error"):
                raise RuntimeError(observation["error"].get("message", observation["error"]))
            return _tool_text(observation.get("result"))

        return Tool(name, spec.get("description", ""), dict(spec.get("input_schema") or {}), runs_on_the_server)

    def _text(self, observation: Mapping[str, Any]) -> str:
        if self.observation_field is None:
            return json.dumps(dict(observation), ensure_ascii=False, sort_keys=True, default=str)
        value: Any = observation
        for part in self.observation_field.split("."):
            if not isinstance(value, Mapping) or part not in value:
                have = sorted(value) if isinstance(value, Mapping) else type(value).__name__
                raise KeyError(
                    f"The OpenEnv observation has no field {self.observation_field!r} ({part!r} not in {have}). "
                    "Set observation_field to one of them (or None for the whole observation as JSON)."
                )
            value = value[part]
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _tool_text(result: Any) -> str:
    """An MCP tool result's text: its text contents joined, else the result as JSON."""
    if isinstance(result, Mapping) and isinstance(result.get("content"), list):
        texts = [c.get("text", "") for c in result["content"] if isinstance(c, Mapping) and c.get("type") == "text"]
        if texts:
            return "\n".join(texts)
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)


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
