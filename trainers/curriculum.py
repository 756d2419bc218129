"""Prompt curriculum by a value model (PCL: Gao et al., "Prompt Curriculum Learning for Efficient
LLM Post-Training", 2025).

Groups whose episodes all succeed or all fail give GRPO no signal; prompts the current policy solves
about half the time give the most. PCL finds them without playing them: a value model ``V(x)``
predicts each prompt's expected reward under the current policy, each step scores a pool of
candidate prompts larger than the batch needs and keeps those predicted closest to a target (0.5),
and after the step ``V`` is regressed (mean squared error) on the success rates the kept prompts'
groups just had, so it follows the policy as it learns.

- :func:`closest_to_target` is the selection, a pure function.
- :class:`PromptValueModel` is ``V``: a copy of the policy's backbone and a scalar head read at the
  prompt's last token, squashed into ``[0, 1]``.
- :class:`PromptCurriculum` holds ``V`` and its optimizer: :meth:`~PromptCurriculum.select` and
  :meth:`~PromptCurriculum.update`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from agentrl.trainers.models import ValueModel


def closest_to_target(predictions: Sequence[float] | torch.Tensor, k: int, target: float = 0.5) -> list[int]:
    """The indices of the ``k`` predictions nearest ``target``, nearest first (ties: lower index first).

    >>> closest_to_target([0.9, 0.45, 0.1, 0.6, 0.5], 3)
    [4, 1, 3]
    """
    values = torch.as_tensor(predictions, dtype=torch.float64).flatten()
    if not 0 < k <= values.numel():
        raise ValueError(f"k must be between 1 and the {values.numel()} candidates, got {k}.")
    distance = (values - target).abs()
    order = sorted(range(values.numel()), key=lambda i: (float(distance[i]), i))
    return order[:k]


class PromptValueModel(ValueModel):
    """``V(x)`` in ``[0, 1]``: the backbone of the model at ``path`` (its own copy) and a linear head
    on the hidden state of the prompt's last token, through a sigmoid. It is built as the PPO
    critic is (the head starts at zero, so every prompt starts at 0.5) but reads one value per
    prompt rather than one per token."""

    def forward(self, prompts: Sequence[Sequence[int]], pad_token_id: int = 0) -> torch.Tensor:  # type: ignore[override]
        """``[N]`` predictions for ``N`` prompts given as token ids (right-padded here)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("PromptValueModel needs at least one prompt, each with at least one token.")
        device = self.head.weight.device
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long, device=device)
        mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):
            ids[row, : len(prompt)] = torch.tensor(list(prompt), dtype=torch.long)
            mask[row, : len(prompt)] = 1
        hidden = self.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        last = hidden[torch.arange(len(prompts), device=device), mask.sum(-1) - 1]
        return torch.sigmoid(self.head(last).squeeze(-1).float())


class PromptCurriculum:
    """PCL's selection and its value model's online updates.

    >>> curriculum = PromptCurriculum(PromptValueModel(model_dir), lr=1e-5)  # doctest: +SKIP
    >>> kept = curriculum.select(candidate_prompts, k=groups_per_step)     # doctest: +SKIP
    >>> curriculum.update([candidate_prompts[i] for i in kept], success_rates)  # doctest: +SKIP
    """

    def __init__(self, model: PromptValueModel, *, lr: float = 1e-5, target: float = 0.5, pad_token_id: int = 0):
        if not 0 <= target <= 1:
            raise ValueError(f"target is an expected reward in [0, 1], got {target}.")
        self.model = model
        self.target = target
        self.pad_token_id = pad_token_id
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    @torch.no_grad()
    def predict(self, prompts: Sequence[Sequence[int]]) -> list[float]:
        """``V`` of each prompt."""
        return [float(v) for v in self.model(prompts, self.pad_token_id)]

    def select(self, prompts: Sequence[Sequence[int]], k: int) -> list[int]:
        """The indices of the ``k`` prompts predicted closest to the target, nearest first."""
        return closest_to_target(self.predict(prompts), k, self.target)

    def update(self, prompts: Sequence[Sequence[int]], success_rates: Sequence[float]) -> float:
        """One optimizer step of ``V`` toward the groups' observed success rates; returns the loss
        (mean squared error) before the step."""
        if len(prompts) != len(success_rates):
            raise ValueError(f"got {len(prompts)} prompts and {len(success_rates)} success rates.")
        targets = torch.tensor(list(success_rates), dtype=torch.float32, device=self.model.head.weight.device)
        if bool(((targets < 0) | (targets > 1)).any()):
            raise ValueError(f"success rates must lie in [0, 1], got {list(success_rates)}.")
        self.optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(self.model(prompts, self.pad_token_id), targets)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())
