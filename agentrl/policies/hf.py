"""The ``hf`` backend: transformers ``generate`` on the local machine, for CPU runs and debugging.

Concurrent requests are gathered into batches (left-padded, one ``generate`` call per batch of
requests with the same sampling settings) and run in a worker thread, so the event loop stays free
and many episodes share the model. Log-probs are those of the distribution each token was sampled
from (``output_scores``: logits / temperature, renormalised over top-k/top-p), as the ``vllm``
backend reports them; greedy requests report the raw logits' distribution (``output_logits``).

A request whose caller gives up (an episode's time limit) costs little: dropped from the queue if
its batch has not started, otherwise its row stops at the next token (a stopping criterion reads
the caller's cancelled future), and a batch whose rows have all stopped ends. :attr:`HFPolicy.requests`
counts both.

:meth:`HFPolicy.adapter` serves policies as LoRA adapters of this model (:mod:`.lora`): the model
becomes a peft model with one named adapter per adapter version, and each batch runs one adapter,
or the base with adapters disabled, so requests are batched by sampling settings and adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from agentrl.policies.base import EngineClosed, Generation, Sampling
from agentrl.policies.lora import AdapterPolicy, check_adapter_config


class HFRequests(NamedTuple):
    """An :class:`HFPolicy`'s generation requests so far."""

    received: int
    dropped: int
    """Cancelled by their caller while queued: never computed."""
    aborted: int
    """Cancelled by their caller while their batch ran: their rows stopped at the next token."""


_GATHER_STEP_S = 0.02
_GATHER_STEPS = 10


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: Sampling
    future: asyncio.Future[Generation] = field(repr=False)
    adapter: str | None = None
    """The peft adapter this request runs with; None for the base model."""


class HFPolicy:
    """A transformers causal LM as a :class:`~agentrl.policies.Policy`.

    >>> policy = HFPolicy("path/to/checkpoint")  # doctest: +SKIP
    >>> await policy.generate(prompt_ids, Sampling(max_tokens=32))  # doctest: +SKIP

    A model object passed in is used as it is: serving adapters wraps it in peft in place.
    """

    def __init__(
        self,
        model: str | Path | Any,
        tokenizer: Any | None = None,
        dtype: str = "float32",
        device: str = "cpu",
        max_batch_size: int = 64,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, (str, Path)):
            self.model = AutoModelForCausalLM.from_pretrained(str(model), dtype=getattr(torch, dtype))
            self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(model))
        else:
            if tokenizer is None:
                raise ValueError("HFPolicy needs a tokenizer when given a model object.")
            self.model, self.tokenizer = model, tokenizer
        self.model.to(device).eval()
        self.device = device
        self.max_batch_size = max_batch_size
        self._version = 0
        self._queue: list[_Request] = []
        self._batch: list[_Request] = []  # the requests being generated now
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self._weights_lock = threading.Lock()  # a weight update never lands mid-batch
        self._received = self._dropped = self._aborted = 0
        self.stop_token_ids = _stop_ids(self.tokenizer, self.model)
        self._adapter_names = (f"agentrl_lora_{n}" for n in itertools.count(1))  # peft names cannot hold "."
        self._adapter_policies: set[str] = set()
        self._retired: list[str] = []  # adapters to delete before the next batch (under the weights lock)

    @property
    def version(self) -> int:
        return self._version

    @property
    def requests(self) -> HFRequests:
        """How many requests this policy received, dropped from its queue, and aborted mid-batch."""
        return HFRequests(self._received, self._dropped, self._aborted)

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        return await self.generate_with_adapter(None, prompt_ids, sampling)

    def adapter(self, policy_id: str, config: Mapping[str, Any]) -> AdapterPolicy:
        """A policy served as a LoRA adapter of this model; ``config`` is the trainer's
        ``adapter_config(model)``. It serves the base model until its first ``update_weights``."""
        # The vLLM backend's rules (no rank limit here): what passes on hf must pass on vllm.
        check_adapter_config(config, None, setting="")
        if policy_id in self._adapter_policies:
            raise ValueError(f"This HFPolicy already serves an adapter policy {policy_id!r}; close it first.")
        self._adapter_policies.add(policy_id)
        return AdapterPolicy(self, policy_id, config, on_close=self._adapter_policies.discard)

    # --- the AdapterHost protocol (agentrl.policies.lora), used by AdapterPolicy ---------------------

    async def generate_with_adapter(self, adapter: Any, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """Generate with the peft adapter named ``adapter`` (from :meth:`load_adapter`), or the base (None)."""
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._serve())
        request = _Request(list(prompt_ids), sampling, loop.create_future(), adapter)
        self._received += 1
        self._queue.append(request)
        assert self._wakeup is not None
        self._wakeup.set()
        return await request.future

    def load_adapter(self, name: str, config: Mapping[str, Any], tensors: Mapping[str, Any]) -> Any:
        """Add the tensors as a new peft adapter (the first one wraps the model in peft); return its name.

        ``name`` is for messages only: the peft name is a fresh ``agentrl_lora_N``, as peft's
        module names cannot hold the dots a policy id may have.
        """
        from peft import PeftConfig, PeftModel, get_peft_model, set_peft_model_state_dict

        adapter = next(self._adapter_names)
        lora = PeftConfig.from_peft_type(**dict(config))
        with self._weights_lock:
            self._drop_retired()
            if isinstance(self.model, PeftModel):
                self.model.add_adapter(adapter, lora)
            else:
                self.model = get_peft_model(self.model, lora, adapter_name=adapter)
            try:
                result = set_peft_model_state_dict(self.model, dict(tensors), adapter_name=adapter)
                missing = [k for k in result.missing_keys if f".{adapter}." in k]
                if result.unexpected_keys or missing:
                    raise ValueError(
                        f"Adapter {name!r} does not fit this model: unexpected tensors {result.unexpected_keys[:3]}, "
                        f"missing {missing[:3]}. Send adapter_weights(model) of a model with this adapter config."
                    )
            except Exception:
                self._retired.append(adapter)
                self._drop_retired()
                raise
            self.model.to(self.device).eval()
        return adapter

    def unload_adapter(self, adapter: Any) -> None:
        """Delete the peft adapter before the next batch (a running batch holds the model)."""
        self._retired.append(adapter)

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """Load new base weights (the trainer's whole ``state_dict()``); adapters stay as they are."""
        with self._weights_lock:
            state = dict(named_tensors)
            target = self.model
            if hasattr(target, "get_base_model"):  # wrapped by peft: base weights sit under .base_layer
                target = target.get_base_model()
                state = _peft_base_names(state, target.state_dict().keys())
            missing, unexpected = target.load_state_dict(state, strict=False)
            if unexpected:
                raise ValueError(f"update_weights got tensors the model does not have: {unexpected[:5]}")
            self._version += 1
        return self._version

    async def aupdate_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """:meth:`update_weights` in a thread: it waits for the running batch."""
        return await asyncio.to_thread(self.update_weights, named_tensors)

    def close(self) -> None:
        """Stop serving, from any thread: the requests queued or in a batch raise
        :class:`~agentrl.policies.base.EngineClosed` (they had waited for ever), as vLLM's do."""
        worker, self._worker = self._worker, None
        if worker is None or worker.done() or worker.get_loop().is_closed():
            return
        try:
            same_loop = asyncio.get_running_loop() is worker.get_loop()
        except RuntimeError:
            same_loop = False
        if same_loop:
            worker.cancel()
        else:
            worker.get_loop().call_soon_threadsafe(worker.cancel)

    async def _serve(self) -> None:
        try:
            await self._serve_queue()
        finally:  # closed (or its loop ended): no request is left waiting
            self._dropped += sum(r.future.done() for r in self._queue)  # callers that gave up
            for request in self._queue + self._batch:
                if not request.future.done():
                    request.future.set_exception(EngineClosed("the hf policy was closed while this request waited"))
            self._queue, self._batch = [], []

    async def _serve_queue(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue:
                await self._gather_requests()
                live = [r for r in self._queue if not r.future.done()]  # a caller that gave up (timeout)
                self._dropped += len(self._queue) - len(live)
                self._queue = live
                if not live:
                    break
                first, adapter = live[0].sampling, live[0].adapter
                batch = [r for r in live if r.sampling == first and r.adapter == adapter][: self.max_batch_size]
                for request in batch:
                    self._queue.remove(request)
                self._batch = batch
                prompts, futures = [r.prompt_ids for r in batch], [r.future for r in batch]
                try:
                    results = await asyncio.to_thread(self._generate_batch, prompts, first, futures, adapter)
                except Exception as e:  # one bad batch fails its requests, not the server
                    for request in batch:
                        if not request.future.done():
                            request.future.set_exception(e)
                    continue
                for request, result in zip(batch, results):
                    if not request.future.done():
                        request.future.set_result(result)

    async def _gather_requests(self) -> None:
        # Episodes reach their next generation a few milliseconds apart (env calls run in threads).
        # Waiting until the queue stops growing puts them in one batch: on a CPU a lone request
        # pays the same prefill-dominated step time as a batch, so batching is most of the speed.
        for _ in range(_GATHER_STEPS):
            size = len(self._queue)
            await asyncio.sleep(_GATHER_STEP_S)
            if len(self._queue) == size or len(self._queue) >= self.max_batch_size:
                return

    def _generate_batch(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        futures: Sequence[asyncio.Future[Any]] = (),
        adapter: str | None = None,
    ) -> list[Generation]:
        import torch
        from transformers import StoppingCriteriaList

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.stop_token_ids[0]
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        stops = list(dict.fromkeys([*self.stop_token_ids, *sampling.stop_token_ids]))
        options: dict[str, Any] = dict(
            max_new_tokens=sampling.max_tokens,
            eos_token_id=stops,
            pad_token_id=pad,
            return_dict_in_generate=True,
            output_logits=sampling.temperature == 0,
            output_scores=sampling.temperature > 0,
        )
        if futures:
            options["stopping_criteria"] = StoppingCriteriaList([_StopCancelled(self, futures)])
        if sampling.temperature > 0:
            options.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
        else:
            options.update(do_sample=False)
        with self._weights_lock, torch.no_grad():
            self._drop_retired()
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            version = self._version
            with self._using(adapter):
                out = self.model.generate(input_ids=input_ids, attention_mask=attention, **options)
        new_tokens = out.sequences[:, width:]
        steps = out.scores if sampling.temperature > 0 else out.logits
        logprobs = torch.stack(steps, dim=1).float().log_softmax(-1)
        chosen = logprobs.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        results = []
        for row in range(len(prompts)):
            ids = new_tokens[row].tolist()
            end = next((i + 1 for i, t in enumerate(ids) if t in stops), None)
            finish = "stop" if end is not None else "length"
            end = end if end is not None else len(ids)
            results.append(Generation(ids[:end], chosen[row, :end].tolist(), version, finish))
        return results

    @contextlib.contextmanager
    def _using(self, adapter: str | None) -> Iterator[None]:
        """Under the weights lock: run the model with ``adapter``, or as the bare base model for None."""
        if adapter is not None:
            self.model.set_adapter(adapter)
            yield
        elif hasattr(self.model, "disable_adapter"):
            with self.model.disable_adapter():
                yield
        else:
            yield

    def _drop_retired(self) -> None:
        """Under the weights lock: delete the adapters no request needs any more. peft cannot hold
        zero adapters, so the last one stays (unused) until another is added."""
        while self._retired and len(self.model.peft_config) > 1:
            adapter = self._retired.pop()
            if adapter in self.model.active_adapters:  # peft warns when the active adapter goes
                self.model.set_adapter(next(a for a in self.model.peft_config if a != adapter))
            self.model.delete_adapter(adapter)


def _peft_base_names(state: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """``state`` under the names of a peft-wrapped model's base: ``x.weight`` is ``x.base_layer.weight``
    in a module that has adapters."""
    known = set(names)
    renamed = {}
    for name, tensor in state.items():
        module, _, leaf = name.rpartition(".")
        wrapped = f"{module}.base_layer.{leaf}"
        renamed[wrapped if name not in known and wrapped in known else name] = tensor
    return renamed


class _StopCancelled:
    """A stopping criterion that ends the rows whose callers have cancelled. It runs between tokens
    in the generation thread; reading a future's cancelled flag there is safe, as a cancelled future
    stays cancelled."""

    def __init__(self, policy: HFPolicy, futures: Sequence[asyncio.Future[Any]]):
        self.policy = policy
        self.futures = futures
        self.stopped = [False] * len(futures)

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for row, future in enumerate(self.futures):
            if future.cancelled():
                if not self.stopped[row]:
                    self.stopped[row] = True
                    self.policy._aborted += 1
                done[row] = True
        return done


def _stop_ids(tokenizer: Any, model: Any) -> list[int]:
    ids: list[int] = []
    for source in (getattr(model, "generation_config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None)
        ids.extend(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if not ids:
        raise ValueError("The tokenizer has no eos_token_id; set one so generation knows where a turn ends.")
    return list(dict.fromkeys(ids))
