"""A fault that ends a run: one message (what died, the step, the resume command), exit code 1, and
the traceback in RUN_DIR/train.log; the real case is vLLM's engine core killed mid-run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from agentrl.faults import RUN_LOG, failure_message, resume_command, what_died, write_traceback
from agentrl.metrics import read_metrics
from agentrl.trainers.checkpoint import checkpoint_step, list_checkpoints, load_checkpoint, save_checkpoint


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
        (OSError(28, "No space left on device"), "a disk is full (free space on it, then resume) (OSError"),
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
    assert (
        message.startswith("Training stopped after step 3: the run failed (RuntimeError: x).")
        and "step-000002" in message
        and command in message
    )
    assert str(run_dir / RUN_LOG) in message
    fresh = failure_message(RuntimeError("x"), tmp_path / "nothing", resume_command(["c.yaml"], resume=True))
    assert "after step 0" in fresh and "starts over: agentrl train c.yaml." in fresh


def test_the_end_of_a_run_says_which_faults_it_survived():
    from agentrl.cli.train import faults_survived

    one = [{"step": 1, "rollout/failed": 2.0, "fault/engine_restarts": 0.0},
           {"step": 2, "rollout/failed": 1.0, "fault/engine_restarts": 1.0, "fault/env_workers_replaced": 0.0}]  # fmt: skip
    assert faults_survived(one, []) == [
        ("inference engines replaced", "1"),
        ("episodes failed (counted, never trained on)", "3"),
    ]
    several = [{"step": 1, "fault/a/engine_restarts": 1.0, "fault/b/engine_restarts": 1.0, "rollout/a/failed": 0.0}]
    assert faults_survived(several, ["a", "b"]) == [("inference engines replaced", "a 1, b 1")]
    assert faults_survived([{"step": 1, "rollout/failed": 0.0}], []) == []


def test_the_traceback_goes_to_the_run_log(tmp_path):
    try:
        raise ValueError("deep down")
    except ValueError as e:
        path = write_traceback(e, tmp_path)
    text = path.read_text()
    assert "Traceback (most recent call last)" in text and "ValueError: deep down" in text


def test_a_traceback_the_run_log_cannot_take_goes_to_stderr_and_the_message_says_so(tmp_path, capsys):
    # A full disk ends the run and refuses its traceback too; neither may be lost.
    (tmp_path / "run").write_text("a file where the run directory should be")
    error = OSError(28, "No space left on device")
    assert write_traceback(error, tmp_path / "run") is None
    assert "OSError: [Errno 28] No space left on device" in capsys.readouterr().err
    message = failure_message(error, tmp_path / "run", "agentrl train c.yaml", traceback_written=False)
    assert "a disk is full" in message and "The traceback is above (it could not be written to" in message


def test_a_checkpoint_write_cut_short_is_never_read_and_is_cleared_by_the_next(tmp_path):
    # SIGKILL or a full disk mid-write leaves a partial folder: list_checkpoints ignores it and the
    # next save removes it.
    state = {"weights": torch.zeros(2)}
    save_checkpoint(tmp_path, 1, state, {"step": 1})
    torn = tmp_path / "checkpoints" / ".partial-step-000002-12345"
    torn.mkdir()
    (torn / "trainer.pt").write_bytes(b"torn")
    assert [checkpoint_step(c) for c in list_checkpoints(tmp_path)] == [1]
    save_checkpoint(tmp_path, 2, state, {"step": 2})
    assert not torn.exists() and [checkpoint_step(c) for c in list_checkpoints(tmp_path)] == [1, 2]
    assert load_checkpoint(list_checkpoints(tmp_path)[-1])[1] == {"step": 2}


ROOT = Path(__file__).resolve().parents[1]


def tiny_train_command(model_dir, run_dir, *overrides: str) -> list[str]:
    """``agentrl train`` of the quickstart on the tiny model, synchronous (every token on-policy, so
    every step measures the engine's log-prob gap), every group trained, a checkpoint after each step."""
    return [sys.executable, "-m", "agentrl.cli", "train", "examples/quickstart.yaml",
            f"rollout.model={model_dir}", "rollout.max_tokens=8", "rollout.max_length=2048",
            "trainer.trainable_layers=1", "max_staleness=0", "eval_episodes=0", "checkpoint_every=1",
            "curriculum.selection=uniform",  # the tiny model's groups all score 0: train them, do not replace them
            "export=false", f"run_dir={run_dir}", *overrides]  # fmt: skip


def run_and_kill(
    command: list[str], run_dir: Path, victim: str, after_steps: tuple[int, ...] = (2,), first_only: bool = False
) -> tuple[int, str, str]:
    """Run ``command``; each time ``after_steps[i]`` steps are recorded in ``batches.jsonl`` and the
    newest step's checkpoint is written, SIGKILL its descendant processes whose command line contains
    ``victim`` (the oldest of them, with ``first_only``); return its exit code, stdout and stderr."""
    # vLLM's logging as a user who set nothing gets it (other tests' commands set VLLM_LOGGING_LEVEL here).
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_LOGGING")} | {"OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        killed: set[int] = set()
        for after_step in after_steps:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not _steps_saved(run_dir, after_step):
                assert process.poll() is None, process.stderr.read()[-3000:] if process.stderr else ""
                time.sleep(0.2)
            children = psutil.Process(process.pid).children(recursive=True)
            victims = sorted(
                (p for p in children if p.pid not in killed and victim in " ".join(p.cmdline())),
                key=lambda p: p.create_time(),
            )
            assert victims, f"no process {victim!r} found under the run after step {after_step}"
            for found in victims[:1] if first_only else victims:
                os.kill(found.pid, signal.SIGKILL)
                killed.add(found.pid)
        out, err = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, out, err


def _steps_saved(run_dir: Path, steps: int) -> bool:
    """Whether ``steps`` steps (of any policy) are recorded and a checkpoint of at least that many exists."""
    batches = run_dir / "batches.jsonl"
    recorded = len(batches.read_text().splitlines()) if batches.exists() else 0
    saved = [checkpoint_step(c) for c in list_checkpoints(run_dir)] if recorded else []
    return recorded >= steps and max(saved, default=0) >= steps


def assert_recovered(run_dir: Path, steps: int, err: str, *, exact: bool = True) -> None:
    """The run trained steps 1 to ``steps`` (or more, unless ``exact``) once each, on groups none of
    which was trained twice, with one engine restart, and every step's tokens came from exactly the
    weights trained (version and log-probs)."""
    steps_logged = [m for m in read_metrics(run_dir) if "train/loss" in m]
    done = steps if exact else max(steps, len(steps_logged))
    assert [int(m["step"]) for m in steps_logged] == list(range(1, done + 1)), err[-3000:]
    assert steps_logged[-1]["fault/engine_restarts"] == 1.0
    assert steps_logged[0]["fault/engine_restarts"] == 0.0
    print(f"engine restart took {steps_logged[-1]['fault/engine_seconds_lost']:.1f} s")
    for m in steps_logged:  # after the restart as before: the engine serves the trainer's weights
        assert m["train/engine_logprob_gap"] <= 1e-4, m
        assert m["train/staleness_max"] == 0.0 and m["train/policy_version"] == m["step"], m
    groups = [g for line in (run_dir / "batches.jsonl").read_text().splitlines() for g in json.loads(line)["groups"]]
    assert len(groups) == len(set(groups)) == 2 * done, groups


@pytest.mark.e2e
def test_a_killed_engine_core_is_replaced_and_one_death_too_many_ends_agentrl_train_with_one_clear_message(
    tiny_model_dir, tmp_path
):
    # One run for what two runs checked the same way: the engine core killed once step 2 is saved is
    # replaced and training goes on exactly on-policy; killed again once step 4 is, past
    # max_engine_restarts=1, it ends the run with one message (max_engine_restarts=0, which keeps
    # no copy of the weights, is tests/test_supervisor.py's).
    run_dir = tmp_path / "run"
    command = tiny_train_command(tiny_model_dir, run_dir, "steps=200", "max_engine_restarts=1")
    code, out, err = run_and_kill(command, run_dir, "EngineCore", after_steps=(2, 4))
    assert code == 1, err[-3000:]
    assert_recovered(run_dir, 4, err, exact=False)
    assert re.search(r"Training stopped after step [4-6]: the inference engine died \(EngineDeadError", err), err[
        -3000:
    ]
    assert (
        "max_engine_restarts=1 allows no more new engines" in err
        and "resume=true" in err
        and str(run_dir / RUN_LOG) in err
    )
    assert "Traceback" not in out + err.split("Training stopped")[-1]
    log = (run_dir / RUN_LOG).read_text()
    assert "EngineDeadError" in log and "Traceback (most recent call last)" in log  # vLLM's account, off the screen


@pytest.mark.ray
def test_a_killed_ray_policy_actor_and_env_worker_are_replaced_and_the_run_finishes(
    ray_cluster, tiny_model_dir, tmp_path
):
    # One run on the session's cluster, two faults (each was once a run of its own): the policy
    # actor's process is SIGKILLed once step 2 is saved, an env worker's once step 3 is.
    import ray

    from agentrl.config import load_config
    from agentrl.train import Progress, TrainConfig, train

    address, _ = ray_cluster
    run_dir = tmp_path / "run"
    command = tiny_train_command(
        tiny_model_dir, run_dir, "steps=5", "rollout.backend=hf", f"rollout.ray_address={address}"
    )
    config = load_config(TrainConfig, ROOT / command[4], command[5:])
    killed: list[int] = []

    def pid_of(victim: str) -> int:
        if victim == "PolicyActor":  # this run's, by its name
            (name,) = [n for n in ray.util.list_named_actors() if n.startswith("agentrl-policy-")]
            return ray.get(ray.get_actor(name).location.remote(), timeout=60).pid
        workers = [p for p in psutil.process_iter(["cmdline"]) if " ".join(p.info["cmdline"] or []).startswith("ray::EnvWorker")]  # fmt: skip
        assert workers, "no env worker process found"
        return workers[0].pid

    def kill(info: dict) -> None:
        if info and len(killed) < 2 and _steps_saved(run_dir, 2 + len(killed)):
            os.kill(pid_of(("PolicyActor", "EnvWorker")[len(killed)]), signal.SIGKILL)
            killed.append(1)

    result = train(config, Progress(on_advance=kill))
    assert len(killed) == 2 and result.steps == 5
    assert_recovered(run_dir, 5, "")  # the policy actor: one restart, on-policy after it, no group twice
    steps_logged = [m for m in read_metrics(run_dir) if "train/loss" in m]
    assert steps_logged[-1]["fault/env_workers_replaced"] >= 1.0


@pytest.mark.e2e
def test_a_killed_shared_lora_engine_of_a_multi_policy_run_is_replaced_and_it_finishes(tiny_model_dir, tmp_path):
    # Both policies are LoRA adapters on the one shared engine, killed once step 2 is saved: it comes
    # back with each adapter made again at its current version. (A full-weight policy's engine of its
    # own is the same EngineSupervisor in a run of one lane or of several: the single-policy kill test
    # above; an engine of its own here would only add an engine start.)
    run_dir = tmp_path / "run"
    policies = json.dumps({"sayer_a": {"weights": "lora"}, "sayer_b": {"weights": "lora"}})
    command = [sys.executable, "-m", "agentrl.cli", "train", "imports=[multi_env]", "rollout.env_id=tests/SayLetters-v0",
               f"rollout.model={tiny_model_dir}", "rollout.backend=vllm", "rollout.group_size=4", "rollout.max_tokens=8",
               "rollout.max_length=256", "rollout.max_turns=2", "mapping=individual", f"policies={policies}",
               "groups_per_step=2", "steps=4", "max_staleness=0", "eval_episodes=0", "checkpoint_every=1",
               "export=false", "torch_threads=1", f"run_dir={run_dir}"]  # fmt: skip
    tests = str(Path(__file__).parent)
    os.environ["PYTHONPATH"] = os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])
    try:
        code, out, err = run_and_kill(command, run_dir, "EngineCore", first_only=True)
    finally:
        os.environ["PYTHONPATH"] = os.environ["PYTHONPATH"].split(os.pathsep, 1)[1]
    assert code == 0, err[-3000:]
    metrics = read_metrics(run_dir)
    restarts = {p: max(m.get(f"fault/{p}/engine_restarts", 0.0) for m in metrics) for p in ("sayer_a", "sayer_b")}
    assert restarts == {"sayer_a": 1.0, "sayer_b": 1.0}, restarts  # the shared engine came back once
    for policy in ("sayer_a", "sayer_b"):
        steps = [m for m in metrics if f"train/{policy}/loss" in m]
        assert [int(m["step"]) for m in steps] == [1, 2, 3, 4], err[-3000:]
        assert all(m[f"train/{policy}/staleness_max"] == 0.0 for m in steps)
        # before the kill as after: each adapter on the engine serves exactly its trainer's weights
        assert all(m[f"train/{policy}/engine_logprob_gap"] <= 1e-4 for m in steps), [
            m[f"train/{policy}/engine_logprob_gap"] for m in steps
        ]
        groups = [g for line in (run_dir / "batches.jsonl").read_text().splitlines()
                  for g in json.loads(line)["groups"] if json.loads(line)["policy"] == policy]  # fmt: skip
        assert len(groups) == len(set(groups)) == 8, groups
    # the weights probe ran at each policy's first step after the restart: the new engine serves
    # each adapter the trainer sent
    for policy in ("sayer_a", "sayer_b"):
        probes = [m[f"fault/{policy}/adapter_probe_gap"] for m in metrics if f"fault/{policy}/adapter_probe_gap" in m]
        assert probes and max(probes) <= 1e-3, probes
    # the end of the run says what it survived
    assert re.search(r"inference engines replaced\s*│?\s*sayer_a 1, sayer_b 1", out), out[-2000:]


@pytest.mark.e2e
def test_sigterm_ends_agentrl_train_with_its_engine_processes_and_keeps_its_checkpoint(tiny_model_dir, tmp_path):
    # A scheduler's kill (SIGTERM) runs every finally, as Ctrl-C does: the vLLM engine's processes go
    # with the command instead of living on, the exit code is 143, and the checkpoints written stay.
    run_dir = tmp_path / "run"
    command = tiny_train_command(tiny_model_dir, run_dir, "steps=200")
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not _steps_saved(run_dir, 1):
            assert process.poll() is None, process.stderr.read()[-3000:] if process.stderr else ""
            time.sleep(0.2)
        children = psutil.Process(process.pid).children(recursive=True)
        assert any("EngineCore" in " ".join(p.cmdline()) for p in children), [p.cmdline() for p in children]
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143, err[-3000:]
    assert "terminated (SIGTERM)" in err
    _, alive = psutil.wait_procs([p for p in children if p.is_running()], timeout=30)
    assert not alive, [p.cmdline() for p in alive]
    assert list_checkpoints(run_dir)  # resuming from it is the SIGKILL tests' part
