"""Several policies trained in one job (agentrl.train, one lane per policy), fast: the tiny model on the hf backend.

A two-agent env where each agent's reward depends only on its own reply (tests/multi_env.py): both
policies train on their own agent's trajectories, async and in lockstep; a frozen policy's weights
stay bitwise equal; ``all`` trains one policy on both agents' turns; stages say who trains when; a
resumed run (and one killed with SIGKILL) trains no group twice for any policy; config errors are
caught before an engine starts. LoRA adapters served on one engine are in
tests/test_lora_serving.py; the same loop on vLLM is marked slow here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import multi_env  # noqa: E402  (registers tests/SayLetters-v0)

from agentrl.config import ConfigError, load_config  # noqa: E402
from agentrl.dashboard import read_trajectories, sample_files  # noqa: E402
from agentrl.metrics import read_metrics  # noqa: E402
from agentrl.train import TrainConfig, train  # noqa: E402
from agentrl.train.serving import Serving  # noqa: E402

POLICIES = ("sayer_a", "sayer_b")


def _config(model_dir: Path, run_dir: Path, *overrides: str, policies: dict[str, Any] | None = None) -> TrainConfig:
    config = load_config(
        TrainConfig,
        None,
        [
            f"rollout.env_id={multi_env.ENV_ID}",
            f"rollout.model={model_dir}",
            "rollout.backend=hf",
            "rollout.group_size=4",
            "rollout.max_tokens=8",
            "rollout.max_length=256",
            "rollout.max_turns=2",
            "trainer.lr=1e-2",
            "trainer.micro_batch_size=8",
            "mapping=individual",
            "groups_per_step=2",
            "steps=3",
            "eval_episodes=0",
            "checkpoint_every=0",
            "export=false",
            "torch_threads=1",
            f"run_dir={run_dir}",
            *([f"policies={json.dumps(policies)}"] if policies is not None else []),
            *overrides,
        ],
    )
    return config


FULL = {p: {"weights": "full"} for p in POLICIES}


def _steps(run_dir: Path, policy: str | None) -> list[dict[str, float]]:
    """The step records of ``policy`` (None: of a run of one policy, whose names are unprefixed)."""
    name = "train/policy_version" if policy is None else f"train/{policy}/policy_version"
    return [m for m in read_metrics(run_dir) if name in m]


def _batches(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]


def _rose(rewards: list[float]) -> bool:
    return sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2


def test_tail_batching_trains_every_policy_on_each_rounds_first_groups(tiny_model_dir, tmp_path):
    # "Say aaa" episodes take 0.4 s a step: short rounds abort them, long rounds play them whole.
    slow = 'rollout.env_kwargs={"slow": 0.4}'
    options = ["tail_batching=true", "tail_extra=1.0", "max_staleness=0", "steps=6", "checkpoint_every=6", slow]
    result = train(_config(tiny_model_dir, tmp_path / "run", *options, policies=FULL))

    assert result.steps == 12
    for policy in POLICIES:
        steps = _steps(result.run_dir, policy)
        assert [m[f"train/{policy}/policy_version"] for m in steps] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        assert all(m[f"train/{policy}/staleness_max"] == 0 for m in steps)  # on-policy, each of them
        assert any(m[f"train/{policy}/tail_long_round"] == 1.0 for m in steps)
        assert sum(m[f"train/{policy}/tail_aborted_groups"] for m in steps) >= 2
    by_policy: dict[str, dict[int, list[int]]] = {p: {} for p in POLICIES}
    for record in _batches(result.run_dir):
        by_policy[record["policy"]][record["step"]] = record["groups"]
    a, b = (by_policy[p] for p in POLICIES)
    assert sorted(a) == sorted(b) == list(range(1, 7))
    assert all(sorted(a[step]) == sorted(b[step]) for step in a)  # one round, the same first groups for both
    trained = [g for step in sorted(a) for g in a[step]]
    assert len(trained) == len(set(trained)) == 12  # no group twice
    state = json.loads(sorted((result.run_dir / "checkpoints").glob("*/controller.json"))[-1].read_text())
    assert not set(state["tail_queue"]) & set(trained)


@pytest.mark.parametrize("lockstep", [False, True])
def test_both_policies_train_asynchronously_and_in_lockstep(tiny_model_dir, tmp_path, lockstep):
    # (Whether rewards rise within a few steps of the random tiny model is too noisy to assert; the
    # learning evidence is examples/negotiation.yaml on SmolLM2, see the README.)
    config = _config(
        tiny_model_dir,
        tmp_path / "run",
        "steps=4",
        "max_staleness=1",
        f"lockstep={lockstep}",
        "export=true",
        policies=FULL,
    )
    result = train(config)

    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    trained = {}
    assert result.policies == list(POLICIES) and result.steps == 8
    for policy in POLICIES:
        steps = _steps(result.run_dir, policy)
        assert [m[f"train/{policy}/policy_version"] for m in steps] == [1.0, 2.0, 3.0, 4.0]
        assert max(m[f"train/{policy}/staleness_max"] for m in steps) <= 1
        # its batches hold only its own agent's trajectories: 2 groups x 4 episodes, one each
        assert all(m[f"train/{policy}/trajectories"] == 8 for m in steps)
        trained[policy] = AutoModelForCausalLM.from_pretrained(result.run_dir / "model" / policy).state_dict()
        assert any(not torch.equal(base[k], trained[policy][k]) for k in base), f"{policy} did not change"
    a, b = (trained[p] for p in POLICIES)
    assert any(not torch.equal(a[k], b[k]) for k in a)  # two trainers, two different updates
    for record in _batches(result.run_dir):
        assert record["policy"] in POLICIES and len(record["groups"]) == 2
    # the dashboard's samples: one group per step of each policy, only that policy's agent
    kinds = {(kind, step) for kind, step, _ in sample_files(result.run_dir)}
    assert kinds == {(f"train.{p}", s) for p in POLICIES for s in range(1, 5)}
    for kind, _, path in sample_files(result.run_dir):
        records = read_trajectories(path)
        assert {r["policy_id"] for r in records} == {kind.removeprefix("train.")} and len(records) == 4
        assert all(len(r["advantages"]) == len(r["token_ids"]) for r in records)


def test_a_frozen_policy_keeps_its_weights_bitwise(tiny_model_dir, tmp_path, monkeypatch):
    served = {}
    serve = Serving.serve

    def spy(self, policy_id, trainer):  # the engine-side policy of each id, to read its weights after
        served[policy_id] = serve(self, policy_id, trainer)
        return served[policy_id]

    monkeypatch.setattr(Serving, "serve", spy)
    policies = {"sayer_a": {"weights": "full"}, "sayer_b": {"weights": "full", "trainable": False}}
    result = train(_config(tiny_model_dir, tmp_path / "run", "export=true", policies=policies))

    assert len(_steps(result.run_dir, "sayer_a")) == 3 and _steps(result.run_dir, "sayer_b") == []
    assert not (result.run_dir / "model" / "sayer_b").exists()
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    frozen = served["sayer_b"].policy.model.state_dict()  # the engine inside its EngineSupervisor
    assert served["sayer_b"].version == 0 and all(torch.equal(base[k], frozen[k]) for k in base)
    trained = AutoModelForCausalLM.from_pretrained(result.run_dir / "model" / "sayer_a").state_dict()
    assert any(not torch.equal(base[k], trained[k]) for k in base), "the trained policy did not change"


def test_all_trains_one_shared_policy_on_both_agents_turns(tiny_model_dir, tmp_path):
    config = _config(tiny_model_dir, tmp_path / "run", "mapping=all", policies={"default": {"weights": "full"}})
    result = train(config)

    steps = _steps(result.run_dir, None)  # one policy: one lane, whose names are unprefixed
    assert result.policies == [] and len(steps) == 3
    # each group holds both agents' trajectories of its 4 episodes: 2 groups x 4 episodes x 2 agents
    assert all(m["train/trajectories"] == 16 for m in steps)


def test_stages_train_the_named_policies_in_order(tiny_model_dir, tmp_path):
    stages = [{"steps": 2, "train": ["sayer_a"]}, {"steps": 1, "lr": {"sayer_b": 0.0}}]
    config = _config(tiny_model_dir, tmp_path / "run", f"stages={json.dumps(stages)}", policies=FULL)
    result = train(config)

    a, b = _steps(result.run_dir, "sayer_a"), _steps(result.run_dir, "sayer_b")
    assert [m["train/sayer_a/stage"] for m in a] == [0.0, 0.0, 1.0] and [m["train/sayer_b/stage"] for m in b] == [1.0]
    assert b[0]["train/sayer_b/lr"] == 0.0 and a[0]["train/sayer_a/lr"] == pytest.approx(1e-2)


@pytest.mark.timeout(180)
def test_a_policy_training_in_two_stages_does_not_wait_for_groups_its_first_stage_abandoned(tiny_model_dir, tmp_path):
    # Generation runs ahead (max_staleness), so groups are still being played when stage 1 ends;
    # they are abandoned, and sayer_a must not wait for them in stage 2 (it once did, forever).
    stages = [{"steps": 1, "train": ["sayer_a"]}, {"steps": 2}]
    config = _config(
        tiny_model_dir, tmp_path / "run", f"stages={json.dumps(stages)}", "max_staleness=3", "rollout.concurrency=64",
        policies=FULL,
    )  # fmt: skip
    result = train(config)

    assert [m["train/sayer_a/stage"] for m in _steps(result.run_dir, "sayer_a")] == [0.0, 1.0, 1.0]
    assert len(_steps(result.run_dir, "sayer_b")) == 2


def test_a_resumed_run_trains_no_group_twice_for_any_policy(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    common = ("max_staleness=1", "checkpoint_every=1", "resume=true")
    train(_config(tiny_model_dir, run_dir, "steps=2", *common, policies=FULL))
    result = train(_config(tiny_model_dir, run_dir, "steps=4", *common, policies=FULL))

    assert result.steps == 8
    for policy in POLICIES:
        by_step = {b["step"]: b["groups"] for b in _batches(run_dir) if b["policy"] == policy}
        trained = [g for step in sorted(by_step) for g in by_step[step]]
        assert sorted(by_step) == [1, 2, 3, 4] and len(trained) == len(set(trained)) == 8, by_step
        versions = [m[f"train/{policy}/policy_version"] for m in _steps(run_dir, policy)]
        assert versions == sorted(versions) and len(set(versions)) == 4, versions


def test_a_fault_in_a_policys_weight_sync_after_a_checkpointed_step_does_not_cost_the_step(
    tiny_model_dir, tmp_path, monkeypatch
):
    from agentrl.policies.hf import HFPolicy

    run_dir = tmp_path / "run"
    common = ("max_staleness=0", "checkpoint_every=2", "resume=true")
    real_update, calls = HFPolicy.aupdate_weights, {}

    async def dies_at_the_second_update(self, named_tensors):
        calls[id(self)] = calls.get(id(self), 0) + 1
        if calls[id(self)] == 2:  # the first policy to finish its step 2, which checkpoint_every=2 saves
            raise RuntimeError("the engine died during the weight sync")
        return await real_update(self, named_tensors)

    monkeypatch.setattr(HFPolicy, "aupdate_weights", dies_at_the_second_update)
    with pytest.raises(RuntimeError, match="during the weight sync"):
        train(_config(tiny_model_dir, run_dir, "steps=3", *common, policies=FULL))
    state = json.loads(sorted((run_dir / "checkpoints").iterdir())[-1].joinpath("controller.json").read_text())
    saved = {policy: lane["step"] for policy, lane in state["lanes"].items()}
    assert 2 in saved.values(), saved  # the step whose sync failed is in the checkpoint

    monkeypatch.setattr(HFPolicy, "aupdate_weights", real_update)
    result = train(_config(tiny_model_dir, run_dir, "steps=3", *common, policies=FULL))
    assert result.steps == 6
    for policy in POLICIES:
        by_step = {b["step"]: b["groups"] for b in _batches(run_dir) if b["policy"] == policy}
        trained = [g for step in sorted(by_step) for g in by_step[step]]
        assert sorted(by_step) == [1, 2, 3] and len(trained) == len(set(trained)) == 6, by_step
        if saved[policy] == 2:  # not re-done after the resume
            assert [b["step"] for b in _batches(run_dir) if b["policy"] == policy] == [1, 2, 3]


def test_reward_samples_and_metrics_hooks_shape_what_each_policy_trains_on_and_reports(
    tiny_model_dir, tmp_path, caplog
):
    config = _config(
        tiny_model_dir,
        tmp_path / "run",
        "steps=2",
        "reward_fn=multi_env:reward_other",
        "samples_fn=multi_env:first_turn_only",
        "metrics_fn=multi_env:count_report",
        "metrics_args={scale: 0.5}",
        policies=FULL,
    )
    result = train(config)
    for policy in POLICIES:
        steps = _steps(result.run_dir, policy)
        assert [m[f"rollout/{policy}/turns_mean"] for m in steps] == [1.0, 1.0]  # cut to its first turn by samples_fn
    # metrics_fn's report, under env/<env id>/<policy>/: 2 groups of 4 samples a step, times scale
    a = [m for m in read_metrics(result.run_dir) if "train/sayer_a/loss" in m]
    family = f"env/{multi_env.ENV_ID}/sayer_a/batch"
    assert [(m[f"{family}/samples"], m[f"{family}/previous"]) for m in a] == [(4.0, 0.0), (4.0, 1.0)]
    # sayer_b's second report was no number: that report is skipped with a warning, the step is not
    b = [m for m in read_metrics(result.run_dir) if "train/sayer_b/loss" in m]
    assert len(b) == 2 and f"env/{multi_env.ENV_ID}/sayer_b/batch/samples" in b[0]
    assert not any(name.startswith(f"env/{multi_env.ENV_ID}/sayer_b/") for name in b[1])
    assert "metrics_fn failed on a step of policy sayer_b" in caplog.text


def test_the_filter_curriculum_drops_each_policys_own_groups_of_equal_rewards(tiny_model_dir, tmp_path):
    config = _config(
        tiny_model_dir, tmp_path / "run", "reward_fn=multi_env:flat_for_sayer_a", "curriculum.selection=filter",
        "curriculum.max_filtered=2", "checkpoint_every=3", "steps=2", policies=FULL,
    )  # fmt: skip
    result = train(config)

    a, b = _steps(result.run_dir, "sayer_a"), _steps(result.run_dir, "sayer_b")
    assert len(a) == len(b) == 2
    # every sayer_a group had equal rewards: each step dropped max_filtered of them, then took what came
    dropped = [m["train/sayer_a/filtered_groups"] for m in a]
    assert dropped == [2.0, 2.0], dropped
    assert all(m["train/sayer_a/reward_mean"] == 1.0 for m in a)
    state = json.loads(sorted((result.run_dir / "checkpoints").iterdir())[-1].joinpath("controller.json").read_text())
    filtered = state["lanes"]["sayer_a"]["filtered_groups"]
    assert len(filtered) == sum(dropped) and not set(filtered) & set(state["lanes"]["sayer_a"]["trained_groups"])
    # sayer_b's groups are its own: filtered only where its own rewards were all equal
    assert len(state["lanes"]["sayer_b"]["filtered_groups"]) == sum(m["train/sayer_b/filtered_groups"] for m in b)


def test_two_policies_train_on_a_multi_agent_env_served_by_agentrl_serve(tiny_model_dir, tmp_path):
    import httpx

    from agentrl.server import ServerThread, make_app

    with ServerThread(make_app([multi_env.ENV_ID])) as url:  # what `agentrl serve` runs, on loopback
        config = _config(
            tiny_model_dir, tmp_path / "run", f"rollout.env_url={url}", "steps=2", "eval_episodes=2", policies=FULL
        )
        result = train(config)
        served = httpx.get(f"{url}/metrics").text

    for policy in POLICIES:
        steps = _steps(result.run_dir, policy)
        assert len(steps) == 2 and sum(m[f"rollout/{policy}/failed"] for m in steps) == 0
        assert all(m[f"rollout/{policy}/turns_mean"] == 2.0 for m in steps)  # both rounds, played on the server
        assert result.eval_after is not None and result.eval_after[f"eval/{policy}/episodes"] == 2
    steps = [line for line in served.splitlines() if line.startswith("agentrl_server_steps_total{")]
    # 2 steps x 2 groups x 4 episodes x 2 rounds, at least (the evaluations and any group run ahead besides)
    assert steps and float(steps[0].split()[-1]) >= 32, steps


@pytest.mark.parametrize(
    ("overrides", "policies", "message"),
    [
        ((), {"sayer_a": {}}, "gives agent 'sayer_b' policy 'sayer_b', which has no entry"),
        (("mapping=all",), {"default": {}, "sayer_a": {}}, "policies.sayer_a is played by no agent"),
        (("mapping=individul",), FULL, "Did you mean 'individual'"),
        ((), {"sayer_a": {"model": "elsewhere"}, "sayer_b": {}}, "adapters need the engine's base"),
        (("rollout.backend=openai",), FULL, "engine that takes new weights"),
        (("reward_fn=multi_env:nope",), FULL, "reward_fn: cannot load 'multi_env:nope'"),
    ],
)
def test_a_bad_multi_policy_config_fails_before_any_engine_starts(
    tiny_model_dir, tmp_path, overrides, policies, message
):
    with pytest.raises(ConfigError, match=message):
        train(_config(tiny_model_dir, tmp_path / "run", *overrides, policies=policies))


@pytest.mark.parametrize(
    ("policies", "message"),
    [
        ({"sayer_a": {"trainer": {"lrr": 1}}, "sayer_b": {}}, "Unknown field 'lrr'"),
        ({"sayer_a": {"init_from": "sayer_c"}, "sayer_b": {}}, "init_from names 'sayer_c'"),
        ({"sayer_a": {"init_from": "sayer_b", "weights": "full"}, "sayer_b": {}}, "same kind"),
    ],
)
def test_policy_settings_are_checked_when_the_config_loads(tiny_model_dir, tmp_path, policies, message):
    with pytest.raises(ValueError, match=message):
        _config(tiny_model_dir, tmp_path / "run", policies=policies)


def test_lora_policies_on_one_hf_model_train_their_own_adapters(tiny_model_dir, tmp_path):
    # (The tiny random model's logits are near uniform and LoRA on its projections barely moves them:
    # rewards rising is shown with full weights above and with SmolLM2 in examples/negotiation.yaml.)
    config = _config(
        tiny_model_dir,
        tmp_path / "run",
        "trainer.lr=5e-2",
        "trainer.lora_rank=8",
        "export=true",
        "eval_episodes=8",
        "eval_against_base=true",
    )
    result = train(config)  # no policies: one LoRA policy per id the mapping gives

    from safetensors.torch import load_file

    adapters = {}
    for policy in POLICIES:
        steps = _steps(result.run_dir, policy)
        assert [m[f"train/{policy}/policy_version"] for m in steps] == [1.0, 2.0, 3.0]
        # on-policy: the host served each policy's adapter version the trainer scores
        assert max(m[f"train/{policy}/engine_logprob_gap"] for m in steps) < 1e-4
        adapters[policy] = load_file(result.run_dir / "model" / policy / "adapter_model.safetensors")
        assert any(t.abs().sum() > 0 for n, t in adapters[policy].items() if "lora_B" in n)  # B starts at 0
        for name in ("success_rate", "reward_mean", "vs_base_success_rate", "vs_base_reward_mean"):
            assert f"eval/{policy}/{name}" in result.eval_after
    a, b = (adapters[p] for p in POLICIES)
    assert any(not torch.equal(a[n], b[n]) for n in a if "lora_B" in n)  # each trained on its own agent
    assert result.eval_before is not None and "eval/sayer_a/vs_base_reward_mean" not in result.eval_before


@pytest.mark.engine
def test_lora_policies_on_one_vllm_engine_train_with_the_engines_logprobs(vllm_engine, tiny_model_dir, tmp_path):
    config = _config(
        tiny_model_dir,
        tmp_path / "run",
        "rollout.backend=vllm",
        "rollout.max_length=512",
        "steps=3",
        "max_staleness=0",
        "trainer.lr=5e-2",
        "trainer.lora_rank=8",
    )
    result = train(config, policy=vllm_engine)  # the session's engine serves both adapters

    for policy in POLICIES:
        steps = _steps(result.run_dir, policy)
        assert [m[f"train/{policy}/policy_version"] for m in steps] == [1.0, 2.0, 3.0]
        # on-policy: the engine sampled with the adapter version the trainer scores, token for token
        gaps = [m[f"train/{policy}/engine_logprob_gap"] for m in steps]
        assert max(gaps) < 1e-3, gaps


@pytest.mark.engine
def test_a_full_weight_policy_on_vllm_sends_step_ones_changes_alone_and_the_engine_keeps_up(
    tiny_model_dir, tmp_path, monkeypatch
):
    # An engine of its own, started by the run: what is checked is that the run tells its own engine
    # it serves the starting weights (a lent engine is sent them instead).
    from agentrl.policies.vllm import VLLMPolicy

    sent: list[int] = []  # bytes each update sent the engine
    updated = VLLMPolicy._updated

    def spy(self, changed, held):
        version = updated(self, changed, held)
        sent.append(self.sent_bytes)
        return version

    monkeypatch.setattr(VLLMPolicy, "_updated", spy)
    config = _config(
        tiny_model_dir,
        tmp_path / "run",
        "rollout.backend=vllm",
        "rollout.max_length=512",
        "mapping=all",
        "steps=2",
        "max_staleness=0",
        "trainer.trainable_layers=1",
        policies={"default": {"weights": "full"}},
    )
    result = train(config)

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    whole = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    top = sum(t.numel() * t.element_size() for t in model.model.layers[-1].state_dict().values())
    # the engine was told it serves the starting weights, so step 1 sent only the trained top layer
    assert len(sent) == 2 and all(0 < n <= top + 2 * model.model.norm.weight.nbytes for n in sent), (sent, whole)
    steps = _steps(result.run_dir, None)
    # step 2's batch was sampled after that partial update: the engine served the trainer's weights
    assert [m["train/policy_version"] for m in steps] == [1.0, 2.0]
    assert max(m["train/engine_logprob_gap"] for m in steps) < 1e-4


@pytest.mark.e2e
@pytest.mark.ray
def test_kill_9_and_resume_of_a_two_policy_run_on_ray_loses_and_repeats_no_batch(ray_cluster, tiny_model_dir, tmp_path):
    # The multi-policy kill -9 (the same run with local env workers was a test of its own, checking
    # the same ledger the same way; tests/trainers/test_train_job.py kills a local run): the run joins
    # the session's two-node cluster, an env worker per node plays the episodes, each agent's turns
    # going to its policy's actor by name. Its actors die with it (their owner); the resumed run
    # starts new ones.
    import ray

    address, _ = ray_cluster
    run_dir = kill_9_and_resume(tiny_model_dir, tmp_path, {"ray_address": address})

    metrics = read_metrics(run_dir)
    for policy in POLICIES:
        steps = [m for m in metrics if f"train/{policy}/loss" in m]
        assert all(m[f"fault/{policy}/env_workers_replaced"] == 0 for m in steps)  # played by env workers
        assert all(m[f"rollout/{policy}/failed"] == 0 for m in steps[-3:])  # after the resume, nothing failed
    assert not [n for n in ray.util.list_named_actors() if n.startswith("agentrl-policy-")]  # closed with the run


def kill_9_and_resume(tiny_model_dir: Path, tmp_path: Path, rollout: dict[str, Any]) -> Path:
    """``agentrl train`` of two policies killed with SIGKILL after step 7 of 12 and run again: each
    policy trains every step once, on groups none of which it trains twice, and the groups its
    buffer held at the checkpoint are trained after the resume."""
    import os
    import signal
    import subprocess
    import time

    run_dir = tmp_path / "run"
    config = {
        "rollout": {
            "env_id": multi_env.ENV_ID,
            "model": str(tiny_model_dir),
            "backend": "hf",
            "group_size": 4,
            "max_tokens": 6,
            "max_length": 256,
            "max_turns": 2,
            **rollout,
        },
        "trainer": {"lr": 1e-2, "micro_batch_size": 8},
        "mapping": "individual",
        "policies": FULL,
        "steps": 6,
        "groups_per_step": 2,
        "max_staleness": 1,
        "eval_episodes": 0,
        "checkpoint_every": 2,
        "keep_checkpoints": 20,
        "export": False,
        "torch_threads": 1,
        "run_dir": str(run_dir),
        "imports": ["multi_env"],
    }
    config_path = tmp_path / "train.yaml"
    config_path.write_text(json.dumps(config))  # JSON is YAML
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}

    def start() -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "agentrl.cli", "train", str(config_path)]
        return subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )

    process = start()
    ledger = run_dir / "batches.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:  # kill once 7 of the 12 steps trained
        if ledger.exists() and len(ledger.read_text().splitlines()) >= 7:
            break
        time.sleep(0.05)
    assert process.poll() is None, process.stdout.read().decode()[-3000:]
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    checkpoints = sorted((run_dir / "checkpoints").glob("step-*"))
    assert checkpoints, "no checkpoint before the kill"
    state = json.loads((checkpoints[-1] / "controller.json").read_text())
    buffered = [json.loads(line) for line in (checkpoints[-1] / "buffer.jsonl").read_text().splitlines() if line]

    process = start()
    output = process.communicate(timeout=600)[0].decode()
    assert process.returncode == 0, output[-3000:]

    records = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
    for policy in POLICIES:
        history = {r["step"]: r["groups"] for r in records if r["policy"] == policy}  # the last record wins
        assert sorted(history) == list(range(1, 7))
        used = [g for step in sorted(history) for g in history[step]]
        assert len(used) == len(set(used)) == 12, f"{policy} trained a group twice: {used}"
        saved = state["lanes"][policy]
        # the steps up to the checkpoint are the ones it says the policy trained
        assert [g for step in range(1, saved["step"] + 1) for g in history[step]] == saved["trained_groups"]
        # groups waiting in its buffer at the checkpoint were trained on after the resume, not lost
        waiting = {int(t["group_id"].split("#0-")[1].split("/")[0]) for t in buffered if t["policy_id"] == policy}
        assert waiting <= {g for step in range(saved["step"] + 1, 7) for g in history[step]}
    return run_dir
