"""``RemoteEnv``: an env served by ``agentrl serve``, played as if it were here.

:class:`RemoteEnv` is an :class:`~agentrl.env.AgentEnv`: ``reset`` / ``step`` (and the native
async ``areset`` / ``astep``) are calls to one session on the server, which runs the env, its
tools and its reward. A session is made and reset over HTTP; its steps go over one WebSocket
(``/sessions/ID/ws``, a frame per step: no HTTP request to parse each time), or over HTTP when the
server has no such route (an older one) or ``websocket=False``. The tools' schemas, the tool-call format and the reply prefix come from
``GET /envs``, so an agent renders the same prompt as for the env in process, and for the same
seeds and replies the same messages come back: the trajectories' token ids are equal.

Faults, and what a caller sees:

- 503 (the server is full) and connection errors (it is down, or restarting) are retried with
  exponential backoff (``Retry-After`` honoured) for up to ``retry_for`` seconds;
- a session the server no longer has (expired, or the server restarted) is made again at the
  next ``reset``; mid-episode it fails that episode only, with :class:`EnvServerError`, which the
  rollout counts under that cause and goes on;
- every other error answer raises :class:`EnvServerError` with the server's explanation, except
  a step outside an episode, which raises ``RuntimeError`` exactly as a local env does.

>>> env = RemoteEnv("http://127.0.0.1:8000", "agentrl/Calculator-v0", split="test")  # doctest: +SKIP
>>> observation, info = env.reset(seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
import warnings
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, NamedTuple

import aiohttp
import gymnasium as gym
import httpx
import websockets.asyncio.client as ws_async
import websockets.sync.client as ws_sync
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from agentrl.env import Action, AgentEnv, ReplySpace, ResetResult, StepResult
from agentrl.threads import ENV_THREADS
from agentrl.tools import Tool
from agentrl.types import Message

TOKEN_ENV = "AGENTRL_SERVER_TOKEN"
"""The environment variable both ``agentrl serve`` and :class:`RemoteEnv` read the token from."""


class EnvServerError(RuntimeError):
    """The env server could not serve a call: the message says what it answered and what to do."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class Answer(NamedTuple):
    """One HTTP answer, whichever library fetched it."""

    status: int
    text: str
    retry_after: str = ""


class EnvClient:
    """Pooled HTTP connections to one env server, sync and async, with retries.

    ``url`` is ``http://host:port`` or ``unix:///path/to/socket``. One client serves any number of
    :class:`RemoteEnv` (a rollout's envs share one). The sync calls go through ``httpx``; the async
    ones through ``aiohttp``, one session per event loop, because httpx's async pool spent several
    times the server's own CPU per request once dozens of connections were open, and a rollout
    keeps hundreds of episodes in flight (figures: ``benchmarks/README.md``, ``env_server.py``).
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 120.0,
        retry_for: float = 30.0,
        max_connections: int = 1024,
        websocket: bool = True,
    ):
        if url.startswith("unix://"):
            self.uds: str | None = url.removeprefix("unix://")
            self.base_url = "http://agentrl-env-server"
        elif url.startswith(("http://", "https://")):
            self.uds, self.base_url = None, url.rstrip("/")
        else:
            raise ValueError(f"An env server URL is http://HOST:PORT or unix:///PATH, got {url!r}.")
        self.url = url
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self.headers = {"authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        self.retry_for = retry_for
        self.max_connections = max_connections
        self.websocket = websocket
        """Whether steps go over a session's WebSocket (cleared when the server has no such route)."""
        self._sync: httpx.Client | None = None
        self._async: dict[int, tuple[asyncio.AbstractEventLoop, aiohttp.ClientSession, Any]] = {}

    # --- requests ------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """``method path`` with ``body`` as JSON; the decoded answer, or :class:`EnvServerError`.
        503 and connection errors are retried with backoff for up to ``retry_for`` seconds."""
        deadline = time.monotonic() + self.retry_for
        for attempt in range(1_000_000):
            try:
                response = self._sync_client().request(method, path, **_json(body))
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                wait = self._backoff(attempt, None, deadline, e)
            except httpx.TransportError as e:
                raise self._lost(method, path, e) from e
            else:
                answer = Answer(response.status_code, response.text, response.headers.get("retry-after", ""))
                if answer.status != 503:
                    return _decoded(answer, method, path)
                wait = self._backoff(attempt, answer, deadline, None)
            time.sleep(wait)
        raise AssertionError("unreachable")

    async def arequest(self, method: str, path: str, body: Any = None) -> Any:
        """The async :meth:`request`. A connection the server dropped is retried too, except for
        a step (which may have been played)."""
        deadline = time.monotonic() + self.retry_for
        for attempt in range(1_000_000):
            try:
                session = await self._async_session()
                data = _json(body)
                async with session.request(
                    method, self.base_url + path, data=data.get("content"), headers=data.get("headers")
                ) as response:
                    answer = Answer(response.status, await response.text(), response.headers.get("retry-after", ""))
            except aiohttp.ClientConnectorError as e:  # not connected: nothing was sent
                wait = self._backoff(attempt, None, deadline, e)
            except TimeoutError as e:  # sent, perhaps played: never sent again
                raise self._lost(method, path, e) from e
            except aiohttp.ServerDisconnectedError as e:
                if path.endswith("/step"):
                    raise self._lost(method, path, e) from e
                wait = self._backoff(attempt, None, deadline, e)
            except aiohttp.ClientError as e:
                raise self._lost(method, path, e) from e
            else:
                if answer.status != 503:
                    return _decoded(answer, method, path)
                wait = self._backoff(attempt, answer, deadline, None)
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    def env_spec(self, env_id: str) -> dict[str, Any]:
        """What the server says of ``env_id`` (``GET /envs``)."""
        specs = {s["id"]: s for s in self.request("GET", "/envs")["envs"]}
        if env_id not in specs:
            raise EnvServerError(f"The env server at {self.url} does not serve {env_id!r}; it serves {sorted(specs)}.")
        return specs[env_id]

    def close(self) -> None:
        """Close the sync connections (async ones close with :meth:`aclose`, or with their loop)."""
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    async def aclose(self) -> None:
        """Close this event loop's connections."""
        entry = self._async.pop(id(asyncio.get_running_loop()), None)
        if entry is not None:
            await entry[1].close()

    # --- plumbing ------------------------------------------------------------------------------

    def _lost(self, method: str, path: str, error: Exception) -> EnvServerError:
        return EnvServerError(
            f"Lost the env server at {self.url} during {method} {path} ({type(error).__name__}: {error}); "
            "the episode it held is gone."
        )

    def _backoff(self, attempt: int, answer: Answer | None, deadline: float, error: Exception | None) -> float:
        wait = min(0.05 * 2**attempt, 2.0) * (0.5 + random.random())
        if answer is not None and answer.retry_after.isdigit():
            wait = max(wait, float(answer.retry_after))
        if time.monotonic() + wait > deadline:
            if error is not None:
                raise EnvServerError(
                    f"Cannot reach the env server at {self.url} ({type(error).__name__}: {error}) after retrying "
                    f"for {self.retry_for:g} s; start it with `agentrl serve ENV_ID` or check the URL."
                ) from error
            assert answer is not None
            raise EnvServerError(f"The env server at {self.url} is still full after {self.retry_for:g} s: "
                                 f"{_detail(answer)}", 503)  # fmt: skip
        return wait

    def _sync_client(self) -> httpx.Client:
        if self._sync is None:
            limits = httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections)
            transport = httpx.HTTPTransport(uds=self.uds, limits=limits) if self.uds else None
            self._sync = httpx.Client(
                base_url=self.base_url, headers=self.headers, timeout=self.timeout, limits=limits, transport=transport
            )
        return self._sync

    async def _async_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        entry = self._async.get(id(loop))
        if entry is None or entry[0] is not loop:
            for key, (old, *_) in list(self._async.items()):  # sessions of loops that are gone
                if old.is_closed():
                    del self._async[key]
            if self.uds:
                connector: aiohttp.BaseConnector = aiohttp.UnixConnector(path=self.uds, limit=self.max_connections)
            else:
                connector = aiohttp.TCPConnector(limit=self.max_connections)
            session = aiohttp.ClientSession(
                connector=connector, headers=self.headers, timeout=aiohttp.ClientTimeout(total=self.timeout)
            )
            keeper = _closed_with_the_loop(session)
            await keeper.__anext__()
            entry = self._async[id(loop)] = (loop, session, keeper)
        return entry[1]


class RemoteEnv(AgentEnv):
    """One session of an env on an env server, as an :class:`~agentrl.env.AgentEnv` (see the module docstring).

    ``split`` and ``env_kwargs`` go to the server when the session is made (the server allows only
    the kwargs it was told to). ``client`` shares connections among envs; ``spec`` is what
    ``GET /envs`` said of ``env_id`` (read once when not given).
    """

    def __init__(
        self,
        url: str,
        env_id: str,
        *,
        split: str | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        token: str | None = None,
        client: EnvClient | None = None,
        spec: Mapping[str, Any] | None = None,
    ):
        super().__init__()
        self.client = client or EnvClient(url, token)
        self._owns_client = client is None
        self.env_id = env_id
        self.split = split
        self.env_kwargs = dict(env_kwargs or {})
        spec = dict(spec or self.client.env_spec(env_id))
        if spec["kind"] != "single":
            raise TypeError(f"{env_id!r} is a multi-agent env ({spec['kind']}); RemoteEnv plays single-agent envs.")
        agent = spec["agents"]["agent"]
        self.description = spec.get("description", "")
        self.tools = [_remote_tool(schema) for schema in agent["tools"]]
        self.tool_format = agent["tool_format"]
        self.action_space = ReplySpace(self.tools, reply_prefix=agent["reply_prefix"])
        self.session_id: str | None = None
        self._warned_split = False
        self._socket: tuple[str, ws_sync.ClientConnection] | None = None  # (session id, connection)
        self._asocket: tuple[str, asyncio.AbstractEventLoop, ws_async.ClientConnection] | None = None

    @property
    def _env_name(self) -> str:
        return f"RemoteEnv({self.env_id} at {self.client.url})"

    # --- the gymnasium contract ---------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        self._seed_locally(seed)
        body = {"seed": seed, "options": options}
        if self.session_id is None:
            self.session_id = self._created(self.client.request("POST", "/sessions", self._create_body()))
        try:
            data = self.client.request("POST", f"/sessions/{self.session_id}/reset", body)
        except EnvServerError as e:
            if e.status not in (404, 409):  # 404: expired or the server restarted; 409: broken
                raise
            if e.status == 409:  # broken: free its slot now rather than at its idle timeout
                self._delete_quietly(self.session_id)
            self.session_id = self._created(self.client.request("POST", "/sessions", self._create_body()))
            data = self.client.request("POST", f"/sessions/{self.session_id}/reset", body)
        return self._began(data)

    def step(self, action: Action) -> StepResult:
        self._check_stepping()
        body = _step_body(action)
        socket = self._step_socket() if self.client.websocket else None
        if socket is None:
            return self._stepped(self.client.request("POST", f"/sessions/{self.session_id}/step", body))
        try:
            socket.send(json.dumps(body, ensure_ascii=True))
            answer = socket.recv(timeout=self.client.timeout)
        except (ConnectionClosed, TimeoutError, OSError) as e:  # sent, perhaps played: never sent again
            self._close_sockets()
            raise self.client._lost("step on", f"/sessions/{self.session_id}/ws", e) from e
        return self._stepped(self._answered(answer))

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        self._seed_locally(seed)
        body = {"seed": seed, "options": options}
        if self.session_id is None:
            self.session_id = self._created(await self.client.arequest("POST", "/sessions", self._create_body()))
        try:
            data = await self.client.arequest("POST", f"/sessions/{self.session_id}/reset", body)
        except EnvServerError as e:
            if e.status not in (404, 409):
                raise
            if e.status == 409:
                ENV_THREADS.submit(lambda old=self.session_id: self._delete_quietly(old))
            self.session_id = self._created(await self.client.arequest("POST", "/sessions", self._create_body()))
            data = await self.client.arequest("POST", f"/sessions/{self.session_id}/reset", body)
        return self._began(data)

    async def astep(self, action: Action) -> StepResult:
        self._check_stepping()
        body = _step_body(action)
        socket = await self._astep_socket() if self.client.websocket else None
        if socket is None:
            return self._stepped(await self.client.arequest("POST", f"/sessions/{self.session_id}/step", body))
        try:
            await socket.send(json.dumps(body, ensure_ascii=True))
            answer = await asyncio.wait_for(socket.recv(), self.client.timeout)
        except (ConnectionClosed, TimeoutError, OSError) as e:  # sent, perhaps played: never sent again
            self._close_sockets()
            raise self.client._lost("step on", f"/sessions/{self.session_id}/ws", e) from e
        return self._stepped(self._answered(answer))

    def close(self) -> None:
        """Delete the session (from a daemon thread when an event loop runs here); never raises."""
        self._close_sockets()
        session_id, self.session_id = self.session_id, None
        if session_id is not None:
            if _loop_running():  # not a task of this loop, which may be about to end and cancel it
                ENV_THREADS.submit(lambda: self._delete_quietly(session_id))
            else:
                self._delete_quietly(session_id)
        if self._owns_client:
            self.client.close()

    # --- the step socket -------------------------------------------------------------------------

    def _step_socket(self) -> ws_sync.ClientConnection | None:
        """This session's step connection (made on its first step), or ``None``: steps go over HTTP."""
        assert self.session_id is not None
        if self._socket is not None and self._socket[0] == self.session_id:
            return self._socket[1]
        self._close_sockets()
        url, path = self._socket_url()
        try:
            opened = (
                ws_sync.unix_connect(path, url, **self._socket_options())
                if path
                else ws_sync.connect(url, **self._socket_options())
            )
        except InvalidHandshake:
            return self._no_socket()
        except (OSError, TimeoutError):  # not connected, nothing sent: this step goes over HTTP, which retries
            return None
        socket = opened.__enter__()  # connect() is its own context manager; _close_sockets closes it
        self._socket = (self.session_id, socket)
        return socket

    async def _astep_socket(self) -> ws_async.ClientConnection | None:
        """:meth:`_step_socket` for this event loop."""
        assert self.session_id is not None
        loop = asyncio.get_running_loop()
        if self._asocket is not None and self._asocket[:2] == (self.session_id, loop):
            return self._asocket[2]
        self._close_sockets()
        url, path = self._socket_url()
        try:
            if path:
                socket = await ws_async.unix_connect(path, url, **self._socket_options())
            else:
                socket = await ws_async.connect(url, **self._socket_options())
        except InvalidHandshake:
            return self._no_socket()
        except (OSError, TimeoutError):
            return None
        self._asocket = (self.session_id, loop, socket)
        return socket

    def _socket_url(self) -> tuple[str, str | None]:
        base = self.client.base_url.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
        return f"{base}/sessions/{self.session_id}/ws", self.client.uds

    def _socket_options(self) -> dict[str, Any]:
        return {"additional_headers": self.client.headers, "open_timeout": self.client.timeout, "max_size": None,
                "compression": None, "proxy": None}  # fmt: skip

    def _no_socket(self) -> None:
        """The server refused the step socket (it predates it): this client's steps go over HTTP."""
        self.client.websocket = False

    def _answered(self, frame: str | bytes) -> Any:
        answer = json.loads(frame)
        if answer["status"] == 200:
            return answer["body"]
        text = json.dumps({"detail": answer.get("detail", "")})
        return _decoded(Answer(answer["status"], text), "POST", f"/sessions/{self.session_id}/step")

    def _close_sockets(self) -> None:
        """Close the step connections; never raises (an async one whose loop is gone is aborted)."""
        if self._socket is not None:
            socket, self._socket = self._socket[1], None
            with contextlib.suppress(Exception):
                socket.close()
        if self._asocket is not None:
            _, loop, asocket = self._asocket
            self._asocket = None
            with contextlib.suppress(Exception):
                if _loop_running() and asyncio.get_running_loop() is loop:
                    loop.create_task(asocket.close())
                else:
                    asocket.transport.abort()

    # --- plumbing ------------------------------------------------------------------------------

    def _delete_quietly(self, session_id: str) -> None:
        try:
            self.client.request("DELETE", f"/sessions/{session_id}")
        except Exception:  # the server is gone, or already forgot it: nothing is left to close
            pass

    def _create_body(self) -> dict[str, Any]:
        return {"env_id": self.env_id, "split": self.split, "env_kwargs": self.env_kwargs}

    def _created(self, data: Any) -> str:
        if data.get("split_ignored") and not self._warned_split:
            self._warned_split = True
            warnings.warn(
                f"{self.env_id!r} on {self.client.url} takes no split argument, so training and evaluation draw "
                "from the same tasks; give its constructor a split parameter ('train' / 'test') for held-out evaluation.",
                stacklevel=3,
            )
        return str(data["session_id"])

    def _seed_locally(self, seed: int | None) -> None:
        # The local generator only drives action_space.sample() (the random agent); the task is the server's.
        gym.Env.reset(self, seed=seed)
        if seed is not None:
            self.action_space.seed(seed)

    def _began(self, data: Mapping[str, Any]) -> ResetResult:
        observation = [Message.from_dict(m) for m in data["observation"]]
        self.turn = 0
        self._episode_over = ""
        self.messages = list(observation)
        return ResetResult(observation, dict(data["info"]))

    def _check_stepping(self) -> None:
        if self._episode_over is None or self.session_id is None:
            raise RuntimeError(f"{self._env_name}.step was called before reset(); call reset() first.")
        if self._episode_over:
            raise RuntimeError(
                f"{self._env_name}.step was called after the episode ended ({self._episode_over}); "
                "call reset() to start a new one."
            )

    def _stepped(self, data: Mapping[str, Any]) -> StepResult:
        observation = [Message.from_dict(m) for m in data["observation"]]
        self.turn += 1
        self.messages.extend(observation)
        terminated, truncated = bool(data["terminated"]), bool(data["truncated"])
        if terminated or truncated:
            self._episode_over = "terminated" if terminated else "truncated"
        return StepResult(observation, float(data["reward"]), terminated, truncated, dict(data["info"]))


def remote_env_factory(
    url: str, env_id: str, env_kwargs: Mapping[str, Any] | None = None, *, token: str | None = None
) -> Callable[[], RemoteEnv]:
    """A function making a fresh :class:`RemoteEnv` each call, all sharing one :class:`EnvClient`
    and one read of ``GET /envs``. ``env_kwargs["split"]``, if set, is the session's split."""
    kwargs = dict(env_kwargs or {})
    split = kwargs.pop("split", None)
    client = EnvClient(url, token)
    spec = client.env_spec(env_id)
    return lambda: RemoteEnv(url, env_id, split=split, env_kwargs=kwargs, client=client, spec=spec)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _closed_with_the_loop(session: aiohttp.ClientSession) -> AsyncIterator[None]:
    """Closes ``session`` when its event loop shuts down: ``asyncio.run`` finalises the async
    generators still suspended in its loop (``loop.shutdown_asyncgens``), and this one waits there."""
    try:
        yield
        await asyncio.Event().wait()
    finally:
        await session.close()


def _json(body: Any) -> dict[str, Any]:
    """The request's body as ASCII JSON: a reply may hold a lone surrogate, which UTF-8 cannot carry."""
    if body is None:
        return {}
    return {"content": json.dumps(body, ensure_ascii=True), "headers": {"content-type": "application/json"}}


def _step_body(action: Action) -> dict[str, Any]:
    if isinstance(action, Message):
        return {"reply": action.to_dict()}
    if isinstance(action, str):
        return {"reply": action}
    raise TypeError(f"RemoteEnv.step expects the reply as a str or an assistant Message, got {type(action).__name__}.")


def _remote_tool(schema: Mapping[str, Any]) -> Tool:
    function = schema["function"]

    def runs_on_the_server(**_: Any) -> Any:
        raise RuntimeError(f"The tool {function['name']!r} runs on the env server; a RemoteEnv's step calls it there.")

    return Tool(
        function["name"], function.get("description", ""), dict(function.get("parameters") or {}), runs_on_the_server
    )


def _decoded(answer: Answer, method: str, path: str) -> Any:
    if answer.status == 204:
        return None
    if 200 <= answer.status < 300:
        return json.loads(answer.text)
    detail = _detail(answer)
    if answer.status == 409 and "reset it" in detail:
        raise RuntimeError(f"The env server refused {method} {path}: {detail}")
    raise EnvServerError(f"The env server answered {method} {path} with {answer.status}: {detail}", answer.status)


def _detail(answer: Answer) -> str:
    try:
        detail = json.loads(answer.text).get("detail", answer.text)
    except (ValueError, AttributeError):
        detail = answer.text
    return detail if isinstance(detail, str) else str(detail)
