"""A policy whose inference engine is replaced when it dies: :class:`EngineSupervisor`.

An engine dies under a run: vLLM's engine-core process is killed (out of memory, a crash), a Ray
policy actor or its node goes away. The supervisor wraps the engine and, when a request or a weight
update fails with such a death (:func:`engine_died`), does what a person would:

1. the requests running on the dead engine fail with their cause, as before (their episodes are
   counted as failed and their groups replaced);
2. a new engine is started, from the same factory, in a thread of its own (the run's loop goes on);
   requests made meanwhile wait for it;
3. the weights of the last update are loaded into it, so that it serves exactly what the trainer
   last published, and its versions are counted on from there: a token it generates carries the
   same version a token of the dead engine would have (the staleness bound and the off-policy
   corrections read it);
4. generation resumes.

Deaths are noticed by the requests and updates that pass through the supervisor, and by a ping of
the engine every ``watch_every`` seconds (backends with a ``ping`` method: vLLM, a Ray policy
actor), for an engine that others use directly (Ray env workers reach the policy actor by its name,
:class:`~agentrl.policies.ray_actor.RemotePolicy`, and follow it to the new one).

At most ``max_restarts`` engines are started this way; one more death (or a new engine that fails to
start) makes every request, and so the run, end with :class:`~agentrl.faults.EngineLost`, which says
what happened. To load them into a new engine the supervisor keeps a copy of the last weights in
host memory (one model's worth; ``max_restarts=0`` keeps none).

>>> policy = EngineSupervisor(lambda: make_policy("vllm", "path/to/model"), max_restarts=3)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from agentrl.faults import EngineLost, error_chain
from agentrl.policies.base import (
    CountsVersions,
    EngineClosed,
    Generation,
    KnowsServedWeights,
    Pingable,
    Policy,
    Sampling,
    TensorStamp,
    stamp,
    unchanged,
)

log = logging.getLogger(__name__)

ENGINE_DEATHS = frozenset(
    {"EngineDeadError", "RayActorError", "ActorDiedError", "ActorUnavailableError", EngineClosed.__name__}
)
"""Names of the exception types that say an engine is gone: vLLM's ``EngineDeadError`` (its engine
core process died), Ray's actor errors (a policy actor, or its node, died), and
:class:`~agentrl.policies.base.EngineClosed` (a call was still running on an engine closed in the
meantime, such as the dead engine this supervisor replaces). Matched by name, so that neither
library is imported to tell."""


def engine_died(error: BaseException) -> bool:
    """Whether ``error``, or an exception it was raised from, says the engine is gone (:data:`ENGINE_DEATHS`)."""
    return any(kind.__name__ in ENGINE_DEATHS for e in error_chain(error) for kind in type(e).__mro__)


class EngineSupervisor:
    """A :class:`~agentrl.policies.Policy` that starts its engine with ``start()`` and starts a new one,
    with the last weights, when it dies (see the module docstring). ``version`` counts this
    supervisor's weight updates, whichever engine took them."""

    def __init__(self, start: Callable[[], Policy], *, max_restarts: int = 3, watch_every: float = 2.0):
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0 (0: the first engine death ends the run), got {max_restarts}.")
        self._start = start
        self.max_restarts = max_restarts
        self.policy = start()
        """The engine serving now."""
        self.tokenizer = self.policy.tokenizer
        self.restarts = 0
        """Engines started to replace a dead one."""
        self.seconds_lost = 0.0
        """Seconds from each death being noticed to its replacement serving, summed."""
        self.failure: EngineLost | None = None
        """Set when the engine died once more than allowed; every request raises it from then on."""
        self._version = 0
        self._offset = 0  # this supervisor's version minus the serving engine's
        self._weights: list[tuple[str, Any]] | None = None  # the last update, for a new engine
        self._copies: dict[str, tuple[TensorStamp, Any]] = {}  # name -> (the tensor's stamp, its copy)
        self._lock = threading.Lock()
        self._restarting: concurrent.futures.Future[None] | None = None
        self._closed = threading.Event()
        if watch_every > 0:  # others may be the engine's only users (Ray env workers): look for its death too
            threading.Thread(target=self._watch, args=(watch_every,), name="agentrl-engine-watch", daemon=True).start()

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        policy, offset = await self._serving()
        try:
            generation = await policy.generate(prompt_ids, sampling)
        except Exception as error:
            if engine_died(error):
                self._restart_soon(policy, error)
            raise  # this request's episode fails with its cause; later ones wait for the new engine
        return generation._replace(version=generation.version + offset)

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        weights = self._keep(named_tensors)
        while True:
            policy = self._serving_now()
            try:
                inner = policy.update_weights(weights)
            except Exception as error:
                if not engine_died(error):
                    raise
                self._restart_soon(policy, error)
                continue  # loaded into the new engine instead, once it serves
            version = self._updated(policy, weights, inner)
            if version is not None:
                return version

    async def aupdate_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        weights = await asyncio.to_thread(self._keep, named_tensors)
        while True:
            policy, _ = await self._serving()
            try:
                inner = await policy.aupdate_weights(weights)
            except Exception as error:
                if not engine_died(error):
                    raise
                self._restart_soon(policy, error)
                continue
            version = self._updated(policy, weights, inner)
            if version is not None:
                return version

    def serves(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Tell the engine that it serves these tensors already (``VLLMPolicy.serves``: its first update
        then sends only what changed); a backend without the method is left alone. A new engine
        starts from the same checkpoint, so this holds for it too until the first update."""
        if isinstance(self.policy, KnowsServedWeights):  # the engine is told of the copies that updates will pass it
            self.policy.serves(self._keep(named_tensors))

    def adapter(self, policy_id: str, config: Mapping[str, Any]) -> EngineSupervisor:
        """A LoRA adapter of this engine (``host.adapter``, :class:`~agentrl.policies.lora.AdapterPolicy`)
        that follows it to a new engine: when a request of the adapter meets the engine's death, the
        adapter is made again on the new engine and given its last weights, its versions counted on.
        A shared LoRA engine of a multi-policy run is supervised this way, each adapter a policy."""

        def start() -> Policy:
            self._revive()  # the engine may not have noticed yet the death its adapter's request met
            return self._serving_now().adapter(policy_id, config)  # type: ignore[attr-defined,no-any-return]

        return EngineSupervisor(start, max_restarts=self.max_restarts, watch_every=0)

    def metrics(self) -> dict[str, float]:
        """``fault/engine_restarts`` and ``fault/engine_seconds_lost`` so far."""
        return {"fault/engine_restarts": float(self.restarts), "fault/engine_seconds_lost": self.seconds_lost}

    def close(self) -> None:
        self._closed.set()
        restarting = self._restarting
        if restarting is not None:  # a new engine being started is closed once it is up
            restarting.result(timeout=600)
        self.policy.close()

    # --- restarts ----------------------------------------------------------------------------------

    def _keep(self, named_tensors: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """The update as a list; with restarts allowed, of copies in host memory (the trainer's own
        tensors change with its next step, and a new engine must get these). A tensor unchanged
        since the last update (:func:`~agentrl.policies.base.unchanged`: a frozen layer) keeps its
        copy, so only what training changed is copied again."""
        if not self.max_restarts:
            return list(named_tensors)
        kept, copies = [], {}
        for name, tensor in named_tensors:
            previous, now = self._copies.get(name), stamp(tensor)
            if previous is not None and unchanged(previous[0], now):
                copy = previous[1]
            else:
                copy = tensor.detach().to("cpu", copy=True)
            copies[name] = (now, copy)
            kept.append((name, copy))
        self._copies = copies
        return kept

    def _updated(self, policy: Policy, weights: list[tuple[str, Any]], inner: int) -> int | None:
        """Count an update ``policy`` took as version ``inner``; None if ``policy`` died meanwhile and
        was replaced, or is being replaced, by an engine that has not got this update (push again)."""
        with self._lock:
            if policy is not self.policy or self._restarting is not None:
                return None
            self._version += 1
            self._offset = self._version - inner
            if self.max_restarts:
                self._weights = weights
            return self._version

    def _current(self) -> tuple[Policy, int] | concurrent.futures.Future[None]:
        """The engine serving now and its version offset, or the restart under way to wait for."""
        with self._lock:
            if self.failure is not None:
                raise self.failure
            return self._restarting or (self.policy, self._offset)

    async def _serving(self) -> tuple[Policy, int]:
        """The engine serving now and its version offset, once no new engine is being started."""
        while isinstance(current := self._current(), concurrent.futures.Future):
            # Shielded: a waiter cancelled (its episode abandoned) must not cancel the restart that
            # every other waiter waits for, which would then raise CancelledError in their tasks.
            await asyncio.shield(asyncio.wrap_future(current))
        return current

    def _serving_now(self) -> Policy:
        """:meth:`_serving`'s engine, blocking."""
        while isinstance(current := self._current(), concurrent.futures.Future):
            current.result()
        return current[0]

    def _revive(self) -> None:
        """Replace the engine now if a ping says it died, and wait until an engine serves."""
        policy = self._serving_now()
        if isinstance(policy, Pingable):
            try:
                policy.ping()
            except Exception as error:
                if not engine_died(error):
                    raise
                self._restart_soon(policy, error)
        self._serving_now()

    def _watch(self, every: float) -> None:
        """Every ``every`` seconds, ping the engine (a backend with a ``ping`` method) and replace it if
        it died: requests that others send it (env workers on a cluster) never pass through here."""
        while not self._closed.wait(every):
            policy = self.policy
            if not isinstance(policy, Pingable) or self._restarting is not None or self.failure is not None:
                continue
            try:
                policy.ping()
            except Exception as error:
                if engine_died(error) and not self._closed.is_set():
                    self._restart_soon(policy, error)

    def _restart_soon(self, dead: Policy, error: BaseException) -> None:
        """Start a new engine in place of ``dead`` in a thread, unless one is being started or is up."""
        with self._lock:
            stale = dead is not self.policy or self._restarting is not None or self.failure is not None
            if stale or self._closed.is_set():
                return
            self._restarting = concurrent.futures.Future()
        threading.Thread(target=self._restart, args=(dead, error), name="agentrl-engine-restart", daemon=True).start()

    def _restart(self, dead: Policy, error: BaseException) -> None:
        noticed = time.perf_counter()
        first = (str(error).strip().splitlines() or ["no message"])[0].split(". ")[0].rstrip(".")
        cause = f"{type(error).__name__}: {first}"
        try:
            if self.restarts >= self.max_restarts:
                raise EngineLost(
                    f"the inference engine died ({cause}), and max_engine_restarts={self.max_restarts} allows no "
                    f"more new engines this run ({self.restarts} started); raise it to let a run replace more"
                ) from error
            self.restarts += 1
            log.warning(
                "the inference engine died (%s); starting a new one (%d of at most %d)",
                cause,
                self.restarts,
                self.max_restarts,
            )
            _close_quietly(dead)
            policy = self._start()
            with self._lock:
                weights, version = self._weights, self._version
            inner = policy.update_weights(weights) if weights is not None else policy.version
            if isinstance(policy, CountsVersions):  # the engine itself reports our versions (others reach it too)
                policy.set_version(version)
                inner = version
            with self._lock:
                self.policy, self._offset = policy, version - inner
            log.warning("a new inference engine serves version %d after %.1f s", version, time.perf_counter() - noticed)
        except Exception as e:
            failure = (
                e
                if isinstance(e, EngineLost)
                else EngineLost(f"the inference engine died ({cause}) and a new one failed to start: {e}")
            )
            if failure is not e:
                failure.__cause__ = e
            with self._lock:
                self.failure = failure
        finally:
            with self._lock:
                self.seconds_lost += time.perf_counter() - noticed
                restarting, self._restarting = self._restarting, None
            assert restarting is not None
            restarting.set_result(None)


def _close_quietly(policy: Policy) -> None:
    try:
        policy.close()
    except Exception as e:  # a dead engine may not close cleanly; its processes are gone anyway
        log.warning("closing the dead inference engine failed: %s", e)
