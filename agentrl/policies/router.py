"""Several inference engines behind one policy: :class:`RouterPolicy`.

A run with ``cluster.engines: N`` plays against N engines serving the same weights. The router is an
ordinary :class:`~agentrl.policies.Policy` in front of them, so the rollout and the controller do
not change:

- **Sticky episodes.** Each episode's first request goes to the engine with the fewest requests
  outstanding, and the episode stays there: its next turn's prompt starts with the last one's, which
  that engine's prefix cache already holds. The rollout marks an episode with :func:`episode_route`
  (a context variable, so every turn of the episode, and nothing else, shares the mark); a request
  made outside any episode goes to the least loaded engine.
- **A dead engine's episodes are replayed on the others.** A request that fails because its engine
  died (:func:`~agentrl.policies.supervisor.engine_died`) is sent again, unchanged, to a live engine,
  which then serves the rest of the episode; nothing the dead engine returned is kept, so every
  token still comes from an engine holding the version it is tagged with. Replays and lost engines
  are counted (:meth:`RouterPolicy.metrics`). When the last engine dies the run ends with
  :class:`~agentrl.faults.EngineLost`.
- **Weights to every engine.** :meth:`RouterPolicy.aupdate_weights` loads the same tensors into
  every live engine at once and returns only when all of them hold the new version (they must agree
  on it), so with ``max_staleness: 0`` no request of the next batch can reach an engine that still
  holds the old one. Weights with a ``deliver`` method (a broadcast from the trainer,
  :class:`agentrl.policies.weight_sync.BroadcastWeights`) are handed the live engines and deliver to them.

>>> router = RouterPolicy([make_policy("vllm", path), make_policy("vllm", path)])  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agentrl.faults import EngineLost
from agentrl.policies.base import Generation, Policy, Sampling
from agentrl.policies.supervisor import engine_died

log = logging.getLogger(__name__)


@runtime_checkable
class Delivers(Protocol):
    """Weights that bring themselves to the engines (:class:`agentrl.policies.weight_sync.BroadcastWeights`, a
    broadcast from the trainer's rank 0): the router hands them the live engines and gets one result
    (a version, or the exception) per engine."""

    async def deliver(self, engines: Sequence[Any]) -> list[Any]: ...


@dataclass
class Route:
    """Where one episode's requests go: the index of its engine, once its first request chose one."""

    engine: int | None = None


_ROUTE: ContextVar[Route | None] = ContextVar("agentrl_episode_route", default=None)


@contextlib.contextmanager
def episode_route() -> Iterator[Route]:
    """Mark the requests made inside as one episode's: a :class:`RouterPolicy` sends them to one engine."""
    token = _ROUTE.set(Route())
    try:
        yield _ROUTE.get()  # type: ignore[misc]
    finally:
        _ROUTE.reset(token)


class RouterPolicy:
    """One policy served by several engines (see the module docstring). ``engines`` serve the same
    model with the same weights; the router owns them (:meth:`close` closes them)."""

    def __init__(self, engines: Sequence[Policy]):
        if not engines:
            raise ValueError("RouterPolicy needs at least one engine.")
        self.engines = list(engines)
        self.tokenizer = self.engines[0].tokenizer
        self.outstanding = [0] * len(self.engines)
        """Requests each engine is serving now."""
        self.served = [0] * len(self.engines)
        """Requests each engine has answered."""
        self.live = list(range(len(self.engines)))
        """Indices of the engines not known to be dead."""
        self.replayed = 0
        """Requests sent again to another engine because theirs died."""
        self._version = min(engine.version for engine in self.engines)

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        route = _ROUTE.get()
        while True:
            index = self._pick(route)
            self.outstanding[index] += 1
            try:
                generation = await self.engines[index].generate(prompt_ids, sampling)
            except Exception as e:
                if not engine_died(e):
                    raise
                self._lost(index, e)
                self.replayed += 1
                continue  # the same request, on a live engine
            finally:
                self.outstanding[index] -= 1
            self.served[index] += 1
            return generation

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """Load ``named_tensors`` into every live engine; return the version they all hold now."""
        return asyncio.run(self.aupdate_weights(named_tensors))

    async def aupdate_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """:meth:`update_weights` without blocking the caller's event loop; the engines load at once."""
        # An iterator (the trainer's generator) is read once, here; anything iterable again (a list,
        # an object-store reference: agentrl.policies.ray_actor.SharedWeights) is passed on as it is.
        weights = list(named_tensors) if isinstance(named_tensors, Iterator) else named_tensors
        indices = list(self.live)
        if isinstance(weights, Delivers):  # a broadcast to the engines (agentrl.policies.weight_sync.BroadcastWeights)
            results = await weights.deliver([self.engines[i] for i in indices])
        else:
            results = await asyncio.gather(
                *(self.engines[i].aupdate_weights(weights) for i in indices), return_exceptions=True
            )
        versions = set()
        for index, result in zip(indices, results):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception) or not engine_died(result):
                    raise result
                self._lost(index, result)
            else:
                versions.add(int(result))
        if len(versions) != 1:
            raise RuntimeError(f"the engines hold different versions after one update: {sorted(versions)}")
        self._version = versions.pop()
        return self._version

    async def sleep(self) -> None:
        """Put every live engine to sleep (vLLM's sleep mode: a colocated trainer gets the device)."""
        await asyncio.gather(*(self.engines[i].sleep() for i in self.live))  # type: ignore[attr-defined]

    async def wake_up(self) -> None:
        """Wake every live engine."""
        await asyncio.gather(*(self.engines[i].wake_up() for i in self.live))  # type: ignore[attr-defined]

    def metrics(self) -> dict[str, float]:
        """Engines lost and requests replayed so far, and the least and most busy engines' shares of
        the requests answered."""
        shares = [served / max(sum(self.served), 1) for served in self.served]
        return {
            "fault/engines_lost": float(len(self.engines) - len(self.live)),
            "fault/replayed_requests": float(self.replayed),
            "perf/engine_share_min": min(shares),
            "perf/engine_share_max": max(shares),
        }

    def close(self) -> None:
        for engine in self.engines:
            try:
                engine.close()
            except Exception as e:  # a dead engine may fail to close; the others still must
                log.warning("closing engine failed: %s", e)

    def _pick(self, route: Route | None) -> int:
        """The episode's engine if it is alive, else the live engine with the fewest outstanding requests."""
        if route is not None and route.engine in self.live:
            return route.engine
        if not self.live:
            raise EngineLost(f"all {len(self.engines)} inference engines of the run died.")
        index = min(self.live, key=lambda i: (self.outstanding[i], i))
        if route is not None:
            route.engine = index
        return index

    def _lost(self, index: int, error: BaseException) -> None:
        if index in self.live:
            self.live.remove(index)
            log.warning(
                "inference engine %d died (%s: %s); %d left serve its episodes",
                index,
                type(error).__name__,
                error,
                len(self.live),
            )
        if not self.live:
            raise EngineLost(f"all {len(self.engines)} inference engines of the run died.") from error
