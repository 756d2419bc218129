"""The dashboard: the samples a run writes, the read-only API on real uvicorn, and the page in a
real headless Chromium (Debian's ``chromium`` and ``chromium-driver``) while a test trainer writes."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

import agentrl
from agentrl import AgentEnv, Feedback, Message
from agentrl.config import RolloutConfig, load_config
from agentrl.dashboard import make_dashboard, sample_files, sample_records, write_samples
from agentrl.dashboard.records import read_trajectories, sample_kind
from agentrl.run import rollout
from agentrl.server import ServerThread
from agentrl.testing import ScriptedPolicy, headless_chromium
from agentrl.train import Progress, TrainConfig, train

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("AGENTRL_TEST_ARTIFACTS", ROOT / "test-artifacts"))


ENV_ID = "tests/Multiply-v0"


@agentrl.tool
def calculate(expression: str) -> str:
    """Evaluate a product such as 6*7.

    Args:
        expression: Two integers joined by *.
    """
    a, b = expression.split("*")
    return str(int(a) * int(b))


class Multiply(AgentEnv):
    """Multiply two numbers, with a calculator: the reward is 1 for the right product."""

    tools = (calculate,)

    def __init__(self, split: str = "train", max_turns: int = 3):
        super().__init__(max_turns=max_turns)
        self.split = split

    def start(self, options):
        self.a, self.b = (int(x) for x in self.np_random.integers(2, 20, size=2))
        return [
            Message("system", "Use the calculate tool, then say the product."),
            Message("user", f"What is {self.a}*{self.b}?"),
        ]

    def respond(self, reply):
        right = str(self.a * self.b) in reply.content
        return Feedback([], reward=float(right), terminated=True, info={"success": right})


if ENV_ID not in agentrl.registered_ids():
    agentrl.register(ENV_ID, entry_point=Multiply)


def scripted(tokenizer, delay: float = 0.0) -> ScriptedPolicy:
    """Calls calculate on the question, then says the product, wrong every third time (so a group has advantages)."""
    calls = itertools.count()

    def reply(prompt: str) -> str:
        a, b = re.findall(r"What is (\d+)\*(\d+)\?", prompt)[-1]
        if f'"expression": "{a}*{b}"' not in prompt:
            call = json.dumps({"name": "calculate", "arguments": {"expression": f"{a}*{b}"}})
            return f"<tool_call>{call}</tool_call>"
        return f"It is {int(a) * int(b) + (next(calls) % 3 == 0)}."

    return ScriptedPolicy(tokenizer, reply, delay=delay)


def config(model_dir: Path, run_dir: Path, *overrides: str) -> TrainConfig:
    return load_config(TrainConfig, None, [
        f"rollout.env_id={ENV_ID}", f"rollout.model={model_dir}", "rollout.backend=hf",
        "rollout.group_size=4", "rollout.max_tokens=48", "trainer.micro_batch_size=4", "groups_per_step=1",
        "steps=3", "eval_episodes=4", "eval_every=1", "checkpoint_every=0", "export=false", "torch_threads=1",
        f"run_dir={run_dir}", *overrides,
    ])  # fmt: skip


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tiny_tokenizer, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("dash") / "run"
    train(config(tiny_model_dir, run_dir), policy=scripted(tiny_tokenizer))
    return run_dir


def test_training_writes_a_group_per_step_with_advantages_and_the_same_eval_prompts_each_time(trained):
    files = sample_files(trained)
    assert [(k, n) for k, n, _ in files if k == "train"] == [("train", 1), ("train", 2), ("train", 3)]
    assert [n for k, n, _ in files if k == "eval"] == [0, 1, 2, 3]
    records = read_trajectories(next(p for k, n, p in files if (k, n) == ("train", 1)))
    assert len(records) == 4 and len({r["group_id"] for r in records}) == 1
    for r in records:
        n = len(r["token_ids"])
        assert len(r["token_texts"]) == len(r["advantages"]) == len(r["loss_mask"]) == n
        assert all(a == 0 for a, m in zip(r["advantages"], r["loss_mask"], strict=True) if m == 0)
        assert "calculate" in "".join(r["token_texts"][r["prompt_length"] :])
    assert any(a != 0 for r in records for a in r["advantages"])  # some reply did better than the group
    evals = [read_trajectories(p) for k, _, p in files if k == "eval"]
    prompts = [[r["messages"][1]["content"] for r in e] for e in evals]
    assert all(p == prompts[0] for p in prompts) and len(prompts[0]) == 4  # the same held-out prompts


@pytest.fixture(scope="module")
def dashboard(trained, tiny_model_dir, tiny_tokenizer, tmp_path_factory):
    rollout_out = tmp_path_factory.mktemp("out") / "rollout.jsonl"  # what `agentrl rollout --out` writes
    rollout(RolloutConfig(env_id=ENV_ID, model=str(tiny_model_dir), backend="hf", episodes=2, out=str(rollout_out)),
            policy=scripted(tiny_tokenizer))  # fmt: skip
    with ServerThread(make_dashboard([trained, rollout_out], tokenizer=tiny_tokenizer)) as url:
        yield url


def test_the_api_serves_runs_metrics_from_an_offset_samples_and_trajectory_files(dashboard, tiny_tokenizer):
    runs = httpx.get(f"{dashboard}/api/runs").json()
    assert [(r["id"], r["kind"]) for r in runs] == [(0, "run"), (1, "trajectories")]
    first = httpx.get(f"{dashboard}/api/runs/0/metrics").json()
    assert {"train/loss", "eval/success_rate"} <= {k for r in first["records"] for k in r}
    rest = httpx.get(f"{dashboard}/api/runs/0/metrics", params={"offset": first["offset"]}).json()
    assert rest == {"records": [], "offset": first["offset"]}
    assert {"kind": "train", "step": 2} in httpx.get(f"{dashboard}/api/runs/0/samples").json()
    assert len(httpx.get(f"{dashboard}/api/runs/0/samples/train/2").json()) == 4
    (decoded, _) = httpx.get(f"{dashboard}/api/runs/1/trajectories").json()
    assert "".join(decoded["token_texts"]) == tiny_tokenizer.decode(decoded["token_ids"])  # decoded by the dashboard
    assert httpx.get(f"{dashboard}/api/runs/0/config").json()["steps"] == 3
    assert httpx.get(f"{dashboard}/static/plotly.min.js").text.startswith("/**")
    with httpx.stream("GET", f"{dashboard}/api/stream", params={"offsets": "0:0"}) as stream:
        lines = []
        for line in stream.iter_lines():
            lines.append(line)
            if line.startswith("event: samples"):
                break
    assert "event: metrics" in lines and lines[-1] == "event: samples"
    ids = [line for line in lines if line.startswith("id: ")]
    assert ids and ids[-1] == f"id: 0:{first['offset']}"  # a reconnect resumes from here (Last-Event-ID)
    with httpx.stream("GET", f"{dashboard}/api/stream", headers={"last-event-id": f"0:{first['offset']}"}) as stream:
        for line in stream.iter_lines():
            assert not line.startswith("event: metrics"), "a resumed stream sent old records again"
            if line.startswith("event: samples"):
                break


@pytest.mark.parametrize(
    "path",
    [
        "/api/runs/2/metrics",
        "/api/runs/-1/metrics",
        "/api/runs/0/samples/train/99",
        "/api/runs/0/samples/..%2F..%2Fetc/1",
        "/api/runs/0/samples/train/..%2F..%2Fconfig.json",
        "/api/runs/..%2F..%2Fetc/metrics",
        "/api/runs/0/trajectories",
        "/static/..%2F..%2F..%2Fetc%2Fpasswd",
        "/api/runs/0/../../../etc/passwd",
        "/static/plotly.min.js/../../../../etc/passwd",
    ],
)
def test_only_the_given_runs_files_are_served(dashboard, path):
    answer = httpx.get(dashboard + path)
    assert answer.status_code in (404, 422) and "root:" not in answer.text


def test_the_dashboard_is_read_only_and_wants_its_token_when_it_has_one(trained):
    with ServerThread(make_dashboard([trained], tokens=["dash-token"])) as url:
        assert httpx.get(f"{url}/api/runs").status_code == 401
        assert httpx.get(f"{url}/").status_code == 401
        assert httpx.get(f"{url}/api/runs", params={"token": "dash-token"}).status_code == 200
        assert httpx.get(f"{url}/api/runs", headers={"authorization": "Bearer dash-token"}).status_code == 200
        assert httpx.post(f"{url}/api/runs", params={"token": "dash-token"}).status_code == 405


# --- in a real browser -----------------------------------------------------------------------------

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture
def browser():
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("Debian's chromium and chromium-driver are not installed (scripts/install.sh --dev installs them)")
    driver = headless_chromium()
    yield driver
    driver.quit()


def wait_for(driver, script: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for: {script}")


@pytest.mark.browser
def test_the_page_follows_a_run_as_it_trains_and_shows_its_trajectories(
    browser, tiny_model_dir, tiny_tokenizer, tmp_path
):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    run_dir = tmp_path / "live"
    # The run waits after its second step until the page has drawn what it has: on a busy machine
    # the page could otherwise first draw the chart after the last step, with nothing left to follow.
    drawn, steps = threading.Event(), itertools.count(1)

    def wait_after_step_2(info: dict) -> None:
        if info and next(steps) == 2:
            drawn.wait(timeout=120)

    job = threading.Thread(
        target=train,
        # probe_every=0: the scripted policy's log-probs are made up, and a probe would end the run at step 10
        args=(
            config(tiny_model_dir, run_dir, "steps=10", "eval_every=0", "eval_episodes=0", "probe_every=0"),
            Progress(on_advance=wait_after_step_2),
        ),
        kwargs={"policy": scripted(tiny_tokenizer, delay=0.3)}, daemon=True,
    )  # fmt: skip
    with ServerThread(make_dashboard([run_dir])) as url:
        browser.get(url + "/")  # before the run writes anything: all of it arrives live
        wait_for(browser, "return document.body.dataset.ready")
        job.start()
        chart = "document.querySelector('[data-metric=\"train/loss\"]')"
        seen = wait_for(browser, f"return {chart} && {chart}.data[0].x.length")
        assert seen <= 2
        drawn.set()
        grown = wait_for(browser, f"return {chart}.data[0].x.length > {seen} && {chart}.data[0].x.length")
        assert grown > seen  # new points arrived without a reload
        browser.save_screenshot(str(ARTIFACTS / "dashboard-metrics.png"))
        browser.find_element("css selector", "button[data-tab=trajectories]").click()
        wait_for(browser, "return document.querySelectorAll('#traj-view .traj').length")
        roles = browser.execute_script(
            "return [...document.querySelectorAll('#traj-view .traj:first-child .msg .role')].map(e => e.textContent)"
        )
        assert roles[:4] == ["system", "user", "assistant", "tool"]
        assert (
            browser.execute_script("return document.querySelectorAll('#traj-view [data-tool=calculate]').length") >= 1
        )
        colours = browser.execute_script(
            "return [...document.querySelectorAll('#traj-view .tok.trained')].map(e => [e.style.background, e.dataset.advantage, e.title])"
        )
        assert colours and all(background.startswith("rgba(") for background, _, _ in colours)
        assert any(float(advantage) > 0 for _, advantage, _ in colours) and any(float(a) < 0 for _, a, _ in colours)
        assert all("log-prob" in title for _, _, title in colours)
        untrained = browser.execute_script("return document.querySelectorAll('#traj-view .tok:not(.trained)').length")
        assert untrained > 0
        browser.save_screenshot(str(ARTIFACTS / "dashboard-trajectory.png"))
        job.join(timeout=300)
    assert json.loads((run_dir / "config.json").read_text())["steps"] == 10


def test_the_page_loads_plotly_without_the_token_and_odd_records_do_not_break_it(tmp_path, tiny_tokenizer):
    run = tmp_path / "odd"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        '{"step": 1, "train/loss": NaN}\n{"step": 2, "train/loss": 0.5}\n{"step": 3, "tr'
    )
    records = sample_records([agentrl.Trajectory(token_ids=[1], messages=[Message("user", "\ud800")])], 1, "train")
    write_samples(run, records, 1, "train")
    with ServerThread(make_dashboard([run], tokens=["t"])) as url:
        assert httpx.get(f"{url}/static/plotly.min.js").status_code == 200  # the script tag sends no token
        metrics = httpx.get(f"{url}/api/runs/0/metrics", params={"token": "t"}).json()
        assert [r["train/loss"] for r in metrics["records"]] == [None, 0.5]  # NaN as null, the torn line later
        (sample,) = httpx.get(f"{url}/api/runs/0/samples/train/1", params={"token": "t"}).json()
        assert sample["messages"][0]["content"] == "\ud800"
    assert sample_kind("train", "red+team/v2.5") == "train.red+team_v2.5"
