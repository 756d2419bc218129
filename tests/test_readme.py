"""The README's examples run as they stand."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_custom_env_example_runs():
    blocks = python_blocks()
    assert blocks, "README lost its custom-env example"
    # A fresh interpreter, so the example needs nothing this test process set up.
    subprocess.run([sys.executable, "-c", blocks[0]], check=True, timeout=120)


def test_first_screen_names_the_test_command_ci_runs():
    first_screen = "\n".join(README.read_text().splitlines()[:20])
    assert "python -m pytest -q" in first_screen
    ci = (README.parent / ".ci" / "run").read_text()
    assert "python -m pytest -q" in ci


@pytest.mark.docker  # the sandbox example
def test_the_other_examples_run():
    from agentrl.sandboxes import DEFAULT_IMAGE, docker_available

    for block in python_blocks()[1:]:
        if "make_sandbox" in block and not docker_available(DEFAULT_IMAGE):
            continue  # the sandbox example needs the engine and the image (install.sh sets both up)
        subprocess.run([sys.executable, "-c", block], check=True, timeout=180)


def test_quickstart_config_loads_and_names_a_registered_env():
    import agentrl
    from agentrl.config import load_config
    from agentrl.train import TrainConfig

    config = load_config(TrainConfig, README.parent / "examples" / "quickstart.yaml")
    assert config.rollout.env_id in agentrl.registered_ids()
    assert "agentrl train examples/quickstart.yaml" in "\n".join(README.read_text().splitlines()[:20])


@pytest.mark.e2e
def test_the_main_job_runs_as_configured_with_a_tiny_model_and_budget(tiny_model_dir, tmp_path):
    # examples/quickstart.yaml as it stands (async one batch ahead, one trainer thread, GRPO on
    # ToolArithmetic), with only the model, the backend and the budget made small.
    import json

    small = [
        f"rollout.model={tiny_model_dir}",
        "rollout.backend=hf",
        "rollout.group_size=2",
        "groups_per_step=1",
        "steps=3",
        "eval_episodes=2",
        "trainer.micro_batch_size=2",
        "trainer.trainable_layers=1",
        "curriculum.max_filtered=1",
        "eval_every=2",  # an evaluation between steps: the step lines go on after it
        f"run_dir={tmp_path / 'run'}",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", str(README.parent / "examples" / "quickstart.yaml"), *small],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "held-out" in done.stdout and "before" in done.stdout
    assert "faults the run survived: none" in done.stdout
    # stdout is a pipe: one line per phase and per step, as they happen, and no bars on stderr
    lines = done.stdout.splitlines()
    assert [line.split("] ", 1)[1].split("  ")[0] for line in lines if "] step " in line] == [
        "step 1/3",
        "step 2/3",
        "step 3/3",
    ]
    assert all(
        re.search(r"reward \d\.\d{3}  success \d+%  \d+\.\d s/step  eta ", line) for line in lines if "] step " in line
    )
    for phase in ("starting the inference engine", "evaluating (step 0) (2 episodes)", "training (3 steps)"):
        assert any(line.endswith(f"] {phase}") for line in lines), (phase, lines)
    assert any("] starting the inference engine: done in " in line for line in lines), lines
    # the evaluation after step 2 sits between steps 2 and 3, and training ends once, after step 3
    shown = [line.split("] ", 1)[1].split("  ")[0] for line in lines if "] " in line]
    middle = shown.index("evaluating (step 2) (2 episodes)")
    assert shown[middle - 1] == "step 2/3" and shown[middle + 1].startswith("held-out success"), shown
    assert shown[middle + 2].startswith("evaluating (step 2): done in") and shown[middle + 3] == "step 3/3", shown
    assert [s for s in shown if s.startswith("training: done")] == [shown[shown.index("step 3/3") + 1]], shown
    assert "Loading weights" not in done.stderr and "it/s" not in done.stderr, done.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [s for s in steps if "train/loss" in s]
    assert [s["step"] for s in trained] == [1, 2, 3]
    assert max(s["train/staleness_max"] for s in trained) <= 1  # max_staleness: 1 from the file
    # curriculum.selection: filter from the file; the tiny model solves nothing, so every group's
    # rewards are equal: each step dropped one (max_filtered 1), then trained on the next
    assert [s["train/filtered_groups"] for s in trained] == [1.0, 1.0, 1.0]
    assert (tmp_path / "run" / "curves.png").exists() and (tmp_path / "run" / "model").is_dir()
