"""The whole loop: rollouts on the real vLLM engine, training, weights back to the engine; sync and
async; the trained weights reach vLLM exactly; the exported model loads; kill -9 and resume."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import learnable_env
import pytest
import torch

from agentrl.config import load_config
from agentrl.metrics import read_metrics
from agentrl.policies import Sampling
from agentrl.rollout import group_name
from agentrl.train import TrainConfig, train
from agentrl.trainers import Trainer, TrainerConfig, generated_logprobs, load_policy_model
from agentrl.types import Trajectory

HERE = Path(__file__).parent


def _config(model_dir, run_dir, *overrides: str) -> TrainConfig:
    return load_config(
        TrainConfig,
        None,
        [
            f"rollout.env_id={learnable_env.ENV_ID}",
            f"rollout.model={model_dir}",
            "rollout.backend=vllm",
            "rollout.group_size=8",
            "rollout.max_tokens=8",
            "rollout.max_length=256",
            "trainer.lr=1e-2",
            "trainer.micro_batch_size=16",
            "groups_per_step=4",
            "steps=12",
            "eval_episodes=32",
            "checkpoint_every=0",
            "torch_threads=1",
            f"run_dir={run_dir}",
            *overrides,
        ],
    )


@pytest.fixture
def engine(vllm_engine):
    """The session's vLLM engine on the tiny model (train() gives it the trainer's starting weights)."""
    return vllm_engine


def _learned(run_dir: Path) -> tuple[float, float]:
    rewards = [m["rollout/reward_mean"] for m in read_metrics(run_dir) if "rollout/reward_mean" in m]
    return sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3


@pytest.mark.engine
@pytest.mark.parametrize("staleness", [0, 1], ids=["sync", "async"])
def test_training_on_vllm_learns(engine, tiny_model_dir, tmp_path, staleness):
    from transformers import AutoModelForCausalLM

    config = _config(tiny_model_dir, tmp_path / "run", f"max_staleness={staleness}")
    result = train(config, policy=engine)

    assert result.steps == 12
    first, last = _learned(result.run_dir)
    assert last > first + 0.05, f"reward did not go up: first steps {first:.3f}, last steps {last:.3f}"
    assert result.eval_after["eval/reward_mean"] > result.eval_before["eval/reward_mean"]
    versions = [m["train/policy_version"] for m in read_metrics(result.run_dir) if "train/policy_version" in m]
    assert versions == sorted(versions) and len(set(versions)) == 12
    staleness_max = max(m.get("train/staleness_max", 0) for m in read_metrics(result.run_dir))
    assert staleness_max == 0 if staleness == 0 else staleness_max <= 1
    # The default correction (auto) applies exactly to the steps that trained stale tokens; the
    # tokens sampled by the weights being trained score as the engine scored them.
    steps = [m for m in read_metrics(result.run_dir) if "train/corrected" in m]
    assert [m["train/corrected"] for m in steps] == [float(m["train/stale_token_fraction"] > 0) for m in steps]
    assert any(m["train/corrected"] for m in steps) == (staleness > 0)
    assert all(m["train/engine_logprob_gap"] < 1e-4 for m in steps if "train/engine_logprob_gap" in m)
    assert (result.run_dir / "curves.png").stat().st_size > 10_000

    # the exported model is the trained one, and transformers loads it
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trained = AutoModelForCausalLM.from_pretrained(result.model_dir)
    changed = [n for n, t in start.state_dict().items() if not torch.equal(t, trained.state_dict()[n])]
    assert changed, "no parameter changed"


@pytest.mark.engine
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vllm_serves_exactly_the_trained_weights(engine, tiny_model_dir, tmp_path, temperature):
    model = load_policy_model(tiny_model_dir)
    trainer = Trainer(model, TrainerConfig(lr=1e-2, micro_batch_size=8, temperature=temperature), pad_token_id=0)
    engine.update_weights(trainer.inference_weights())
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say aa"}], add_generation_prompt=True, tokenize=True, return_dict=False
    )

    def play() -> list[Trajectory]:
        out = []
        for seed in range(8):
            sampling = Sampling(max_tokens=12, seed=seed, temperature=temperature)
            generation = asyncio.run(engine.generate(prompt, sampling))
            n = len(generation.token_ids)
            out.append(
                Trajectory(
                    token_ids=list(prompt) + list(generation.token_ids),
                    loss_mask=[0] * len(prompt) + [1] * n,
                    logprobs=[0.0] * len(prompt) + list(generation.logprobs),
                    versions=[-1] * len(prompt) + [generation.version] * n,
                    prompt_length=len(prompt),
                    turn_ends=[len(prompt) + n - 1],
                    turn_rewards=[float(seed % 2)],
                    reward=float(seed % 2),
                    group_id="g",
                )
            )
        return out

    trainer.step(play())
    engine.update_weights(trainer.inference_weights())
    for trajectory in play():  # generated by the updated engine
        ids = torch.tensor([trajectory.token_ids])
        mask = torch.tensor([trajectory.loss_mask], dtype=torch.float32)
        with torch.no_grad():
            mine = generated_logprobs(model, ids, torch.ones_like(ids), mask, temperature=temperature).logprobs[0]
        theirs = torch.tensor(trajectory.logprobs)
        gap = ((mine - theirs).abs() * mask[0]).max().item()
        assert gap < 1e-4, f"vLLM and the trainer disagree by {gap:.2e} nats after a sync"


# --- kill -9 and resume ----------------------------------------------------------------------------


def _start(config_path: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "train", str(config_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.mark.e2e
def test_kill_9_and_resume_loses_and_repeats_no_batch(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    config = {
        "rollout": {
            "env_id": learnable_env.ENV_ID,
            "model": str(tiny_model_dir),
            "backend": "hf",
            "group_size": 4,
            "max_tokens": 6,
            "max_length": 256,
        },
        "trainer": {"lr": 1e-2, "micro_batch_size": 8},
        "steps": 10,
        "groups_per_step": 2,
        "max_staleness": 1,
        "eval_episodes": 0,
        "checkpoint_every": 2,
        "keep_checkpoints": 10,
        "export": False,
        "torch_threads": 1,
        "run_dir": str(run_dir),
        "imports": ["learnable_env"],
    }
    config_path = tmp_path / "train.yaml"
    config_path.write_text(json.dumps(config))  # JSON is YAML

    process = _start(config_path)
    deadline = time.monotonic() + 300
    ledger = run_dir / "batches.jsonl"
    while time.monotonic() < deadline and process.poll() is None:  # kill just after step 5 trained
        if ledger.exists() and len(ledger.read_text().splitlines()) >= 5:
            break
        time.sleep(0.05)
    assert process.poll() is None, process.stdout.read().decode()[-3000:]
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    before_kill = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
    checkpoints = sorted((run_dir / "checkpoints").glob("step-*"))
    assert checkpoints, "no checkpoint before the kill"
    resumed_from = int(checkpoints[-1].name.split("-")[1])
    state = json.loads((checkpoints[-1] / "controller.json").read_text())
    controller = {**state, **state["lanes"]["default"]}  # the run and its one lane
    buffered = {
        json.loads(line)["group_id"]
        for line in (checkpoints[-1] / "buffer.jsonl").read_text().splitlines()
        if line.strip()
    }
    assert len(before_kill) >= 5 > resumed_from - 1

    process = _start(config_path)
    output = process.communicate(timeout=600)[0].decode()
    assert process.returncode == 0, output[-3000:]

    records = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
    history: dict[int, list[int]] = {}
    for record in records:  # a step re-done after the resume replaces its record
        history[record["step"]] = record["groups"]
    assert sorted(history) == list(range(1, 11))
    used = [g for step in sorted(history) for g in history[step]]
    assert len(used) == len(set(used)) == 20, f"a group was trained on twice: {used}"
    # the steps up to the checkpoint are the ones the checkpoint says it trained
    assert [g for step in range(1, resumed_from + 1) for g in history[step]] == controller["trained_groups"]
    # groups waiting in the buffer at the checkpoint were trained on after the resume, not lost
    number = {group_name(learnable_env.ENV_ID, 0, n): n for n in range(controller["next_group"])}
    after = {g for step in range(resumed_from + 1, 11) for g in history[step]}
    assert {number[name] for name in buffered} <= after
    metrics = read_metrics(run_dir)
    assert max(m["step"] for m in metrics) == 10


@pytest.mark.ray
def test_training_with_the_engine_as_a_ray_actor(ray_cluster, tiny_model_dir, tmp_path, monkeypatch):
    # The env workers import the module that registers the test env (imports:); Ray's processes
    # inherit PYTHONPATH from this one.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    config = _config(
        tiny_model_dir,
        tmp_path / "run",
        "rollout.backend=hf",
        "rollout.ray_address=local",
        "imports=[learnable_env]",
        "steps=3",
        "eval_episodes=0",
        "export=false",
    )
    result = train(config)
    versions = [m["train/policy_version"] for m in read_metrics(result.run_dir) if "train/policy_version" in m]
    assert versions == [1.0, 2.0, 3.0]  # each update reached the actor, which counted it
    behaviour = [m["train/behaviour_version_min"] for m in read_metrics(result.run_dir) if "train/policy_version" in m]
    assert behaviour == [0.0, 1.0, 2.0]  # and the next batch was generated by the new weights
