"""Advantage estimators: pure functions of tensors, one per method, and a dict that names them.

Sequence-level estimators (GRPO, Dr. GRPO, RLOO) give one advantage per trajectory from the episode
returns, spread over its generated tokens with :func:`expand_to_tokens`; with turn-level returns
(``returns="turn"``, for per-turn rewards such as a multi-agent env's) they give one advantage per
turn from its return to go instead (:func:`turn_returns`, :func:`turn_group_advantages`,
:func:`turn_rloo_advantages`), spread over the turn's tokens with :func:`expand_turns_to_tokens`.
Token-level estimators (REINFORCE++, GAE) read ``token_rewards`` ``[B, T]``, where each turn's
reward sits on the last generated token of the turn, and run over generated tokens only: prompt,
observation and padding positions (``mask`` 0) are skipped, as if the generated tokens of all turns
stood side by side. JEPO (:func:`jensen_terms`) is sequence-level too, with a reward the trainer
computes itself: the log-likelihood the policy gives a reference answer after the trajectory.
Every ``[B, T]`` result is 0 where ``mask`` is 0.

:func:`estimate_advantages` is the one call a trainer makes, for every algorithm: it picks an
estimator of :data:`ADVANTAGE_ESTIMATORS` by name and returns :class:`Advantages` for a
:class:`Batch`: ``[B, T]`` advantages and, for an estimator with a critic (GAE), the returns the
critic learns from.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, NamedTuple, Protocol

import torch

from agentrl.suggest import did_you_mean
from agentrl.trainers.batch import Batch

Scale = Literal["group", "batch", "none"]
SCALES: tuple[str, ...] = ("group", "batch", "none")
Returns = Literal["episode", "turn"]
RETURNS: tuple[str, ...] = ("episode", "turn")


def _group_stats(rewards: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per trajectory: its group's size, reward sum and (unbiased) reward std; std 0 for size 1."""
    if rewards.ndim != 1 or group_index.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_index must both be [N], got shapes {tuple(rewards.shape)} and "
            f"{tuple(group_index.shape)}."
        )
    rewards = rewards.to(torch.float32)
    num_groups = int(group_index.max().item()) + 1 if group_index.numel() else 0
    counts = torch.bincount(group_index, minlength=num_groups).to(rewards.dtype)
    sums = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device).index_add_(0, group_index, rewards)
    means = sums / counts.clamp(min=1)
    squares = torch.zeros_like(sums).index_add_(0, group_index, (rewards - means[group_index]) ** 2)
    # Bessel's correction, as torch.std (and TRL's GRPOTrainer) use; a lone sample has no spread.
    stds = torch.where(counts > 1, (squares / (counts - 1).clamp(min=1)).sqrt(), torch.zeros_like(squares))
    return counts[group_index], sums[group_index], stds[group_index]


def group_advantages(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    *,
    scale: Scale = "group",
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO's advantage (Shao et al. 2024): each reward minus its group's mean, then scaled.

    ``scale="group"`` divides by the group's standard deviation plus ``eps`` (the unbiased
    ``torch.std``, as TRL's ``GRPOTrainer``; TRL adds 1e-4 where this adds ``eps``), ``"batch"`` by
    the unbiased std of all ``N`` rewards (Hu et al., REINFORCE++-baseline; TRL's
    ``scale_rewards="batch"``), and ``"none"`` leaves the difference unscaled (Dr. GRPO, Liu et al.
    2025, who show the std scaling biases training towards too easy and too hard prompts). A group
    of one trajectory gets advantage 0: it has no baseline but itself.

    >>> group_advantages(torch.tensor([1.0, 0.0, 3.0, 3.0]), torch.tensor([0, 0, 1, 1]), scale="none")
    tensor([ 0.5000, -0.5000,  0.0000,  0.0000])
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}.")
    counts, sums, group_stds = _group_stats(rewards, group_index)
    advantages = rewards.to(torch.float32) - sums / counts
    if scale == "group":
        return advantages / (group_stds + eps)
    if scale == "batch":
        batch_std = rewards.to(torch.float32).std() if rewards.numel() > 1 else rewards.new_zeros(())
        return advantages / (batch_std + eps)
    return advantages


def rloo_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """RLOO's advantage (Kool et al. 2019; Ahmadian et al. 2024): each reward minus the mean of the
    *other* rewards of its group, ``r_i - (sum_j r_j - r_i) / (n - 1)``.

    A group of one trajectory has no other sample to form a baseline, so its advantage is 0 (it
    contributes no gradient) rather than its raw reward: sample at least two per prompt.

    >>> rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 5.0]), torch.tensor([0, 0, 0, 1]))
    tensor([ 1.0000, -0.5000, -0.5000,  0.0000])
    """
    counts, sums, _ = _group_stats(rewards, group_index)
    rewards = rewards.to(torch.float32)
    baseline = (sums - rewards) / (counts - 1).clamp(min=1)
    return torch.where(counts > 1, rewards - baseline, torch.zeros_like(rewards))


Bound = Literal["single", "multi"]
BOUNDS: tuple[str, ...] = ("single", "multi")


class JensenTerms(NamedTuple):
    """JEPO's per-trajectory terms (:func:`jensen_terms`), each ``[N]``."""

    advantages: torch.Tensor
    """The learning signal of the trajectory's own tokens (its chain of thought)."""
    weights: torch.Tensor
    """The weight of the reference answer's log-likelihood after the trajectory (mean 1 in a group)."""
    bound: torch.Tensor
    """The group's estimate of the lower bound on ``log p(reference | prompt)``."""


def jensen_terms(logliks: torch.Tensor, group_index: torch.Tensor, *, bound: Bound = "multi") -> JensenTerms:
    """JEPO (Tang, Wang, Madaan and Munos, "Beyond Verifiable Rewards: Scaling Reinforcement Learning
    for Language Models to Unverifiable Data", 2025): the gradient of a Jensen lower bound on the
    log-likelihood of a reference answer ``y*``, with the chain of thought ``z`` as a latent variable.

    ``logliks[i] = log pi(y* | x, z_i)`` for the ``K`` samples ``z_i ~ pi(. | x)`` of a group:

    - ``single``: ``J = mean_i logliks[i]`` (``E_z log pi(y*|x,z) <= log p(y*|x)``); each
      trajectory's advantage is ``logliks[i] - mean_{j != i} logliks[j]`` (RLOO's baseline) and its
      reference weight 1;
    - ``multi``: ``J = log mean_i pi(y*|x,z_i)``, the K-sample bound (tighter; the paper's
      multi-sample JEPO); advantage ``K * (J - log mean_{j != i} pi(y*|x,z_j))`` (the bound without
      sample ``i``: a baseline that does not depend on ``z_i``) and weight ``K * softmax(logliks)_i``.

    Both are ``K`` times the gradient of ``J``, shared out per trajectory: the other estimators'
    scale, so a token-mean loss over a batch is a mean over its trajectories. A group of one sample
    gets advantage 0 and weight 1 (no baseline; a plain supervised term on the reference).

    >>> terms = jensen_terms(torch.tensor([1.0, 3.0]).log(), torch.tensor([0, 0]), bound="multi")  # p = 1, 3
    >>> terms.bound, terms.weights
    (tensor([0.6931, 0.6931]), tensor([0.5000, 1.5000]))
    """
    if bound not in BOUNDS:
        hint = did_you_mean(bound, BOUNDS)
        raise ValueError(f"bound must be one of {BOUNDS}, got {bound!r}." + (f" {hint}" if hint else ""))
    if logliks.ndim != 1 or group_index.shape != logliks.shape:
        raise ValueError(
            f"logliks and group_index must both be [N], got shapes {tuple(logliks.shape)} and "
            f"{tuple(group_index.shape)}."
        )
    logliks = logliks.to(torch.float32)
    advantages, weights, value = torch.zeros_like(logliks), torch.ones_like(logliks), torch.zeros_like(logliks)
    for group in torch.unique(group_index):
        rows = (group_index == group).nonzero().squeeze(-1)
        samples = logliks[rows]
        k = len(rows)
        if bound == "single":
            value[rows] = samples.mean()
            if k > 1:
                advantages[rows] = samples - (samples.sum() - samples) / (k - 1)
            continue
        value[rows] = torch.logsumexp(samples, 0) - math.log(k)
        if k > 1:
            others = samples.expand(k, k).masked_fill(torch.eye(k, dtype=torch.bool, device=samples.device), -math.inf)
            without = torch.logsumexp(others, 1) - math.log(k - 1)
            advantages[rows] = k * (value[rows] - without)
            weights[rows] = k * torch.softmax(samples, 0)
    return JensenTerms(advantages, weights, value)


def expand_to_tokens(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Give each generated token its trajectory's advantage: ``[B]`` to ``[B, T]``, 0 where
    ``mask`` is 0."""
    if advantages.ndim != 1 or mask.ndim != 2 or advantages.shape[0] != mask.shape[0]:
        raise ValueError(
            f"expand_to_tokens takes advantages [B] and mask [B, T], got {tuple(advantages.shape)} "
            f"and {tuple(mask.shape)}."
        )
    return advantages.to(torch.float32)[:, None] * (mask > 0)


def turn_returns(token_rewards: torch.Tensor, turn_index: torch.Tensor) -> torch.Tensor:
    """Each trajectory's returns to go per turn, ``[B, K]``: ``G_k = sum_{j >= k} r_j``, where the
    turn reward ``r_j`` is the sum of ``token_rewards`` over the tokens of turn ``j`` (``turn_index
    == j``: the turn's reward on its last generated token, a KL penalty on each of them) and ``K``
    is the most turns any trajectory has. 0 past a trajectory's last turn; tokens with
    ``turn_index`` -1 are ignored.

    Undiscounted, like the episode return the group estimators read otherwise (``G_0`` is it):
    ``TrainerConfig.gamma`` discounts per token, and discounting turns of unequal lengths by the
    same factor would mean something else.

    >>> turn_returns(torch.tensor([[0.0, 1.0, 0.0, 2.0]]), torch.tensor([[-1, 0, -1, 1]]))
    tensor([[3., 2.]])
    """
    if turn_index.ndim != 2 or token_rewards.shape != turn_index.shape:
        raise ValueError(
            f"token_rewards and turn_index must both be [B, T], got shapes {tuple(token_rewards.shape)} "
            f"and {tuple(turn_index.shape)}."
        )
    return per_turn_rewards(token_rewards, turn_index).flip(-1).cumsum(-1).flip(-1)


def per_turn_rewards(
    token_rewards: torch.Tensor, turn_index: torch.Tensor, num_turns: int | None = None
) -> torch.Tensor:
    """Each turn's reward, ``[B, K]``: the sum of ``token_rewards`` over the tokens of the turn
    (``K``: ``num_turns``, else the most turns any trajectory has); -1 tokens are ignored.

    >>> per_turn_rewards(torch.tensor([[0.0, 1.0, 0.0, 2.0]]), torch.tensor([[-1, 0, -1, 1]]))
    tensor([[1., 2.]])
    """
    if num_turns is None:
        num_turns = int(turn_index.max().item()) + 1 if turn_index.numel() else 0  # 0 when all are -1
    rewards = torch.zeros((turn_index.shape[0], num_turns), dtype=torch.float32, device=token_rewards.device)
    if num_turns == 0:
        return rewards
    per_token = torch.where(turn_index >= 0, token_rewards.to(torch.float32), 0.0)
    rewards.scatter_add_(1, turn_index.clamp(min=0), per_token)  # -1 positions add their 0 to turn 0
    return rewards


def _per_turn(
    advantage_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    returns: torch.Tensor,
    num_turns: torch.Tensor,
    group_index: torch.Tensor,
) -> torch.Tensor:
    """``advantage_fn`` (a group estimator of ``[N]`` returns and group indices) applied to each
    turn column in turn, over the trajectories that have that turn; 0 where they do not."""
    if returns.ndim != 2 or num_turns.shape != (returns.shape[0],) or group_index.shape != num_turns.shape:
        raise ValueError(
            f"returns must be [B, K] with num_turns and group_index [B], got shapes {tuple(returns.shape)}, "
            f"{tuple(num_turns.shape)} and {tuple(group_index.shape)}."
        )
    advantages = torch.zeros(returns.shape, dtype=torch.float32, device=returns.device)
    for turn in range(returns.shape[1]):
        rows = num_turns > turn
        if rows.any():
            advantages[rows, turn] = advantage_fn(returns[rows, turn], group_index[rows])
    return advantages


def turn_group_advantages(
    returns: torch.Tensor,
    num_turns: torch.Tensor,
    group_index: torch.Tensor,
    *,
    scale: Scale = "group",
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO's advantage (Shao et al. 2024) per turn: :func:`group_advantages` of the returns to go
    at turn ``k``, among the members of each group that have a turn ``k``, ``[B, K]``.

    ``returns`` is ``[B, K]`` (:func:`turn_returns`), ``num_turns`` ``[B]`` says how many of its
    columns each trajectory has (the rest are 0 in the result). The mean and, by ``scale``, the std
    are those of one turn index: the group's (``"group"``), every trajectory of the batch that has
    that turn (``"batch"``), or none (``"none"``, Dr. GRPO). A (group, turn) of one trajectory gets
    0. When only the last turn is rewarded and a group's members have equal turn counts, every turn
    gets the episode's :func:`group_advantages` (with ``"batch"``, when the whole batch's do).

    >>> turn_group_advantages(torch.tensor([[3.0, 2.0], [1.0, 0.0]]), torch.tensor([2, 1]),
    ...                       torch.tensor([0, 0]), scale="none")
    tensor([[ 1.,  0.],
            [-1.,  0.]])
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}.")
    return _per_turn(lambda r, g: group_advantages(r, g, scale=scale, eps=eps), returns, num_turns, group_index)


def turn_rloo_advantages(returns: torch.Tensor, num_turns: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """RLOO's advantage (Kool et al. 2019; Ahmadian et al. 2024) per turn, ``[B, K]``: each return
    to go at turn ``k`` minus the mean of those of the *other* members of its group that have a
    turn ``k`` (:func:`rloo_advantages` per turn; see :func:`turn_group_advantages` for the shapes).
    A (group, turn) of one trajectory gets 0.

    >>> turn_rloo_advantages(torch.tensor([[3.0, 2.0], [1.0, 0.0], [2.0, 2.0]]), torch.tensor([2, 1, 2]),
    ...                      torch.tensor([0, 0, 0]))
    tensor([[ 1.5000,  0.0000],
            [-1.5000,  0.0000],
            [ 0.0000,  0.0000]])
    """
    return _per_turn(rloo_advantages, returns, num_turns, group_index)


def discounted_turn_returns(turn_rewards: torch.Tensor, num_turns: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Discounted returns to go per turn, ``[B, K]``: ``G_k = r_k + gamma * G_{k+1}``, counted in
    turns (GiGPO's step returns); 0 past each trajectory's ``num_turns``.

    >>> discounted_turn_returns(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([3]), gamma=0.5)
    tensor([[0.2500, 0.5000, 1.0000]])
    """
    if turn_rewards.ndim != 2 or num_turns.shape != (turn_rewards.shape[0],):
        raise ValueError(
            f"turn_rewards must be [B, K] with num_turns [B], got {tuple(turn_rewards.shape)} and {tuple(num_turns.shape)}."
        )
    valid = torch.arange(turn_rewards.shape[1], device=turn_rewards.device)[None, :] < num_turns[:, None]
    rewards = torch.where(valid, turn_rewards.to(torch.float32), 0.0)
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=torch.float32, device=rewards.device)
    for turn in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, turn] + gamma * running
        returns[:, turn] = running
    return torch.where(valid, returns, 0.0)


def step_group_advantages(
    returns: torch.Tensor,
    states: torch.Tensor,
    group_index: torch.Tensor,
    *,
    scale: Scale = "group",
    eps: float = 1e-6,
) -> torch.Tensor:
    """GiGPO's step-level advantage (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM
    Agent Training"), ``[B, K]``: the turns of one group's episodes that answered the same state
    (an *anchor state*: equal ``states`` within equal ``group_index``) form a step group, and each
    turn's return to go is compared with its step group's: minus their mean, divided by their std
    with ``scale="group"`` (not with ``"none"``). A turn alone in its step group, and a turn with
    state -1 (none recorded, or past the trajectory's end), gets 0.

    >>> step_group_advantages(torch.tensor([[1.0, 1.0], [0.0, 0.5]]), torch.tensor([[0, 1], [0, 2]]),
    ...                       torch.tensor([0, 0]), scale="none")
    tensor([[ 0.5000,  0.0000],
            [-0.5000,  0.0000]])
    """
    if scale not in ("group", "none"):
        raise ValueError(
            f"step_group_advantages scales by its step group's std ('group') or not ('none'), got {scale!r}."
        )
    if returns.shape != states.shape or returns.ndim != 2 or group_index.shape != (returns.shape[0],):
        raise ValueError(
            f"returns and states must both be [B, K] with group_index [B], got {tuple(returns.shape)}, "
            f"{tuple(states.shape)} and {tuple(group_index.shape)}."
        )
    advantages = torch.zeros(returns.shape, dtype=torch.float32, device=returns.device)
    valid = states >= 0
    if not valid.any():
        return advantages
    groups = group_index[:, None].expand_as(states)
    keys = torch.stack([groups[valid], states[valid]], dim=-1)
    _, anchor = torch.unique(keys, dim=0, return_inverse=True)
    values = returns[valid].to(torch.float32)
    count = torch.zeros(int(anchor.max()) + 1, dtype=torch.float32, device=returns.device).scatter_add_(
        0, anchor, torch.ones_like(values)
    )
    mean = torch.zeros_like(count).scatter_add_(0, anchor, values) / count
    centred = values - mean[anchor]
    if scale == "group":
        variance = torch.zeros_like(count).scatter_add_(0, anchor, centred**2) / (count - 1).clamp(min=1)
        centred = centred / (variance.sqrt()[anchor] + eps)
    advantages[valid] = torch.where(count[anchor] > 1, centred, 0.0)
    return advantages


def gigpo_advantages(
    episode_returns: torch.Tensor,
    step_returns: torch.Tensor,
    states: torch.Tensor,
    num_turns: torch.Tensor,
    group_index: torch.Tensor,
    *,
    step_weight: float = 1.0,
    scale: Scale = "group",
) -> torch.Tensor:
    """GiGPO's advantage per turn, ``[B, K]``: the episode-level group advantage (GRPO's, of the
    episode returns, the same for every turn of an episode) plus ``step_weight`` times the
    step-level advantage among turns that answered the same anchor state
    (:func:`step_group_advantages` of ``step_returns``); 0 past each trajectory's ``num_turns``.

    >>> gigpo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([[1.0, 1.0], [0.0, 0.5]]),
    ...                  torch.tensor([[0, 1], [0, 2]]), torch.tensor([2, 2]), torch.tensor([0, 0]), scale="none")
    tensor([[ 1.0000,  0.5000],
            [-1.0000, -0.5000]])
    """
    episode = group_advantages(episode_returns, group_index, scale=scale)
    valid = torch.arange(states.shape[1], device=states.device)[None, :] < num_turns[:, None]
    step = step_group_advantages(step_returns, torch.where(valid, states, -1), group_index, scale=scale)
    return torch.where(valid, episode[:, None] + step_weight * step, 0.0)


def expand_turns_to_tokens(turn_advantages: torch.Tensor, turn_index: torch.Tensor) -> torch.Tensor:
    """Give each generated token its turn's advantage: ``[B, K]`` to ``[B, T]`` by ``turn_index``,
    0 where ``turn_index`` is -1.

    >>> expand_turns_to_tokens(torch.tensor([[0.5, -1.0]]), torch.tensor([[-1, 0, 0, -1, 1]]))
    tensor([[ 0.0000,  0.5000,  0.5000,  0.0000, -1.0000]])
    """
    if turn_advantages.ndim != 2 or turn_index.ndim != 2 or turn_advantages.shape[0] != turn_index.shape[0]:
        raise ValueError(
            f"expand_turns_to_tokens takes turn advantages [B, K] and turn_index [B, T], got "
            f"{tuple(turn_advantages.shape)} and {tuple(turn_index.shape)}."
        )
    if turn_advantages.shape[1] == 0:  # no trajectory has a turn: nothing to gather from
        return torch.zeros(turn_index.shape, dtype=torch.float32, device=turn_index.device)
    gathered = turn_advantages.to(torch.float32).gather(1, turn_index.clamp(min=0))
    return torch.where(turn_index >= 0, gathered, 0.0)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, *, eps: float = 1e-8) -> torch.Tensor:
    """Shift and scale ``values`` to mean 0 and variance 1 over the positions where ``mask`` is 1
    (the population variance of those positions, as OpenRLHF); 0 elsewhere."""
    keep = mask > 0
    count = keep.sum().clamp(min=1)
    mean = torch.where(keep, values, 0.0).sum() / count
    var = torch.where(keep, (values - mean) ** 2, 0.0).sum() / count
    return torch.where(keep, (values - mean) * torch.rsqrt(var + eps), 0.0)


def _pack(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The generated positions of each row moved to its front, in order: a permutation ``order``
    of each row, the packed mask, and the longest row's count of generated tokens."""
    keep = mask > 0
    # A stable sort on "not generated" keeps the generated positions first and in sequence order.
    order = torch.argsort((~keep).to(torch.int8), dim=-1, stable=True)
    packed_keep = keep.gather(-1, order)
    return order, packed_keep, int(keep.sum(-1).max().item()) if keep.numel() else 0


def _unpack(packed: torch.Tensor, order: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(packed).scatter_(-1, order, packed) * (mask > 0)


def _check_tokens(name: str, tensor: torch.Tensor, mask: torch.Tensor) -> None:
    if tensor.ndim != 2 or tensor.shape != mask.shape:
        raise ValueError(f"{name} must be [B, T] like mask {tuple(mask.shape)}, got {tuple(tensor.shape)}.")


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, *, gamma: float = 1.0) -> torch.Tensor:
    """Rewards to go over generated tokens: ``G_t = r_t + gamma * G_next``, where ``next`` is the
    next generated token (observation tokens are skipped and do not count as steps). Rewards on
    positions where ``mask`` is 0 are ignored; the result is 0 there.

    >>> discounted_returns(torch.tensor([[0.0, 1.0, 0.0, 2.0]]), torch.tensor([[1, 1, 0, 1]]), gamma=0.5)
    tensor([[1., 2., 0., 2.]])
    """
    _check_tokens("token_rewards", token_rewards, mask)
    order, packed_keep, length = _pack(mask)
    rewards = torch.where(packed_keep, token_rewards.to(torch.float32).gather(-1, order), 0.0)
    returns = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])
    # Past a row's last generated token the packed rewards are 0, so ``running`` stays 0 there.
    for t in range(length - 1, -1, -1):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return _unpack(returns, order, mask)


def reinforce_pp_advantages(
    token_rewards: torch.Tensor, mask: torch.Tensor, *, gamma: float = 1.0, eps: float = 1e-8
) -> torch.Tensor:
    """REINFORCE++ (Hu 2025): the rewards to go of each generated token (:func:`discounted_returns`),
    whitened over all generated tokens of the batch (a global baseline and scale, no critic).

    The paper puts the per-token KL penalty into the rewards: pass
    ``kl_penalty_rewards(token_rewards, kl, coef)`` (:mod:`agentrl.trainers.losses`) to follow it.
    """
    return masked_whiten(discounted_returns(token_rewards, mask, gamma=gamma), mask, eps=eps)


class Advantages(NamedTuple):
    """What :func:`gae` and every estimator return: ``[B, T]`` tensors, 0 off generated tokens."""

    advantages: torch.Tensor
    """Each generated token's advantage."""
    returns: torch.Tensor | None = None
    """The critic's targets, advantages plus values (:func:`gae`); None for estimators without a
    critic."""


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> Advantages:
    """Generalised advantage estimation (Schulman et al. 2016) over generated tokens.

    ``values[:, t]`` is the critic's value of the state in which token ``t`` was generated (the
    tokens before it). The recursion runs over generated tokens only: the successor of a turn's
    last generated token is the first generated token of the next turn, and after the last
    generated token the value is 0. ``delta_t = r_t + gamma * V_next - V_t``,
    ``A_t = delta_t + gamma * lam * A_next``, ``returns = A + V``; all 0 where ``mask`` is 0.
    ``gamma=1, lam=0.95`` are the RLHF defaults (Ouyang et al. 2022; OpenRLHF); the advantages are
    not whitened here (:func:`estimate_advantages` does it for ``"gae"``).

    >>> gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.0, 0.5]]), torch.tensor([[1, 0, 1]]),
    ...     gamma=1.0, lam=1.0).advantages
    tensor([[0.5000, 0.0000, 0.5000]])
    """
    _check_tokens("token_rewards", token_rewards, mask)
    _check_tokens("values", values, mask)
    order, packed_keep, length = _pack(mask)
    rewards = torch.where(packed_keep, token_rewards.to(torch.float32).gather(-1, order), 0.0)
    packed_values = torch.where(packed_keep, values.detach().to(torch.float32).gather(-1, order), 0.0)
    # Past a row's last generated token the packed values are 0: exactly the terminal value 0.
    next_values = torch.cat([packed_values[:, 1:], torch.zeros_like(packed_values[:, :1])], dim=-1)
    deltas = rewards + gamma * next_values - packed_values
    advantages = torch.zeros_like(deltas)
    running = deltas.new_zeros(deltas.shape[0])
    for t in range(length - 1, -1, -1):
        running = deltas[:, t] + gamma * lam * running
        advantages[:, t] = running
    advantages = _unpack(advantages, order, mask)
    returns = advantages + torch.where(mask > 0, values.detach().to(torch.float32), 0.0)
    return Advantages(advantages, returns)


class AdvantageEstimator(Protocol):
    """The common call shape of :data:`ADVANTAGE_ESTIMATORS`: a batch (and, for GAE, values) in,
    :class:`Advantages` out (0 where ``batch.loss_mask`` is 0; returns only from GAE)."""

    def __call__(
        self,
        batch: Batch,
        values: torch.Tensor | None,
        *,
        token_rewards: torch.Tensor,
        gamma: float,
        lam: float,
        scale: Scale | None,
        whiten: bool,
        returns: Returns,
        step_weight: float,
        bound: Bound,
    ) -> Advantages: ...


def _turn_level(batch: Batch, token_rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's returns to go per turn ``[B, K]`` and turn counts ``[B]``, once it is checked
    that every generated token is in a turn and every reward is on one (else the turn-level
    estimators would silently leave part of the signal out)."""
    outside = ((batch.loss_mask > 0) & (batch.turn_index < 0)).any(-1)
    if outside.any():
        row = int(outside.nonzero()[0])
        raise ValueError(
            f"returns='turn' needs every generated token inside a turn, but trajectory {row} (group "
            f"{_group_name(batch, row)}) has generated tokens after its last turn end; end each turn "
            "with a turn_ends entry (the rollout does), or use returns='episode'."
        )
    unplaced = ~torch.isclose(batch.token_rewards.sum(-1), batch.rewards.to(torch.float32), rtol=1e-4, atol=1e-4)
    if unplaced.any():
        row = int(unplaced.nonzero()[0])
        raise ValueError(
            f"returns='turn' reads the per-turn rewards, but trajectory {row} (group {_group_name(batch, row)}) "
            f"has turn rewards summing to {float(batch.token_rewards[row].sum()):g} and reward "
            f"{float(batch.rewards[row]):g}; put each reward in turn_rewards (reward is their sum), or use "
            "returns='episode'."
        )
    return turn_returns(token_rewards, batch.turn_index), batch.turn_index.amax(-1) + 1


def _group_name(batch: Batch, row: int) -> str:
    index = int(batch.group_index[row])
    return repr(batch.group_ids[index]) if index < len(batch.group_ids) else str(index)


def _grpo(
    batch: Batch,
    values: torch.Tensor | None,
    *,
    scale: Scale | None,
    returns: Returns,
    token_rewards: torch.Tensor,
    **_: object,
) -> Advantages:
    if returns == "turn":
        to_go, num_turns = _turn_level(batch, token_rewards)
        advantages = turn_group_advantages(to_go, num_turns, batch.group_index, scale=scale or "group")
        return Advantages(expand_turns_to_tokens(advantages, batch.turn_index))
    advantages = group_advantages(batch.rewards, batch.group_index, scale=scale or "group")
    return Advantages(expand_to_tokens(advantages, batch.loss_mask))


def _dr_grpo(batch: Batch, values: torch.Tensor | None, *, scale: Scale | None, **rest: object) -> Advantages:
    if scale not in (None, "none"):
        raise ValueError(
            f"dr_grpo is GRPO without std scaling; got scale={scale!r}. Use 'grpo' with scale={scale!r} "
            "to scale, or leave scale unset."
        )
    return _grpo(batch, values, scale="none", **rest)  # type: ignore[arg-type]


def _rloo(
    batch: Batch, values: torch.Tensor | None, *, returns: Returns, token_rewards: torch.Tensor, **_: object
) -> Advantages:
    if returns == "turn":
        to_go, num_turns = _turn_level(batch, token_rewards)
        advantages = turn_rloo_advantages(to_go, num_turns, batch.group_index)
        return Advantages(expand_turns_to_tokens(advantages, batch.turn_index))
    return Advantages(expand_to_tokens(rloo_advantages(batch.rewards, batch.group_index), batch.loss_mask))


def _reinforce_pp(
    batch: Batch, values: torch.Tensor | None, *, token_rewards: torch.Tensor, gamma: float, **_: object
) -> Advantages:
    return Advantages(reinforce_pp_advantages(token_rewards, batch.loss_mask, gamma=gamma))


def _gae(
    batch: Batch,
    values: torch.Tensor | None,
    *,
    token_rewards: torch.Tensor,
    gamma: float,
    lam: float,
    whiten: bool,
    **_: object,
) -> Advantages:
    if values is None:
        raise ValueError("The 'gae' estimator needs the critic's values [B, T]; pass values=... (PPO with a critic).")
    advantages, returns = gae(token_rewards, values, batch.loss_mask, gamma=gamma, lam=lam)
    # PPO implementations (baselines, cleanrl, OpenRLHF, verl) normalise GAE advantages by default;
    # the critic's targets are the returns of the advantages before that.
    return Advantages(masked_whiten(advantages, batch.loss_mask) if whiten else advantages, returns)


def _gigpo(
    batch: Batch,
    values: torch.Tensor | None,
    *,
    token_rewards: torch.Tensor,
    gamma: float,
    scale: Scale | None,
    step_weight: float = 1.0,
    **_: object,
) -> Advantages:
    num_turns = (batch.turn_index.amax(-1) + 1).clamp(min=0)
    most = int(num_turns.max().item()) if len(batch) else 0
    states = batch.turn_states if batch.turn_states is not None else torch.full((len(batch), most), -1)
    states = (
        states[:, :most]
        if states.shape[1] >= most
        else torch.nn.functional.pad(states, (0, most - states.shape[1]), value=-1)
    )
    step_returns = discounted_turn_returns(per_turn_rewards(token_rewards, batch.turn_index, most), num_turns, gamma)
    advantages = gigpo_advantages(
        batch.rewards, step_returns, states.to(token_rewards.device), num_turns, batch.group_index,
        step_weight=step_weight, scale=scale or "group",
    )  # fmt: skip
    return Advantages(expand_turns_to_tokens(advantages, batch.turn_index))


def scored_jensen_terms(batch: Batch, *, bound: Bound = "multi") -> JensenTerms:
    """:func:`jensen_terms` of ``batch.rewards`` (each trajectory's ``log pi(reference | ...)``) over
    the trajectories that have a reference answer; the others (an episode cut off before the env
    gave its reference) get advantage, weight and bound 0 and take no part in their group's bound.

    Raises:
        ValueError: when no trajectory of the batch has a reference (the env gives none).
    """
    scored = batch.reference_mask.sum(-1) > 0 if batch.reference_mask is not None else None
    if scored is None or not bool(scored.any()):
        raise ValueError(
            "jepo scores a reference answer after each trajectory, but no trajectory of this batch has one; "
            "use an env that ends its episodes with info['reference'] (e.g. agentrl/Explain-v0), or another algorithm."
        )
    rows = scored.nonzero().squeeze(-1)
    terms = jensen_terms(batch.rewards[rows], batch.group_index[rows], bound=bound)
    out = JensenTerms(*(torch.zeros_like(batch.rewards, dtype=torch.float32) for _ in range(3)))
    for whole, part in zip(out, terms, strict=True):
        whole[rows] = part
    return out


def _jepo(batch: Batch, values: torch.Tensor | None, *, scale: Scale | None, bound: Bound, **_: object) -> Advantages:
    advantages = scored_jensen_terms(batch, bound=bound).advantages  # in nats, unscaled as in the paper
    if scale == "group":  # opt in to GRPO's scalings
        advantages = advantages / (_group_stats(advantages, batch.group_index)[2] + 1e-6)
    elif scale == "batch" and advantages.numel() > 1:
        advantages = advantages / (advantages.std() + 1e-6)
    return Advantages(expand_to_tokens(advantages, batch.loss_mask))


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "grpo": _grpo,
    "gigpo": _gigpo,
    "dr_grpo": _dr_grpo,
    "rloo": _rloo,
    "reinforce_pp": _reinforce_pp,
    "gae": _gae,
    "jepo": _jepo,
}
"""The advantage estimators by name, each with the :class:`AdvantageEstimator` call shape."""


def estimate_advantages(
    name: str,
    batch: Batch,
    values: torch.Tensor | None = None,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
    scale: Scale | None = None,
    token_rewards: torch.Tensor | None = None,
    whiten: bool = True,
    returns: Returns = "episode",
    step_weight: float = 1.0,
    bound: Bound = "multi",
) -> Advantages:
    """The :class:`Advantages` of ``batch`` by the estimator called ``name``: ``[B, T]`` advantages
    (0 off generated tokens) and, from ``gae``, the critic's ``[B, T]`` returns (None otherwise).

    Args:
        name: a key of :data:`ADVANTAGE_ESTIMATORS`: ``grpo``, ``dr_grpo``, ``rloo``,
            ``reinforce_pp``, ``gae``, ``gigpo`` or ``jepo``.
        batch: the whole batch (group baselines need every member of a group: estimate before
            splitting into micro-batches).
        values: the critic's ``[B, T]`` values, aligned with the tokens; only ``gae`` reads them
            (and needs them), and returns the critic's targets (advantages before whitening plus
            values).
        gamma: discount per generated token (``reinforce_pp``, ``gae``); per turn for ``gigpo``'s
            step returns.
        lam: GAE's lambda.
        scale: ``grpo``'s scaling (``group`` when unset); ``dr_grpo`` allows only ``none``;
            ``jepo`` scales only when asked (``none`` when unset); the other estimators ignore it.
        token_rewards: replaces ``batch.token_rewards`` for the token-level estimators (and the
            group ones with ``returns="turn"``), e.g. with a KL penalty added
            (:func:`agentrl.trainers.losses.kl_penalty_rewards`).
        whiten: whiten ``gae``'s advantages over the batch's generated tokens (PPO's usual
            normalisation; REINFORCE++ always whitens, the group estimators never do).
        returns: what ``grpo``, ``dr_grpo`` and ``rloo`` compare within a group: ``"episode"``,
            each trajectory's return, for all its tokens; ``"turn"``, each turn's return to go
            (:func:`turn_returns`), compared with the same turn of the group's other members and
            given to that turn's tokens. ``reinforce_pp`` and ``gae`` are token-level already and
            ignore it; ``gigpo`` has both levels of its own.
        step_weight: ``gigpo``'s weight of the step-level advantage (the paper's omega).
        bound: ``jepo``'s Jensen bound, ``single`` or ``multi`` (:func:`jensen_terms`); ``jepo``
            reads ``batch.rewards`` as each trajectory's ``log pi(reference | prompt, trajectory)``.

    Raises:
        ValueError: for an unknown name (with the closest known one), an unknown ``returns``,
            ``gae`` without values, or ``returns="turn"`` on a batch whose rewards or generated
            tokens are not all in turns.
    """
    if name not in ADVANTAGE_ESTIMATORS:
        hint = did_you_mean(name, ADVANTAGE_ESTIMATORS)
        raise ValueError(
            f"Unknown advantage estimator {name!r}; expected one of {sorted(ADVANTAGE_ESTIMATORS)}."
            + (f" {hint}" if hint else "")
        )
    if returns not in RETURNS:
        hint = did_you_mean(returns, RETURNS)
        raise ValueError(f"returns must be one of {RETURNS}, got {returns!r}." + (f" {hint}" if hint else ""))
    return ADVANTAGE_ESTIMATORS[name](
        batch,
        values,
        token_rewards=batch.token_rewards if token_rewards is None else token_rewards,
        gamma=gamma,
        lam=lam,
        scale=scale,
        whiten=whiten,
        returns=returns,
        step_weight=step_weight,
        bound=bound,
    )
