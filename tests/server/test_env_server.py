"""The env server under real uvicorn on 127.0.0.1: the endpoints, the limits, the bad-input suite,
security, multi-agent sessions, and a load of 256 concurrent sessions."""

from __future__ import annotations

import asyncio
import json
import time

import gymnasium as gym
import httpx
import pytest

import agentrl
from agentrl import AgentEnv, Feedback, Message
from agentrl.server import EnvClient, RemoteEnv, ServerLimits, ServerThread, make_app
from agentrl.server.run import check_bind, is_loopback
from agentrl.server.sessions import SESSION_ID


class Counter(AgentEnv):
    """Count the replies: each step answers with the step number (never ends by itself)."""

    def __init__(self, split: str = "train", start: int = 0, max_turns: int | None = None):
        super().__init__(max_turns=max_turns)
        self.split, self.start_at = split, start

    def start(self, options):
        self.count = self.start_at + int(self.np_random.integers(1000))
        return [Message("user", f"{self.split} {self.count}")]

    def respond(self, reply):
        self.count += 1
        return Feedback([Message("user", f"{self.count} {reply.content}")], reward=1.0)


class Hang(Counter):
    """A step that sleeps for as long as the reply says (seconds)."""

    def respond(self, reply):
        time.sleep(float(reply.content))
        return super().respond(reply)


class Crash(Counter):
    """A step that raises."""

    def respond(self, reply):
        raise ValueError("the env fell over")


COUNTER, HANG, CRASH = "test/ServerCounter-v0", "test/ServerHang-v0", "test/ServerCrash-v0"
TOKEN, OTHER = "s3cret-token-one", "s3cret-token-two"


@pytest.fixture(scope="module", autouse=True)
def registered():
    """The test envs, registered for this module only (Crash and Hang break check_env on purpose,
    so they must not be among the ids tests/test_checker.py checks)."""
    for env_id, cls in ((COUNTER, Counter), (HANG, Hang), (CRASH, Crash)):
        agentrl.register(env_id, cls)
    yield
    for env_id in (COUNTER, HANG, CRASH):
        del gym.registry[env_id]


@pytest.fixture(scope="module")
def server():
    app = make_app(
        [COUNTER, HANG, CRASH, "agentrl/Calculator-v0", "agentrl/Negotiation-v0", "agentrl/Waltz-v0"],
        limits=ServerLimits(step_timeout=1.0, max_body_bytes=1 << 20),
        allow_kwargs=["start", "max_turns"],
    )
    with ServerThread(app) as url:
        yield url


@pytest.fixture(scope="module")
def guarded():
    """A server that wants a token (two are served)."""
    with ServerThread(make_app([COUNTER], tokens=[TOKEN, OTHER])) as url:
        yield url


def create(url: str, env_id: str = COUNTER, headers: dict | None = None, **body) -> httpx.Response:
    return httpx.post(f"{url}/sessions", json={"env_id": env_id, **body}, headers=headers)


def test_envs_lists_each_env_with_its_tools_kind_and_allowed_kwargs(server):
    envs = {e["id"]: e for e in httpx.get(f"{server}/envs").json()["envs"]}
    calculator = envs["agentrl/Calculator-v0"]
    assert calculator["kind"] == "single" and calculator["takes_split"]
    assert [t["function"]["name"] for t in calculator["agents"]["agent"]["tools"]] == ["calculate"]
    assert envs[COUNTER]["description"].startswith("Count the replies")
    assert envs[COUNTER]["env_kwargs"] == ["max_turns", "start"]
    assert envs["agentrl/Negotiation-v0"]["kind"] == "parallel"
    assert envs["agentrl/Waltz-v0"]["kind"] == "aec"
    assert envs["agentrl/Waltz-v0"]["agents"]["feedback"]["reply_prefix"].startswith("{")


def test_a_session_plays_a_multi_step_episode_and_reports_its_state(server):
    created = create(server, split="test", seed=5, env_kwargs={"start": 10_000})
    assert created.status_code == 201
    sid = created.json()["session_id"]
    assert SESSION_ID.fullmatch(sid)
    first = httpx.post(f"{server}/sessions/{sid}/reset", json={}).json()  # the session's seed
    split, count = first["observation"][0]["content"].split()
    assert split == "test" and int(count) >= 10_000
    for i in range(1, 4):
        step = httpx.post(f"{server}/sessions/{sid}/step", json={"reply": "hi"}).json()
        assert step["observation"][0]["content"] == f"{int(count) + i} hi" and step["reward"] == 1.0
    state = httpx.get(f"{server}/sessions/{sid}").json()
    assert (state["steps"], state["episodes"], state["episode"], state["broken"]) == (3, 1, "running", None)
    assert httpx.post(f"{server}/sessions/{sid}/reset", json={"seed": 5}).json() == first
    assert httpx.delete(f"{server}/sessions/{sid}").status_code == 204
    assert httpx.get(f"{server}/sessions/{sid}").status_code == 404


def test_an_assistant_message_is_a_reply_too_and_its_tool_calls_run_on_the_server(server):
    sid = create(server, "agentrl/Calculator-v0").json()["session_id"]
    httpx.post(f"{server}/sessions/{sid}/reset", json={"seed": 0})
    call = Message("assistant", "", tool_calls=[agentrl.ToolCall("calculate", {"expression": "6*7"}, id="c1")])
    step = httpx.post(f"{server}/sessions/{sid}/step", json={"reply": call.to_dict()}).json()
    assert step["observation"][0]["role"] == "tool" and "42" in step["observation"][0]["content"]
    text = '<tool_call>{"name": "calculate", "arguments": {"expression": "2+2"}}</tool_call>'
    step = httpx.post(f"{server}/sessions/{sid}/step", json={"reply": text}).json()
    assert "4" in step["observation"][0]["content"]


@pytest.mark.parametrize(
    "env_id",
    [pytest.param(i, marks=pytest.mark.docker) if "CodeSandbox" in i else i for i in agentrl.registered_ids("agentrl")],
)
def test_check_env_passes_on_a_remote_env_for_every_builtin_env(server, env_id):
    with ServerThread(make_app([env_id])) as url:
        env = RemoteEnv(url, env_id, split="test")
        agentrl.check_env(env)
        local = agentrl.make(env_id, split="test")
        assert env.reset(seed=3).observation == local.reset(seed=3)[0]
        assert [t.schema for t in env.tools] == [t.schema for t in agentrl.as_agent_env(local).tools]
        local.close()


def test_step_before_reset_and_after_the_end_raise_as_a_local_env_does(server):
    env = RemoteEnv(server, COUNTER, env_kwargs={"max_turns": 1})
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("x")
    env.reset(seed=0)
    assert env.step("x").truncated
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("x")
    sid = create(server).json()["session_id"]
    answer = httpx.post(f"{server}/sessions/{sid}/step", json={"reply": "x"})
    assert answer.status_code == 409 and "reset it first" in answer.json()["detail"]
    env.close()


def test_a_hung_step_answers_504_breaks_only_its_session_and_the_server_serves_on(server):
    sid = create(server, HANG).json()["session_id"]
    httpx.post(f"{server}/sessions/{sid}/reset", json={"seed": 0})
    t0 = time.monotonic()
    hung = httpx.post(f"{server}/sessions/{sid}/step", json={"reply": "3"}, timeout=10)
    assert hung.status_code == 504 and "broken" in hung.json()["detail"] and time.monotonic() - t0 < 2.5
    again = httpx.post(f"{server}/sessions/{sid}/step", json={"reply": "0"})
    assert again.status_code == 409 and "broken" in again.json()["detail"]
    assert httpx.get(f"{server}/sessions/{sid}").json()["broken"].startswith("step of test/ServerHang-v0 ran past")
    other = create(server, HANG).json()["session_id"]
    httpx.post(f"{server}/sessions/{other}/reset", json={"seed": 0})
    assert httpx.post(f"{server}/sessions/{other}/step", json={"reply": "0"}).status_code == 200
    # A RemoteEnv makes a fresh session at its next reset instead of failing on the broken one.
    env = RemoteEnv(server, HANG)
    env.reset(seed=0)
    with pytest.raises(agentrl.server.EnvServerError, match="504"):
        env.step("3")
    env.reset(seed=0)
    assert env.step("0").reward == 1.0


def test_an_env_that_raises_answers_500_with_a_json_error_and_no_traceback(server):
    sid = create(server, CRASH).json()["session_id"]
    httpx.post(f"{server}/sessions/{sid}/reset", json={"seed": 0})
    answer = httpx.post(f"{server}/sessions/{sid}/step", json={"reply": "x"})
    assert answer.status_code == 500
    assert answer.json() == {"detail": "The env raised ValueError during step: the env fell over"}
    assert "Traceback" not in answer.text
    assert httpx.get(f"{server}/healthz").json()["status"] == "ok"


BAD_INPUTS = [
    # (name, method, path, request kwargs, status)
    (
        "malformed JSON",
        "POST",
        "/sessions",
        {"content": b"{not json", "headers": {"content-type": "application/json"}},
        422,
    ),
    ("wrong types", "POST", "/sessions", {"json": {"env_id": 3, "seed": "x"}}, 422),
    # gymnasium refuses a negative seed: the client's mistake, 422, not the env's 500 at the first reset
    ("a negative seed", "POST", "/sessions", {"json": {"env_id": COUNTER, "seed": -1}}, 422),
    ("a reset with a negative seed", "RESET", "", {"json": {"seed": -1}}, 422),
    ("an unknown field", "POST", "/sessions", {"json": {"env_id": COUNTER, "evil": 1}}, 422),
    ("a body of 10 MB", "POST", "/sessions", {"content": b"x" * (10 << 20)}, 413),
    ("an unknown env", "POST", "/sessions", {"json": {"env_id": "agentrl/Nope-v0"}}, 404),
    ("an import path as env id", "POST", "/sessions", {"json": {"env_id": "os:system"}}, 404),
    ("a kwarg outside the allow-list", "POST", "/sessions", {"json": {"env_id": COUNTER, "env_kwargs": {"x": 1}}}, 400),
    (
        "a kwarg the env does not take",
        "POST",
        "/sessions",
        {"json": {"env_id": "agentrl/Calculator-v0", "env_kwargs": {"start": 1}}},
        400,
    ),
    ("split in env_kwargs", "POST", "/sessions", {"json": {"env_id": COUNTER, "env_kwargs": {"split": "test"}}}, 400),
    (
        "an import path as a value",
        "POST",
        "/sessions",
        {"json": {"env_id": COUNTER, "env_kwargs": {"start": "os.path:join"}}},
        400,
    ),
    ("a path-like split", "POST", "/sessions", {"json": {"env_id": COUNTER, "split": "../../etc"}}, 422),
    ("an unknown session", "POST", "/sessions/" + "A" * 43 + "/reset", {"json": {}}, 404),
    ("a path-like session id", "GET", "/sessions/..%2F..%2Fetc%2Fpasswd", {}, 404),
    ("a short session id", "DELETE", "/sessions/abc", {}, 404),
    ("a step without a reply", "STEP", "", {"json": {}}, 422),
    ("a step with a user message", "STEP", "", {"json": {"reply": {"role": "user", "content": "x"}}}, 422),
    ("a step with parallel actions", "STEP", "", {"json": {"actions": {"a": "x"}}}, 422),
    ("a reply of the wrong type", "STEP", "", {"json": {"reply": 12}}, 422),
]


@pytest.mark.parametrize(("name", "method", "path", "kwargs", "status"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_gets_its_documented_status_and_the_server_keeps_serving(server, name, method, path, kwargs, status):
    if method == "RESET":
        sid = create(server).json()["session_id"]
        method, path = "POST", f"/sessions/{sid}/reset"
    if method == "STEP":
        sid = create(server).json()["session_id"]
        httpx.post(f"{server}/sessions/{sid}/reset", json={"seed": 0})
        method, path = "POST", f"/sessions/{sid}/step"
    answer = httpx.request(method, server + path, **kwargs)
    assert answer.status_code == status, answer.text
    assert "detail" in answer.json() and "Traceback" not in answer.text
    sid = create(server).json()["session_id"]  # still serving
    assert httpx.post(f"{server}/sessions/{sid}/reset", json={"seed": 1}).status_code == 200
    httpx.delete(f"{server}/sessions/{sid}")


def test_tokens_are_required_checked_and_bind_sessions_to_their_maker(guarded):
    assert create(guarded).status_code == 401
    assert create(guarded).headers["www-authenticate"] == "Bearer"
    assert create(guarded, headers={"authorization": "Bearer wrong"}).status_code == 401
    assert create(guarded, headers={"authorization": f"Basic {TOKEN}"}).status_code == 401
    assert httpx.get(f"{guarded}/envs").status_code == 401 and httpx.get(f"{guarded}/metrics").status_code == 401
    assert httpx.get(f"{guarded}/healthz").status_code == 200
    mine, theirs = {"authorization": f"Bearer {TOKEN}"}, {"authorization": f"Bearer {OTHER}"}
    sid = create(guarded, headers=mine).json()["session_id"]
    assert httpx.post(f"{guarded}/sessions/{sid}/reset", json={}, headers=theirs).status_code == 404
    assert httpx.delete(f"{guarded}/sessions/{sid}", headers=theirs).status_code == 404
    assert httpx.post(f"{guarded}/sessions/{sid}/reset", json={}, headers=mine).status_code == 200
    env = RemoteEnv(guarded, COUNTER, token=OTHER)
    assert env.reset(seed=0).observation
    with pytest.raises(agentrl.server.EnvServerError, match="401"):
        RemoteEnv(guarded, COUNTER, token="nope")


def test_only_loopback_may_serve_without_a_token():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    with pytest.raises(ValueError, match="without a token"):
        check_bind("0.0.0.0", None, [])
    check_bind("0.0.0.0", None, ["t"])
    check_bind("127.0.0.1", None, [])


def test_a_full_server_answers_503_with_retry_after_and_a_client_retries_until_there_is_room():
    with ServerThread(make_app([COUNTER], limits=ServerLimits(max_sessions=2))) as url:
        first, _ = create(url).json()["session_id"], create(url)
        full = create(url)
        assert full.status_code == 503 and full.headers["retry-after"] == "1"
        client = EnvClient(url, retry_for=10)

        def free_a_slot():
            time.sleep(0.5)
            httpx.delete(f"{url}/sessions/{first}")

        import threading

        threading.Thread(target=free_a_slot).start()
        t0 = time.monotonic()
        assert client.request("POST", "/sessions", {"env_id": COUNTER})["session_id"]
        assert time.monotonic() - t0 >= 0.4
        with pytest.raises(agentrl.server.EnvServerError, match="still full"):
            EnvClient(url, retry_for=0.3).request("POST", "/sessions", {"env_id": COUNTER})


def test_the_reaper_closes_idle_sessions():
    limits = ServerLimits(idle_timeout=0.3, reap_interval=0.05)
    with ServerThread(make_app([COUNTER], limits=limits)) as url:
        sid = create(url).json()["session_id"]
        busy = create(url).json()["session_id"]
        for _ in range(8):  # used every 0.1 s: stays
            time.sleep(0.1)
            httpx.get(f"{url}/sessions/{busy}")
        assert httpx.get(f"{url}/sessions/{sid}").status_code == 404
        assert httpx.get(f"{url}/sessions/{busy}").status_code == 200
        metrics = httpx.get(f"{url}/metrics").text
        assert 'agentrl_server_sessions_closed_total{reason="idle"} 1.0' in metrics


def test_metrics_count_sessions_steps_latencies_and_errors(server):
    sid = create(server).json()["session_id"]
    httpx.post(f"{server}/sessions/{sid}/reset", json={})
    httpx.post(f"{server}/sessions/{sid}/step", json={"reply": "x"})
    httpx.post(f"{server}/sessions", json={"env_id": 1})
    text = httpx.get(f"{server}/metrics").text
    assert "# TYPE agentrl_server_sessions gauge" in text
    assert 'agentrl_server_steps_total{env="test/ServerCounter-v0"}' in text
    assert 'agentrl_server_call_seconds_count{call="step",env="test/ServerCounter-v0"}' in text
    assert 'agentrl_server_errors_total{status="422"}' in text


def test_the_openapi_page_documents_every_body(server):
    schema = httpx.get(f"{server}/openapi.json").json()
    names = set(schema["components"]["schemas"])
    assert {"CreateSession", "StepRequest", "StepResponse", "ParallelResponse", "AECResponse", "EnvList"} <= names
    assert {"/envs", "/sessions", "/sessions/{session_id}/step", "/healthz", "/metrics"} <= set(schema["paths"])


def test_a_parallel_multi_agent_env_steps_every_live_agent_at_once(server):
    sid = create(server, "agentrl/Negotiation-v0").json()["session_id"]
    first = httpx.post(f"{server}/sessions/{sid}/reset", json={"seed": 0}).json()
    assert sorted(first["agents"]) == ["trader_0", "trader_1"] and first["observations"]["trader_0"]
    missing = httpx.post(f"{server}/sessions/{sid}/step", json={"actions": {"trader_0": "Claim: 1 book"}})
    assert missing.status_code == 409 and "live agents" in missing.json()["detail"]
    claims = {"trader_0": "Claim: 1 book, 1 hat, 1 ball", "trader_1": "Claim: 0 books, 0 hats, 0 balls"}
    step = httpx.post(f"{server}/sessions/{sid}/step", json={"actions": claims}).json()
    local = agentrl.make_multiagent("agentrl/Negotiation-v0")
    local.reset(seed=0)
    _, rewards, terminations, *_ = local.step({a: Message("assistant", c) for a, c in claims.items()})
    assert step["rewards"] == {a: float(r) for a, r in rewards.items()} and step["terminations"] == terminations


def test_a_turn_based_multi_agent_env_takes_the_selected_agents_step(server):
    sid = create(server, "agentrl/Waltz-v0", split="test").json()["session_id"]
    first = httpx.post(f"{server}/sessions/{sid}/reset", json={"seed": 0}).json()
    assert first["agent_selection"] == "conversation" and first["observation"]
    wrong = httpx.post(f"{server}/sessions/{sid}/step", json={"agent": "feedback", "reply": "{}"})
    assert wrong.status_code == 409 and "turn" in wrong.json()["detail"]
    after = httpx.post(
        f"{server}/sessions/{sid}/step", json={"agent": "conversation", "reply": "I cannot help."}
    ).json()
    assert after["agent_selection"] == "feedback"
    verdict = '{"unsafe": false, "overrefuse": false, "feedback": ""}'
    httpx.post(f"{server}/sessions/{sid}/step", json={"agent": "feedback", "reply": verdict})
    state = httpx.get(f"{server}/sessions/{sid}").json()
    assert state["steps"] == 2


def test_256_concurrent_sessions_of_20_steps_lose_no_step():
    with ServerThread(make_app([COUNTER])) as url:  # the default limits: a loaded machine may take a while
        lose_no_step(url)


def lose_no_step(server: str) -> None:
    client = EnvClient(server)

    async def episode(i: int) -> list[int]:
        env = RemoteEnv(server, COUNTER, client=client, spec=client.env_spec(COUNTER) if i < 0 else SPEC)
        observation, _ = await env.areset(seed=i)
        counts = [int(observation[0].content.split()[1])]
        for _ in range(20):
            observation, *_ = await env.astep(f"s{i}")
            count, echo = observation[0].content.split()
            assert echo == f"s{i}"
            counts.append(int(count))
        await env.client.arequest("DELETE", f"/sessions/{env.session_id}")
        return counts

    SPEC = client.env_spec(COUNTER)

    async def main():
        return await asyncio.gather(*(episode(i) for i in range(256)))

    results = asyncio.run(main())
    assert len(results) == 256
    for counts in results:
        assert counts == list(range(counts[0], counts[0] + 21))  # every step arrived, once, in order


def test_a_delete_during_a_step_waits_for_it_and_the_step_completes(server):
    import threading

    sid = create(server, HANG).json()["session_id"]
    httpx.post(f"{server}/sessions/{sid}/reset", json={"seed": 0})
    answers = {}
    stepping = threading.Thread(
        target=lambda: answers.update(step=httpx.post(f"{server}/sessions/{sid}/step", json={"reply": "0.5"}))
    )
    stepping.start()
    time.sleep(0.1)
    assert httpx.delete(f"{server}/sessions/{sid}").status_code == 204
    stepping.join()
    assert answers["step"].status_code == 200  # its env was not closed under it


def test_an_async_step_that_times_out_is_not_sent_again(server):
    client = EnvClient(server, timeout=0.4)

    async def play():
        env = RemoteEnv(server, HANG, client=client)
        await env.areset(seed=0)
        with pytest.raises(agentrl.server.EnvServerError, match="Lost the env server"):
            await env.astep("0.8")
        return env.session_id

    sid = asyncio.run(play())
    time.sleep(0.6)
    assert httpx.get(f"{server}/sessions/{sid}").json()["steps"] == 1  # played once, not replayed


def test_the_creation_seed_seeds_only_the_first_reset_and_idle_time_is_reported(server):
    sid = create(server, seed=3).json()["session_id"]
    first = httpx.post(f"{server}/sessions/{sid}/reset", json={}).json()
    second = httpx.post(f"{server}/sessions/{sid}/reset", json={}).json()
    assert first == httpx.post(f"{server}/sessions/{sid}/reset", json={"seed": 3}).json() and first != second
    time.sleep(0.3)
    assert httpx.get(f"{server}/sessions/{sid}").json()["idle_seconds"] >= 0.25


def test_no_token_gets_401_before_its_body_is_read_and_an_odd_token_is_just_wrong(guarded):
    sid = "A" * 43
    assert httpx.post(f"{guarded}/sessions/{sid}/step", json={"bad": 1}).status_code == 401
    odd = {"authorization": "Bearer t\u00f6ken"}
    assert httpx.get(f"{guarded}/envs", headers={k: v.encode() for k, v in odd.items()}).status_code == 401


def test_a_unix_socket_server_is_its_owners_alone(tmp_path):
    import stat

    from agentrl.server.run import private_unix_socket

    sock = private_unix_socket(str(tmp_path / "s.sock"))
    assert stat.S_IMODE((tmp_path / "s.sock").stat().st_mode) == 0o600
    sock.close()


class NoSplit(Counter):
    """A counter without a split argument."""

    def __init__(self):
        super().__init__()


def test_a_split_the_env_does_not_take_is_reported_and_the_client_warns():
    agentrl.register("test/ServerNoSplit-v0", NoSplit)
    try:
        with ServerThread(make_app(["test/ServerNoSplit-v0"])) as url:
            assert create(url, "test/ServerNoSplit-v0", split="test").json()["split_ignored"] is True
            assert create(url, "test/ServerNoSplit-v0").json()["split_ignored"] is False
            env = RemoteEnv(url, "test/ServerNoSplit-v0", split="test")
            with pytest.warns(UserWarning, match="takes no split argument"):
                env.reset(seed=0)
    finally:
        del gym.registry["test/ServerNoSplit-v0"]


def test_a_broken_sessions_env_is_closed_when_the_session_goes():
    import threading

    app = make_app([HANG], limits=ServerLimits(step_timeout=0.5))
    with ServerThread(app) as url:
        sid = create(url, HANG).json()["session_id"]
        httpx.post(f"{url}/sessions/{sid}/reset", json={"seed": 0})
        closed = threading.Event()
        app.state.store.get(sid, "").env.close = closed.set
        assert httpx.post(f"{url}/sessions/{sid}/step", json={"reply": "1.5"}).status_code == 504
        assert httpx.delete(f"{url}/sessions/{sid}").status_code == 204
        assert closed.wait(5)  # closed although its step still runs in an abandoned thread


class SlowBuild(Counter):
    """Takes a second to make; each one made is remembered, so that a test can see it closed."""

    made: list[SlowBuild] = []

    def __init__(self, split: str = "train"):
        time.sleep(1.0)
        super().__init__(split)
        self.closed = False
        SlowBuild.made.append(self)

    def close(self):
        self.closed = True


def test_an_env_built_after_its_build_timed_out_is_closed():
    # The client got 504 and holds no session: had the late env not been closed, its sandboxes or
    # processes would live as long as the server.
    agentrl.register("test/ServerSlowBuild-v0", SlowBuild)
    try:
        with ServerThread(make_app(["test/ServerSlowBuild-v0"], limits=ServerLimits(step_timeout=0.3))) as url:
            SlowBuild.made.clear()  # the server made (and closed) a probe at start, to list the env
            answer = create(url, "test/ServerSlowBuild-v0")
            assert answer.status_code == 504 and "building the env" in answer.text
            deadline = time.monotonic() + 5
            while not (SlowBuild.made and SlowBuild.made[0].closed) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(SlowBuild.made) == 1 and SlowBuild.made[0].closed
    finally:
        del gym.registry["test/ServerSlowBuild-v0"]


# --- the step socket (RemoteEnv's steps over one WebSocket per session) ----------------------------


def test_remote_steps_go_over_the_session_socket_and_match_http_steps(server):
    over_socket, over_http = (
        RemoteEnv(server, COUNTER),
        RemoteEnv(server, COUNTER, client=EnvClient(server, websocket=False)),
    )
    for env in (over_socket, over_http):
        env.reset(seed=5)
    assert over_socket.step("a") == over_http.step("a")
    assert over_socket._socket is not None and over_http._socket is None

    async def play():
        await over_socket.areset(seed=6)
        await over_http.areset(seed=6)
        return await over_socket.astep("b"), await over_http.astep("b")

    stepped, expected = asyncio.run(play())
    assert stepped == expected
    assert httpx.get(f"{server}/sessions/{over_socket.session_id}").json()["steps"] == 2
    over_socket.close(), over_http.close()


def test_socket_steps_answer_errors_as_http_steps_do(server):
    env = RemoteEnv(server, COUNTER)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("x")
    env.reset(seed=0)
    env.step("x")
    httpx.delete(f"{server}/sessions/{env.session_id}")  # expired, say
    with pytest.raises(agentrl.server.EnvServerError, match="with 404: No such session") as raised:
        env.step("y")
    assert raised.value.status == 404
    env.reset(seed=0)  # a new session, and a new socket for it
    assert env.step("z").observation[0].content.endswith(" z")
    hang = RemoteEnv(server, HANG)
    hang.reset(seed=0)
    with pytest.raises(agentrl.server.EnvServerError, match="with 504"):
        hang.step("2")  # past the server's step limit of 1 s
    env.close(), hang.close()


def test_the_step_socket_refuses_bad_frames_and_missing_tokens(server, guarded):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    sid = create(server).json()["session_id"]
    ws_url = server.replace("http://", "ws://")
    with connect(f"{ws_url}/sessions/{sid}/ws") as socket:
        for frame, status in (("not json", 422), ('{"reply": 5}', 422), ('{"reply": "x"}', 409), ("[" * 100, 422)):
            socket.send(frame)
            answer = json.loads(socket.recv(timeout=10))
            assert answer["status"] == status, (frame, answer)
        socket.send("x" * ((1 << 20) + 1))
        assert json.loads(socket.recv(timeout=10))["status"] == 413
    guarded_sid = create(guarded, headers={"Authorization": f"Bearer {TOKEN}"}).json()["session_id"]
    with pytest.raises(InvalidStatus, match="403"):
        connect(f"{guarded.replace('http://', 'ws://')}/sessions/{guarded_sid}/ws").close()
    with connect(f"{guarded.replace('http://', 'ws://')}/sessions/{guarded_sid}/ws",
                 additional_headers={"Authorization": f"Bearer {OTHER}"}) as socket:  # fmt: skip
        socket.send('{"reply": "x"}')
        assert json.loads(socket.recv(timeout=10))["status"] == 404  # another token's session


def test_a_server_without_the_step_socket_is_stepped_over_http(server, monkeypatch):
    client = EnvClient(server)
    env = RemoteEnv(server, COUNTER, client=client)
    monkeypatch.setattr(
        RemoteEnv, "_socket_url", lambda self: (f"{server.replace('http://', 'ws://')}/no/such/route", None)
    )
    env.reset(seed=1)
    assert env.step("a").observation[0].content.endswith(" a")  # refused handshake: over HTTP instead
    assert client.websocket is False and env._socket is None
    env.close()
