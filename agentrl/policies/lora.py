"""Policies served as LoRA adapters of one shared engine (issue 11): one engine, many policies.

In a multi-agent run, the policies that are LoRA adapters of the same base model share one
inference engine instead of one engine each: every request carries its policy's adapter, and the
engine batches the requests of all policies together (vLLM multi-LoRA; transformers + peft in the
``hf`` backend). The host engine (:class:`~agentrl.policies.vllm.VLLMPolicy` or
:class:`~agentrl.policies.hf.HFPolicy`) makes one :class:`AdapterPolicy` per policy id:

>>> host = VLLMPolicy(base_dir, max_loras=2, max_lora_rank=16)  # doctest: +SKIP
>>> solver = host.adapter("solver", adapter_config(trainer_model))  # doctest: +SKIP
>>> solver.update_weights(adapter_weights(trainer_model))  # after each training step  # doctest: +SKIP

Versions. An adapter policy starts at version 0, which is the base model itself (peft initialises
``lora_B`` to zero, so an untrained adapter is the base). Each update loads the tensors as a new
adapter version with its own name (``policy_id@vN``), its own engine-wide id and, for vLLM, its own
directory: vLLM caches adapters by id and prefixes by name and path, so reusing any of them would
serve stale weights (``docs/vllm-cpu.md`` section 8). Requests started on a version finish on it;
later requests get the new one. An old version is unloaded, and its directory deleted, once its
last request has finished: the engine reloads an adapter from its directory mid-request when it has
evicted it, so the directory must outlive every request of that version.

Bookkeeping, per adapter policy::

    running[v]   requests of version v in flight (incremented at request start, decremented at its end)
    loaded       versions whose adapter is on the host: the current one, and old ones with running[v] > 0
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from agentrl.policies.base import Generation, Sampling


class AdapterHost(Protocol):
    """What an engine that serves adapters does for its :class:`AdapterPolicy` objects.

    :class:`~agentrl.policies.vllm.VLLMPolicy` and :class:`~agentrl.policies.hf.HFPolicy` implement
    it; callers use their ``adapter(policy_id, config)`` instead of these methods.
    """

    tokenizer: Any

    def load_adapter(self, name: str, config: Mapping[str, Any], tensors: Mapping[str, Any]) -> Any:
        """Load one adapter version under ``name`` (never used before) and return the host's handle
        for it. Blocks until later requests can use it; raises, having loaded nothing, if the
        engine refuses the adapter."""
        ...

    async def generate_with_adapter(self, adapter: Any, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """Generate with the adapter of handle ``adapter``, or the bare base model for ``None``."""
        ...

    def unload_adapter(self, adapter: Any) -> None:
        """Free an adapter version that no request uses any more. It must not wait for the engine:
        it is called from callers' event loops, as a request ends."""
        ...


def lora_rank(config: Mapping[str, Any]) -> int:
    """The largest rank in an adapter config: ``r``, or a per-module override in ``rank_pattern``
    (the rank an engine must hold, as vLLM counts it)."""
    return max([int(config["r"]), *(int(r) for r in (config.get("rank_pattern") or {}).values())])


def check_adapter_config(config: Mapping[str, Any], max_rank: int | None, setting: str) -> None:
    """Raise ``ValueError`` for a config no host can serve, or whose rank exceeds ``max_rank``.

    vLLM's own checks run in its worker; an adapter it refuses there while a request carries it
    kills the whole engine, every policy on it included. So every rule that can be checked here is
    checked before anything reaches the engine. ``setting`` names what to raise in the message.
    """
    if not isinstance(config, Mapping) or "r" not in config:
        raise ValueError(
            "An adapter config must be a peft LoRA config as a dict (adapter_config(model) from "
            f"agentrl.trainers.models), got {type(config).__name__} without an 'r' field."
        )
    kind = str(config.get("peft_type", "LORA"))
    if kind != "LORA":
        raise ValueError(f"Only LoRA adapters can be served, got a peft {kind} config.")
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        raise ValueError("LoRA adapters with bias terms cannot be served (vLLM refuses them); train with bias='none'.")
    if config.get("use_dora"):
        raise ValueError("DoRA adapters cannot be served (vLLM refuses them); train plain LoRA (use_dora=False).")
    if config.get("modules_to_save"):
        raise ValueError(
            f"Adapters with modules_to_save ({config['modules_to_save']}) cannot be served as adapters; "
            "serve the merged model instead (inference_state_dict)."
        )
    try:
        json.dumps(dict(config))
    except TypeError as e:
        raise ValueError(f"The adapter config must be JSON-able (use adapter_config(model)): {e}") from None
    rank = lora_rank(config)
    if max_rank is not None and rank > max_rank:
        raise ValueError(
            f"The adapter's LoRA rank {rank} is greater than the engine's max_lora_rank {max_rank}; "
            f"raise {setting} to at least {rank} (or train with a smaller lora_rank)."
        )


def write_adapter_dir(path: str | Path, config: Mapping[str, Any], tensors: Mapping[str, Any]) -> Path:
    """Write an adapter as peft's ``save_pretrained`` does: ``adapter_config.json`` and
    ``adapter_model.safetensors``, the layout vLLM loads adapters from."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, str(path / "adapter_model.safetensors")
    )
    (path / "adapter_config.json").write_text(json.dumps(dict(config), indent=2))
    return path


class AdapterPolicy:
    """One policy served as a LoRA adapter of a shared host engine, as a :class:`~agentrl.policies.Policy`.

    Made by the host: ``host.adapter(policy_id, adapter_config(model))``. ``update_weights`` takes
    the trainer's ``adapter_weights(model)``; ``close`` unloads this policy's adapters and leaves
    the host's engine running (the host's own ``close`` stops it).
    """

    def __init__(
        self,
        host: AdapterHost,
        policy_id: str,
        config: Mapping[str, Any],
        *,
        max_rank: int | None = None,
        on_close: Callable[[str], None] | None = None,
    ):
        self.host = host
        self.policy_id = policy_id
        self.config = dict(config)
        self.tokenizer = host.tokenizer
        self._max_rank = max_rank
        self._on_close = on_close
        self._lock = threading.Lock()  # guards the fields below
        self._update_lock = threading.Lock()  # one update at a time, so versions load in order
        self._version = 0
        self._loaded: dict[int, Any] = {}  # version -> host handle; version 0 (the base) has none
        self._running: defaultdict[int, int] = defaultdict(int)
        self._closed = False

    @property
    def version(self) -> int:
        return self._version

    @property
    def loaded_versions(self) -> tuple[int, ...]:
        """The versions whose adapter is on the host now: the current one (from version 1 on) and
        old ones whose requests are still running."""
        with self._lock:
            return tuple(sorted(self._loaded))

    @property
    def running(self) -> dict[int, int]:
        """Requests in flight per version."""
        with self._lock:
            return {v: n for v, n in self._running.items() if n}

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """Continue ``prompt_ids`` with this policy's adapter as of now; the generation carries that version."""
        with self._lock:
            if self._closed:
                raise RuntimeError(
                    f"Adapter policy {self.policy_id!r} is closed; make a new one with host.adapter(...)."
                )
            version = self._version
            handle = self._loaded.get(version)
            self._running[version] += 1
        try:
            generation = await self.host.generate_with_adapter(handle, prompt_ids, sampling)
        finally:
            self._release(version)
        return generation._replace(version=version)

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """Load the trainer's ``adapter_weights(model)`` as a new version; return it."""
        return self._load(self._checked(named_tensors))

    async def aupdate_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """:meth:`update_weights` in a thread, so the caller's loop goes on serving requests."""
        tensors = self._checked(named_tensors)  # read here: the caller's tensors may change once it resumes
        return await asyncio.to_thread(self._load, tensors)

    def close(self) -> None:
        """Unload this policy's adapters (a running request's version goes when the request ends)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle = [self._loaded.pop(v) for v in list(self._loaded) if not self._running[v]]
        for handle in idle:
            self.host.unload_adapter(handle)
        if self._on_close is not None:
            self._on_close(self.policy_id)

    def _checked(self, named_tensors: Iterable[tuple[str, Any]]) -> dict[str, Any]:
        tensors = {name: tensor.detach() for name, tensor in named_tensors}
        if not tensors:
            raise ValueError(f"update_weights for adapter policy {self.policy_id!r} got no tensors.")
        strays = [name for name in tensors if "lora_" not in name]
        if strays:
            raise ValueError(
                f"An adapter policy takes only LoRA tensors (adapter_weights(model)), got {strays[:3]}; "
                "a full state_dict goes to the host engine's own update_weights."
            )
        # The rank the tensors really have: an engine that meets a larger one mid-request dies.
        rank = max((t.shape[0] for name, t in tensors.items() if "lora_A" in name), default=0)
        if self._max_rank is not None and rank > self._max_rank:
            raise ValueError(
                f"Adapter {self.policy_id!r} got lora_A tensors of rank {rank}, above the engine's max_lora_rank "
                f"{self._max_rank}; start the host with a larger max_lora_rank."
            )
        return tensors

    def _load(self, tensors: Mapping[str, Any]) -> int:
        with self._update_lock:
            with self._lock:
                if self._closed:
                    raise RuntimeError(f"Adapter policy {self.policy_id!r} is closed; it takes no more updates.")
                version = self._version + 1
            handle = self.host.load_adapter(f"{self.policy_id}@v{version}", self.config, tensors)
            with self._lock:
                closed = self._closed
                if not closed:
                    previous, self._version = self._version, version
                    self._loaded[version] = handle
                    retired = self._retire(previous)
            if closed:
                self.host.unload_adapter(handle)
                raise RuntimeError(f"Adapter policy {self.policy_id!r} was closed during an update.")
            for old in retired:
                self.host.unload_adapter(old)
        return version

    def _release(self, version: int) -> None:
        with self._lock:
            self._running[version] -= 1
            retired = self._retire(version)
        for handle in retired:
            self.host.unload_adapter(handle)

    def _retire(self, version: int) -> list[Any]:
        """Under the lock: take ``version``'s handle off the loaded set if nothing needs it any more
        (not current, or the policy closed, and no request running)."""
        if self._running[version] <= 0:
            self._running.pop(version, None)
            if (version != self._version or self._closed) and version in self._loaded:
                return [self._loaded.pop(version)]
        return []
