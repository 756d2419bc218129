"""The one table of inference backends: a backend name and a model in, a :class:`Policy` out.

``hf`` (:class:`~agentrl.policies.hf.HFPolicy`), ``vllm`` (:class:`~agentrl.policies.vllm.VLLMPolicy`),
``openai`` (:class:`~agentrl.policies.openai.OpenAIPolicy`, an OpenAI-compatible server; ``model`` is
where its tokenizer comes from) and ``scripted`` (:class:`~agentrl.testing.ScriptedPolicy` with
``model``'s tokenizer, for tests of the machinery). Each backend module is imported only when used:
vLLM and torch stay out of ``import agentrl``.

>>> policy = make_policy("hf", "path/to/checkpoint", dtype="float32")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agentrl.policies.base import Policy
from agentrl.suggest import did_you_mean


def _hf(path: str | None, **options: Any) -> Policy:
    from agentrl.policies.hf import HFPolicy  # torch and transformers load with the backend

    return HFPolicy(_needs(path, "hf"), **options)


def _vllm(path: str | None, **options: Any) -> Policy:
    from agentrl.policies.vllm import VLLMPolicy  # vllm loads with the backend

    return VLLMPolicy(_needs(path, "vllm"), **options)


def _openai(path: str | None, **options: Any) -> Policy:
    from agentrl.policies.openai import OpenAIPolicy  # httpx and transformers load with the backend

    # The server holds the model; ``path``, when given, is where the tokenizer comes from (by
    # default the folder the server reports it loaded the model from).
    return OpenAIPolicy(tokenizer=path, **options)


def _scripted(path: str | None, **options: Any) -> Policy:
    from transformers import AutoTokenizer  # heavy; only this backend needs it here

    from agentrl.testing import ScriptedPolicy  # with transformers: only this backend needs either

    return ScriptedPolicy(AutoTokenizer.from_pretrained(_needs(path, "scripted")), **options)


BACKENDS: dict[str, Callable[..., Policy]] = {"hf": _hf, "vllm": _vllm, "openai": _openai, "scripted": _scripted}
"""Backend name -> ``factory(path, **options)``; the ``openai`` options name the served model ``model``."""


def make_policy(
    backend: str | Callable[[], Policy], model: str | Path | None = None, options: Mapping[str, Any] | None = None
) -> Policy:
    """The policy named by ``backend`` serving ``model``, built with keyword ``options``.

    ``backend`` is a name of :data:`BACKENDS` or a picklable zero-argument callable that returns a
    policy (then ``model`` and ``options`` must be left out).
    """
    if callable(backend):
        if model is not None or options:
            raise ValueError("make_policy: a callable backend takes no model or options; bind them into it.")
        return backend()
    if backend not in BACKENDS:
        hint = did_you_mean(backend, BACKENDS) or "Or pass a callable that returns a policy."
        raise ValueError(f"Unknown backend {backend!r}; expected one of {sorted(BACKENDS)}. {hint}")
    return BACKENDS[backend](None if model is None else str(model), **dict(options or {}))


def _needs(model: str | None, backend: str) -> str:
    if model is None:
        raise ValueError(f"The {backend!r} backend needs a model (a checkpoint directory or a hub id).")
    return model
