"""Losses: pure functions of ``[B, T]`` tensors aligned with the token ids.

Position ``t`` of every per-token tensor describes token ``t``: the log-prob of token ``t`` given
the tokens before it (:func:`agentrl.trainers.models.generated_logprobs`), its advantage, its KL to
the reference; position 0 (no context) holds 0. The per-token losses are 0 where the mask is 0;
:func:`aggregate` turns them into one scalar in one of three documented ways, and sums over
micro-batches to the whole batch's value when it is given the whole batch's counts (gradient
accumulation gives the same gradient as one big batch).

Return values carry names: :class:`PolicyLossStats` holds 0-dim detached tensors (``float()`` them
for logging; keeping them as tensors avoids a device sync per micro-batch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import torch

AggregationMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLKind = Literal["k1", "k2", "k3"]
Correction = Literal["none", "tis", "decoupled"]
CORRECTIONS: tuple[str, ...] = ("none", "tis", "decoupled")

KL_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": lambda log_ratio: log_ratio,
    "k2": lambda log_ratio: 0.5 * log_ratio**2,
    "k3": lambda log_ratio: torch.expm1(-log_ratio) + log_ratio,
}
"""Schulman's estimators of KL(policy || reference) from ``log_ratio = logprobs - ref_logprobs``
of tokens sampled from the policy: k1 unbiased, k2 biased with low variance, k3 unbiased and
non-negative (GRPO's choice)."""


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind = "k3") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) (Schulman, "Approximating KL divergence", 2020).

    With ``x = logprobs - ref_logprobs``: k1 = ``x``, k2 = ``x**2 / 2``, k3 = ``exp(-x) - 1 + x``.
    k3 is GRPO's (Shao et al. 2024) and the default.

    >>> kl_estimate(torch.tensor([0.0, -1.0]), torch.tensor([0.0, 0.0]), "k2")
    tensor([0.0000, 0.5000])
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"kind must be one of {sorted(KL_ESTIMATORS)}, got {kind!r}.")
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs and ref_logprobs must have one shape, got {tuple(logprobs.shape)} and "
            f"{tuple(ref_logprobs.shape)}."
        )
    return KL_ESTIMATORS[kind](logprobs - ref_logprobs)


def kl_penalty_rewards(
    token_rewards: torch.Tensor, kl: torch.Tensor, coef: float, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """KL as a reward penalty (Ziegler et al. 2019; InstructGPT): ``token_rewards - coef * kl``,
    the penalty only on generated tokens when ``mask`` is given. (KL as a loss term instead is
    ``coef * aggregate(kl_estimate(...), mask, mode)``.)"""
    penalty = coef * kl.detach()
    if mask is not None:
        penalty = torch.where(mask > 0, penalty, 0.0)
    return token_rewards - penalty


def _per_sequence(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's masked sum and token count."""
    keep = mask > 0
    # where, not multiply: a non-finite value on a padding position must not turn the sum into NaN.
    return torch.where(keep, values, 0.0).sum(-1), keep.sum(-1).to(values.dtype)


def _count(counted: torch.Tensor, given: float | None) -> torch.Tensor | float:
    """The count to divide by: the one given (the whole batch's), else the one counted here; at
    least 1, so an empty mask gives 0 rather than NaN."""
    return counted.clamp(min=1) if given is None else max(float(given), 1.0)


def _token_mean(
    values: torch.Tensor,
    mask: torch.Tensor,
    num_tokens: float | None,
    num_seqs: float | None,
    norm_length: float | None,
) -> torch.Tensor:
    sums, counts = _per_sequence(values, mask)
    return sums.sum() / _count(counts.sum(), num_tokens)


def _seq_mean_token_mean(
    values: torch.Tensor,
    mask: torch.Tensor,
    num_tokens: float | None,
    num_seqs: float | None,
    norm_length: float | None,
) -> torch.Tensor:
    sums, counts = _per_sequence(values, mask)
    return (sums / counts.clamp(min=1)).sum() / _count((counts > 0).sum(), num_seqs)


def _seq_mean_token_sum_norm(
    values: torch.Tensor,
    mask: torch.Tensor,
    num_tokens: float | None,
    num_seqs: float | None,
    norm_length: float | None,
) -> torch.Tensor:
    sums, counts = _per_sequence(values, mask)
    length = float(values.shape[-1] if norm_length is None else norm_length)
    return (sums / length).sum() / _count((counts > 0).sum(), num_seqs)


LOSS_AGGREGATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}
"""The aggregation modes of :func:`aggregate` by name."""


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: AggregationMode = "token-mean",
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """Reduce per-token ``values`` ``[B, T]`` over the positions where ``mask`` is 1 to a scalar.

    Modes:
        ``token-mean``: the sum over all tokens divided by the number of tokens (DAPO, Yu et al.
            2025: every token weighs the same, long answers are not diluted).
        ``seq-mean-token-mean``: each sequence's mean over its tokens, then the mean over
            sequences (the original GRPO, Shao et al. 2024).
        ``seq-mean-token-sum-norm``: each sequence's sum divided by the constant ``norm_length``
            (default ``T``; give the generation budget to keep it constant across batches), then
            the mean over sequences (Dr. GRPO, Liu et al. 2025).

    ``num_tokens`` and ``num_seqs`` replace the counts taken from ``mask``: pass the whole batch's
    (``Batch.num_tokens``, ``Batch.num_seqs``) for each micro-batch, and the micro-batch results
    sum to the whole batch's result. A sequence counts when it has at least one masked-in token;
    an empty mask gives 0.

    >>> aggregate(torch.tensor([[1.0, 3.0], [5.0, 0.0]]), torch.tensor([[1, 1], [1, 0]]), "seq-mean-token-mean")
    tensor(3.5000)
    """
    if mode not in LOSS_AGGREGATIONS:
        raise ValueError(f"mode must be one of {sorted(LOSS_AGGREGATIONS)}, got {mode!r}.")
    if values.shape != mask.shape or values.ndim != 2:
        raise ValueError(f"values and mask must both be [B, T], got {tuple(values.shape)} and {tuple(mask.shape)}.")
    if norm_length is not None and norm_length <= 0:
        raise ValueError(f"norm_length must be positive, got {norm_length}.")
    return LOSS_AGGREGATIONS[mode](values, mask, num_tokens, num_seqs, norm_length)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` where ``mask`` is 1 (0 when the mask is empty)."""
    keep = mask > 0
    return torch.where(keep, values, 0.0).sum() / keep.sum().clamp(min=1)


class PolicyLossStats(NamedTuple):
    """Statistics of one :func:`policy_loss` call over its masked tokens (0-dim detached tensors)."""

    clip_fraction: torch.Tensor
    """Share of tokens whose clipped term is the active one (no gradient through the ratio)."""
    dual_clip_fraction: torch.Tensor
    """Share of tokens bounded by the dual clip (0 without ``dual_clip``)."""
    approx_kl: torch.Tensor
    """Mean of ``(ratio - 1) - log(ratio)``: k3's estimate of KL(old || current)."""
    ratio_mean: torch.Tensor
    """Mean of ``exp(logprobs - old_logprobs)``."""
    ratio_max: torch.Tensor
    """Largest ratio."""
    is_weight_mean: torch.Tensor
    """Mean behaviour importance weight after truncation (1 without a correction)."""
    is_capped_fraction: torch.Tensor
    """Share of tokens whose behaviour weight hit ``is_cap`` (clamped for tis, dropped for decoupled)."""


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    behaviour_logprobs: torch.Tensor | None = None,
    correction: Correction = "none",
    is_cap: float | None = 2.0,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """PPO's clipped surrogate per token (Schulman et al. 2017), 0 where ``mask`` is 0.

    ``loss = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))`` with
    ``r = exp(logprobs - old_logprobs)``. Options, all off by default:

    - ``clip_high > clip_low``: DAPO's clip-higher (Yu et al. 2025 use 0.28 against 0.2).
    - ``dual_clip=c`` (``c > 1``, Ye et al. 2020 use 3): for ``A < 0`` the loss is bounded by
      ``c * |A|``, so a huge ratio on a bad token cannot blow the update up.
    - ``correction="tis"``: truncated importance sampling (Yao et al. 2025) for the gap between
      the inference engine and the trainer: ``old_logprobs`` are the trainer's recomputation,
      ``behaviour_logprobs`` the engine's, and each token's loss is multiplied by
      ``min(exp(old - behaviour), is_cap)`` (detached).
    - ``correction="decoupled"``: decoupled PPO (AReaL, Fu et al. 2025) for stale rollouts: the
      clip is taken against the proximal policy ``old_logprobs`` (the trainer's recomputation with
      the weights before this update), and the behaviour gap enters as the weight
      ``exp(old - behaviour)``; as in AReaL's code, tokens whose weight exceeds ``is_cap`` are
      dropped (weight 0) rather than clamped. ``is_cap=None`` keeps every weight as it is.

    Returns:
        The per-token loss ``[B, T]`` (reduce it with :func:`aggregate`) and its
        :class:`PolicyLossStats`.
    """
    if not logprobs.shape == old_logprobs.shape == advantages.shape == mask.shape:
        raise ValueError(
            "logprobs, old_logprobs, advantages and mask must share one [B, T] shape, got "
            f"{tuple(logprobs.shape)}, {tuple(old_logprobs.shape)}, {tuple(advantages.shape)}, {tuple(mask.shape)}."
        )
    if correction not in CORRECTIONS:
        raise ValueError(f"correction must be one of {CORRECTIONS}, got {correction!r}.")
    if correction != "none" and behaviour_logprobs is None:
        raise ValueError(
            f"correction={correction!r} needs behaviour_logprobs (the engine's log-probs, Batch.behaviour_logprobs)."
        )
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be greater than 1 (Ye et al. use 3), got {dual_clip}.")
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low} and {clip_high}.")
    if is_cap is not None and is_cap <= 0:
        raise ValueError(f"is_cap must be positive or None, got {is_cap}.")

    keep = mask > 0
    old_logprobs = old_logprobs.detach()
    advantages = advantages.detach()
    log_ratio = torch.where(keep, logprobs - old_logprobs, 0.0)
    ratio = torch.exp(log_ratio)
    surrogate = -advantages * ratio
    clipped_surrogate = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(surrogate, clipped_surrogate)
    clipped = clipped_surrogate > surrogate
    dual_clipped = torch.zeros_like(keep)
    if dual_clip is not None:
        bound = -advantages * dual_clip  # c * |A| where A < 0
        dual_clipped = (advantages < 0) & (loss > bound)
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)

    weight = torch.ones_like(ratio)
    capped = torch.zeros_like(keep)
    if correction != "none":
        assert behaviour_logprobs is not None  # checked above; narrows the type
        raw = torch.exp(torch.where(keep, old_logprobs - behaviour_logprobs.detach(), 0.0))
        capped = raw > is_cap if is_cap is not None else torch.zeros_like(keep)
        if correction == "tis":
            weight = raw.clamp(max=is_cap) if is_cap is not None else raw
        else:
            weight = torch.where(capped, 0.0, raw)
        loss = loss * weight

    loss = torch.where(keep, loss, 0.0)
    with torch.no_grad():
        stats = PolicyLossStats(
            clip_fraction=masked_mean(clipped.float(), mask),
            dual_clip_fraction=masked_mean(dual_clipped.float(), mask),
            approx_kl=masked_mean(ratio - 1.0 - log_ratio, mask),
            ratio_mean=masked_mean(ratio, mask),
            ratio_max=torch.where(keep, ratio, 0.0).max() if ratio.numel() else ratio.new_zeros(()),
            is_weight_mean=masked_mean(weight, mask),
            is_capped_fraction=masked_mean((capped & keep).float(), mask),
        )
    return loss, PolicyLossStats(*(s.detach() for s in stats))


def reference_loss(
    logprobs: torch.Tensor, reference_mask: torch.Tensor, weights: torch.Tensor, *, num_tokens: float | None = None
) -> torch.Tensor:
    """JEPO's supervised term: the negative log-likelihood of reference answers, each trajectory's
    reference tokens weighted by ``weights[i]`` (:func:`agentrl.trainers.advantages.jensen_terms`;
    all 1 is plain supervised fine-tuning), summed and divided by ``num_tokens`` (the reference
    tokens of the whole mini-batch; this micro-batch's when None), so micro-batches add up.

    >>> reference_loss(torch.tensor([[0.0, -1.0, -2.0]]), torch.tensor([[0.0, 1.0, 1.0]]), torch.tensor([2.0]))
    tensor(3.)
    """
    if logprobs.shape != reference_mask.shape or weights.shape != logprobs.shape[:1]:
        raise ValueError(
            f"reference_loss takes logprobs and reference_mask [B, T] and weights [B], got {tuple(logprobs.shape)}, "
            f"{tuple(reference_mask.shape)} and {tuple(weights.shape)}."
        )
    count = reference_mask.sum().clamp(min=1) if num_tokens is None else max(num_tokens, 1.0)
    return -(logprobs * reference_mask * weights[:, None]).sum() / count


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = 0.2,
) -> torch.Tensor:
    """PPO's clipped value loss per token, 0 where ``mask`` is 0:
    ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, -clip, clip) - R)^2)``; ``clip=None`` gives the
    plain ``0.5 * (V - R)^2``."""
    if not values.shape == old_values.shape == returns.shape == mask.shape:
        raise ValueError(
            "values, old_values, returns and mask must share one [B, T] shape, got "
            f"{tuple(values.shape)}, {tuple(old_values.shape)}, {tuple(returns.shape)}, {tuple(mask.shape)}."
        )
    returns = returns.detach()
    loss = (values - returns) ** 2
    if clip is not None:
        if clip <= 0:
            raise ValueError(f"clip must be positive or None, got {clip}.")
        old_values = old_values.detach()
        clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
        loss = torch.maximum(loss, (clipped_values - returns) ** 2)
    return torch.where(mask > 0, 0.5 * loss, 0.0)
