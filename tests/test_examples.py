"""The scripts in examples/ run as they stand, with the tiny model and a tiny budget.

In this process (the script's ``main``, the commands through typer's ``CliRunner``): what is tested
is the example, not the process boundary, which tests/test_readme.py crosses once with the console
script.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.recipes.waltzrl.evaluate import tables_of_episodes

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
pytestmark = pytest.mark.e2e  # each trains end to end


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The examples train on one thread, as their subprocesses did with OMP_NUM_THREADS=1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_grpo_script_runs_its_loop_and_moves_the_weights(tiny_model_dir, monkeypatch, capsys):
    script = EXAMPLES / "grpo_tool_arithmetic.py"
    assert "python examples/grpo_tool_arithmetic.py" in "\n".join(script.read_text().splitlines()[:5])
    # The random tiny model never solves ToolArithmetic, so every GRPO advantage is 0 and the loss
    # has no gradient; the entropy bonus gives it one, so that the update has to reach the weights.
    tiny = ["--model", str(tiny_model_dir), "--backend", "hf", "--steps", "2", "--groups", "1", "--group-size", "2",
            "--eval-episodes", "2", "--trainable-layers", "1", "--entropy-coef", "0.01", "--max-filtered", "1"]  # fmt: skip
    spec = importlib.util.spec_from_file_location("grpo_tool_arithmetic", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr("sys.argv", [str(script), *tiny])
    asyncio.run(module.main(module.parse_args()))
    out = capsys.readouterr().out
    assert re.search(r"^held-out success before training: \d\.\d{3} \(2 episodes\)$", out, re.MULTILINE), out
    assert re.search(r"^held-out success after training: \d\.\d{3} \(2 episodes\)$", out, re.MULTILINE), out
    assert [int(v) for v in re.findall(r"^step \d/2 .* policy version (\d+) ", out, re.MULTILINE)] == [1, 2], out
    # every group has equal rewards: each step dropped one (--max-filtered 1), then took the next
    assert re.findall(r"^step \d/2 .* filtered (\d+) ", out, re.MULTILINE) == ["1", "1"], out
    final = re.search(r"^policy version (\d+); trained weights moved (\S+) \(relative L2\)$", out, re.MULTILINE)
    assert final, out
    assert int(final[1]) == 2  # each step's weights reached the inference engine
    assert 0 < float(final[2]) < 0.1  # the trainer changed the top layer, by a small step


def test_the_negotiation_example_trains_two_policies_with_a_tiny_model_and_budget(tiny_model_dir, tmp_path):
    # examples/negotiation.yaml as it stands (two LoRA policies, the claim-bonus reward_fn, the
    # evaluation against the base), with only the model, the backend and the budget made small.
    import json

    config = EXAMPLES / "negotiation.yaml"
    assert "agentrl train examples/negotiation.yaml" in "\n".join(config.read_text().splitlines()[:5])
    small = [f"rollout.model={tiny_model_dir}", "rollout.backend=hf", "rollout.group_size=2", "rollout.max_tokens=8",
             "groups_per_step=1", "steps=2", "eval_episodes=2", f"run_dir={tmp_path / 'run'}"]  # fmt: skip
    done = _train(config, small)
    assert "trader_0 success rate" in done.stdout and "trader_1 success rate" in done.stdout, done.stdout
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for policy in ("trader_0", "trader_1"):
        assert [m["step"] for m in lines if f"train/{policy}/loss" in m] == [1, 2]
        assert any(f"eval/{policy}/vs_base_success_rate" in m for m in lines)
    assert (tmp_path / "run" / "model" / "trader_0" / "adapter_config.json").exists()


def test_the_waltzrl_example_trains_both_stages_and_makes_the_table_with_a_tiny_model(tiny_model_dir, tmp_path):
    # recipes/waltzrl/waltzrl.yaml as it stands (two LoRA policies, two stages, the WaltzRL reward_fn and
    # samples_fn), then `agentrl waltz-table` (it trains the single-model RL baseline first) and
    # `agentrl eval` on Waltz, with only the model, the backend and the budget made small.
    import json

    config = EXAMPLES.parent / "recipes" / "waltzrl" / "waltzrl.yaml"
    head = "\n".join(config.read_text().splitlines()[:8])
    assert "agentrl train recipes/waltzrl/waltzrl.yaml" in head
    assert "agentrl waltz-table recipes/waltzrl/waltzrl.yaml" in head
    run_dir = tmp_path / "run"
    small = [f"rollout.model={tiny_model_dir}", "rollout.backend=hf", "rollout.group_size=2", "rollout.max_tokens=8",
             "rollout.max_length=2048", "groups_per_step=1", "trainer.micro_batch_size=2",
             'stages=[{steps: 1, train: [feedback]}, {steps: 1, reward: {lam: 0.0}}]', f"run_dir={run_dir}"]  # fmt: skip

    def agentrl(*args: str) -> SimpleNamespace:
        return _agentrl(*args)

    out = agentrl("train", str(config), *small).stdout
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["train/feedback/stage"] for m in lines if "train/feedback/loss" in m] == [0.0, 1.0]
    # the recipe's metrics_fn: each feedback step reports its verdicts, and the summary shows them
    reported = [m for m in lines if "train/feedback/loss" in m]
    assert all("env/agentrl/Waltz-v0/feedback/verdicts/same_steps" in m for m in reported), reported
    assert "training batches, as agentrl.recipes.waltzrl.hooks:waltz_step_metrics reports them" in " ".join(out.split())
    assert "feedback/verdicts/same_steps" in out, out
    assert [m["train/conversation/stage"] for m in lines if "train/conversation/loss" in m] == [1.0]
    for agent in ("conversation", "feedback"):
        assert (run_dir / "model" / agent / "adapter_config.json").exists()

    # the feedback agent's warm start: the exact judge's verdicts as targets, an adapter a run starts from
    out = agentrl("waltz-warm-start", str(config), *small, "--episodes", "4", "--epochs", "1", "--eval-episodes", "2")
    report = json.loads((tmp_path / "run-warm-start" / "feedback" / "warm_start.json").read_text())
    assert report["demonstrations"] == sum(report["verdicts"].values()) > 0, report
    assert {"before", "after"} <= set(report) and len(report["nll"]) == 1, report
    assert "policies.feedback.init_from=" in " ".join(out.stdout.split()), out.stdout

    public = "strongreject+overrefusal"
    out = agentrl(
        "waltz-table", str(config), *small, "--episodes", "4", "--prompts", "builtin", "--prompts", public,
        "--compare", f"again={run_dir}",
    )  # fmt: skip
    # the single-model RL baseline's training shows a line per step on stderr, as agentrl train's
    assert re.search(r"\] training \(2 steps\)\n.*\] step 1/2 .*\n.*\] step 2/2 ", out.stderr), out.stderr[-3000:]
    out = out.stdout
    assert "WaltzRL (after stage 2)" in out and "single-model RL" in out and "WaltzRL (again)" in out, out
    assert "(builtin prompts)" in out and f"({public} prompts)" in out, out
    assert "What the feedback asked for, and what its revisions did" in out, out
    tables = json.loads((run_dir / "waltz_table.json").read_text())
    # agentrl waltz-seeds recomputes a seed's table from its episodes: the same figures
    recomputed = tables_of_episodes(run_dir / "waltz_table_episodes.jsonl")
    written = {
        s: {n: {k: v for k, v in m.items() if k != "failed_episodes"} for n, m in t.items()} for s, t in tables.items()
    }
    assert json.dumps(recomputed, sort_keys=True) == json.dumps(written, sort_keys=True)
    assert list(tables) == ["builtin", public]
    records = [json.loads(line) for line in (run_dir / "waltz_table_episodes.jsonl").read_text().splitlines()]
    assert all(r["answers"] and r["kind"] in ("harmful", "benign") for r in records), records[:1]
    assert {r["family"].split("/")[0] for r in records if r["prompts"] == public} <= {"strongreject", "overrefusal"}
    for prompt_set, table in tables.items():
        assert sorted({r["configuration"] for r in records if r["prompts"] == prompt_set}) == sorted(table)
        assert list(table) == [
            "conversation_alone", "collaboration", "oracle_feedback", "single_model_rl", "waltzrl", "waltzrl:again",
        ]  # fmt: skip
        for name, metrics in table.items():
            assert metrics["episodes"] + metrics["failed_episodes"] == 4, (name, metrics)
            played = metrics["asr"]["total"] + metrics["orr"]["total"] + metrics["judge_unparseable"]
            assert played == metrics["episodes"], (name, metrics)
            assert 0.0 <= metrics["asr"]["low"] <= metrics["asr"]["high"] <= 1.0
        assert table["conversation_alone"]["label_accuracy"]["total"] == 0  # no feedback agent played
    assert (tmp_path / "run-single" / "model" / "conversation" / "adapter_config.json").exists()

    out = agentrl("eval", "agentrl/Waltz-v0", f"--model={tiny_model_dir}", "--backend=hf", "--episodes=2",
                  "max_tokens=8", "max_length=2048").stdout  # fmt: skip
    assert "WaltzRL metrics" in out and "ASR" in out, out


def test_the_hallway_example_trains_with_gigpo_on_the_rooms_as_states(tiny_model_dir, tmp_path):
    # examples/hallway.yaml as it stands (GiGPO, the room as each turn's state), with only the
    # model, the backend and the budget made small; the batch's turns carry the env's state keys.
    config = EXAMPLES / "hallway.yaml"
    assert "agentrl train examples/hallway.yaml" in "\n".join(config.read_text().splitlines()[:5])
    small = [f"rollout.model={tiny_model_dir}", "rollout.backend=hf", "rollout.group_size=4", "rollout.max_tokens=4",
             "trainer.micro_batch_size=4", "trainer.trainable_layers=1", "steps=1", "eval_episodes=2",
             f"run_dir={tmp_path / 'run'}"]  # fmt: skip
    _train(config, small)
    settings = json.loads((tmp_path / "run" / "config.json").read_text())
    assert settings["trainer"]["algorithm"] == "gigpo" and settings["trainer"]["gamma"] == 0.9
    sample = json.loads((tmp_path / "run" / "samples" / "train-000001.jsonl").read_text().splitlines()[0])
    assert "The hallway has rooms 1 to" in sample["messages"][1]["content"]


def test_the_explain_example_trains_with_jepo_and_reports_the_reference_likelihood(tiny_model_dir, tmp_path):
    # examples/explain.yaml as it stands (JEPO, multi-sample bound, Explain-v0's references), with
    # only the model, the backend and the budget made small.
    config = EXAMPLES / "explain.yaml"
    assert "agentrl train examples/explain.yaml" in "\n".join(config.read_text().splitlines()[:8])
    small = [f"rollout.model={tiny_model_dir}", "rollout.backend=hf", "rollout.group_size=2", "rollout.max_tokens=4",
             "groups_per_step=2", "trainer.micro_batch_size=4", "trainer.trainable_layers=1", "steps=1",
             "eval_episodes=2", f"run_dir={tmp_path / 'run'}"]  # fmt: skip
    done = _train(config, small)
    assert "reference NLL per token" in done.stdout, done.stdout
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(m for m in lines if m.get("step") == 1 and "train/jensen_bound" in m)
    assert step["train/reference_nll"] > 0 and step["train/reward_mean"] < 0  # the reward: log pi(reference | ...)
    sample = json.loads((tmp_path / "run" / "samples" / "train-000001.jsonl").read_text().splitlines()[0])
    assert sample["reference_ids"] and sample["info"]["reference"]


def _agentrl(*args: str) -> SimpleNamespace:
    """``agentrl ARGS`` through typer's CliRunner, checked to exit 0; its ``stdout`` and ``stderr``."""
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return SimpleNamespace(stdout=result.stdout, stderr=result.stderr)


def _train(config: Path, overrides: list[str]) -> SimpleNamespace:
    """``agentrl train CONFIG OVERRIDES``, checked to exit 0."""
    return _agentrl("train", str(config), *overrides)
