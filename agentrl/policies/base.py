"""The policy protocol: an LLM behind an inference backend, token ids in, token ids and log-probs out.

Every backend (``vllm``, ``hf``, ``openai``) implements :class:`Policy`. Generation is awaitable so
that many episodes share one engine, which batches their requests. The ``version`` grows by one
with each weight update; each :class:`Generation` records the version that produced it, which the
trajectory keeps per token (the staleness bound and the off-policy corrections read it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class Sampling:
    """Sampling settings for one generation request."""

    max_tokens: int = 256
    """Most tokens to generate in one turn."""
    temperature: float = 1.0
    """Softmax temperature; 0 is greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass; 1.0 turns it off."""
    top_k: int = 0
    """Sample among the k most likely tokens; 0 turns it off."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra token ids that end the turn (the tokenizer's end-of-turn token always does)."""
    seed: int | None = None
    """Seed of this request's sampler, for reproducible samples."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"Sampling.max_tokens must be at least 1, got {self.max_tokens}.")
        if self.temperature < 0:
            raise ValueError(f"Sampling.temperature must be >= 0, got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"Sampling.top_p must be in (0, 1], got {self.top_p}.")


class EngineClosed(RuntimeError):
    """A request or weight update was still running on an engine when the engine was shut down (by its
    owner, or by an :class:`~agentrl.policies.supervisor.EngineSupervisor` replacing a dead engine)."""


class Generation(NamedTuple):
    """What one generation request returned."""

    token_ids: list[int]
    """The generated tokens, the end-of-turn token included when generation stopped on it."""
    logprobs: list[float]
    """The behaviour log-prob of each generated token under the distribution it was sampled from (logits /
    temperature, renormalised over top-k/top-p when set; the raw distribution for greedy requests)."""
    version: int
    """The policy version (weight update count) that produced these tokens."""
    finish_reason: FinishReason
    """``stop`` at an end-of-turn token, ``length`` at ``max_tokens``, ``abort`` if cancelled."""


@runtime_checkable
class Policy(Protocol):
    """An inference backend serving one policy.

    Everything a caller of a policy uses is declared here: the rollout reads ``tokenizer``
    (the agent renders prompts with it) and awaits ``generate``; the trainer's controller awaits
    ``aupdate_weights`` so that episodes go on while the weights load.
    """

    tokenizer: Any
    """The tokenizer of the served model (a transformers tokenizer): prompts are its token ids."""

    @property
    def version(self) -> int:
        """How many weight updates this policy has had."""
        ...

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """Continue ``prompt_ids``; safe to call from many tasks at once."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """Load new weights (every tensor of the trainer's ``state_dict()``); return the new version."""
        ...

    async def aupdate_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """:meth:`update_weights` without blocking the caller's event loop (a blocking backend runs
        it in a thread)."""
        ...

    def close(self) -> None:
        """Free the engine."""
        ...


# --- what some engines can do besides (checked with isinstance, never probed by name) -------------


@runtime_checkable
class Pingable(Protocol):
    """An engine that can say whether it is alive (vLLM, a Ray policy actor): ``ping`` raises once it died."""

    def ping(self) -> None: ...


@runtime_checkable
class KnowsServedWeights(Protocol):
    """An engine that can be told which tensors it serves already, so that its first update sends
    only what changed (vLLM)."""

    def serves(self, named_tensors: Iterable[tuple[str, Any]]) -> None: ...


@runtime_checkable
class CountsVersions(Protocol):
    """An engine that reports versions others set (a new Ray policy actor that took over a dead one's
    weights reports the version those had)."""

    def set_version(self, version: int) -> None: ...


class TensorStamp(NamedTuple):
    """What a tensor held when :func:`stamp` saw it, to tell later whether it changed (:func:`unchanged`)."""

    storage: Any
    """A weak reference to its memory: while that lives, no new tensor can be given the memory."""
    data_ptr: int
    shape: tuple[int, ...]
    version: int
    """Its in-place version counter then: every in-place change through the tensor raises it."""
    sample: Any
    """Up to 64 of its values, evenly spread: a write that passes the counter by (``p.data.add_``, a
    fused optimizer's step) changes them."""


def stamp(tensor: Any) -> TensorStamp:
    """``tensor``'s :class:`TensorStamp`; it holds no reference to the tensor's memory."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef

    flat = tensor.detach().reshape(-1)
    count = min(flat.numel(), 64)  # evenly spread, first and last included; integers (floats lose large indices)
    picks = torch.arange(count, device=flat.device) * (flat.numel() - 1) // max(count - 1, 1)
    storage = StorageWeakRef(tensor.untyped_storage())
    return TensorStamp(storage, tensor.data_ptr(), tuple(tensor.shape), tensor._version, flat[picks].clone())


def unchanged(before: TensorStamp, now: TensorStamp) -> bool:
    """Whether the tensor stamped ``now`` holds what the one stamped ``before`` held: the same memory,
    still of the same storage, not changed since. A ``state_dict()`` tensor of a layer no optimizer
    touched is unchanged; a new tensor (LoRA merged, a dtype cast, one that arrived through Ray)
    never is, even where the allocator gave it the memory of one that was freed."""
    import torch

    same_memory = not before.storage.expired() and now.data_ptr == before.data_ptr
    if not same_memory or now.shape != before.shape or now.version != before.version:
        return False
    return now.sample.dtype == before.sample.dtype and torch.equal(now.sample, before.sample)
