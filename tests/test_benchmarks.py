"""The benchmark scripts run as they stand, with a tiny budget, and print their figures.

Nothing here asserts on a timing: the figures depend on the machine. What is asserted is that each
script states its launch command, exits 0 (the async benchmark exits 1 if its two modes did not
play exactly the same work) and prints its table, and that the simulated engine's schedule follows
its continuous-batching model step by step.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import json
import pathlib
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from agentrl.policies import Sampling

BENCHMARKS = pathlib.Path(__file__).parents[1] / "benchmarks"


def load(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["rollout_async_vs_sync", "rollout_overhead"])
def test_the_script_states_its_launch_command(name):
    head = (BENCHMARKS / f"{name}.py").read_text().splitlines()[:6]
    assert any(line.strip().startswith(f"python benchmarks/{name}.py --quick") for line in head)


def test_async_vs_sync_quick_run_prints_its_table(capsys):
    assert load("rollout_async_vs_sync").main(["--quick"]) == 0
    out = capsys.readouterr().out
    for row in ("ideal bound", "async (SingleAgentRollout)", "sync lock-step turns", "async / sync:", "async / ideal:"):
        assert row in out
    assert "PROBLEM" not in out


def test_overhead_quick_run_prints_its_table(capsys):
    assert load("rollout_overhead").main(["--quick"]) == 0
    out = capsys.readouterr().out
    for row in ("bare asyncio", "agentrl, default limits", "chat-template delta + encode", "overhead per turn:"):
        assert row in out


def test_the_simulated_engine_batches_continuously(tiny_tokenizer):
    """Capacity 2: two 3-token requests decode together from step 0, the third waits for a slot
    (step 3), and a request that comes later starts at the next step boundary after it came."""
    bench = load("rollout_async_vs_sync")
    tables = types.SimpleNamespace(tokens=np.array([[3, 5], [3, 1], [3, 1]]))
    filler = tiny_tokenizer.encode(" go", add_special_tokens=False)[0]
    engine = bench.SimulatedEngine(tiny_tokenizer, tables, capacity=2, step_time=0.002, filler_id=filler)
    eot = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    sampling = Sampling(max_tokens=4, stop_token_ids=(eot,))

    def prompt(task: int, turn: int) -> list[int]:
        return tiny_tokenizer.encode(f"<|im_start|>user\ntask {task} turn {turn}: go on.<|im_end|>\n")

    async def play():
        engine.start()
        first = await engine.generate_batch([prompt(0, 0), prompt(1, 0), prompt(2, 0)], sampling)
        later = await engine.generate(prompt(0, 1), sampling)  # wants 5 tokens, max_tokens cuts it to 4
        return first, later

    first, later = asyncio.run(play())
    assert engine.schedule[:3] == [(0, 3), (0, 3), (3, 6)]
    start, end = engine.schedule[3]
    assert start >= 6 and end == start + 4
    assert [g.token_ids for g in first] == [[filler, filler, eot]] * 3
    assert [g.finish_reason for g in first] == ["stop"] * 3
    assert (later.token_ids, later.finish_reason) == ([filler] * 4, "length")


# --- the fast paths the overhead benchmark led to keep their results exactly -------------------


def test_the_cached_placeholder_head_gives_the_uncached_deltas(tiny_tokenizer):
    from agentrl.agents.chat import ChatAgent
    from agentrl.tools import tool
    from agentrl.types import Message

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    observations = [[Message("user", "Try again.")], [Message("tool", "5", tool_call_id="c1", name="add")], []]
    agent = ChatAgent(tiny_tokenizer, [add])
    for messages in observations * 2:
        expected = ChatAgent(tiny_tokenizer, [add]).observation_text(messages, turn_closed=False)
        assert agent.observation_text(messages, turn_closed=False) == expected
    # What the head depends on changes after the first render: it is rendered afresh, not trusted.
    template = tiny_tokenizer.chat_template.replace(
        "{%- for message in turns %}", "{{- stamp }}{%- for message in turns %}"
    )
    stamped = ChatAgent(tiny_tokenizer, chat_template=template, chat_template_kwargs={"stamp": "[1]"})
    first = stamped.observation_text(observations[0])
    stamped.chat_template_kwargs["stamp"] = "[22]"
    stamped.tool_schemas.append(add.schema)
    fresh = ChatAgent(tiny_tokenizer, [add], chat_template=template, chat_template_kwargs={"stamp": "[22]"})
    assert stamped.observation_text(observations[0]) == fresh.observation_text(observations[0]) == first


def test_would_exceed_then_add_observation_renders_once(tiny_tokenizer):
    from agentrl.agents.chat import ChatAgent
    from agentrl.agents.trajectory import TrajectoryBuilder
    from agentrl.types import Message

    agent = ChatAgent(tiny_tokenizer)
    calls = []
    render = agent.observation_ids
    agent.observation_ids = lambda messages, **kw: calls.append(copy.deepcopy(messages)) or render(messages, **kw)
    reply = agent.encode("no") + agent.end_of_turn_ids
    builder = TrajectoryBuilder(agent, max_length=4096)
    builder.start([Message("user", "Say 5.")])
    builder.add_turn(reply, [-1.0] * len(reply), 0)
    wrong = [Message("user", "Try again.")]
    assert not builder.would_exceed(wrong)
    assert builder.add_observation(list(wrong)) == render(wrong)  # equal messages: no second render
    assert len(calls) == 1
    builder.add_turn(reply[:1], [-1.0], 0)  # cut: the next observation starts with the end-of-turn token
    assert not builder.would_exceed(wrong)
    other = [Message("user", "Still wrong.")]
    assert builder.add_observation(other) == render(other, turn_closed=False)  # different messages
    builder.add_turn(reply, [-1.0] * len(reply), 0)
    changed = [Message("user", "Try again.")]
    assert not builder.would_exceed(changed)
    changed[0].content = "Changed after the check."  # the same objects, edited in place
    assert builder.add_observation(changed) == render(changed)
    assert calls == [wrong, wrong, other, [Message("user", "Try again.")], changed]


@pytest.mark.docker
def test_sandbox_latency_quick_run_prints_its_table(capsys):
    """Runs whichever sandbox backends this machine has (CI has both); with neither, only the header."""
    from agentrl.sandboxes.docker import DEFAULT_IMAGE, docker_available
    from agentrl.sandboxes.local import bubblewrap_problem

    head = (BENCHMARKS / "sandbox_latency.py").read_text().splitlines()[:6]
    assert any(line.strip().startswith("python benchmarks/sandbox_latency.py --quick") for line in head)
    assert load("sandbox_latency").main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "p50 ms" in out
    if docker_available(DEFAULT_IMAGE):
        for row in (
            "DockerSandbox, warm server",
            "docker exec (SDK exec_run)",
            "docker run per call",
            "DockerSandboxes in parallel",
            "docker exec / warm server:",
        ):
            assert row in out
    if bubblewrap_problem() is None:
        for row in ("LocalSandbox, warm server", "bwrap per call", "LocalSandboxes in parallel"):
            assert row in out


def test_trainer_step_quick_run_compares_the_same_work(capsys):
    """Both sides train on the same batch; the script exits 1 if their first gradients differ."""
    head = (BENCHMARKS / "trainer_step.py").read_text().splitlines()[:6]
    assert any(line.strip().startswith("python benchmarks/trainer_step.py --quick") for line in head)
    assert load("trainer_step").main(["--quick"]) == 0
    out = capsys.readouterr().out
    for row in (
        "single-turn  TRL GRPOTrainer",
        "single-turn  agentrl Trainer",
        "multi-turn   TRL GRPOTrainer",
        "multi-turn   agentrl Trainer",
        "first-step gradients differ by",
        "agentrl / TRL, single-turn:",
        "agentrl / TRL, multi-turn:",
        "against the machine: fp32 matmul peak",
        "GFLOP/step",
    ):
        assert row in out
    assert "PROBLEM" not in out
    # agentrl's head scores only the generated positions, TRL's every position: fewer FLOPs on both shapes.
    fewer = [float(x) for x in re.findall(r"(\d+\.\d+)x fewer FLOPs than TRL", out)]
    assert len(fewer) == 2 and min(fewer) > 1.0


def test_train_async_vs_sync_quick_run_prints_its_table(capsys):
    head = (BENCHMARKS / "train_async_vs_sync.py").read_text().splitlines()[:6]
    assert any(line.strip().startswith("python benchmarks/train_async_vs_sync.py --quick") for line in head)
    load("train_async_vs_sync").main(["--quick"])
    out = capsys.readouterr().out
    assert "async2-wait / sync:" in out and "generated vs trained" in out


@pytest.mark.engine
@pytest.mark.e2e  # each setting in a child process
def test_multi_policy_serving_quick_run_prints_its_table(capsys):
    """One policy: two tiny vLLM engines (one plain, one serving an adapter), not the four of two
    policies; two engines side by side in one process are tests/test_faults.py's multi-policy run's."""
    head = (BENCHMARKS / "multi_policy_serving.py").read_text().splitlines()[:6]
    assert any(
        line.strip().startswith("python benchmarks/multi_policy_serving.py --quick --policies 1") for line in head
    )
    assert load("multi_policy_serving").main(["--quick", "--policies", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("running ") == 2  # with one policy the one engine is the separate setting
    for row in (
        "one engine, full weights",
        "separate engines, full weights",
        "LoRA adapters, one engine",
        "1 policies: adapters / separate engines",
        "adapters' RSS / one engine's",
    ):
        assert row in out


@pytest.mark.engine  # vLLM's CPU punica wrapper, with agentrl's replacements in place
def test_lora_ops_quick_run_checks_the_four_ways_agree_and_prints_its_table(capsys):
    head = (BENCHMARKS / "lora_ops.py").read_text().splitlines()[:6]
    assert any(line.strip().startswith("python benchmarks/lora_ops.py --quick") for line in head)
    assert load("lora_ops").main(["--quick"]) == 0  # raises if a way's output differs from stock's
    out = capsys.readouterr().out
    for row in ("stock", "grouped ops", "grouped wrapper", "dense wrapper", "base matmuls", "the four ways agree"):
        assert row in out
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    from agentrl.policies import vllm_worker

    # The script swaps the wrapper's methods to time each way; what the engine runs is left in place.
    for name in ("add_shrink", "add_expand", "add_lora_linear"):
        assert getattr(PunicaWrapperCPU, name) is not vllm_worker.REPLACED[f"PunicaWrapperCPU.{name}"]


@pytest.mark.e2e
def test_prompt_selection_quick_run_trains_a_step_with_pcl_on_vllm(tiny_model_dir, capsys):
    """One step of examples/hallway.yaml with PCL choosing its prompts, on vLLM and the tiny model
    (the default model on vLLM: tests/test_default_model.py), in a process of its own."""
    head = (BENCHMARKS / "prompt_selection.py").read_text().splitlines()[:8]
    assert any(line.strip().startswith("python benchmarks/prompt_selection.py --quick") for line in head)
    tiny = ["--set", f"rollout.model={tiny_model_dir}", "--set", "trainer.trainable_layers=1"]
    load("prompt_selection").main(["--quick", "--selections", "pcl", *tiny])
    out = capsys.readouterr().out
    result = json.loads(out.splitlines()[0])
    assert result["selection"] == "pcl" and result["select_seconds"] > 0 and 0 <= result["effective_ratio"] <= 1
    assert [e["step"] for e in result["eval"]] == [0.0, 1.0]
    assert "held-out success at step" in out


def test_env_server_quick_run_compares_remote_and_local_steps(capsys):
    head = (BENCHMARKS / "env_server.py").read_text().splitlines()[:6]
    assert any(line.strip().startswith("python benchmarks/env_server.py --quick") for line in head)
    assert load("env_server").main(["--quick"]) == 0
    out = capsys.readouterr().out
    for row in (
        "in process, env.step",
        "RemoteEnv.astep, WebSocket (async)",
        "RemoteEnv.astep, HTTP (aiohttp, async)",
        "added at p50:",
        "remote / in process:",
    ):
        assert row in out


@pytest.mark.browser
def test_dashboard_render_quick_run_prints_its_figures(capsys):
    import shutil

    if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
        pytest.skip("Debian's chromium and chromium-driver are not installed (scripts/install.sh --dev installs them)")
    head = (BENCHMARKS / "dashboard_render.py").read_text().splitlines()[:6]
    assert any(line.strip().startswith("python benchmarks/dashboard_render.py --quick") for line in head)
    assert load("dashboard_render").main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "page ready s" in out and "+100 steps live s" in out


def test_e2e_vs_trl_summarises_the_seeds_with_a_run_that_never_got_there_as_the_slowest(capsys):
    # Three seeds a side, hand-made curves of (step, training seconds, held-out success): TRL's
    # seeds 1 and 2 never reach 90%, so its median seed did not, and its highest is "not reached".
    e2e = load("e2e_vs_trl")
    curves = {"agentrl": [[(0, 0, 0.3), (1, 60, 0.85), (2, 120, 0.92)]] * 2 + [[(0, 0, 0.3), (1, 60, 0.91)]]}
    curves["TRL"] = [[(0, 0, 0.3), (1, 200, 0.7), (2, 400, after)] for after in (0.95, 0.81, 0.85)]
    runs = [
        {"seed": seed, "sides": [{"name": n, "curve": curves[n][seed], "command_s": 60.0 * (seed + 1)} for n in curves]}
        for seed in range(3)
    ]
    summary = e2e.seed_summary(runs, [0.8, 0.9])
    assert summary["agentrl"]["minutes_to_0.9"] == {"median": 2.0, "low": 1.0, "high": 2.0, "seeds": [2.0, 2.0, 1.0]}
    assert summary["agentrl"]["minutes_to_0.8"]["median"] == 1.0
    assert summary["TRL"]["minutes_to_0.9"] == {
        "median": None,
        "low": 400 / 60,
        "high": None,
        "seeds": [400 / 60, None, None],
    }
    assert summary["TRL"]["after"] == {"median": 0.85, "low": 0.81, "high": 0.95}
    assert summary["TRL"]["command_minutes"] == {"median": 2.0, "low": 1.0, "high": 3.0}
    assert e2e.spread([3.0, 1.0]) == {"median": 2.0, "low": 1.0, "high": 3.0}
    assert e2e.spread([1.0, None])["median"] is None and e2e.spread([])["low"] is None
    e2e.print_summary(summary, [0.8, 0.9], same_job=False)
    out = capsys.readouterr().out
    assert "to 80%: TRL's median training minutes / agentrl's = 6.67x" in out
    assert "to 90%: no ratio (TRL's median seed did not reach it)" in out
    assert re.search(r"^TRL\s+6\.7 \[6\.7, 6\.7\]\s+- \[6\.7, -\]\s+85\.0% \[81\.0%, 95\.0%\]", out, re.MULTILINE), out


@pytest.mark.e2e
def test_e2e_vs_trl_quick_run_trains_both_sides_on_the_same_groups(capsys):
    """One step of the main job with the tiny model through agentrl and through TRL's GRPOTrainer,
    each in a process of its own, both evaluated by agentrl: slow (about a minute)."""
    head = (BENCHMARKS / "e2e_vs_trl.py").read_text().splitlines()[:8]
    assert any(line.strip().startswith("python benchmarks/e2e_vs_trl.py --quick") for line in head)
    assert load("e2e_vs_trl").main(["--quick"]) == 0  # 1: the two sides' prompts, tools or groups differed
    out = capsys.readouterr().out
    assert "trained groups: the same" in out and "TRL's prompt and tool-result tokens: the same as agentrl's" in out
    assert re.search(r"^agentrl\s+[\d.]+", out, re.MULTILINE) and re.search(r"^TRL\s+[\d.]+", out, re.MULTILINE)


@pytest.mark.ray
def test_scale_out_quick_run_prints_its_three_tables(ray_cluster, capsys):
    """The session's Ray with the tiny model: 1 and 2 hf engines, 1 and 2 DDP ranks, weight syncs (about a minute)."""
    head = (BENCHMARKS / "scale_out.py").read_text().splitlines()[:6]
    assert any(line.strip().startswith("python benchmarks/scale_out.py --quick") for line in head)
    assert load("scale_out").main(["--quick"]) == 0
    out = capsys.readouterr().out
    for row in ("1 engine(s)", "2 engine(s)", "scaling efficiency", "1 rank(s)", "2 rank(s)", "speed-up with 2 ranks"):
        assert row in out
    syncs = re.findall(r"^  (tiny|layers-1) +[0-9.]+ +([12]) ", out, flags=re.M)
    assert sorted(syncs) == [("layers-1", "1"), ("layers-1", "2"), ("tiny", "1"), ("tiny", "2")]


@pytest.mark.e2e
def test_scale_sim_quick_run_prints_cpu_per_turn_at_two_scales():
    """In a process of its own, with its own local Ray (the env workers import the benchmark's
    module by its folder, which the session's cluster would not find), 2 workers."""
    head = (BENCHMARKS / "scale_sim.py").read_text().splitlines()[:6]
    assert any(line.strip().startswith("python benchmarks/scale_sim.py --quick") for line in head)
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "scale_sim.py"), "--quick"], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = re.findall(r"^ +(16|256) +(\d+) +(\d+) ", run.stdout, flags=re.M)
    assert [(n, int(episodes), int(turns)) for n, episodes, turns in rows] == [("16", 64, 256), ("256", 256, 1024)]
    assert "CPU per turn within" in run.stdout


@pytest.mark.timeout(300)  # transformers' generate on the CPU: 70 s beside a training run, more beside the suite
def test_waltz_revisions_quick_run_prints_each_feedback_wording(capsys):
    """The default model (transformers, one thread, as each xdist worker has) on 8 training prompts:
    the first answers, then each flawed one revised under each wording."""
    head = (BENCHMARKS / "waltz_revisions.py").read_text().splitlines()[:6]
    assert any(line.strip().startswith("python benchmarks/waltz_revisions.py --quick") for line in head)
    assert load("waltz_revisions").main(["--quick", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "first answers" in out and "revisions fine" in out
    assert re.search(r"of 4 benign lack the fact, \d+ of 4 harmful leak", out)
    assert re.search(r"over-refusal +teacher +\d+/\d", out), out  # the untrained model rarely gives the fact
