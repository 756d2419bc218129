"""Policy backends on a tiny model built by a fixture: log-probs, versions, weight updates, rollouts."""

import asyncio
import os

import pytest

torch = pytest.importorskip("torch", reason="the policy backends need torch (pip install -e '.[cpu]')")

import agentrl  # noqa: E402
from agentrl.agents import ChatAgent  # noqa: E402
from agentrl.policies import EngineClosed, Policy, Sampling  # noqa: E402
from agentrl.policies.hf import HFPolicy  # noqa: E402
from agentrl.rollout import EpisodeLimits, RolloutSettings, SingleAgentRollout  # noqa: E402
from agentrl.testing import max_logprob_gap, reference_logprobs, reference_model  # noqa: E402
from agentrl.types import Trajectory  # noqa: E402


@pytest.fixture(scope="module")
def hf_policy(tiny_model_dir):
    policy = HFPolicy(tiny_model_dir)
    yield policy
    policy.close()


def test_the_reference_log_probs_and_the_gap_at_generated_tokens(tiny_model_dir, tiny_tokenizer):
    model = reference_model(tiny_model_dir)
    ids = tiny_tokenizer.encode("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n5<|im_end|>")
    expected = reference_logprobs(model, ids)
    # The mean of the next-token log-probs is minus transformers' own language-modelling loss.
    with torch.no_grad():
        loss = model(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
    assert len(expected) == len(ids) and expected[0] == 0.0
    assert abs(sum(expected[1:]) / (len(ids) - 1) + loss) < 1e-5
    generated = 3
    mask = [0] * (len(ids) - generated) + [1] * generated
    recorded = [0.0 if not m else lp for lp, m in zip(expected, mask)]
    t = Trajectory(token_ids=ids, loss_mask=mask, logprobs=recorded, versions=[0] * len(ids))
    assert max_logprob_gap(model, [t]) < 1e-6
    t.logprobs[-2] += 0.25
    t.logprobs[1] = 9.0  # a prompt position: not compared
    assert abs(max_logprob_gap(model, [t]) - 0.25) < 1e-5
    with pytest.raises(ValueError, match="no generated tokens"):
        max_logprob_gap(model, [Trajectory(token_ids=ids, loss_mask=[0] * len(ids), logprobs=[0.0] * len(ids))])


def test_hf_policy_is_a_policy(hf_policy):
    assert isinstance(hf_policy, Policy) and hf_policy.version == 0


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_hf_rollout_logprobs_match_a_transformers_forward_pass(hf_policy, tiny_model_dir, temperature):
    env_id = "agentrl/Calculator-v0"
    agent = ChatAgent.from_env(hf_policy.tokenizer, agentrl.make(env_id))
    engine = SingleAgentRollout(
        lambda: agentrl.make(env_id),
        agent,
        hf_policy,
        RolloutSettings(
            env_id=env_id,
            sampling=Sampling(max_tokens=24, seed=0, temperature=temperature),
            limits=EpisodeLimits(max_turns=3, max_length=1024),
            group_size=2,
        ),
    )
    trajectories = asyncio.run(engine.collect(num_groups=2))
    assert len(trajectories) == 4 and all(t.error is None for t in trajectories)
    reference = reference_model(tiny_model_dir)
    for t in trajectories:
        assert max_logprob_gap(reference, [t], temperature) < 1e-4
    if temperature != 1.0:
        assert max_logprob_gap(reference, trajectories) > 1e-2  # the sampled distribution's, not the raw one's


def test_weight_update_bumps_the_version_and_changes_the_model(hf_policy):
    prompt = hf_policy.tokenizer.encode("What is 2 + 3?")
    greedy = Sampling(max_tokens=8, temperature=0)
    before = asyncio.run(hf_policy.generate(prompt, greedy))
    state = {k: v + 0.5 * torch.randn_like(v) for k, v in hf_policy.model.state_dict().items()}
    assert hf_policy.update_weights(state.items()) == 1
    after = asyncio.run(hf_policy.generate(prompt, greedy))
    assert (before.version, after.version) == (0, 1)
    assert before.logprobs != after.logprobs
    with pytest.raises(ValueError, match="does not have"):
        hf_policy.update_weights([("no.such.weight", torch.zeros(1))])


def test_concurrent_requests_are_batched_and_each_stops_on_its_own(hf_policy):
    prompts = [hf_policy.tokenizer.encode(f"question {i}") for i in range(6)]

    async def run():
        return await asyncio.gather(*[hf_policy.generate(p, Sampling(max_tokens=5 + i)) for i, p in enumerate(prompts)])

    generations = asyncio.run(run())
    for i, g in enumerate(generations):
        assert len(g.token_ids) == len(g.logprobs) <= 5 + i
        assert (g.finish_reason == "length") == (
            len(g.token_ids) == 5 + i and g.token_ids[-1] not in hf_policy.stop_token_ids
        )


def test_a_cancelled_request_stops_its_row_and_a_queued_one_is_never_computed(tiny_model_dir):
    policy = HFPolicy(tiny_model_dir)
    prompt = policy.tokenizer.encode("Count to a thousand:")
    long = Sampling(max_tokens=900, stop_token_ids=(), seed=0)

    async def pair(cancel_first: bool):
        first = asyncio.ensure_future(policy.generate(prompt, long))
        second = asyncio.ensure_future(policy.generate(prompt, long))  # same batch
        if not cancel_first:
            return await asyncio.gather(first, second)
        await asyncio.sleep(0.5)  # both rows are running now
        queued = asyncio.ensure_future(policy.generate(prompt, Sampling(max_tokens=3, temperature=0.5)))
        await asyncio.sleep(0)
        queued.cancel()  # gives up before its batch starts
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        return [None, await second]

    try:
        _, alone = asyncio.run(pair(cancel_first=False))
        _, partner = asyncio.run(pair(cancel_first=True))
        after = asyncio.run(policy.generate(prompt, Sampling(max_tokens=4)))
    finally:
        policy.close()
    # The other row of the batch is untouched (same seed, same batch: the same tokens), the queued
    # request was never run, the cancelled row stopped, and the policy serves on.
    assert partner == alone and len(alone.token_ids) > 100
    assert policy.requests == (6, 1, 1)  # received, dropped from the queue, aborted mid-batch
    assert 1 <= len(after.token_ids) <= 4


def test_requests_waiting_when_the_hf_policy_is_closed_raise_engine_closed(tiny_model_dir):
    # They waited for ever: an EngineSupervisor replacing a dead hf engine closes it from its thread.
    policy = HFPolicy(tiny_model_dir)
    prompt = policy.tokenizer.encode("Count to a thousand:")

    async def run():
        long = Sampling(max_tokens=900, stop_token_ids=(), seed=0)
        running = [asyncio.ensure_future(policy.generate(prompt, long)) for _ in range(2)]
        await asyncio.sleep(0.5)  # their batch runs
        queued = asyncio.ensure_future(policy.generate(prompt, Sampling(max_tokens=3)))  # the next batch's
        await asyncio.sleep(0)
        await asyncio.to_thread(policy.close)
        return await asyncio.wait_for(asyncio.gather(*running, queued, return_exceptions=True), 60)

    results = asyncio.run(run())
    assert [type(r) for r in results] == [EngineClosed] * 3, results


def test_rollout_cli_with_the_hf_backend_writes_jsonl(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from agentrl.cli import app
    from agentrl.types import read_jsonl

    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        app,
        [
            "rollout",
            "agentrl/Countdown-v0",
            "--model",
            str(tiny_model_dir),
            "--backend",
            "hf",
            "--episodes",
            "4",
            "--group-size",
            "2",
            "--out",
            str(out),
            "max_tokens=16",
            "max_length=1024",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "success rate" in result.output and "tokens/s" in result.output
    trajectories = list(read_jsonl(out))
    assert len(trajectories) == 4 and len({t.group_id for t in trajectories}) == 2
    for t in trajectories:
        assert t.env_id == "agentrl/Countdown-v0" and t.policy_id == "default" and t.agent_id == "agent"
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs) and sum(t.loss_mask) > 0


def test_eval_uses_the_held_out_split_and_bad_configs_exit_2(tiny_model_dir):
    from typer.testing import CliRunner

    from agentrl.cli import app

    result = CliRunner().invoke(
        app,
        [
            "eval",
            "agentrl/Countdown-v0",
            "--model",
            str(tiny_model_dir),
            "--backend",
            "hf",
            "--episodes",
            "2",
            "max_tokens=8",
            "max_length=1024",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "split test" in result.output
    result = CliRunner().invoke(app, ["rollout", "agentrl/Countdown-v0", "--episodes", "3", "--group-size", "2"])
    assert result.exit_code == 2 and "not a multiple of group_size" in result.output


def test_the_rollout_example_config_runs_with_a_tiny_budget(tiny_model_dir, tmp_path):
    from pathlib import Path

    from agentrl.config import load_config
    from agentrl.run import RolloutConfig, rollout

    example = Path(__file__).resolve().parent.parent / "examples" / "rollout.yaml"
    assert example.read_text().startswith("# agentrl rollout ")  # the launch command comes first
    out = tmp_path / "out.jsonl"
    config = load_config(
        RolloutConfig,
        example,
        [
            f"model={tiny_model_dir}",
            "backend=hf",
            "episodes=4",
            "group_size=2",
            "max_tokens=8",
            "max_length=1024",
            f"out={out}",
        ],
    )
    trajectories, stats = rollout(config)
    assert len(trajectories) == 4 and stats.episodes == 4 and out.exists()


def test_a_vllm_update_names_whole_layers_that_changed_and_nothing_unchanged():
    from agentrl.policies.vllm import changed_units

    embed = torch.zeros(8, 4)
    state = {
        "model.embed_tokens.weight": embed,
        "model.layers.0.self_attn.q_proj.weight": torch.zeros(4, 4),
        "model.layers.0.self_attn.k_proj.weight": torch.zeros(4, 4),
        "model.layers.1.self_attn.q_proj.weight": torch.zeros(4, 4),
        "model.layers.1.self_attn.k_proj.weight": torch.zeros(4, 4),
        "model.norm.weight": torch.zeros(4),
        "lm_head.weight": embed,  # tied
    }
    sent, held = changed_units({}, state.items())
    assert [name for name, _ in sent] == list(state)  # a new engine gets everything
    state["model.layers.1.self_attn.q_proj.weight"].add_(1.0)  # an optimizer step on layer 1's q alone
    sent, held = changed_units(held, state.items())
    assert [name for name, _ in sent] == [
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_proj.weight",  # vLLM reloads q, k and v as one matrix
    ]
    assert changed_units(held, state.items())[0] == []
    embed.add_(1.0)  # a trained embedding goes with its tied head
    assert [name for name, _ in changed_units(held, state.items())[0]] == [
        "model.embed_tokens.weight",
        "lm_head.weight",
    ]
    state["model.norm.weight"] = torch.zeros(4)  # a new tensor: sent, whatever it holds
    assert [name for name, _ in changed_units(held, state.items())[0]] == [
        "model.embed_tokens.weight",
        "model.norm.weight",
        "lm_head.weight",
    ]


def test_a_stamped_tensor_is_unchanged_until_written_or_freed():
    from agentrl.policies.base import stamp, unchanged

    parameter = torch.nn.Parameter(torch.zeros(1000))
    before = stamp(parameter.detach())
    assert unchanged(before, stamp(parameter.detach()))  # a new view of the same, untouched memory
    with torch.no_grad():
        parameter.add_(1.0)  # an optimizer step: in place
    assert not unchanged(before, stamp(parameter.detach()))
    before = stamp(parameter.detach())
    parameter.data[999] = 5.0  # past the version counter, as a fused optimizer writes
    assert not unchanged(before, stamp(parameter.detach()))
    embedding = torch.zeros(28_311_552)  # SmolLM2's: its last index is not a float32
    assert stamp(embedding).sample.numel() == 64
    merged = parameter.detach() * 2  # new at every update, as LoRA-merged weights are
    before = stamp(merged)
    del merged
    assert before.storage.expired()  # so a new tensor given its memory is not taken for it
    assert not unchanged(before, stamp(torch.zeros(1000)))


def test_a_lone_engine_gets_every_core_on_an_avx2_cpu_of_a_few_cores_unless_the_user_bound_it(monkeypatch):
    from agentrl.policies import vllm

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("torch.backends.cpu.get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 0})
    assert vllm.lone_engine_cores() == "0,3"
    monkeypatch.setattr("torch.backends.cpu.get_cpu_capability", lambda: "AVX512")  # measured: little gain
    assert vllm.lone_engine_cores() is None
    monkeypatch.setattr("torch.backends.cpu.get_cpu_capability", lambda: "AVX2")
    for cores in ({0}, set(range(8))):  # nothing to gain on one; one kept for the scheduler is little of 8
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, cores=cores: cores)
        assert vllm.lone_engine_cores() is None
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")  # the user's binding, vLLM's own included
    assert vllm.lone_engine_cores() is None
    # The binding is set only while the engine starts.
    with vllm._thread_binding("0,1"):
        assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "auto"
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND")
    with vllm._thread_binding("1"):
        assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
