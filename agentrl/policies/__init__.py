"""Policies: an LLM behind an inference backend, token ids in, token ids and log-probs out.

The protocol (:class:`Policy`, :class:`Sampling`, :class:`Generation`) is in :mod:`.base`; the one
table of backends (``hf``, ``vllm``, ``openai``, ``scripted``) is :func:`make_policy` in :mod:`.make`;
the backends are :mod:`.hf`, :mod:`.vllm` (with its worker extension :mod:`.vllm_worker`) and
:mod:`.openai`; a policy served from a Ray actor is :mod:`.ray_actor`; policies served as LoRA
adapters of one shared engine are :class:`AdapterPolicy` (:mod:`.lora`). Each backend imports its
engine only when used.
"""

from agentrl.policies.base import EngineClosed, FinishReason, Generation, Policy, Sampling
from agentrl.policies.lora import AdapterPolicy
from agentrl.policies.make import BACKENDS, make_policy

__all__ = [
    "BACKENDS",
    "AdapterPolicy",
    "EngineClosed",
    "FinishReason",
    "Generation",
    "Policy",
    "Sampling",
    "make_policy",
]
