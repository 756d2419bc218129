"""How a trainer group's new weights reach the engines on Ray under ``cluster.weight_sync:
broadcast``: rank 0 and the live engines form a process group (:mod:`agentrl.policies.broadcast`)
and rank 0 broadcasts the tensors into them (:class:`WeightBroadcaster`), formed again when the
engines change; :class:`BroadcastWeights` is one sync's weights as a
:class:`~agentrl.policies.router.RouterPolicy` delivers them. An engine the broadcast misses gets the
weights through Ray's object store (:class:`~agentrl.policies.ray_actor.SharedWeights`), the
default transport.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from typing import Any

try:
    import ray
except ImportError as e:  # an optional dependency: say which extra brings it
    raise ImportError(
        "agentrl.policies.weight_sync needs Ray: pip install -e '.[cpu]' (or '.[gpu]'), or ray==2.60.0."
    ) from e
from ray.exceptions import RayActorError

from agentrl.faults import TrainerLost
from agentrl.policies import broadcast
from agentrl.policies.ray_actor import SharedWeights
from agentrl.policies.supervisor import engine_died

log = logging.getLogger(__name__)


class WeightBroadcaster:
    """Rank 0's side of ``weight_sync: broadcast`` across syncs: the group it forms with the live
    engines (:mod:`agentrl.policies.broadcast`), formed again when the engines change (one died)."""

    def __init__(self, rank0: Any):
        self.rank0 = rank0
        self.members: tuple[int, ...] | None = None
        """The engines (ids) of the group formed last, None once it broke."""
        self.fallbacks = 0
        """Syncs (or parts of one) that went through the object store because a broadcast failed."""

    async def deliver(self, engines: Sequence[Any], spec: list[broadcast.TensorSpec]) -> list[Any]:
        """Broadcast the weights rank 0 holds to ``engines`` (:class:`~agentrl.policies.ray_actor.RemotePolicy`
        of vLLM); per engine, its new version or the error it failed with. An engine the broadcast
        did not reach, alive, gets the weights through the object store instead."""
        joined = await self._form(engines) if self.members != tuple(id(e) for e in engines) else None
        if joined is None:
            sent, *results = await asyncio.gather(
                self.rank0.send_weights.remote(), *(e.receive_weights(spec) for e in engines), return_exceptions=True
            )
        else:  # the group did not form: nothing was sent; an engine's own error says whether it died
            not_formed = RuntimeError("the weight broadcast group did not form")
            sent, *results = [j if isinstance(j, BaseException) else not_formed for j in joined]
        if isinstance(sent, RayActorError):
            raise TrainerLost(f"trainer rank 0 died while it sent the weights ({type(sent).__name__})") from sent
        if isinstance(sent, BaseException) or any(isinstance(r, BaseException) for r in results):
            log.warning("the weight broadcast failed (%s); this sync goes through the object store", sent)
            self.members = None  # formed again, with the engines alive then, next sync
            self.fallbacks += 1
            missed = [i for i, r in enumerate(results) if isinstance(r, BaseException) and not engine_died(r)]
            if missed:
                shared = SharedWeights((await self.rank0.put_weights.remote())[0])
                again = await asyncio.gather(
                    *(engines[i].aupdate_weights(shared) for i in missed), return_exceptions=True
                )
                for i, result in zip(missed, again):
                    results[i] = result
        return results

    async def _form(self, engines: Sequence[Any]) -> list[Any] | None:
        """A new group: rank 0 hosts its store, engine *i* joins as member *i + 1* (all at once).
        None once formed; else what each member's join returned or raised (rank 0's first)."""
        self.members = None
        host, port = await self.rank0.address.remote()
        world = len(engines) + 1
        joined = await asyncio.gather(
            self.rank0.join_weights.remote(host, port, world),
            *(engine.join_weights(host, port, world, i + 1) for i, engine in enumerate(engines)),
            return_exceptions=True,
        )
        if any(isinstance(j, BaseException) for j in joined):
            return joined
        self.members = tuple(id(e) for e in engines)
        return None


class BroadcastWeights:
    """One sync's weights under ``weight_sync: broadcast``: rank 0 holds them, and a
    :class:`~agentrl.policies.router.RouterPolicy` has them :meth:`deliver`-ed to its live engines.
    Iterating fetches them through the object store (any other policy takes them so)."""

    def __init__(self, broadcaster: WeightBroadcaster, spec: list[broadcast.TensorSpec]):
        self.broadcaster = broadcaster
        self.spec = spec

    async def deliver(self, engines: Sequence[Any]) -> list[Any]:
        """:meth:`WeightBroadcaster.deliver`."""
        return await self.broadcaster.deliver(engines, self.spec)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(SharedWeights(ray.get(self.broadcaster.rank0.put_weights.remote())[0]))
