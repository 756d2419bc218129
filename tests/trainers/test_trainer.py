"""The training step on the tiny model: it learns, accumulation and data parallelism change nothing,
the fast log-prob path equals a full forward pass, LoRA and PPO work, state round-trips."""

from __future__ import annotations

import asyncio
import copy
import dataclasses

import learnable_env
import pytest
import torch
import torch.multiprocessing as mp

import agentrl
from agentrl.agents.chat import ChatAgent
from agentrl.policies import Sampling
from agentrl.policies.hf import HFPolicy
from agentrl.rollout import RolloutSettings, SingleAgentRollout
from agentrl.testing import token_entropy, token_logprobs
from agentrl.trainers import (
    ADVANTAGE_ESTIMATORS,
    Trainer,
    TrainerConfig,
    ValueModel,
    collate,
    generated_logprobs,
    load_policy_model,
    models,
)
from agentrl.trainers.models import inference_state_dict, load_reference_model


def _play(model_dir, temperature: float = 1.0) -> list:
    """16 real SayA trajectories (4 groups of 4) played by the tiny model at ``temperature``."""
    torch.set_num_threads(1)
    policy = HFPolicy(model_dir)
    agent = ChatAgent.from_env(policy.tokenizer, agentrl.make(learnable_env.ENV_ID))
    engine = SingleAgentRollout(
        lambda: agentrl.make(learnable_env.ENV_ID),
        agent,
        policy,
        RolloutSettings(
            env_id=learnable_env.ENV_ID, sampling=Sampling(max_tokens=8, temperature=temperature), group_size=4
        ),
    )
    played = asyncio.run(engine.collect(4))
    policy.close()
    assert all(t.error is None for t in played)
    return sorted(played, key=lambda t: t.group_id)


@pytest.fixture(scope="module")
def trajectories(tiny_model_dir):
    return _play(tiny_model_dir)


def _trainer(model_dir, **overrides) -> Trainer:
    torch.manual_seed(0)
    config = TrainerConfig(**{"lr": 1e-3, "micro_batch_size": 16, **overrides})
    value_model = ValueModel(model_dir) if config.algorithm == "ppo" else None
    return Trainer(load_policy_model(model_dir), config, pad_token_id=0, value_model=value_model)


def _grads(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def test_generated_logprobs_equal_a_full_forward_pass(tiny_model_dir, trajectories):
    model = load_policy_model(tiny_model_dir)
    batch = collate(trajectories, pad_token_id=0)
    with torch.no_grad():
        fast = generated_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        full = token_logprobs(logits, batch.input_ids) * batch.loss_mask
    assert batch.num_tokens > 0
    torch.testing.assert_close(fast.logprobs, full, atol=1e-5, rtol=0)
    # the entropy the trainer logs (and the bonus it may add) is that of the full distribution too
    torch.testing.assert_close(fast.entropy, token_entropy(logits) * batch.loss_mask, atol=1e-5, rtol=0)
    # and they are the behaviour log-probs the hf backend recorded (same weights, fp32)
    torch.testing.assert_close(fast.logprobs, batch.behaviour_logprobs, atol=1e-4, rtol=0)


def test_the_trainer_scores_the_distribution_the_rollouts_sampled_from(tiny_model_dir):
    # Rollouts at temperature 0.7 report log-probs of logits / 0.7; a trainer told the temperature
    # computes the same ones (plain and shared-prompt passes), so the first update's ratio is 1.
    played = _play(tiny_model_dir, temperature=0.7)
    model = load_policy_model(tiny_model_dir)
    batch = collate(played, pad_token_id=0)
    groups = torch.arange(len(played)) // 4  # sorted by group: four rows a group
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        full = token_logprobs(logits, batch.input_ids, temperature=0.7) * batch.loss_mask
        entropy = token_entropy(logits, temperature=0.7) * batch.loss_mask
        for group_index in (None, groups):
            tempered = generated_logprobs(
                model, batch.input_ids, batch.attention_mask, batch.loss_mask, group_index=group_index, temperature=0.7
            )
            torch.testing.assert_close(tempered.logprobs, full, atol=1e-5, rtol=0)
            torch.testing.assert_close(tempered.entropy, entropy, atol=1e-5, rtol=0)
            torch.testing.assert_close(tempered.logprobs, batch.behaviour_logprobs, atol=1e-4, rtol=0)
        raw = generated_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask).logprobs
    assert float((raw - batch.behaviour_logprobs).abs().max()) > 1e-2
    # the step reports the gap: about 0 when told the temperature, plain to see when not
    assert _trainer(tiny_model_dir, temperature=0.7, correction="tis").step(played)["train/engine_logprob_gap"] < 1e-5
    assert _trainer(tiny_model_dir, correction="tis").step(played)["train/engine_logprob_gap"] > 1e-2


def test_a_step_changes_the_weights_and_the_engine_copy(tiny_model_dir, trajectories):
    trainer = _trainer(tiny_model_dir)
    before = {n: t.clone() for n, t in inference_state_dict(trainer.model)}
    metrics = trainer.step(trajectories)
    after = dict(inference_state_dict(trainer.model))
    assert "lm_head.weight" in after  # the tied head goes to the engine under its own name
    assert any(not torch.equal(before[n], after[n]) for n in before)
    for name in (
        "train/loss",
        "train/policy_loss",
        "train/entropy",
        "train/grad_norm",
        "train/clip_fraction",
        "train/lr",
    ):
        assert name in metrics and metrics[name] == metrics[name], name
    assert metrics["train/entropy"] > 0
    assert trainer.step_count == 1


@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo", "rloo", "reinforce_pp"])
def test_every_critic_free_algorithm_steps_with_its_default_settings(tiny_model_dir, trajectories, algorithm):
    metrics = _trainer(tiny_model_dir, algorithm=algorithm).step(trajectories)
    assert metrics["train/loss"] == metrics["train/loss"]  # not NaN


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_accumulate_to_the_whole_batch(tiny_model_dir, trajectories, mode):
    whole = _trainer(tiny_model_dir, micro_batch_size=16, loss_aggregation=mode, max_grad_norm=0.0)
    pieces = _trainer(tiny_model_dir, micro_batch_size=1, loss_aggregation=mode, max_grad_norm=0.0)
    a, b = whole.step(trajectories), pieces.step(trajectories)
    assert a["train/loss"] == pytest.approx(b["train/loss"], abs=1e-6)
    grads_a, grads_b = _grads(whole), _grads(pieces)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-6, rtol=1e-5)


def test_several_epochs_and_mini_batches_recompute_old_logprobs(tiny_model_dir, trajectories):
    trainer = _trainer(tiny_model_dir, epochs=2, mini_batches=2, micro_batch_size=4, lr=1e-2)
    metrics = trainer.step(trajectories)
    # after the first update the ratio moves off 1, so later updates see the clip
    assert metrics["train/approx_kl"] != 0.0
    assert trainer.scheduler.last_epoch == 4  # one scheduler step per optimizer step


def test_ppo_trains_policy_and_critic(tiny_model_dir, trajectories, monkeypatch):
    trainer = _trainer(tiny_model_dir, algorithm="ppo", value_lr=1e-3)
    assert trainer.value_model is not None
    # PPO's advantages and the critic's targets come from the estimator table's "gae", like every
    # other algorithm's from its own estimator.
    calls = []
    gae = ADVANTAGE_ESTIMATORS["gae"]

    def spy(batch, values, **options):
        calls.append(values)
        return gae(batch, values, **options)

    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "gae", spy)
    head_before = trainer.value_model.head.weight.clone()
    first = trainer.step(trajectories)["train/value_loss"]
    assert len(calls) == 1 and calls[0] is not None and len(calls[0]) == len(trajectories)  # the critic's values
    for _ in range(4):
        last = trainer.step(trajectories)["train/value_loss"]
    assert not torch.equal(head_before, trainer.value_model.head.weight)
    assert last < first  # the critic fits the returns it is shown again


def test_the_value_model_reads_the_state_before_each_token(tiny_model_dir):
    critic = ValueModel(tiny_model_dir)
    torch.nn.init.normal_(critic.head.weight, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    changed = ids.clone()
    changed[0, 3] = 42
    with torch.no_grad():
        values, other = critic(ids, torch.ones_like(ids)), critic(changed, torch.ones_like(ids))
    # values[:, t] is the state in which token t is generated: nothing at t = 0, and a change at
    # position 3 shows only from t = 4 on
    assert values[0, 0] == 0.0 and values[0, 1:].abs().min() > 0
    assert torch.equal(values[0, :4], other[0, :4]) and values[0, 4] != other[0, 4]


def test_a_value_model_goes_only_with_ppo(tiny_model_dir):
    critic = ValueModel(tiny_model_dir)
    with pytest.raises(ValueError, match="has no critic"):
        Trainer(load_policy_model(tiny_model_dir), TrainerConfig(), pad_token_id=0, value_model=critic)


def test_kl_to_the_reference_is_zero_at_the_start(tiny_model_dir, trajectories):
    config = TrainerConfig(lr=1e-2, micro_batch_size=16, kl_coef=0.1)
    trainer = Trainer(
        load_policy_model(tiny_model_dir), config, pad_token_id=0, ref_model=load_reference_model(tiny_model_dir)
    )
    assert trainer.step(trajectories)["train/kl"] == pytest.approx(0.0, abs=1e-6)
    assert trainer.step(trajectories)["train/kl"] > 1e-6  # the policy moved away from the reference
    with pytest.raises(ValueError, match="needs a reference model"):
        Trainer(load_policy_model(tiny_model_dir), config, pad_token_id=0)


def test_lora_trains_adapters_and_merges_for_the_engine(tiny_model_dir, trajectories):
    model = load_policy_model(tiny_model_dir, lora_rank=4, lora_alpha=8)
    base_names = {n for n, _ in inference_state_dict(load_policy_model(tiny_model_dir))}
    trainer = Trainer(model, TrainerConfig(lr=1e-2, micro_batch_size=16), pad_token_id=0)
    frozen = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainer.step(trajectories)
    merged = dict(trainer.inference_weights())
    assert set(merged) == base_names  # the engine sees plain checkpoint names, no adapters
    for name, param in model.named_parameters():
        if not param.requires_grad:
            assert torch.equal(param, frozen[name]), name  # only adapters train
    plain = load_policy_model(tiny_model_dir)
    changed = [n for n, t in plain.state_dict().items() if not torch.allclose(t, merged[n])]
    assert changed and all("proj" in n for n in changed)  # the merged deltas sit in the adapted layers


def test_state_dict_round_trip_reproduces_the_next_step(tiny_model_dir, trajectories):
    first = _trainer(tiny_model_dir, lr=1e-2)
    first.step(trajectories)
    saved = copy.deepcopy(first.state_dict())
    first.step(trajectories)
    second = _trainer(tiny_model_dir, lr=1e-2)
    second.load_state_dict(saved)
    second.step(trajectories)
    for (name, a), (_, b) in zip(first.model.state_dict().items(), second.model.state_dict().items()):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)


def test_bad_settings_say_what_to_do():
    with pytest.raises(ValueError, match="dual_clip must be above 1"):
        TrainerConfig(dual_clip=0.5)
    with pytest.raises(ValueError, match="at least 1"):
        TrainerConfig(micro_batch_size=0)
    assert TrainerConfig(algorithm="dr_grpo").loss_aggregation == "seq-mean-token-sum-norm"
    with pytest.raises(ValueError, match="greedy rollouts have no sampling distribution"):
        TrainerConfig(temperature=0.0)


# --- data parallel: two processes with gloo make the update one process makes -------------------


def _data_parallel_worker(rank: int, world: int, init_file: str, model_dir: str, trajectories, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        trainer = _trainer(model_dir, micro_batch_size=2, max_grad_norm=0.0)
        share = len(trajectories) // world  # whole groups per process
        trainer.step(trajectories[rank * share : (rank + 1) * share])
        if rank == 0:
            torch.save({"grads": _grads(trainer)}, out)
        # Both ranks leave together: rank 1 aborted once in gloo's teardown ("terminate called without an
        # active exception") while rank 0 was still saving, in a loaded quick-tier run (not reproduced
        # in 8 runs alone under load).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_equal_one(tiny_model_dir, trajectories, tmp_path):
    out = str(tmp_path / "rank0.pt")
    mp.get_context("spawn")
    mp.spawn(
        _data_parallel_worker,
        args=(2, str(tmp_path / "init"), str(tiny_model_dir), trajectories, out),
        nprocs=2,
        join=True,
    )
    parallel = torch.load(out)
    single = _trainer(tiny_model_dir, micro_batch_size=2, max_grad_norm=0.0)
    single.step(trajectories)
    grads = _grads(single)
    assert grads.keys() == parallel["grads"].keys()
    for name in grads:
        torch.testing.assert_close(parallel["grads"][name], grads[name], atol=1e-6, rtol=1e-5, msg=name)
    # (weights are not compared: Adam's first step is lr * g / |g|, which turns rounding-level
    # differences of tiny gradient entries into differences of 2 lr)


def test_trainable_layers_freeze_everything_below(tiny_model_dir, trajectories):
    model = load_policy_model(tiny_model_dir, trainable_layers=1)
    layers = model.config.num_hidden_layers
    trainer = Trainer(model, TrainerConfig(lr=1e-2, micro_batch_size=16), pad_token_id=0)
    before = {n: p.clone() for n, p in model.named_parameters()}
    trainer.step(trajectories)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    top = f"model.layers.{layers - 1}."
    assert changed and all(n.startswith(top) or n == "model.norm.weight" for n in changed), changed
    assert "model.embed_tokens.weight" not in changed  # the tied head stays too
    with pytest.raises(ValueError, match="trainable_layers must be between 0"):
        load_policy_model(tiny_model_dir, trainable_layers=layers + 1)


@pytest.mark.parametrize("bucket_cost", [16, 0])  # 0: every length its own forward pass
def test_a_groups_shared_prompt_runs_once_with_the_same_results(tiny_model_dir, monkeypatch, bucket_cost):
    monkeypatch.setattr(models, "BUCKET_COST", bucket_cost)
    model = load_policy_model(tiny_model_dir)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 1000, (20,), generator=generator)
    other = prompt.clone()
    other[15] = 7  # a group whose rows part ways inside the prompt shares only what is common
    rows = [
        torch.cat([p, torch.randint(3, 1000, (n,), generator=generator)])
        for p, n in [(prompt, 5), (prompt, 9), (prompt, 3), (prompt, 7), (other, 6), (prompt, 6), (prompt, 4)]
    ]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        ids[i, : len(r)], attention[i, : len(r)], mask[i, 20 : len(r)] = r, 1, 1
    mask[1, 22:24] = 0  # observation tokens between two turns
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 3])  # rows 3 and 4 differ at position 15

    def run(group_index):
        model.zero_grad(set_to_none=True)
        out = generated_logprobs(model, ids, attention, mask, group_index=group_index)
        (out.logprobs * torch.linspace(-1, 1, width)).sum().backward()
        return out, [p.grad.clone() for p in model.parameters()]

    (plain, plain_grads), (shared, shared_grads) = run(None), run(groups)
    torch.testing.assert_close(shared.logprobs, plain.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(shared.entropy, plain.entropy, atol=1e-5, rtol=0)
    assert bool((plain.logprobs != 0).sum() == mask[:, 1:].sum())
    for a, b in zip(plain_grads, shared_grads):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)


def test_rows_run_in_length_buckets_that_compute_the_fewest_tokens(monkeypatch):
    monkeypatch.setattr(models, "BUCKET_COST", 16)
    rows = torch.tensor([3, 5, 8, 9, 12])
    buckets = models._length_buckets(rows, torch.tensor([40, 300, 42, 290, 41]))
    assert [b.tolist() for b in buckets] == [[3, 8, 12], [5, 9]]  # increasing row order inside each
    # a short row joins a long one when padding it costs less than a pass of its own
    assert [b.tolist() for b in models._length_buckets(rows[:2], torch.tensor([30, 40]))] == [[3, 5]]
    monkeypatch.setattr(models, "BUCKET_COST", 0)
    assert [b.tolist() for b in models._length_buckets(rows[:2], torch.tensor([30, 40]))] == [[3], [5]]


def _sampled_by(trajectories: list, version: int, shift: float = 0.0) -> list:
    """Copies tagged as sampled by ``version``, the engine's log-probs lowered by ``shift``
    (so each token's behaviour weight exp(trainer - engine) becomes about exp(shift))."""
    return [
        dataclasses.replace(
            t,
            versions=[version if v >= 0 else v for v in t.versions],
            logprobs=[lp - shift if m else lp for lp, m in zip(t.logprobs, t.loss_mask)],
        )
        for t in trajectories
    ]


def test_auto_correction_weights_stale_batches_only_and_splits_the_gap(tiny_model_dir, trajectories):
    import math

    from agentrl.trainers.trainer import STALE_CORRECTION

    # Every token seen by version 1's weights as sampled by version 0, with behaviour weight 1.5.
    stale = _sampled_by(trajectories, 0, shift=math.log(1.5))
    plain = _trainer(tiny_model_dir, correction="none", max_grad_norm=0)  # unclipped, to compare gradients
    plain_metrics = plain.step(stale)
    auto = _trainer(tiny_model_dir, max_grad_norm=0)  # correction="auto" is the default
    assert auto.config.correction == "auto"
    metrics = auto.step(stale, version=1)
    assert metrics["train/corrected"] == 1.0 and metrics["train/stale_token_fraction"] == 1.0
    assert "train/engine_logprob_gap" not in metrics  # no token was sampled by the weights trained
    assert abs(metrics["train/policy_lag_logprob_gap"] - math.log(1.5)) < 1e-3
    assert abs(metrics["train/is_weight_mean"] - 1.5) < 1e-3 and metrics["train/is_capped_fraction"] == 0.0
    # The policy-gradient term is the uncorrected one times the weight 1.5 (token-mean loss, no bonus).
    for name, grad in _grads(auto).items():
        torch.testing.assert_close(grad, 1.5 * _grads(plain)[name], atol=1e-6, rtol=2e-3)
    assert plain_metrics["train/corrected"] == 0.0
    assert abs(plain_metrics["train/engine_logprob_gap"] - math.log(1.5)) < 1e-3  # no version: all fresh

    # Weights above is_cap (2): decoupled PPO drops the tokens, tis clamps them to the cap.
    far = _sampled_by(trajectories, 0, shift=math.log(3.0))
    capped = _trainer(tiny_model_dir).step(far, version=1)
    assert capped["train/is_capped_fraction"] == 1.0
    assert capped["train/is_weight_mean"] == pytest.approx(0.0 if STALE_CORRECTION == "decoupled" else 2.0, abs=1e-3)

    # On-policy (every token sampled by the weights trained): no correction, the update of "none".
    fresh = _sampled_by(trajectories, 3)
    on_policy = _trainer(tiny_model_dir)
    metrics = on_policy.step(fresh, version=3)
    assert metrics["train/corrected"] == 0.0 and metrics["train/stale_token_fraction"] == 0.0
    assert "train/policy_lag_logprob_gap" not in metrics and metrics["train/engine_logprob_gap"] < 1e-4
    reference = _trainer(tiny_model_dir, correction="none")
    reference.step(fresh)
    for name, grad in _grads(on_policy).items():
        torch.testing.assert_close(grad, _grads(reference)[name], atol=0, rtol=0)


def test_mixed_batches_split_the_gap_by_token_version(tiny_model_dir, trajectories):
    import math

    half = len(trajectories) // 2
    mixed = _sampled_by(trajectories[:half], 4, shift=math.log(1.2)) + _sampled_by(trajectories[half:], 5)
    metrics = _trainer(tiny_model_dir).step(mixed, version=5)
    stale_tokens = sum(sum(t.loss_mask) for t in mixed[:half]) / sum(sum(t.loss_mask) for t in mixed)
    assert metrics["train/stale_token_fraction"] == pytest.approx(stale_tokens)
    assert metrics["train/corrected"] == 1.0
    assert metrics["train/engine_logprob_gap"] < 1e-4
    assert abs(metrics["train/policy_lag_logprob_gap"] - math.log(1.2)) < 1e-3


def _with_rewards(trajectories: list, rewards: list[float]) -> list:
    return [dataclasses.replace(t, reward=float(r), turn_rewards=[float(r)]) for t, r in zip(trajectories, rewards)]


def test_effective_group_fraction_counts_groups_with_unequal_rewards(tiny_model_dir, trajectories):
    # four groups of four: two all alike (1 1 1 1, 0 0 0 0), two not
    rewards = [1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0.5, 0.5, 0.5, 0.25]
    rewarded = _with_rewards(trajectories, rewards)
    assert len({t.group_id for t in rewarded}) == 4
    assert _trainer(tiny_model_dir).step(rewarded)["train/effective_group_fraction"] == 0.5


def test_rows_without_gradient_are_not_computed_and_the_update_is_the_same(tiny_model_dir, trajectories, monkeypatch):
    # groups 1 and 2 have equal rewards: their GRPO advantages are 0, their rows add no gradient
    rewarded = _with_rewards(trajectories, [1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 1])
    skipping, computing = _trainer(tiny_model_dir, micro_batch_size=4), _trainer(tiny_model_dir, micro_batch_size=4)
    a = skipping.step(rewarded)
    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "_rows_with_gradient", lambda self, mini: torch.arange(len(mini)))
        b = computing.step(rewarded)

    assert a["train/computed_fraction"] == 0.5 and b["train/computed_fraction"] == 1.0
    assert a["train/policy_loss"] == pytest.approx(b["train/policy_loss"], abs=1e-7)
    assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-5)
    grads_a, grads_b = _grads(skipping), _grads(computing)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-7, rtol=1e-5)
    for (name, p), q in zip(skipping.model.named_parameters(), computing.model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-7, rtol=1e-6, msg=name)
    # the token means are the computed rows' own, as if the trainer had been given those rows alone
    alone = _trainer(tiny_model_dir, micro_batch_size=4).step(rewarded[8:])
    for name in ("train/entropy", "train/clip_fraction", "train/approx_kl", "train/engine_logprob_gap"):
        assert a[name] == pytest.approx(alone[name], rel=1e-5, abs=1e-9), name


def test_a_batch_without_signal_computes_one_row_and_an_entropy_bonus_every_row(tiny_model_dir, trajectories):
    rewarded = _with_rewards(trajectories, [1] * 16)  # no group has signal
    assert _trainer(tiny_model_dir).step(rewarded)["train/computed_fraction"] == 1 / 16  # one row, for the gradients
    assert _trainer(tiny_model_dir, entropy_coef=0.01).step(rewarded)["train/computed_fraction"] == 1.0
