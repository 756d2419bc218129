"""``verifiers/Env-v0``: a verifiers v1 ``Env`` (Prime Intellect's ``verifiers`` 0.4) as a PettingZoo ``AECEnv``.

A verifiers v1 environment runs a task with one or more agents ("seats": the ``AgentConfig``
fields of its ``EnvConfig``, such as ``assistant`` and ``user`` in the bundled ``user-sim``), each
``trainable`` or not. It drives the episode itself: its ``Env.run`` asks each seat for a reply
through an OpenAI-compatible endpoint. This adapter turns that around into agentrl's multi-agent
contract (:mod:`agentrl.multiagent`), so agentrl's rollout plays every seat with the policy the
mapping gives it:

    env = agentrl.make_multiagent("verifiers/Env-v0", taskset="my_taskset", env="user-sim")

- **agents**: the env's seats, by their field names, in declaration order.
- **turns**: whichever seat the env asks next is ``agent_selection`` (seats the env asks at the
  same time take turns in the order they asked).
- **observations**: the messages the seat has not seen yet: the first time, its whole prompt
  (system and user messages); then what came after its last reply.
- **actions**: the reply text, sent back as the seat's completion.
- **rewards**: each seat's verifiers reward (its trace's weighted sum; the mean over its traces if
  it has several), at the end, with ``terminated`` for every seat.
- **info** at the end, per seat: ``success`` (reward > 0) and ``verifiers``: ``reward``,
  ``rewards`` (by name), ``metrics``, ``trainable`` (as the env's ``setup`` marked the seat),
  ``stop`` (the trace's stop condition) and ``turns``. A seat marked ``trainable=False`` should be
  played by a frozen policy (``policies: {user: {trainable: false}}``); the adapter reports the
  flag, the mapping decides.
- **seeds**: a verifiers episode has no seed; ``reset(seed=s)`` plays task ``s mod n`` of the
  taskset's ``n`` tasks (in the taskset's order), so a seed replays a task.
- **errors**: an episode the env reports as failed raises :class:`VerifiersEpisodeError` with its
  errors (the rollout counts it and goes on); a seat that waits longer than ``reply_timeout`` for
  the env raises ``TimeoutError``.

How it runs offline: verifiers' own agent programs (the ``bash`` and ``null`` harnesses) install
themselves with ``uv`` from PyPI in every new process and its default runtime is Prime's cloud
sandboxes, so every seat gets the local ``subprocess`` runtime and the harness ``agentrl_harness``
(defined here: one chat completion per turn, in process, through verifiers' interception server,
which records the seat's trace and enforces its limits). The endpoint behind it is served here, on
127.0.0.1 with a bearer token: each request is one seat's turn, answered by this env's ``step``.
Tool-using seats (MCP toolsets) and tasks that need a container or an LLM judge are not covered.

It needs ``pip install 'agentrl-platform[verifiers]'`` (``verifiers`` 0.4, imported only when an env
is made).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.util
import os
import queue
import secrets
import sys
import threading
import time
import types
from collections.abc import Mapping
from typing import Any

import numpy as np
from pettingzoo import AECEnv

from agentrl.envs._split import check_split
from agentrl.multiagent import MessageList, MessageSpaces, register_multiagent
from agentrl.registry import register_namespace
from agentrl.types import Message

NAMESPACE = "verifiers"
INSTALL_HINT = "pip install 'agentrl-platform[verifiers]' (or: pip install 'verifiers>=0.4,<0.5')"
HARNESS_ID = "agentrl_harness"
_KEY_VARIABLE = "AGENTRL_VERIFIERS_KEY"


class VerifiersEpisodeError(RuntimeError):
    """A verifiers episode failed (its ``Episode.errors``), or its conversation could not be followed."""


class VerifiersEnv(MessageSpaces, AECEnv[str, MessageList, "str | Message | None"]):
    """A verifiers v1 environment: its seats take the turns its ``Env.run`` gives them (see the module docstring)."""

    metadata: dict[str, Any] = {"name": "verifiers", "render_modes": [], "is_parallelizable": False}

    def __init__(
        self,
        taskset: str | None = None,
        env: str = "",
        config: Mapping[str, Any] | None = None,
        split: str = "train",
        reply_timeout: float = 300.0,
    ):
        """
        Args:
            taskset: the verifiers taskset id (an importable module exporting its ``Taskset``).
            env: the verifiers env id (``user-sim``, ``best-of-n``, a module); ``""``: the
                taskset's own ``Env``, else verifiers' single-agent env.
            config: more of verifiers' env config, merged over this adapter's (a seat's
                ``max_turns``, the taskset's fields, the env's own fields).
            split: ``train`` or ``test``; a taskset is one list of tasks, so held-out episodes
                differ by their seeds only (the evaluation's are offset).
            reply_timeout: the longest a step waits for the env's next request (or its end).
        """
        if not taskset:
            raise ValueError(
                "verifiers/Env-v0 plays a verifiers taskset: make it with taskset=MODULE (an importable module "
                "exporting its Taskset), and env=ENV_ID for an env other than the taskset's own "
                "(rollout.env_kwargs in a config; docs/ecosystem.md)."
            )
        vf = _verifiers()
        self.split = check_split(split)
        self.reply_timeout = reply_timeout
        base: dict[str, Any] = {"id": env, "taskset": {"id": taskset}}
        seats = list(vf.configs.agent.agent_config_fields(vf.resolve_env_config(_merged(base, config or {}))))
        local = {
            seat: {"model": seat, "runtime": {"type": "subprocess"}, "harness": {"id": HARNESS_ID}} for seat in seats
        }
        self.config = vf.resolve_env_config(_merged(_merged(base, local), config or {}))
        self.env = vf.load_environment(self.config)
        self.tasks = list(self.env.taskset)
        if not self.tasks:
            raise ValueError(f"The verifiers taskset {taskset!r} has no tasks.")
        self.metadata = {**self.metadata, "name": f"verifiers_{env or taskset}"}
        self.possible_agents = seats
        self.agents: list[str] = []
        self._make_spaces(seats)
        self.rewards: dict[str, float] = {}
        self._cumulative_rewards: dict[str, float] = {}
        self.terminations: dict[str, bool] = {}
        self.truncations: dict[str, bool] = {}
        self.infos: dict[str, dict[str, Any]] = {}
        self.agent_selection = seats[0]
        self._pending: dict[str, list[Message]] = {}
        self._seen: dict[str, int] = {}  # messages of each seat's conversation it has seen, its replies included
        self._replies: dict[str, concurrent.futures.Future[str]] = {}
        self._events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._bridge = _Bridge(self._events, self.env)

    # --- PettingZoo -----------------------------------------------------------------------------

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self._stop_episode()
        self._seed(seed)
        index = seed if seed is not None else int(self.np_random.integers(2**31))
        task = self.tasks[index % len(self.tasks)]
        self.agents = list(self.possible_agents)
        self._pending = {a: [] for a in self.agents}
        self._seen = {a: 0 for a in self.agents}
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self._bridge.play(task)
        self._advance()

    def observe(self, agent: str) -> MessageList:
        """The messages ``agent`` has not seen yet."""
        return MessageList(self._pending.get(agent, []))

    def step(self, action: str | Message | None) -> None:
        agent = self.agent_selection
        if self.terminations.get(agent) or self.truncations.get(agent):
            self._was_dead_step(action)
            return
        if agent not in self._replies:
            raise RuntimeError("VerifiersEnv.step was called outside an episode; call reset() first.")
        if action is None:
            raise ValueError(f"VerifiersEnv.step needs {agent}'s reply (text or an assistant Message), got None.")
        text = action.content if isinstance(action, Message) else str(action)
        self._cumulative_rewards[agent] = 0.0
        self._pending[agent] = []
        self._seen[agent] += 1
        self._replies.pop(agent).set_result(text)
        self._advance()
        self._accumulate_rewards()

    def render(self) -> None:
        return None

    def close(self) -> None:
        self._stop_episode()
        self._bridge.close()

    # --- the episode ------------------------------------------------------------------------------

    def _advance(self) -> None:
        """Wait for the env's next request (select its seat) or for the episode's end (pay every seat)."""
        try:
            event = self._events.get(timeout=self.reply_timeout)
        except queue.Empty:
            raise TimeoutError(
                f"The verifiers env asked for no reply and did not end within {self.reply_timeout:g} s."
            ) from None
        if event[0] == "failed":
            raise VerifiersEpisodeError(
                f"The verifiers episode failed: {type(event[1]).__name__}: {event[1]}"
            ) from event[1]
        if event[0] == "ended":
            self._finish(event[1])
            return
        _, seat, messages, reply = event
        if seat not in self._seen:
            reply.set_exception(VerifiersEpisodeError(f"unknown seat {seat!r}"))
            raise VerifiersEpisodeError(
                f"The env asked for a reply from {seat!r}, which is not one of its seats {self.possible_agents}."
            )
        seen = self._seen[seat]
        if len(messages) < seen:
            reply.set_exception(VerifiersEpisodeError("conversation restarted"))
            raise VerifiersEpisodeError(
                f"Seat {seat!r} was asked with a conversation of {len(messages)} messages after one of {seen}: "
                "the env started it a new one (several traces of one seat, as in best-of-n), which this adapter does not follow."
            )
        self._pending[seat].extend(_message(m) for m in messages[seen:])
        self._seen[seat] = len(messages)
        self._replies[seat] = reply
        self.agent_selection = seat

    def _finish(self, episode: Any) -> None:
        if not episode.ok:
            errors = "; ".join(getattr(e, "message", str(e)) for e in episode.errors) or "no reason given"
            raise VerifiersEpisodeError(f"The verifiers episode failed: {errors}")
        for seat in self.possible_agents:
            traces = episode.by_agent.get(seat, [])
            reward = float(np.mean([t.reward for t in traces])) if traces else 0.0
            last = traces[-1] if traces else None
            self.rewards[seat] = reward
            self.terminations[seat] = True
            self.infos[seat] = {
                "success": reward > 0,
                "verifiers": {
                    "reward": reward,
                    "rewards": {k: (v.value if v is not None else None) for t in traces for k, v in t.rewards.items()},
                    "metrics": {k: v for t in traces for k, v in t.metrics.items()},
                    "trainable": bool(last.agent.trainable) if last is not None else None,
                    "stop": str(last.stop_condition) if last is not None else None,
                    "turns": sum(t.num_turns for t in traces),
                },
            }
        self.agent_selection = self.agents[0]

    def _stop_episode(self) -> None:
        """Cancel an episode still running (a reset before its end), failing the requests it left."""
        for reply in self._replies.values():
            reply.set_exception(VerifiersEpisodeError("the episode was abandoned"))
        self._replies = {}
        self._bridge.stop()
        while not self._events.empty():
            event = self._events.get_nowait()
            if event[0] == "request":
                event[3].set_exception(VerifiersEpisodeError("the episode was abandoned"))


def _message(wire: Mapping[str, Any]) -> Message:
    content = wire.get("content")
    if isinstance(content, list):  # content parts: their text
        content = "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    return Message(str(wire.get("role", "user")), content or "")


def _merged(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


# --- the endpoint verifiers calls, and the event loop it runs in ---------------------------------


class _Bridge:
    """One env's verifiers side: its event loop (a thread), the env's ``serving()`` context, and the
    OpenAI-compatible endpoint on 127.0.0.1 whose every request is put on ``events`` as a seat's turn."""

    def __init__(self, events: queue.Queue[tuple[Any, ...]], env: Any):
        self.events = events
        self.env = env
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="verifiers-env", daemon=True)
        self.thread.start()
        self.stack = contextlib.AsyncExitStack()
        self.current: asyncio.Task[None] | None = None
        self.url = self._run(self._open())

    def play(self, task: Any) -> None:
        """Start an episode of ``task`` (after stopping one still running)."""
        self.stop()
        self.current = self._run(self._start(task))

    def stop(self) -> None:
        """Cancel the episode still running, if any, and wait for its cleanup (runtimes, sessions)."""
        if self.current is not None and not self.loop.is_closed():
            self._run(_cancelled(self.current))
        self.current = None

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.stop()
        with contextlib.suppress(Exception):
            self._run(self.stack.aclose())
        with contextlib.suppress(Exception):
            self._run(_cancel_the_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()

    async def _start(self, task: Any) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self._episode(task))

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=120)

    async def _open(self) -> str:
        from aiohttp import web  # noqa: PLC0415  (agentrl's dependency; here only)

        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self.stack.push_async_callback(runner.cleanup)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        await self.stack.enter_async_context(self.env.serving())
        return f"http://127.0.0.1:{port}/v1"

    async def _episode(self, task: Any) -> None:
        vf = _verifiers()
        context = vf.ModelContext(
            model="agentrl", client=vf.EvalClientConfig(base_url=self.url, api_key_var=_KEY_VARIABLE)
        )
        try:
            episode = await self.env.run_episode(task, context)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.events.put(("failed", e))
            return
        self.events.put(("ended", episode))

    async def _chat(self, request: Any) -> Any:
        from aiohttp import web  # noqa: PLC0415

        if request.headers.get("Authorization") != f"Bearer {_key()}":
            return web.json_response({"error": {"message": "missing or wrong bearer token"}}, status=401)
        body = await request.json()
        reply: concurrent.futures.Future[str] = concurrent.futures.Future()
        self.events.put(("request", body.get("model", ""), list(body.get("messages") or []), reply))
        try:
            text = await asyncio.wrap_future(reply)
        except VerifiersEpisodeError as e:
            return web.json_response({"error": {"message": str(e)}}, status=409)
        return web.json_response({
            "id": f"agentrl-{secrets.token_hex(6)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        })  # fmt: skip


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _cancel_the_rest() -> None:
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in rest:
        t.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


def _key() -> str:
    """The bearer token of this process's endpoints (verifiers' client reads it from the environment)."""
    if _KEY_VARIABLE not in os.environ:
        os.environ[_KEY_VARIABLE] = secrets.token_urlsafe(24)
    return os.environ[_KEY_VARIABLE]


# --- verifiers, imported on first use ----------------------------------------------------------------


def _verifiers() -> Any:
    try:
        import verifiers.v1 as vf  # noqa: PLC0415  (optional and slow to import: about 9 s)
    except ModuleNotFoundError as e:
        if e.name is not None and e.name.split(".")[0] != "verifiers":
            raise
        raise ModuleNotFoundError(
            f"verifiers/Env-v0 needs the verifiers package: {INSTALL_HINT}", name="verifiers"
        ) from e
    if HARNESS_ID not in sys.modules:
        _key()
        sys.modules[HARNESS_ID] = _harness_module(vf)
    return vf


def _harness_module(vf: Any) -> types.ModuleType:
    """The harness every seat runs: one chat completion per turn, in process, through verifiers'
    interception endpoint (no agent program to install: verifiers' own need ``uv`` and PyPI)."""
    import httpx  # noqa: PLC0415
    from verifiers.v1.dialects.chat import message_to_wire  # noqa: PLC0415
    from verifiers.v1.runtimes import ProgramResult  # noqa: PLC0415

    class AgentrlHarnessConfig(vf.HarnessConfig):
        pass

    class AgentrlHarness(vf.Harness[AgentrlHarnessConfig]):
        APPENDS_SYSTEM_PROMPT = True
        SUPPORTS_RESUME = True
        EXECUTES_CODE = False
        NEEDS_CONTAINER = False

        async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_):  # type: ignore[no-untyped-def]
            system, prompt = self.resolve_prompt(data)
            messages = [{"role": "system", "content": system}] if system else []
            if isinstance(prompt, str):
                messages.append({"role": "user", "content": prompt})
            else:
                messages += [message_to_wire(m) for m in prompt or []]
            async with httpx.AsyncClient(timeout=None) as client:
                answer = await client.post(f"{endpoint}/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                                           json={"model": ctx.model, "messages": messages})  # fmt: skip
            if answer.status_code >= 400:  # e.g. 400 "rollout stopped: max_turns": the seat is done
                return ProgramResult(0 if "stopped" in answer.text else 1, "", answer.text)
            return ProgramResult(0, answer.json()["choices"][0]["message"]["content"] or "", "")

    module = types.ModuleType(HARNESS_ID, "agentrl's in-process chat harness for verifiers (agentrl.envs.verifiers).")
    module.AgentrlHarness = AgentrlHarness  # type: ignore[attr-defined]
    module.__all__ = ["AgentrlHarness"]  # type: ignore[attr-defined]
    return module


def register_envs() -> None:
    """Register ``verifiers/Env-v0`` (the namespace's loader: it needs the package, not its import)."""
    if importlib.util.find_spec("verifiers") is None:
        raise ModuleNotFoundError(f"verifiers/ needs the verifiers package: {INSTALL_HINT}", name="verifiers")
    register_multiagent("verifiers/Env-v0", "agentrl.envs.verifiers:VerifiersEnv")


register_namespace(NAMESPACE, register_envs)
