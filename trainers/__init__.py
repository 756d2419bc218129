"""Trainers: advantage estimators and losses as small pure functions, the training step, checkpoints.

- :mod:`agentrl.trainers.advantages`: GRPO, Dr. GRPO, RLOO, REINFORCE++, GAE, by name.
- :mod:`agentrl.trainers.losses`: PPO's clipped surrogate (asymmetric, dual-clip, TIS, decoupled),
  value loss, KL estimators, entropy, loss aggregation modes.
- :mod:`agentrl.trainers.batch`: trajectories as padded tensors.
- :mod:`agentrl.trainers.trainer`: :class:`Trainer` and :class:`TrainerConfig`, the training step.
- :mod:`agentrl.trainers.models`: the policy (LoRA), reference and value models; weights for the engine.
- :mod:`agentrl.trainers.checkpoint`: atomic checkpoints.

The controller that runs rollouts and training together is :mod:`agentrl.train` (``agentrl train``).
"""

from agentrl.trainers.advantages import (
    ADVANTAGE_ESTIMATORS,
    Advantages,
    estimate_advantages,
    expand_to_tokens,
    gae,
    group_advantages,
    masked_whiten,
    reinforce_pp_advantages,
    rloo_advantages,
)
from agentrl.trainers.batch import Batch, collate
from agentrl.trainers.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from agentrl.trainers.losses import (
    PolicyLossStats,
    aggregate,
    kl_estimate,
    kl_penalty_rewards,
    policy_loss,
    value_loss,
)
from agentrl.trainers.models import (
    ValueModel,
    generated_logprobs,
    inference_state_dict,
    load_policy_model,
    pad_token_id,
)
from agentrl.trainers.trainer import Trainer, TrainerConfig

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "Advantages",
    "Batch",
    "PolicyLossStats",
    "Trainer",
    "TrainerConfig",
    "ValueModel",
    "aggregate",
    "collate",
    "estimate_advantages",
    "expand_to_tokens",
    "gae",
    "generated_logprobs",
    "group_advantages",
    "inference_state_dict",
    "kl_estimate",
    "kl_penalty_rewards",
    "list_checkpoints",
    "load_checkpoint",
    "load_policy_model",
    "masked_whiten",
    "pad_token_id",
    "policy_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "save_checkpoint",
    "value_loss",
]
