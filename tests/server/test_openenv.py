"""OpenEnv 0.10 interoperability on loopback, both ways, with OpenEnv's own servers and client.

OpenEnv cannot be installed beside vLLM 0.32 (``mcp`` pins), so its side runs in its own venv
(``scripts/install.sh --dev`` makes it; ``openenv_side.py`` says more): three OpenEnv servers played
by :class:`~agentrl.server.OpenEnvEnv` here, and OpenEnv's ``GenericEnvClient`` playing ``agentrl
serve`` there.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import agentrl
from agentrl.build import build_rollout
from agentrl.model_paths import cache_dir
from agentrl.policies import Sampling
from agentrl.rollout import EpisodeLimits, RolloutSettings
from agentrl.server import OpenEnvEnv, OpenEnvError, ServerLimits, ServerThread, add_openenv_routes, make_app
from agentrl.testing import ScriptedPolicy

SIDE = Path(__file__).with_name("openenv_side.py")
CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "6*7"}}</tool_call>'
TOKEN = "t0ken-for-openenv"


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def openenv_python() -> Path:
    venv = Path(os.environ.get("AGENTRL_OPENENV_VENV", cache_dir() / "venvs" / "openenv"))
    python = venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no OpenEnv venv at {venv}: `bash scripts/install.sh --dev` makes it")
    return python


@pytest.fixture(scope="module")
def servers(openenv_python, tmp_path_factory):
    """The three OpenEnv servers of openenv_side.py: {"echo": url, "guess": url, "mcp": url}."""
    parent = tmp_path_factory.mktemp("scaffold")
    subprocess.run([openenv_python.parent / "openenv", "init", "echo_env", "--output-dir", str(parent)],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    process = subprocess.Popen([openenv_python, SIDE, "serve", str(parent)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        yield json.loads(process.stdout.readline())
    finally:
        process.stdin.close()
        process.wait(timeout=30)


# --- OpenEnv servers, played here -----------------------------------------------------------------


def test_three_openenv_servers_pass_check_env(servers):
    for env in (
        OpenEnvEnv(servers["echo"], observation_field="echoed_message"),
        OpenEnvEnv(servers["guess"], observation_field="prompt", system_prompt="Play."),
        OpenEnvEnv(servers["mcp"], tools=True, observation_field="question"),
    ):
        agentrl.check_env(env)
        env.close()


def test_openenvs_scaffold_env_echoes_with_its_reward(servers):
    env = OpenEnvEnv(servers["echo"], observation_field="echoed_message")
    assert env.reset(seed=0).observation[0].content == "Echo Env environment ready!"
    step = env.step("hello")
    # The scaffold's reward is a tenth of the message's length.
    assert (step.observation[0].content, step.reward, step.terminated) == ("hello", 0.5, False)
    env.close()


def test_a_text_game_plays_by_its_seed(servers):
    env = OpenEnvEnv(servers["guess"], observation_field="prompt", system_prompt="Play.")
    observation, _ = env.reset(seed=3)
    assert [m.role for m in observation] == ["system", "user"] and observation[1].content == "Guess my number, 0 to 9."
    assert env.step("5").observation[0].content == "lower"  # 3 * 7 % 10 = 1
    step = env.step("1")
    assert (step.observation[0].content, step.reward, step.terminated) == ("Right!", 1.0, True)
    env.close()


def test_an_mcp_envs_tools_are_the_envs_tools_and_run_on_the_server(servers):
    env = OpenEnvEnv(servers["mcp"], tools=True, observation_field="question")
    assert [t.name for t in env.tools] == ["add", "submit"]
    assert env.tools[0].parameters["required"] == ["a", "b"]
    (question,) = env.reset(seed=1).observation
    assert question.content.startswith("What is 23 + 39?")
    added = env.step(call("add", a=23, b=39))
    assert (added.observation[0].role, added.observation[0].content, added.reward) == ("tool", "62", 0.0)
    told = env.step("I think it is 62.")
    assert "call one of add, submit" in told.observation[0].content and not told.terminated
    missing = env.step(call("add", a=1))  # checked against the server's schema before it is sent
    assert "b" in missing.observation[0].content and missing.info["tool_errors"] == 1
    done = env.step(call("submit", answer=62))
    assert (done.observation[0].content, done.reward, done.terminated) == ("submitted 62", 1.0, True)
    wrong = (env.reset(seed=1), env.step(call("submit", answer=61)))[1]
    assert (wrong.reward, wrong.terminated) == (0.0, True)
    env.close()


def test_openenv_envs_train_through_the_rollout_engine(servers, tiny_tokenizer):
    for env_id, kwargs in (
        ("test/OpenEnvGuess-v0", {"url": servers["guess"], "observation_field": "prompt"}),
        ("test/OpenEnvSum-v0", {"url": servers["mcp"], "tools": True, "observation_field": "question"}),
    ):
        if env_id not in agentrl.registered_ids():
            agentrl.register(env_id, OpenEnvEnv, kwargs=kwargs)
    guess = build_rollout(RolloutSettings("test/OpenEnvGuess-v0", group_size=2, limits=EpisodeLimits(max_turns=3), sampling=Sampling(max_tokens=8)), ScriptedPolicy(tiny_tokenizer, "1"))  # fmt: skip
    trajectories = asyncio.run(guess.collect(num_groups=4))
    guess.close()
    assert len(trajectories) == 8 and all(t.error is None for t in trajectories)
    # The number is seed * 7 % 10: "1" is right for the seeds ending in 3, wrong three times otherwise.
    assert {t.reward for t in trajectories} <= {0.0, 1.0} and all(t.turns in (1, 3) for t in trajectories)
    # The policy sees the server's tools in its prompt and submits 62 every time: right for seed 1 only.
    submit = build_rollout(RolloutSettings("test/OpenEnvSum-v0", group_size=2, limits=EpisodeLimits(max_turns=2), sampling=Sampling(max_tokens=64)), ScriptedPolicy(tiny_tokenizer, call("submit", answer=62)))  # fmt: skip
    trajectories = asyncio.run(submit.collect(num_groups=3))
    submit.close()
    assert len(trajectories) == 6 and all(t.error is None and t.turns == 1 for t in trajectories)
    assert '"submit"' in tiny_tokenizer.decode(trajectories[0].token_ids[: trajectories[0].prompt_length])
    for t in trajectories:
        question = next(m.content for m in t.messages if m.role == "user")
        assert t.reward == float(question.startswith("What is 23 + 39?")), question


def test_openenv_errors_are_said(servers):
    env = OpenEnvEnv(servers["guess"], action_field="guess", observation_field="prompt")
    env.reset(seed=0)
    with pytest.raises(OpenEnvError, match="VALIDATION_ERROR") as raised:
        env.step("1")
    assert raised.value.code == "VALIDATION_ERROR"
    env.close()
    with pytest.raises(KeyError, match="no field 'metadata.question'"):
        OpenEnvEnv(servers["guess"], observation_field="metadata.question").reset(seed=0)
    with pytest.raises(OpenEnvError, match="lists no MCP tools"):
        OpenEnvEnv(servers["guess"], tools=True)
    with pytest.raises(OpenEnvError, match="Cannot reach the OpenEnv server"):
        OpenEnvEnv("http://127.0.0.1:9", observation_field="prompt").reset(seed=0)


# --- agentrl envs, for OpenEnv clients ---------------------------------------------------------------


@pytest.fixture(scope="module")
def agentrl_server():
    app = add_openenv_routes(make_app(["agentrl/Calculator-v0"], limits=ServerLimits(max_sessions=2), tokens=[TOKEN]))
    with ServerThread(app) as url:
        yield url


def test_openenvs_client_plays_agentrl_serve_with_a_token(agentrl_server, openenv_python):
    base = f"{agentrl_server}/openenv/agentrl/Calculator-v0"
    run = subprocess.run([openenv_python, SIDE, "client", base, TOKEN], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.splitlines()[-1])
    played = report["played"]
    local = agentrl.make("agentrl/Calculator-v0").unwrapped
    assert played["first"]["messages"] == [m.to_dict() for m in local.reset(seed=0)[0]]
    assert (played["first_reward"], played["first_done"]) == (0.0, False)
    (tool,) = played["step"]["messages"]
    assert tool["role"] == "tool" and "42" in tool["content"] and played["step_done"] is False
    assert played["state"]["step_count"] == 1
    assert "message" in report["wrong_field"] and "seed must be an integer >= 0, got -1" in report["bad_seed"]
    assert "CAPACITY_REACHED" in report["third"]
    for refused in (report["no_token"], report["wrong_token"]):  # the handshake is closed with 1008
        assert refused.startswith(("ConnectionError", "ConnectionClosed", "RuntimeError")) and refused != "no error"


def test_openenvenv_plays_agentrl_serve_too(agentrl_server):
    base = f"{agentrl_server}/openenv/agentrl/Calculator-v0"
    env = OpenEnvEnv(base, token=TOKEN, observation_field="messages")
    first = json.loads(env.reset(seed=0).observation[0].content)
    assert first[-1]["role"] == "user"
    env.close()
    with pytest.raises(OpenEnvError, match="HTTP 403"):
        OpenEnvEnv(base, observation_field="messages").reset(seed=0)
    nowhere = OpenEnvEnv(f"{agentrl_server}/openenv/agentrl/Nope-v0", token=TOKEN)
    with pytest.raises(OpenEnvError, match="FACTORY_ERROR"):
        nowhere.reset(seed=0)


def test_no_openenv_package_is_imported_here():
    code = "import agentrl.server.openenv, sys; print(any(m == 'openenv' or m.startswith('openenv.') for m in sys.modules))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"
