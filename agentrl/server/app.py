"""The env server: registered envs over HTTP, one stateful session per episode stream.

:func:`make_app` builds the FastAPI app; ``agentrl serve`` runs it under uvicorn (:func:`serve`)::

    GET    /envs                   ids, descriptions, tool schemas, the env kwargs a session may set
    POST   /sessions               {env_id, split, seed, env_kwargs} -> {session_id}
    POST   /sessions/{id}/reset    {seed, options} -> the first observation
    POST   /sessions/{id}/step     {reply} | {actions: {agent: reply}} | {agent, reply} -> what step returns
    GET    /sessions/{id}          the session's state
    DELETE /sessions/{id}          close it
    GET    /healthz                no token needed
    GET    /metrics                Prometheus text format

A session keeps its env between calls (a multi-step episode is a sequence of plain HTTP requests,
no socket to hold open) until it is deleted or sits idle past the limit. Every status a client can
get, and what to do about it:

====  ==========================================================================================
400   env kwargs the server does not allow (or a value that looks like an import path)
401   the token is missing or wrong (``Authorization: Bearer ...``)
404   unknown env id, or no such session for this token (expired, deleted, another token's, not an id)
409   the call does not fit the session's state: step before reset or after the episode ended, a
      step while another runs, the wrong agent's turn, a broken session (delete it, make another)
413   the body is larger than ``max_body_bytes``
422   the body is not valid JSON or not the documented shape
500   the env raised: the body names the exception, without a traceback; the session goes on
503   the server holds ``max_sessions`` already: retry after ``Retry-After`` seconds
504   the env ran past ``step_timeout``: the session is broken, the server serves on
====  ==========================================================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Request, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pettingzoo import AECEnv, ParallelEnv
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import ValidationError

from agentrl.env import AgentEnv, as_agent_env
from agentrl.registry import is_multiagent, make, make_multiagent, takes_kwarg
from agentrl.rollout import close_quietly
from agentrl.server.schemas import (
    AECResponse,
    AgentSpec,
    CreateSession,
    EnvList,
    EnvSpec,
    ErrorBody,
    MessageBody,
    ParallelResponse,
    Reply,
    ResetRequest,
    ResetResponse,
    SessionCreated,
    SessionState,
    StepRequest,
    StepResponse,
)
from agentrl.server.sessions import EnvKind, Full, ServerLimits, Session, SessionStore, token_digest
from agentrl.threads import ENV_THREADS
from agentrl.tool_calls import parse_reply
from agentrl.types import Message

logger = logging.getLogger(__name__)
T = TypeVar("T")

IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
"""``module:attribute``: a string env kwarg of this shape is refused, whatever its name."""


class AsciiJSONResponse(JSONResponse):
    """JSON with non-ASCII characters escaped: an env may echo a lone surrogate (``"\\ud800"``)
    that UTF-8 cannot encode, and JSON's ``\\u`` escapes carry it there and back."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def make_app(
    env_ids: Sequence[str],
    *,
    limits: ServerLimits = ServerLimits(),
    tokens: Collection[str] = (),
    allow_kwargs: Collection[str] = (),
) -> FastAPI:
    """The env server of ``env_ids`` (registered ids, single- or multi-agent).

    ``tokens``: bearer tokens a client must present (none: any client on the address it binds,
    which :func:`serve` allows only on loopback). ``allow_kwargs``: the constructor arguments a
    session may set (``split`` and ``seed`` are fields of their own); anything else is refused.

    >>> app = make_app(["agentrl/Calculator-v0"], limits=ServerLimits(max_sessions=8))  # doctest: +SKIP
    """
    if not env_ids:
        raise ValueError("make_app needs at least one env id to serve.")
    specs = {env_id: describe_env(env_id, allow_kwargs) for env_id in env_ids}
    token_list = [t for t in tokens if t]
    if len(token_list) != len(list(tokens)):
        raise ValueError("A server token must not be empty.")
    metrics = _Metrics()
    store = SessionStore(limits, on_close=lambda s, why: metrics.closed.labels(why).inc())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.create_task(store.run_reaper())
        try:
            yield
        finally:
            reaper.cancel()
            await store.close_all()

    app = FastAPI(
        title="agentrl env server",
        summary="Registered agentrl envs as stateful HTTP sessions.",
        description=__doc__,
        lifespan=lifespan,
        default_response_class=AsciiJSONResponse,
        responses={code: {"model": ErrorBody} for code in (400, 401, 404, 409, 413, 500, 503, 504)},
    )
    # What routes added later (agentrl.server.openenv) share with these.
    app.state.store, app.state.metrics, app.state.specs = store, metrics, specs
    app.state.limits, app.state.tokens = limits, token_list
    app.add_middleware(_BodyLimit, max_bytes=limits.max_body_bytes, metrics=metrics)

    # Dependencies are coroutines: FastAPI runs a plain function in a worker thread, a hop per request.
    async def owner(request: Request) -> str:
        """The digest sessions are bound to; 401 unless the request holds a served token."""
        who = authorized(request.headers.get("authorization"), token_list)
        if who is None:
            metrics.errors.labels("401").inc()
            raise HTTPException(
                401,
                "Missing or wrong token: send the server's token as 'Authorization: Bearer TOKEN'.",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return who

    async def session_of(session_id: str, request: Request) -> Session:
        # Called by the hot routes themselves rather than as a Depends chain: FastAPI's dependency
        # solving costs more per request than the lookup (benchmarks/README.md, env_server.py).
        return session_for(session_id, await owner(request))

    def session_for(session_id: str, who: str) -> Session:
        session = store.get(session_id, who)
        if session is None:
            raise _error(metrics, 404, "No such session for this token: it may have expired (idle past "
                         f"{limits.idle_timeout:g} s), been deleted, or never existed. Create one with POST /sessions.")  # fmt: skip
        session.touch()
        return session

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return AsciiJSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        metrics.errors.labels("422").inc()
        problems = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in exc.errors()
        ]
        return AsciiJSONResponse({"detail": problems}, 422)

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("env server: unexpected error on %s %s", request.method, request.url.path)
        metrics.errors.labels("500").inc()
        return AsciiJSONResponse({"detail": f"internal error: {type(exc).__name__}: {exc}"}, 500)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "sessions": len(store), "envs": sorted(specs)}

    @app.get("/metrics", response_class=PlainTextResponse, dependencies=[Depends(owner)])
    async def prometheus() -> PlainTextResponse:
        metrics.sessions.set(len(store))
        metrics.broken.set(sum(s.broken is not None for s in store.sessions()))
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/envs", response_model=EnvList, dependencies=[Depends(owner)])
    async def list_envs() -> EnvList:
        return EnvList(envs=list(specs.values()))

    @app.post("/sessions", response_model=SessionCreated, status_code=201)
    async def create_session(body: CreateSession, who: str = Depends(owner)) -> JSONResponse:
        env_spec = specs.get(body.env_id)
        if env_spec is None:
            raise _error(metrics, 404, f"This server does not serve {body.env_id!r}; it serves {sorted(specs)}.")
        kwargs = _checked_kwargs(body.env_kwargs, env_spec.env_kwargs, metrics)
        try:
            store.reserve()
        except Full as e:
            metrics.errors.labels("503").inc()
            raise HTTPException(503, f"{e}; retry shortly, or delete sessions you no longer use.",
                                headers={"Retry-After": str(limits.retry_after)}) from e  # fmt: skip
        try:
            make = _maker(body.env_id, env_spec.kind, body.split if env_spec.takes_split else None, kwargs)
            env = await _build(make, limits, metrics)
        except HTTPException:
            store.release()
            raise
        except Exception as e:  # a TypeError is arguments the constructor does not take
            store.release()
            status = 400 if isinstance(e, TypeError) else 500
            raise _error(metrics, status, f"Building {body.env_id} raised {type(e).__name__}: {e}") from None
        except BaseException:
            store.release()
            raise
        session = store.add(body.env_id, env_spec.kind, env, who, body.split)
        session.seed = body.seed
        metrics.created.labels(body.env_id).inc()
        created = SessionCreated(session_id=session.id, env_id=session.env_id, kind=session.kind,
                                 split_ignored=body.split is not None and not env_spec.takes_split)  # fmt: skip
        return AsciiJSONResponse(created.model_dump(), 201)

    @app.get("/sessions/{session_id}", response_model=SessionState)
    async def session_state(session_id: str, request: Request) -> SessionState:
        session = await session_of(session_id, request)
        now = time.monotonic()
        return SessionState(
            session_id=session.id, env_id=session.env_id, kind=session.kind, split=session.split,
            episode=session.episode, episodes=session.episodes, steps=session.steps,
            idle_seconds=now - session.previous_use, age_seconds=now - session.created, broken=session.broken,
        )  # fmt: skip

    @app.delete("/sessions/{session_id}", status_code=204)
    async def delete_session(session_id: str, request: Request) -> None:
        session = await session_of(session_id, request)
        await store.close(session, "deleted")

    @app.post("/sessions/{session_id}/reset", response_model=ResetResponse | ParallelResponse | AECResponse)
    async def reset(
        session_id: str, request: Request, body: ResetRequest | None = None, _: str = Depends(owner)
    ) -> JSONResponse:  # Depends(owner): a request without a token gets 401 before its body is read
        session = await session_of(session_id, request)
        body = body or ResetRequest()
        seed = body.seed if body.seed is not None else session.seed
        session.seed = None  # the creation seed is the first reset's only
        return AsciiJSONResponse(await play_reset(session, seed, body.options, limits, metrics))

    @app.post("/sessions/{session_id}/step", response_model=StepResponse | ParallelResponse | AECResponse)
    async def step(session_id: str, body: StepRequest, who: str = Depends(owner)) -> JSONResponse:
        return AsciiJSONResponse(await step_of(session_id, who, body))

    async def step_of(session_id: str, who: str, body: StepRequest) -> dict[str, Any]:
        session = session_for(session_id, who)
        if session.episode != "running":
            what = "reset it first" if session.episode == "not started" else "its episode is over; reset it"
            raise _error(metrics, 409, f"Cannot step session {session.id[:8]}...: {what}.")
        action = _action(session, env_spec=specs[session.env_id], body=body, metrics=metrics)
        result, _ = await play_step(session, action, limits, metrics)
        return result

    @app.websocket("/sessions/{session_id}/ws")
    async def step_socket(websocket: WebSocket, session_id: str) -> None:
        """The session's steps over one connection: each text frame a step's body, each answer
        ``{"status": 200, "body": ...}`` or ``{"status": CODE, "detail": ...}`` as the step route
        would answer. No HTTP request to parse per step: RemoteEnv steps here."""
        who = authorized(websocket.headers.get("authorization"), token_list)
        if who is None:
            metrics.errors.labels("401").inc()
            await websocket.close(code=1008, reason="missing or wrong token (Authorization: Bearer TOKEN)")
            return
        await websocket.accept()
        while True:
            try:
                text = await websocket.receive_text()
            except (WebSocketDisconnect, RuntimeError):  # gone, or sent a binary frame
                return
            try:
                if len(text) > limits.max_body_bytes:
                    raise _error(metrics, 413, f"A step's body is at most {limits.max_body_bytes} bytes.")
                # json.loads, as the HTTP route reads a body: pydantic's own JSON parser refuses the
                # lone surrogates a garbled reply may hold (JSON escapes them as \ud800).
                body = StepRequest.model_validate(json.loads(text))
                answer = {"status": 200, "body": await step_of(session_id, who, body)}
            except HTTPException as e:
                answer = {"status": e.status_code, "detail": e.detail}
            except ValidationError as e:
                metrics.errors.labels("422").inc()
                answer = {"status": 422, "detail": [{"loc": list(x.get("loc", ())), "msg": x.get("msg", "")}
                                                    for x in e.errors()]}  # fmt: skip
            except ValueError as e:  # not JSON
                metrics.errors.labels("422").inc()
                answer = {"status": 422, "detail": f"A step's frame is its body as JSON: {e}"}
            except Exception as e:
                logger.exception("env server: unexpected error on a step of session %s", session_id[:8])
                metrics.errors.labels("500").inc()
                answer = {"status": 500, "detail": f"internal error: {type(e).__name__}: {e}"}
            await websocket.send_text(json.dumps(answer, ensure_ascii=True))

    return app


# --- one call on a session ----------------------------------------------------------------------


async def play_reset(
    session: Session, seed: int | None, options: dict[str, Any] | None, limits: ServerLimits, metrics: _Metrics
) -> dict[str, Any]:
    """Reset ``session``'s env under its lock and the step limit; the answer's body."""
    async with _turn(session, metrics):
        result = await _env_call(session, "reset", lambda: _reset(session, seed, options), limits, metrics)
        session.episode = "running"
        session.episodes += 1
    return result


async def play_step(
    session: Session, action: Any, limits: ServerLimits, metrics: _Metrics
) -> tuple[dict[str, Any], bool]:
    """Step ``session``'s env under its lock and the step limit; the answer's body and whether the episode ended."""
    async with _turn(session, metrics):
        result, over = await _env_call(session, "step", lambda: _step(session, action), limits, metrics)
        session.steps += 1
        metrics.count_step(session.env_id)
        if over:
            session.episode = "over"
    return result, over


# --- what each env kind does ---------------------------------------------------------------------


def describe_env(env_id: str, allow_kwargs: Collection[str] = ()) -> EnvSpec:
    """What ``GET /envs`` says of ``env_id``: a probe env is made (and closed) to read its tools."""
    if is_multiagent(env_id):
        probe = make_multiagent(env_id)
        try:
            kind: EnvKind = "parallel" if isinstance(probe, ParallelEnv) else "aec"
            agents = {a: _agent_spec(probe.action_space(a)) for a in probe.possible_agents}
            description = _first_line(type(probe).__doc__)
        finally:
            probe.close()
    else:
        probe = as_agent_env(make(env_id))
        try:
            kind = "single"
            agents = {"agent": _agent_spec(probe.action_space, probe)}
            description = _first_line(type(getattr(probe, "env", probe).unwrapped).__doc__)
        finally:
            probe.close()
    return EnvSpec(
        id=env_id, kind=kind, description=description, agents=agents,
        env_kwargs=sorted(allow_kwargs), takes_split=takes_kwarg(env_id, "split"),
    )  # fmt: skip


def _agent_spec(action_space: Any, env: AgentEnv | None = None) -> AgentSpec:
    tools = getattr(env, "tools", None) if env is not None else getattr(action_space, "tools", ())
    return AgentSpec(
        tools=[t.schema for t in tools or ()],
        tool_format=getattr(env, "tool_format", "auto") if env is not None else "auto",
        reply_prefix=getattr(action_space, "reply_prefix", ""),
    )


def _maker(env_id: str, kind: EnvKind, split: str | None, kwargs: dict[str, Any]) -> Callable[[], Any]:
    with_split = {**kwargs, **({"split": split} if split is not None else {})}
    if kind == "single":
        return lambda: as_agent_env(make(env_id, **with_split))
    return lambda: make_multiagent(env_id, **with_split)


async def _reset(session: Session, seed: int | None, options: dict[str, Any] | None) -> dict[str, Any]:
    env = session.env
    if session.kind == "single":
        observation, info = await env.areset(seed=seed, options=options)
        return {"observation": _messages(observation), "info": _jsonable(info)}  # a ResetResponse
    if session.kind == "parallel":
        observations, infos = await ENV_THREADS.run(lambda: env.reset(seed=seed, options=options))
        return _parallel(env, observations, {}, {}, {}, infos)
    await ENV_THREADS.run(lambda: env.reset(seed=seed, options=options))
    return _aec(env)


async def _step(session: Session, action: Any) -> tuple[dict[str, Any], bool]:
    env = session.env
    if session.kind == "single":
        observation, reward, terminated, truncated, info = await env.astep(action)
        response = {
            "observation": _messages(observation),
            "reward": float(reward),
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "info": _jsonable(info),
        }  # a StepResponse; fmt: skip
        return response, bool(terminated or truncated)
    if session.kind == "parallel":
        result = await ENV_THREADS.run(lambda: env.step(action))
        return _parallel(env, *result), not env.agents
    await ENV_THREADS.run(lambda: env.step(action))
    return _aec(env), not env.agents


def _action(session: Session, *, env_spec: EnvSpec, body: StepRequest, metrics: _Metrics) -> Any:
    """The step's action in the form the env takes, or 409 / 422 when the body does not fit."""
    if session.kind == "single":
        if body.reply is None or body.actions is not None or body.agent is not None:
            raise _error(metrics, 422, "A single-agent step takes {'reply': TEXT or an assistant message}.")
        return _reply(body.reply, None)
    if session.kind == "parallel":
        if body.actions is None or body.reply is not None or body.agent is not None:
            raise _error(metrics, 422, "A parallel multi-agent step takes {'actions': {agent: reply}}, one per live agent.")  # fmt: skip
        live = set(session.env.agents)
        if set(body.actions) != live:
            raise _error(metrics, 409, f"The live agents are {sorted(live)}; got replies for {sorted(body.actions)}.")
        return {a: _reply(r, env_spec.agents[a].tool_format) for a, r in body.actions.items()}
    if body.agent is None or body.actions is not None:
        raise _error(metrics, 422, "A turn-based step takes {'agent': ID, 'reply': TEXT, message or null}.")
    selected = session.env.agent_selection
    if body.agent != selected:
        raise _error(metrics, 409, f"It is {selected!r}'s turn, not {body.agent!r}'s.")
    if body.reply is None:
        return None
    return _reply(body.reply, env_spec.agents[body.agent].tool_format if body.agent in env_spec.agents else "auto")


def _reply(reply: Reply, tool_format: str | None) -> str | Message:
    """A single-agent env parses text itself (``tool_format`` None); a multi-agent env gets a Message."""
    if isinstance(reply, MessageBody):
        if reply.role != "assistant":
            raise HTTPException(422, f"A reply message must have role 'assistant', got {reply.role!r}.")
        return reply.to_message()
    return reply if tool_format is None else parse_reply(reply, tool_format)  # type: ignore[arg-type]


def _parallel(
    env: Any, observations: Any, rewards: Any, terminations: Any, truncations: Any, infos: Any
) -> dict[str, Any]:
    return {  # a ParallelResponse
        "agents": list(env.agents),
        "observations": {str(a): _messages(o) for a, o in observations.items()},
        "rewards": {str(a): float(r) for a, r in rewards.items()},
        "terminations": {str(a): bool(t) for a, t in terminations.items()},
        "truncations": {str(a): bool(t) for a, t in truncations.items()},
        "infos": {str(a): _jsonable(i) for a, i in infos.items()},
    }


def _aec(env: AECEnv[str, Any, Any]) -> dict[str, Any]:
    if not env.agents:
        return {
            "agents": [],
            "agent_selection": None,
            "observation": None,
            "reward": 0.0,
            "termination": True,
            "truncation": False,
            "info": {},
        }  # an AECResponse; fmt: skip
    observation, reward, termination, truncation, info = env.last()
    return {  # an AECResponse
        "agents": list(env.agents), "agent_selection": env.agent_selection,
        "observation": None if observation is None else _messages(observation), "reward": float(reward),
        "termination": bool(termination), "truncation": bool(truncation), "info": _jsonable(info),
    }  # fmt: skip


# --- the plumbing around each call ---------------------------------------------------------------


@contextlib.asynccontextmanager
async def _turn(session: Session, metrics: _Metrics) -> AsyncIterator[None]:
    """Hold the session for one call: 409 if it is broken or another call holds it."""
    if session.broken is not None:
        raise _error(metrics, 409, f"Session {session.id[:8]}... is broken ({session.broken}); DELETE it and create another.")  # fmt: skip
    if session.lock.locked():
        raise _error(metrics, 409, f"Session {session.id[:8]}... is busy with another call; send one call at a time.")
    async with session.lock:
        try:
            yield
        finally:
            session.touch()


async def _env_call(
    session: Session, call: str, fn: Callable[[], Awaitable[T]], limits: ServerLimits, metrics: _Metrics
) -> T:
    """``fn()`` under the step limit: past it the session is broken (504); an env error is a 500."""
    start = time.perf_counter()
    try:
        return await _timed(fn, limits.step_timeout, f"{call} of {session.env_id}", metrics, session)
    except HTTPException:
        raise
    except Exception as e:
        metrics.errors.labels("500").inc()
        logger.warning("env server: %s of %s raised %s: %s", call, session.env_id, type(e).__name__, e)
        raise HTTPException(500, f"The env raised {type(e).__name__} during {call}: {e}") from None
    finally:
        metrics.observe(session.env_id, call, time.perf_counter() - start)


async def _build(make: Callable[[], Any], limits: ServerLimits, metrics: _Metrics) -> Any:
    """``make()`` on an env thread under the step limit. A build past the limit is abandoned (the
    client gets 504), and the env it makes if it ends after all is closed: nobody will ever use it."""
    lock = threading.Lock()
    abandoned = False
    built: list[Any] = []

    def make_or_close() -> Any:
        env = make()
        with lock:
            if not abandoned:
                built.append(env)
                return env
        close_quietly(env)
        return env

    try:
        return await _timed(lambda: ENV_THREADS.run(make_or_close), limits.step_timeout, "building the env", metrics)
    except BaseException:
        with lock:
            abandoned = True
        for env in built:  # made just as the wait ended: its result reached nobody
            ENV_THREADS.submit(lambda env=env: close_quietly(env))
        raise


async def _timed(
    fn: Callable[[], Awaitable[T]], seconds: float, what: str, metrics: _Metrics, session: Session | None = None
) -> T:
    try:
        async with asyncio.timeout(seconds):  # not wait_for: that starts a task per call
            return await fn()
    except TimeoutError:
        metrics.errors.labels("504").inc()
        if session is not None:
            session.broken = f"{what} ran past the step limit of {seconds:g} s"
        raise HTTPException(504, f"{what} ran past the server's step limit of {seconds:g} s; "
                            "that session is broken: DELETE it and create another.") from None  # fmt: skip


def _checked_kwargs(kwargs: Mapping[str, Any], allowed: Collection[str], metrics: _Metrics) -> dict[str, Any]:
    if "split" in kwargs:
        raise _error(metrics, 400, "Set the split with the 'split' field, not in env_kwargs.")
    refused = sorted(set(kwargs) - set(allowed))
    if refused:
        allows = f"it allows {sorted(allowed)}" if allowed else "it allows none"
        raise _error(metrics, 400, f"This server does not let a session set {refused} ({allows}); the server's "
                     "operator can allow one with `agentrl serve --allow-kwarg NAME`.")  # fmt: skip
    for name, value in kwargs.items():
        for text in _strings(value):
            if IMPORT_PATH.fullmatch(text):
                raise _error(metrics, 400, f"env_kwargs[{name!r}] = {text!r} looks like an import path; a session "
                             "can never name code to load. Configure it on the server instead.")  # fmt: skip
    return dict(kwargs)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _messages(observation: Any) -> list[dict[str, Any]]:
    """Messages as :class:`MessageBody` dicts (``Message.to_dict`` writes that shape already)."""
    return [m.to_dict() for m in observation]


def _jsonable(value: Any) -> Any:
    """``value`` as JSON (an info dict may hold numpy scalars, dataclasses, messages; the rest as repr)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if np.isfinite(value) else str(value)
    if isinstance(value, Message):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    return repr(value)


def _first_line(doc: str | None) -> str:
    doc = (doc or "").strip()
    return doc.splitlines()[0] if doc else ""


def authorized(header: str | None, tokens: Sequence[str]) -> str | None:
    """The owner digest of a request with ``Authorization: header``, or ``None`` when ``tokens``
    are served and the header holds none of them."""
    presented = _bearer(header)
    # Every token is compared, so the time taken says nothing of which one came close.
    if tokens and (presented is None or not sum(hmac.compare_digest(presented.encode(), t.encode()) for t in tokens)):
        return None
    return token_digest(presented)


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _error(metrics: _Metrics, status: int, detail: str) -> HTTPException:
    metrics.errors.labels(str(status)).inc()
    return HTTPException(status, detail)


class _Metrics:
    """The server's Prometheus metrics, in a registry of its own (two apps in one process do not mix)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions = Gauge("agentrl_server_sessions", "Live sessions", registry=r)
        self.broken = Gauge(
            "agentrl_server_broken_sessions", "Live sessions broken by a step past the limit", registry=r
        )
        self.created = Counter("agentrl_server_sessions_created", "Sessions created", ["env"], registry=r)
        self.closed = Counter("agentrl_server_sessions_closed", "Sessions closed, by reason", ["reason"], registry=r)
        self.steps = Counter("agentrl_server_steps", "Steps served", ["env"], registry=r)
        self.errors = Counter("agentrl_server_errors", "Error answers, by status", ["status"], registry=r)
        self.latency = Histogram(
            "agentrl_server_call_seconds", "Env call latency (reset, step)", ["env", "call"], registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )  # fmt: skip
        self._children: dict[tuple[str, ...], Any] = {}  # labels() costs a lookup and a lock per call

    def observe(self, env_id: str, call: str, seconds: float) -> None:
        key = ("latency", env_id, call)
        if key not in self._children:
            self._children[key] = self.latency.labels(env_id, call)
        self._children[key].observe(seconds)

    def count_step(self, env_id: str) -> None:
        key = ("steps", env_id)
        if key not in self._children:
            self._children[key] = self.steps.labels(env_id)
        self._children[key].inc()


class _BodyLimit:
    """ASGI middleware: 413 for a body over ``max_bytes``, by its Content-Length or as it streams."""

    def __init__(self, app: Any, max_bytes: int, metrics: _Metrics):
        self.app = app
        self.max_bytes = max_bytes
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._refuse(send)
            return
        seen = 0

        async def limited() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    self.metrics.errors.labels("413").inc()
                    raise _TooLarge(self.max_bytes)
            return message

        await self.app(scope, limited, send)

    async def _refuse(self, send: Any) -> None:
        self.metrics.errors.labels("413").inc()
        body = json.dumps({"detail": f"The body is larger than this server's limit of {self.max_bytes} bytes."})
        await send({"type": "http.response.start", "status": 413, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body.encode()})


class _TooLarge(HTTPException):
    """Raised while the body streams in; an HTTPException, so FastAPI's body reader lets it through."""

    def __init__(self, max_bytes: int):
        super().__init__(413, f"The body is larger than this server's limit of {max_bytes} bytes.")
