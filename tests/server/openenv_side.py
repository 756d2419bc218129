"""OpenEnv's side of tests/server/test_openenv.py, run by the Python of the OpenEnv venv.

OpenEnv 0.10 (``openenv``) pins ``fastmcp<4`` and so ``mcp<2``; vLLM 0.32 needs ``mcp>=2``: the two
cannot share an environment, so ``scripts/install.sh --dev`` makes OpenEnv a venv of its own
(``AGENTRL_OPENENV_VENV``) and the tests run this script there, as a user runs an OpenEnv server in
its own container or Space.

    python openenv_side.py serve SCAFFOLD_PARENT   # three OpenEnv servers; prints {"name": url}, lives until stdin closes
    python openenv_side.py client BASE_URL TOKEN   # OpenEnv's GenericEnvClient against agentrl serve; prints JSON

The three envs, each served by OpenEnv's own ``create_app`` and uvicorn on 127.0.0.1:

- ``echo``: the env ``openenv init echo_env`` writes (OpenEnv's scaffold, unchanged; the test runs
  the command into SCAFFOLD_PARENT);
- ``guess``: a text game on OpenEnv's ``Environment`` (guess a number from 0 to 9 in three tries);
- ``mcp``: a tool env on OpenEnv's ``MCPEnvironment`` with FastMCP tools ``add`` and ``submit``:
  add two numbers the seed picks, then submit the sum (reward 1 and done on the right sum).
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time

import uvicorn
from openenv.core.env_server import Action, Environment, Observation, State, create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    prompt: str = ""


class GuessEnv(Environment):
    """Guess a number from 0 to 9 in three tries; the seed picks the number (seed * 7 % 10)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id="0", step_count=0)
        self.number = 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.number = (seed or 0) * 7 % 10
        self._state = State(episode_id=episode_id or str(seed), step_count=0)
        return GuessObservation(prompt="Guess my number, 0 to 9.", reward=0.0)

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        right = action.message.strip() == str(self.number)
        done = right or self._state.step_count >= 3
        hint = "Right!" if right else ("higher" if action.message.strip() < str(self.number) else "lower")
        return GuessObservation(prompt=hint, reward=1.0 if right else 0.0, done=done)

    @property
    def state(self):
        return self._state


class SumObservation(Observation):
    question: str = ""


class SumEnv(MCPEnvironment):
    """Add the two numbers the seed picks with the ``add`` tool, then ``submit`` the sum."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        from fastmcp import FastMCP  # noqa: PLC0415  (OpenEnv's venv has it)

        server = FastMCP("sum")

        @server.tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @server.tool
        def submit(answer: int) -> str:
            """Submit the final answer."""
            return f"submitted {answer}"

        super().__init__(server)
        self._state = State(episode_id="0", step_count=0)
        self.numbers = (0, 0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        seed = seed or 0
        self.numbers = (10 + seed * 13 % 90, 10 + seed * 29 % 90)
        self._state = State(episode_id=episode_id or str(seed), step_count=0)
        a, b = self.numbers
        return SumObservation(question=f"What is {a} + {b}? Use the add tool, then the submit tool.", reward=0.0)

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation(done=False, reward=0.0, metadata={"error": "Call a tool: add or submit."})

    async def step_async(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction) and action.tool_name == "submit":
            right = action.arguments.get("answer") == sum(self.numbers)
            return CallToolObservation(tool_name="submit", result=observation.result, done=True,
                                       reward=1.0 if right else 0.0)  # fmt: skip
        return observation

    @property
    def state(self):
        return self._state


def serve(scaffold_parent: str) -> None:
    sys.path.insert(0, scaffold_parent)
    from echo_env.server.app import app as echo_app  # noqa: PLC0415  (written by `openenv init echo_env`)

    apps = {
        "echo": echo_app,
        "guess": create_app(GuessEnv, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=16),
        "mcp": create_app(SumEnv, CallToolAction, CallToolObservation, env_name="sum", max_concurrent_envs=16),
    }
    urls, servers = {}, []
    for name, app in apps.items():
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
        urls[name] = f"http://127.0.0.1:{sock.getsockname()[1]}"
        servers.append(server)
    while not all(server.started for server in servers):
        time.sleep(0.05)
    print(json.dumps(urls), flush=True)
    sys.stdin.read()  # until the test closes our stdin


CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "6*7"}}</tool_call>'


def client(base_url: str, token: str) -> None:
    from openenv.core.generic_client import GenericEnvClient  # noqa: PLC0415

    bearer = {"Authorization": f"Bearer {token}"}
    report: dict = {}

    async def play():
        async with GenericEnvClient(base_url=base_url, headers=bearer) as env:
            first = await env.reset(seed=0)
            step = await env.step({"message": CALL})
            state = await env.state()
            report["played"] = {"first": first.observation, "first_reward": first.reward, "first_done": first.done,
                                "step": step.observation, "step_done": step.done, "state": state}  # fmt: skip
            report["wrong_field"] = await _error(env.step({"reply": "wrong field"}))
            report["bad_seed"] = await _error(env.reset(seed=-1))
            async with GenericEnvClient(base_url=base_url, headers=bearer) as second:
                await second.reset(seed=1)
                third = GenericEnvClient(base_url=base_url, headers=bearer)
                report["third"] = await _error(third.reset(seed=2))
                await third.close()
        for name, headers in (("no_token", None), ("wrong_token", {"Authorization": "Bearer nope"})):
            env = GenericEnvClient(base_url=base_url, headers=headers)
            report[name] = await _error(env.reset(seed=0))
            await env.close()

    asyncio.run(play())
    print(json.dumps(report, default=str), flush=True)


async def _error(call) -> str:
    try:
        await call
    except Exception as e:  # what OpenEnv's client raised, as text for the test
        return f"{type(e).__name__}: {e}"
    return "no error"


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        client(sys.argv[2], sys.argv[3])
