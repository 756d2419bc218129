"""A fault that ends a run: one message (what died, the step, the resume command), exit code 1, and
the traceback in RUN_DIR/train.log; the real case is vLLM's engine core killed mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from agentrl.faults import RUN_LOG, failure_message, resume_command, what_died, write_traceback


def _error_from(module: str, name: str, message: str) -> Exception:
    kind = type(name, (Exception,), {"__module__": module})
    return kind(message)


@pytest.mark.parametrize(
    ("error", "part"),
    [
        (_error_from("vllm.v1.engine.exceptions", "EngineDeadError", "EngineCore encountered an issue."), "inference engine (vLLM) died"),
        (_error_from("ray.exceptions", "ActorDiedError", "The actor died unexpectedly"), "Ray actor or node died"),
        (_error_from("docker.errors", "APIError", "500 Server Error"), "Docker engine failed"),
        (ConnectionRefusedError("refused"), "a connection failed"),
        (RuntimeError("boom\nmore"), "the run failed (RuntimeError: boom)"),
    ],
)  # fmt: skip
def test_what_died_names_the_part_and_the_first_line(error, part):
    assert part in what_died(error)


def test_what_died_looks_through_the_chain():
    try:
        try:
            raise _error_from("vllm.v1.engine.exceptions", "EngineDeadError", "dead")
        except Exception as inner:
            raise RuntimeError("generation failed") from inner
    except RuntimeError as outer:
        assert what_died(outer).startswith("the inference engine (vLLM) died (RuntimeError: generation failed")


def test_the_message_names_the_last_step_the_checkpoint_and_the_resume_command(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step-000002").mkdir(parents=True)
    lines = [{"step": 1, "train/loss": 0.1}, {"step": 2, "train/loss": 0.2}, {"step": 3, "train/loss": 0.3},
             {"step": 3, "eval/success_rate": 0.5}]  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    command = resume_command(["examples/quickstart.yaml", "steps=6"], resume=False)
    assert command == "agentrl train examples/quickstart.yaml steps=6 resume=true"
    message = failure_message(RuntimeError("x"), run_dir, command)
    assert "after step 3" in message and "step-000002" in message and command in message
    assert str(run_dir / RUN_LOG) in message
    fresh = failure_message(RuntimeError("x"), tmp_path / "nothing", resume_command(["c.yaml"], resume=True))
    assert "after step 0" in fresh and "starts over: agentrl train c.yaml." in fresh


def test_the_traceback_goes_to_the_run_log(tmp_path):
    try:
        raise ValueError("deep down")
    except ValueError as e:
        path = write_traceback(e, tmp_path)
    text = path.read_text()
    assert "Traceback (most recent call last)" in text and "ValueError: deep down" in text


@pytest.mark.slow
def test_killing_the_engine_core_ends_agentrl_train_with_one_clear_message(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "agentrl.cli", "train", "examples/quickstart.yaml",
               f"rollout.model={tiny_model_dir}", "rollout.max_tokens=8", "rollout.max_length=256",
               "trainer.trainable_layers=1", "steps=200", "eval_episodes=0", "checkpoint_every=1",
               "export=false", f"run_dir={run_dir}"]  # fmt: skip
    root = Path(__file__).resolve().parents[1]
    process = subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (run_dir / "checkpoints" / "step-000002").exists():
            assert process.poll() is None, process.stderr.read()[-3000:] if process.stderr else ""
            time.sleep(0.5)
        cores = [
            p
            for p in psutil.Process(process.pid).children(recursive=True)
            if "EngineCore" in " ".join(p.cmdline()) or p.name().startswith("VLLM::Engine")
        ]
        assert cores, "no vLLM engine core process found"
        for core in cores:
            os.kill(core.pid, signal.SIGKILL)
        out, err = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1, err[-3000:]
    assert "Training stopped: the inference engine (vLLM) died" in err, err[-3000:]
    assert "resume=true" in err and str(run_dir / RUN_LOG) in err
    assert "Traceback" not in out + err.split("Training stopped")[-1]
    assert "Traceback (most recent call last)" in (run_dir / RUN_LOG).read_text()
