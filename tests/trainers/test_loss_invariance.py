"""Invariance tests on tiny models: the bugs hand-computed values cannot catch.

1. A2C equals PPO with one epoch: at ``old_logprobs = logprobs.detach()`` no clip is active, and the
   PPO gradient is the policy gradient of ``-(logprobs * A)``.
2. One batch of 8 equals 8 micro-batches of 1 with gradient accumulation, when each micro-batch is
   aggregated with the whole batch's counts.
3. The loss ignores observation tokens however many there are.

Everything runs in float64 so that "equal" can mean 1e-6 on sums of many terms.
"""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.testing import token_logprobs
from agentrl.trainers.advantages import estimate_advantages
from agentrl.trainers.batch import Batch, collate
from agentrl.trainers.losses import aggregate, kl_estimate, policy_loss
from agentrl.types import Trajectory

torch.set_num_threads(1)

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
VOCAB = 64
PAD = 0


def tiny_llama() -> LlamaForCausalLM:
    """A one-layer Llama (a real causal transformer with an attention mask), in float64."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=256,
        pad_token_id=PAD,
    )
    return LlamaForCausalLM(config).double()


def random_trajectory(rng: random.Random, group: int) -> Trajectory:
    """Prompt, 1-3 turns of generated tokens, observations between them, rewards on turn ends."""
    ids, mask, logprobs, ends, rewards = [], [], [], [], []
    prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 6))]
    ids += prompt
    mask += [0] * len(prompt)
    logprobs += [0.0] * len(prompt)
    turns = rng.randint(1, 3)
    for turn in range(turns):
        generated = rng.randint(1, 7)
        ids += [rng.randrange(1, VOCAB) for _ in range(generated)]
        mask += [1] * generated
        logprobs += [-rng.uniform(0.5, 4.0) for _ in range(generated)]
        ends.append(len(ids) - 1)
        rewards.append(rng.choice([0.0, 0.5, 1.0]))
        if turn < turns - 1:
            observation = rng.randint(1, 8)
            ids += [rng.randrange(1, VOCAB) for _ in range(observation)]
            mask += [0] * observation
            logprobs += [0.0] * observation
    return Trajectory(
        token_ids=ids,
        loss_mask=mask,
        logprobs=logprobs,
        versions=[0 if m else -1 for m in mask],
        prompt_length=len(prompt),
        turn_ends=ends,
        turn_rewards=rewards,
        reward=sum(rewards),
        group_id=f"group-{group}",
    )


def batch_of_eight() -> Batch:
    rng = random.Random(7)
    batch = collate([random_trajectory(rng, i // 2) for i in range(8)], PAD)
    assert len(set(batch.lengths.tolist())) > 1, "the test needs padding to mean something"
    return batch


def logprobs_of(model: nn.Module, batch: Batch) -> torch.Tensor:
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return token_logprobs(logits, batch.input_ids)


def gradients(model: nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, params, strict=True)]


def assert_same(grads_a: list[torch.Tensor], grads_b: list[torch.Tensor], atol: float = 1e-6) -> None:
    assert any(g.abs().max() > 1e-4 for g in grads_a), "the gradient is ~0: the comparison would prove nothing"
    for a, b in zip(grads_a, grads_b, strict=True):
        assert torch.allclose(a, b, atol=atol, rtol=0), f"gradients differ by {(a - b).abs().max().item():.3g}"


@pytest.mark.parametrize("mode", MODES)
def test_ppo_at_the_first_epoch_is_a2c(mode):
    model, batch = tiny_llama(), batch_of_eight()
    advantages = estimate_advantages("grpo", batch).advantages.double()
    mask = batch.loss_mask

    logprobs = logprobs_of(model, batch)
    # Clip-higher and a dual clip are in place too: at ratio 1 none of them may bite.
    per_token, stats = policy_loss(logprobs, logprobs.detach(), advantages, mask, clip_high=0.28, dual_clip=3.0)
    ppo = gradients(model, aggregate(per_token, mask, mode))
    assert stats.clip_fraction.item() == 0.0 and stats.ratio_max.item() == pytest.approx(1.0)

    logprobs = logprobs_of(model, batch)
    a2c = gradients(model, aggregate(-(logprobs * advantages), mask, mode))
    assert_same(ppo, a2c)


def accumulation_loss(model: nn.Module, batch: Batch, mode: str, **counts: float) -> torch.Tensor:
    """The loss a trainer step sees: PPO with clipping and TIS active on some tokens, plus a KL term."""
    logprobs = logprobs_of(model, batch)
    per_token, _ = policy_loss(
        logprobs,
        batch.old_logprobs,
        batch.advantages,
        batch.loss_mask,
        behaviour_logprobs=batch.behaviour_logprobs.double(),
        correction="tis",
    )
    kl = kl_estimate(logprobs, batch.ref_logprobs)
    return aggregate(per_token, batch.loss_mask, mode, **counts) + 0.1 * aggregate(kl, batch.loss_mask, mode, **counts)


@pytest.mark.parametrize("mode", MODES)
def test_eight_micro_batches_of_one_accumulate_to_the_batch_of_eight(mode):
    model, batch = tiny_llama(), batch_of_eight()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        current = logprobs_of(model, batch)
    # Old log-probs 0.3 nats away from the current ones on average: the clip is active on some tokens.
    batch.old_logprobs = current + 0.3 * torch.randn(current.shape, generator=generator, dtype=torch.float64)
    batch.ref_logprobs = current + 0.1 * torch.randn(current.shape, generator=generator, dtype=torch.float64)
    batch.advantages = estimate_advantages("grpo", batch).advantages.double()

    whole_loss = accumulation_loss(model, batch, mode)
    whole = gradients(model, whole_loss)

    counts = {"num_tokens": batch.num_tokens, "num_seqs": batch.num_seqs}
    micro_losses = [accumulation_loss(model, micro, mode, **counts) for micro in batch.split(1)]
    summed = [torch.zeros_like(g) for g in whole]
    for loss in micro_losses:
        for total, g in zip(summed, gradients(model, loss), strict=True):
            total += g
    assert sum(loss.item() for loss in micro_losses) == pytest.approx(whole_loss.item(), abs=1e-6)
    assert_same(whole, summed)

    # The same accumulation with each micro-batch's own counts is wrong by a wide margin, so the
    # comparison above is one that can fail.
    local = sum(accumulation_loss(model, micro, mode).item() for micro in batch.split(1))
    assert abs(local - whole_loss.item()) > 1e-2


class Bigram(nn.Module):
    """Logits at position t depend on token t alone: inserted tokens cannot reach a generated
    token's log-prob through the context, only through a bug in masking or alignment."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 16, dtype=torch.float64)
        self.head = nn.Linear(16, VOCAB, dtype=torch.float64)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(input_ids)))


HEADER = 3  # the chat template's "assistant" header: the last observation token before a turn


def with_observation(length: int, reward: float, group: str, seed: int) -> Trajectory:
    """Prompt, a turn of 3 tokens, ``length`` random observation tokens then the header, a turn of 2."""
    rng = random.Random(seed)
    observation = [rng.randrange(4, VOCAB) for _ in range(length)] + [HEADER]
    ids = [5, 6, HEADER, 10, 11, 12, *observation, 13, 14]
    mask = [0, 0, 0, 1, 1, 1, *[0] * len(observation), 1, 1]
    logprobs = [-1.5 if m else 0.0 for m in mask]
    return Trajectory(
        token_ids=ids,
        loss_mask=mask,
        logprobs=logprobs,
        versions=[0 if m else -1 for m in mask],
        prompt_length=3,
        turn_ends=[5, len(ids) - 1],
        turn_rewards=[0.5, reward],
        reward=0.5 + reward,
        group_id=group,
    )


def observation_run(
    length: int, estimator: str, mode: str, norm_length: int | None
) -> tuple[float, list[torch.Tensor], torch.Tensor]:
    """The loss, its gradients and the per-token losses at generated positions, for a batch whose
    observations are ``length`` tokens long."""
    model = Bigram()
    trajectories = [
        with_observation(length, 1.0, "a", seed=1),
        with_observation(length, 0.0, "a", seed=2),
        with_observation(2 * length, 0.3, "b", seed=3),  # rows of unequal length: padding too
        with_observation(length, 0.9, "b", seed=4),
    ]
    batch = collate(trajectories, PAD)
    advantages = estimate_advantages(estimator, batch, gamma=0.9).advantages.double()
    logits = model(batch.input_ids)
    logprobs = token_logprobs(logits, batch.input_ids)
    # Old log-probs fixed per generated token, so the ratio (and the clip) is the same in every run.
    offsets = torch.tensor([0.0, 0.3, -0.3, 0.05, -0.25], dtype=torch.float64)
    old = logprobs.detach().clone()
    old[batch.loss_mask > 0] += offsets.repeat(len(trajectories))
    per_token, _ = policy_loss(
        logprobs,
        old,
        advantages,
        batch.loss_mask,
        behaviour_logprobs=batch.behaviour_logprobs.double(),
        correction="tis",
    )
    loss = aggregate(per_token, batch.loss_mask, mode, norm_length=norm_length)
    return loss.item(), gradients(model, loss), per_token[batch.loss_mask > 0].detach()


@pytest.mark.parametrize("estimator", ["grpo", "reinforce_pp"])
@pytest.mark.parametrize("mode", MODES)
def test_the_loss_ignores_observation_tokens_however_many(mode, estimator):
    # A fixed norm_length: Dr. GRPO's constant, not the padded length, which grows with the observations.
    runs = [observation_run(length, estimator, mode, norm_length=128) for length in (0, 5, 50)]
    loss, grads, per_token = runs[0]
    for other_loss, other_grads, other_per_token in runs[1:]:
        assert torch.allclose(other_per_token, per_token, atol=1e-6, rtol=0)
        assert other_loss == pytest.approx(loss, abs=1e-6)
        assert_same(grads, other_grads)


def test_seq_mean_token_sum_norm_defaults_to_the_padded_length():
    # Documented behaviour: without a norm_length the divisor is T, so longer observations shrink
    # the loss. Trainers must pass the generation budget to get Dr. GRPO's constant.
    short, _, _ = observation_run(0, "grpo", "seq-mean-token-sum-norm", norm_length=None)
    long, _, _ = observation_run(50, "grpo", "seq-mean-token-sum-norm", norm_length=None)
    assert short != pytest.approx(long, abs=1e-6)
