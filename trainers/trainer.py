"""The training step: trajectories in, one policy update out.

:class:`Trainer` holds the policy (and, when the algorithm needs them, a frozen reference model and
a value model), the optimizer and the learning-rate schedule. :meth:`Trainer.step` reads top to
bottom:

1. collate the trajectories into padded tensors;
2. without gradients: the old log-probs (only when more than one update uses this batch; for a
   single update they equal the current ones, detached), the reference log-probs (KL) and values
   (PPO);
3. advantages from rewards with an optional KL penalty, by the algorithm's estimator in
   :data:`~agentrl.trainers.advantages.ADVANTAGE_ESTIMATORS` (GRPO, Dr. GRPO, RLOO, REINFORCE++,
   GiGPO, or GAE for PPO, which also gives the critic's returns); for JEPO the rewards are first
   replaced by the log-likelihood the policy gives each trajectory's reference answer;
4. for each epoch and mini-batch: micro-batches with gradient accumulation, each loss aggregated
   with the whole mini-batch's token and sequence counts (so accumulation changes nothing; rows
   whose loss has no gradient, such as a GRPO group of equal rewards, are not computed), then
   gradient clipping, an optimizer step and a scheduler step. JEPO adds its supervised term on the
   reference answers, from the same forward pass.

Data parallel: with ``torch.distributed`` initialised, every process steps on its own share of the
trajectories (whole groups); the counts the losses divide by and the gradients are summed over
processes before the optimizer step, so N processes make exactly the update one process makes on
the whole batch. The same code runs under FSDP2: wrap the model's layers with
``torch.distributed.fsdp.fully_shard`` (gradient divide factor 1) before handing it over; their
gradients arrive reduce-scattered, and only the tensors left whole are all-reduced here
(:mod:`agentrl.trainers.ranks` does this for ``strategy: fsdp``). Every process returns the whole batch's
loss terms; counts and means of its own share are merged by the caller
(:func:`agentrl.trainers.ranks.merge_rank_metrics`).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from agentrl.suggest import did_you_mean
from agentrl.trainers.advantages import RETURNS, JensenTerms, estimate_advantages, scored_jensen_terms
from agentrl.trainers.batch import Batch, collate
from agentrl.trainers.losses import (
    aggregate,
    kl_estimate,
    kl_penalty_rewards,
    policy_loss,
    reference_loss,
    value_loss,
)
from agentrl.trainers.models import (
    ValueModel,
    generated_logprobs,
    inference_state_dict,
    reference_logliks,
    score_references,
)
from agentrl.types import Trajectory

Algorithm = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "ppo", "gigpo", "jepo"]

ESTIMATOR_OF: dict[str, str] = {"ppo": "gae"}
"""The advantage estimator of an algorithm whose name is not an estimator's: PPO's critic-based
advantages (and the critic's targets) are GAE's. Every other algorithm is its estimator's name."""

TOKEN_MEANS = (
    "train/entropy",
    "train/clip_fraction",
    "train/approx_kl",
    "train/is_weight_mean",
    "train/is_capped_fraction",
)
"""Metrics that are means over the tokens of the rows a step computes (rows without a gradient are
skipped: :meth:`Trainer._rows_with_gradient`)."""

STALE_CORRECTION: Literal["tis", "decoupled"] = "decoupled"
"""What ``correction="auto"`` applies to a batch with stale tokens (docs/algorithms.md has the
comparison at max_staleness 1 and 2 that picked it)."""


@dataclass
class TrainerConfig:
    """Settings of the optimizer and the loss. Defaults follow each method's paper; tricks are opt-in."""

    algorithm: Algorithm = "grpo"
    """Advantage estimator: grpo, dr_grpo (no std scaling, token-sum loss), rloo, reinforce_pp, ppo (critic + GAE),
    gigpo (turn-level credit) or jepo (the likelihood of an env's reference answer as the reward)."""
    lr: float = 1e-6
    """Learning rate of the policy (AdamW)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after warm-up, over ``total_steps``."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up from 0."""
    total_steps: int = 0
    """Optimizer steps the schedule spans (0: the controller fills it in)."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0 = off)."""
    micro_batch_size: int = 4
    """Trajectories per forward/backward pass (gradient accumulation over the rest)."""
    mini_batches: int = 1
    """Optimizer steps per batch per epoch (the batch is cut into this many mini-batches)."""
    epochs: int = 1
    """Passes over each batch (PPO epochs)."""
    clip_low: float = 0.2
    """PPO clip range below 1 (ratio >= 1 - clip_low)."""
    clip_high: float = 0.2
    """PPO clip range above 1; DAPO's clip-higher uses 0.28."""
    dual_clip: float | None = None
    """Dual-clip bound c (> 1) on the loss of negative-advantage tokens (Ye et al. 2020); None = off."""
    loss_aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    """How per-token losses become one number (Dr. GRPO: seq-mean-token-sum-norm)."""
    norm_length: int = 0
    """seq-mean-token-sum-norm divides each sequence's token sum by this constant (0: the batch's length T; ``agentrl train`` sets max_tokens x max_turns)."""
    scale_rewards: Literal["group", "batch", "none"] | None = None
    """GRPO: divide advantages by the group's std, the batch's, or not at all; unset: the algorithm's own (grpo: group, dr_grpo: none)."""
    returns: Literal["episode", "turn"] = "episode"
    """grpo / dr_grpo / rloo: episode = one advantage per trajectory from its return; turn = per turn from its return to go, against the group's same turn (per-turn rewards, multi-agent); reinforce_pp and ppo are token-level already and ignore it."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (0 = off)."""
    kl_coef: float = 0.0
    """KL-to-reference coefficient (0 = no reference model is loaded)."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator (Schulman): k1 = log-ratio, k3 = unbiased and positive."""
    kl_in_reward: bool = False
    """Put the KL penalty into the token rewards (PPO/REINFORCE++ style) instead of the loss."""
    correction: Literal["auto", "none", "tis", "decoupled"] = "auto"
    """Off-policy correction with the engine's behaviour log-probs: truncated importance sampling or
    decoupled PPO; ``auto`` applies ``STALE_CORRECTION`` to a batch holding tokens sampled by an older
    policy version than the weights it trains (``step(..., version=)``, which ``agentrl train`` passes)
    and none to an on-policy batch."""
    is_cap: float = 2.0
    """Truncation of the importance weight for tis / decoupled."""
    temperature: float | None = None
    """The rollouts' sampling temperature. Log-probs, entropy and KL are those of logits / temperature,
    the distribution the engine sampled from and reported (as TRL and verl do). ``agentrl train`` fills
    it in from rollout.temperature; None elsewhere means 1."""
    gamma: float = 1.0
    """Discount over tokens (PPO, REINFORCE++); over turns for GiGPO's step returns."""
    step_weight: float = 1.0
    """GiGPO: the weight of the step-level advantage (among turns that answered the same state) added to the episode-level one."""
    lam: float = 0.95
    """GAE lambda (PPO)."""
    jensen_bound: Literal["single", "multi"] = "multi"
    """JEPO: the lower bound on log p(reference | prompt) to climb, single-sample (mean over a group) or multi-sample (log-mean-exp over a group)."""
    reference_coef: float = 1.0
    """JEPO: the weight of the supervised term on the reference answers against the policy-gradient term."""
    value_lr: float = 1e-5
    """Learning rate of the value model (PPO)."""
    value_clip: float = 0.2
    """PPO value clipping range."""
    lora_rank: int = 0
    """LoRA rank (0 = full fine-tuning)."""
    lora_alpha: float = 16.0
    """LoRA alpha."""
    trainable_layers: int = 0
    """Train only the last N decoder layers and the final norm (0 = all); the backward pass stops there."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, one more forward pass per micro-batch)."""
    seed: int = 0
    """Seed of torch, numpy and random in the trainer."""

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1 or self.mini_batches < 1 or self.epochs < 1:
            raise ValueError(
                f"micro_batch_size, mini_batches and epochs must be at least 1; got {self.micro_batch_size}, "
                f"{self.mini_batches} and {self.epochs}."
            )
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be above 1 (it bounds the loss at c * |A|), got {self.dual_clip}.")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0; got {self.clip_low} and {self.clip_high}.")
        if self.temperature is not None and self.temperature <= 0:
            raise ValueError(
                f"temperature must be positive (it is the rollouts' sampling temperature), got {self.temperature}: "
                "greedy rollouts have no sampling distribution to train."
            )
        if self.returns not in RETURNS:
            hint = did_you_mean(self.returns, RETURNS)
            raise ValueError(
                f"returns must be one of {RETURNS} (turn: per-turn returns for grpo, dr_grpo and rloo), got "
                f"{self.returns!r}." + (f" {hint}" if hint else "")
            )
        if self.jensen_bound not in ("single", "multi"):
            raise ValueError(f"jensen_bound must be 'single' or 'multi', got {self.jensen_bound!r}.")
        if self.algorithm == "dr_grpo" and self.loss_aggregation == "token-mean":
            # Dr. GRPO's point is the length-unbiased loss; its paper pairs the two.
            self.loss_aggregation = "seq-mean-token-sum-norm"


class Trainer:
    """Steps a policy on batches of trajectories.

    >>> trainer = Trainer(model, TrainerConfig(lr=1e-6), pad_token_id=tokenizer.pad_token_id)  # doctest: +SKIP
    >>> metrics = trainer.step(trajectories)                                                    # doctest: +SKIP
    >>> policy.update_weights(trainer.inference_weights())                                      # doctest: +SKIP
    """

    def __init__(
        self,
        model: nn.Module,
        config: TrainerConfig,
        *,
        pad_token_id: int,
        ref_model: nn.Module | None = None,
        value_model: ValueModel | None = None,
    ):
        if config.kl_coef > 0 and ref_model is None:
            raise ValueError("kl_coef > 0 needs a reference model: pass ref_model (e.g. load_reference_model(path)).")
        if config.algorithm == "ppo" and value_model is None:
            raise ValueError("algorithm 'ppo' needs a value model: pass value_model=ValueModel(path).")
        if config.algorithm != "ppo" and value_model is not None:
            raise ValueError(
                f"algorithm {config.algorithm!r} has no critic, so a value model would have no targets: "
                "drop value_model, or use algorithm 'ppo'."
            )
        self.model = model
        self.config = config
        self.pad_token_id = pad_token_id
        self.ref_model = ref_model
        self.value_model = value_model
        self.device = next(model.parameters()).device
        self.step_count = 0
        self.last_advantages: torch.Tensor | None = None
        """``[B, T]``: the last step's advantages, rows in its trajectories' order (for the dashboard's samples)."""
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=config.lr,
            betas=config.betas,
            weight_decay=config.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _schedule(config))
        self.value_optimizer = (
            torch.optim.AdamW(value_model.parameters(), lr=config.value_lr) if value_model is not None else None
        )

    # --- the step --------------------------------------------------------------------------------

    def step(self, trajectories: Sequence[Trajectory], version: int | None = None) -> dict[str, float]:
        """One update on these trajectories (whole groups); returns ``train/...`` metrics.

        ``version`` is the engine's tag of the weights the trainer holds now (the version the last
        weight sync produced): tokens tagged lower were sampled by an older policy. It picks the
        ``auto`` correction and splits the log-prob gap into engine mismatch and policy lag; without
        it every token counts as sampled by the current weights."""
        started = time.perf_counter()
        config = self.config
        batch = collate(trajectories, self.pad_token_id).to(self.device)
        stale = _stale_tokens(batch, version)
        correction = config.correction
        if correction == "auto":
            stale_tokens = _all_sum(stale.sum().to("cpu", torch.float64))  # every process decides alike
            correction = STALE_CORRECTION if float(stale_tokens) > 0 else "none"
        reuse = config.epochs > 1 or config.mini_batches > 1
        with torch.no_grad():
            batch = replace(
                batch,
                old_logprobs=self._logprobs(self.model, batch) if reuse else None,
                ref_logprobs=self._logprobs(self.ref_model, batch) if self.ref_model is not None else None,
                values=self._values(batch) if self.value_model is not None else None,
            )
        jensen = None
        if config.algorithm == "jepo":  # JEPO's reward: log pi(reference | prompt, trajectory)
            batch = replace(batch, rewards=self._reference_logliks(batch))
            jensen = scored_jensen_terms(batch, bound=config.jensen_bound)  # the supervised term's weights
            batch = replace(batch, reference_weights=jensen.weights)
        batch = self._with_advantages(batch)
        self.last_advantages = batch.advantages.detach().cpu() if batch.advantages is not None else None

        totals: dict[str, float] = {}
        gaps = torch.zeros(4, dtype=torch.float64)  # |trainer - engine log-prob| sums and token counts: fresh, stale
        for _ in range(config.epochs):
            order = torch.randperm(len(batch)) if config.mini_batches > 1 else torch.arange(len(batch))
            for rows in order.chunk(config.mini_batches):
                sums, mini_gaps = self._update(batch.select(rows), stale[rows], correction)
                gaps += mini_gaps
                for name, value in sums.items():
                    totals[name] = totals.get(name, 0.0) + value
        updates = config.epochs * config.mini_batches
        metrics = {name: value / updates for name, value in totals.items()}
        gaps = _all_sum(gaps)
        if gaps[1] > 0:  # tokens sampled by the weights being trained: where engine and trainer disagree
            metrics["train/engine_logprob_gap"] = float(gaps[0] / gaps[1])
        if gaps[3] > 0:  # tokens sampled by an older version: the policy's lag (engine mismatch included)
            metrics["train/policy_lag_logprob_gap"] = float(gaps[2] / gaps[3])
        self.step_count += 1
        metrics.update(_batch_metrics(batch))
        if jensen is not None:
            metrics.update(_jepo_metrics(batch, jensen))
        metrics["train/stale_token_fraction"] = float(stale.sum()) / max(batch.num_tokens, 1)  # stale: generated only
        metrics["train/corrected"] = float(correction != "none")
        metrics["train/lr"] = self.scheduler.get_last_lr()[0]
        metrics["perf/time_train"] = time.perf_counter() - started
        metrics["perf/train_tokens_per_s"] = int(batch.attention_mask.sum()) / metrics["perf/time_train"]
        return metrics

    def _update(self, mini: Batch, stale: torch.Tensor, correction: str) -> tuple[dict[str, float], torch.Tensor]:
        """Accumulate gradients over micro-batches, then one optimizer step; returns the metric sums
        and this process's log-prob gap sums (see :meth:`step`)."""
        config = self.config
        counts = _all_sum(
            torch.tensor([mini.num_tokens, mini.num_seqs, mini.num_reference_tokens], dtype=torch.float64)
        )
        num_tokens, num_seqs = max(float(counts[0]), 1.0), max(float(counts[1]), 1.0)
        num_reference = float(counts[2])
        norm_length = config.norm_length or mini.input_ids.shape[1]
        self.optimizer.zero_grad(set_to_none=True)
        if self.value_optimizer is not None:
            self.value_optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        gaps = torch.zeros(4, dtype=torch.float64)
        rows = self._rows_with_gradient(mini)
        computed, stale = mini.select(rows), stale[rows]
        for micro, micro_stale in zip(computed.split(config.micro_batch_size), stale.split(config.micro_batch_size)):
            losses = self._losses(micro, micro_stale, correction, num_tokens, num_seqs, norm_length, num_reference)
            losses.pop("loss").backward()
            gaps += losses.pop("gaps")
            for name, value in losses.items():
                sums[name] = sums.get(name, 0.0) + float(value)
        if len(computed) < len(mini):  # means over the rows computed, not diluted by the skipped ones
            _rescale_means(sums, mini, computed, config.loss_aggregation)
        grad_norm = self._finish_gradients(self.model, self.optimizer)
        self.optimizer.step()
        self.scheduler.step()
        if self.value_model is not None and self.value_optimizer is not None:
            self._finish_gradients(self.value_model, self.value_optimizer)
            self.value_optimizer.step()
        if _data_parallel():  # every process reports the whole mini-batch's loss terms
            names = sorted(sums)
            sums = dict(zip(names, _all_sum(torch.tensor([sums[n] for n in names], dtype=torch.float64)).tolist()))
        sums["train/grad_norm"] = grad_norm
        sums["train/computed_fraction"] = len(computed) / len(mini)
        return sums, gaps

    def _losses(
        self,
        micro: Batch,
        stale: torch.Tensor,
        correction: str,
        num_tokens: float,
        num_seqs: float,
        norm_length: int,
        num_reference: float,
    ) -> dict[str, Any]:
        """The loss of one micro-batch, already divided by the mini-batch's counts, and its parts."""
        config = self.config
        mask = micro.loss_mask
        scored = micro.reference_weights is not None and micro.reference_mask is not None  # JEPO

        def total(per_token: torch.Tensor) -> torch.Tensor:
            return aggregate(
                per_token,
                mask,
                config.loss_aggregation,
                num_tokens=num_tokens,
                num_seqs=num_seqs,
                norm_length=norm_length,
            )

        current = generated_logprobs(
            self.model,
            micro.input_ids,
            micro.attention_mask,
            mask + micro.reference_mask if scored else mask,  # type: ignore[operator]  # one pass for both
            entropy_grad=config.entropy_coef > 0,
            group_index=self._groups(micro),
            temperature=config.temperature or 1.0,
        )
        assert micro.advantages is not None  # step() estimates them before any update
        old = micro.old_logprobs if micro.old_logprobs is not None else current.logprobs.detach()
        per_token, stats = policy_loss(
            current.logprobs,
            old,
            micro.advantages,
            mask,
            clip_low=config.clip_low,
            clip_high=config.clip_high,
            dual_clip=config.dual_clip,
            behaviour_logprobs=micro.behaviour_logprobs,
            correction=correction,  # type: ignore[arg-type]  # resolved from "auto" by step()
            is_cap=config.is_cap,
        )
        policy = total(per_token)
        entropy = total(current.entropy)
        loss = policy - config.entropy_coef * entropy if config.entropy_coef else policy
        parts: dict[str, Any] = {"train/policy_loss": policy.detach(), "train/entropy": entropy.detach()}
        if scored:
            assert micro.reference_mask is not None and micro.reference_weights is not None
            supervised = reference_loss(
                current.logprobs, micro.reference_mask, micro.reference_weights, num_tokens=num_reference
            )
            loss = loss + config.reference_coef * supervised
            parts["train/reference_loss"] = supervised.detach()
        if micro.ref_logprobs is not None:  # there is a reference model
            kl = total(kl_estimate(current.logprobs, micro.ref_logprobs, config.kl_estimator))
            if not config.kl_in_reward:
                loss = loss + config.kl_coef * kl
            parts["train/kl"] = kl.detach()
        if self.value_model is not None:
            assert micro.values is not None and micro.returns is not None  # step() sets both for PPO
            values = self.value_model(micro.input_ids, micro.attention_mask)
            critic = total(value_loss(values, micro.values, micro.returns, mask, clip=config.value_clip))
            loss = loss + critic
            parts["train/value_loss"] = critic.detach()
        share = mask.sum() / num_tokens  # weights per-micro-batch stats into mini-batch means
        gap = (current.logprobs.detach() - micro.behaviour_logprobs).abs() * mask
        fresh = mask * ~stale
        parts["gaps"] = torch.stack([(gap * fresh).sum(), fresh.sum(), (gap * stale).sum(), (mask * stale).sum()]).to(
            "cpu", torch.float64
        )
        if correction != "none":
            parts["train/is_weight_mean"] = float(stats.is_weight_mean) * float(share)
            parts["train/is_capped_fraction"] = float(stats.is_capped_fraction) * float(share)
        parts["train/clip_fraction"] = float(stats.clip_fraction) * float(share)
        parts["train/approx_kl"] = float(stats.approx_kl) * float(share)
        parts["train/loss"] = loss.detach()
        parts["loss"] = loss
        return parts

    # --- pieces ----------------------------------------------------------------------------------

    def _rows_with_gradient(self, mini: Batch) -> torch.Tensor:
        """The rows of ``mini`` to compute: those whose loss has a gradient.

        When the loss is the policy-gradient term alone (no entropy bonus, KL term, critic or JEPO
        term), a row whose advantages are all 0, as in a GRPO group of equal rewards, adds exactly
        nothing to the gradient, so it is not computed; its tokens still count in the loss's
        normalisers, so the update is the same. At least one row is kept, so that every parameter
        gets its gradient (zero or not) as usual. Data-parallel processes compute every row: FSDP's
        collectives need the same passes on every process."""
        everything = torch.arange(len(mini))
        config = self.config
        assert mini.advantages is not None  # step() estimates them before any update
        if (
            config.entropy_coef
            or mini.ref_logprobs is not None
            or self.value_model is not None
            or mini.reference_weights is not None
            or _data_parallel()
        ):
            return everything
        live = ((mini.advantages != 0) & (mini.loss_mask > 0)).any(dim=-1).nonzero().squeeze(-1).cpu()
        return live if live.numel() else everything[:1]

    def _logprobs(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        parts = [
            generated_logprobs(
                model,
                micro.input_ids,
                micro.attention_mask,
                micro.loss_mask,
                group_index=self._groups(micro),
                temperature=self.config.temperature or 1.0,
            ).logprobs
            for micro in batch.split(self.config.micro_batch_size)
        ]
        return torch.cat(parts)

    def _reference_logliks(self, batch: Batch) -> torch.Tensor:
        """``[B]``: the log-likelihood the policy gives each trajectory's reference answer after it
        (0 for a trajectory without one), under the weights before this update."""
        if batch.reference_mask is None:
            return torch.zeros(len(batch), device=self.device)
        with torch.no_grad():
            return reference_logliks(
                self.model, batch, self.config.micro_batch_size, temperature=self.config.temperature or 1.0
            )

    def _groups(self, micro: Batch) -> torch.Tensor | None:
        """Group indices for the shared-prompt pass (one forward over a group's common prefix).

        Off with gradient checkpointing, which cannot keep a key/value cache in training."""
        return None if self.config.gradient_checkpointing else micro.group_index

    def _values(self, batch: Batch) -> torch.Tensor:
        assert self.value_model is not None
        parts = [self.value_model(m.input_ids, m.attention_mask) for m in batch.split(self.config.micro_batch_size)]
        return torch.cat(parts) * batch.loss_mask

    def _with_advantages(self, batch: Batch) -> Batch:
        """The batch with its advantages (and, for PPO, the critic's returns) attached; with
        ``kl_in_reward`` its rewards carry the KL penalty first."""
        config = self.config
        if config.kl_in_reward and batch.ref_logprobs is not None:
            behaviour = batch.old_logprobs if batch.old_logprobs is not None else batch.behaviour_logprobs
            kl = kl_estimate(behaviour, batch.ref_logprobs, config.kl_estimator) * batch.loss_mask
            batch = replace(
                batch,
                token_rewards=kl_penalty_rewards(batch.token_rewards, kl, config.kl_coef),
                rewards=batch.rewards - config.kl_coef * kl.sum(-1),  # what sequence-level estimators read
            )
        estimated = estimate_advantages(
            ESTIMATOR_OF.get(config.algorithm, config.algorithm),
            batch,
            batch.values,
            gamma=config.gamma,
            lam=config.lam,
            scale=config.scale_rewards,
            returns=config.returns,
            step_weight=config.step_weight,
            bound=config.jensen_bound,
        )
        return replace(batch, advantages=estimated.advantages, returns=estimated.returns)

    def _finish_gradients(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
        """Sum gradients over data-parallel processes, then clip; returns the norm before clipping."""
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if _data_parallel():  # FSDP has reduce-scattered its shards' gradients (DTensors) already
            for param in params:
                if not _sharded(param.grad):
                    dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
        if any(_sharded(p.grad) for p in params):
            return _clip_sharded(params, self.config.max_grad_norm)
        if self.config.max_grad_norm > 0:
            return float(nn.utils.clip_grad_norm_(params, self.config.max_grad_norm))
        return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))) if params else 0.0

    def reference_nll(self, trajectories: Sequence[Trajectory]) -> float | None:
        """The negative log-likelihood per token that the current weights give the reference answers
        of ``trajectories`` (``Trajectory.reference_ids``), each after its own episode; None when no
        trajectory has one (:func:`~agentrl.trainers.models.score_references`). A held-out measure
        for envs that can only be graded by likelihood."""
        scores = score_references(
            self.model,
            trajectories,
            self.pad_token_id,
            micro_batch_size=self.config.micro_batch_size,
            temperature=self.config.temperature or 1.0,
        )
        return None if scores is None else scores.nll

    def supervised_step(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """One supervised update: raise the likelihood of the tokens marked generated (``loss_mask``
        1) in ``trajectories``, which here are demonstrations written into them, not samples of the
        policy. The loss is their mean negative log-likelihood per token (at temperature 1); the
        run's gradient clipping, optimizer and schedule apply. Returns ``train/nll`` (before the
        update), ``train/grad_norm`` and ``train/lr``. A warm start before RL uses it (the WaltzRL
        recipe's feedback format: ``recipes/waltzrl/warm_start.py``)."""
        batch = collate(trajectories, self.pad_token_id).to(self.device)
        num_tokens = max(float(_all_sum(torch.tensor([batch.num_tokens], dtype=torch.float64))[0]), 1.0)
        self.optimizer.zero_grad(set_to_none=True)
        nll = 0.0
        for micro in batch.split(self.config.micro_batch_size):
            current = generated_logprobs(self.model, micro.input_ids, micro.attention_mask, micro.loss_mask)
            loss = -(current.logprobs * micro.loss_mask).sum() / num_tokens
            loss.backward()
            nll += float(loss.detach())
        grad_norm = self._finish_gradients(self.model, self.optimizer)
        self.optimizer.step()
        self.scheduler.step()
        self.step_count += 1
        return {"train/nll": nll, "train/grad_norm": grad_norm, "train/lr": self.scheduler.get_last_lr()[0]}

    def logprob_gap(self, trajectories: Sequence[Trajectory]) -> float:
        """The mean |log-prob under the weights held now - the recorded log-prob| over the generated
        tokens of ``trajectories``, at the sampling temperature: about 0 when the engine that sampled
        them serves exactly these weights (the training job's weights probe)."""
        batch = collate(trajectories, self.pad_token_id).to(self.device)
        with torch.no_grad():
            mine = self._logprobs(self.model, batch)
        mask = batch.loss_mask.to(mine.dtype)
        return float(((mine - batch.behaviour_logprobs).abs() * mask).sum() / mask.sum().clamp(min=1))

    # --- weights and state -----------------------------------------------------------------------

    def inference_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's tensors for the inference engine (LoRA merged, tied head included)."""
        return inference_state_dict(self.model)

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed trainer needs: weights, optimizer, schedule, step, RNG states."""
        state: dict[str, Any] = {
            "model": {k: v for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step_count,
            "rng": rng_state(),
        }
        if self.value_model is not None and self.value_optimizer is not None:
            state["value_model"] = self.value_model.state_dict()
            state["value_optimizer"] = self.value_optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step_count = int(state["step"])
        set_rng_state(state["rng"])
        if self.value_model is not None and "value_model" in state:
            self.value_model.load_state_dict(state["value_model"])
            assert self.value_optimizer is not None
            self.value_optimizer.load_state_dict(state["value_optimizer"])


def rng_state() -> dict[str, Any]:
    """The random states of torch, numpy and Python."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def _schedule(config: TrainerConfig) -> Any:
    def factor(step: int) -> float:
        if config.warmup_steps and step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        if config.lr_schedule == "constant" or config.total_steps <= config.warmup_steps:
            return 1.0
        progress = min(1.0, (step - config.warmup_steps) / (config.total_steps - config.warmup_steps))
        if config.lr_schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def _data_parallel() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _all_sum(tensor: torch.Tensor) -> torch.Tensor:
    if _data_parallel():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def _sharded(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a shard of a whole one (an FSDP2 ``DTensor``)."""
    return hasattr(tensor, "full_tensor")


def _clip_sharded(params: list[nn.Parameter], max_norm: float) -> float:
    """``clip_grad_norm_`` over gradients some of which are FSDP shards: each shard's norm is completed
    over the ranks, the whole ones' taken as they are; returns the norm before clipping."""
    norms = []
    for param in params:
        norm = torch.linalg.vector_norm(param.grad)
        norms.append(norm.full_tensor() if _sharded(norm) else norm)
    total = torch.linalg.vector_norm(torch.stack(norms))
    if max_norm > 0:
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for param in params:
            param.grad.mul_(scale)
    return float(total)


def _rescale_means(sums: dict[str, float], whole: Batch, computed: Batch, aggregation: str) -> None:
    """Make the :data:`TOKEN_MEANS` in ``sums``, divided by ``whole``'s counts as the loss is, means
    over the rows of ``computed`` alone."""
    by_tokens = whole.num_tokens / max(computed.num_tokens, 1)
    by_seqs = whole.num_seqs / max(computed.num_seqs, 1)
    for name in TOKEN_MEANS:
        if name in sums:
            aggregated = name == "train/entropy" and aggregation != "token-mean"  # as the loss: over sequences
            sums[name] *= by_seqs if aggregated else by_tokens


def _stale_tokens(batch: Batch, version: int | None) -> torch.Tensor:
    """``[B, T]`` bool: generated tokens sampled by an older policy version than ``version``."""
    if version is None:
        return torch.zeros_like(batch.versions, dtype=torch.bool)
    return (batch.versions >= 0) & (batch.versions < version) & (batch.loss_mask > 0)


def _batch_metrics(batch: Batch) -> dict[str, float]:
    mask = batch.loss_mask
    advantages = batch.advantages
    assert advantages is not None  # estimated at the start of every step
    versions = batch.versions[batch.versions >= 0]
    groups = [batch.rewards[batch.group_index == g] for g in torch.unique(batch.group_index)]
    informative = sum(bool((g != g[0]).any()) for g in groups)  # a group of equal rewards has no GRPO signal
    return {
        "train/reward_mean": float(batch.rewards.mean()),
        "train/effective_group_fraction": informative / max(len(groups), 1),
        "train/advantage_mean": float((advantages * mask).sum() / mask.sum().clamp(min=1)),
        "train/trajectories": float(len(batch)),
        "train/generated_tokens": float(mask.sum()),
        "train/behaviour_version_min": float(versions.min()) if versions.numel() else -1.0,
    }


def _jepo_metrics(batch: Batch, terms: JensenTerms) -> dict[str, float]:
    """The reference answers' likelihood per token: each trajectory's, and its group's bound."""
    assert batch.reference_mask is not None  # the jepo estimator refused batches without references
    tokens = batch.reference_mask.sum(-1)
    scored = tokens > 0
    return {
        "train/reference_nll": float(-batch.rewards[scored].sum() / tokens.sum()),
        "train/jensen_bound": float(terms.bound[scored].sum() / tokens.sum()),  # a group's rows share one reference
        "train/unscored_trajectories": float((~scored).sum()),
    }
