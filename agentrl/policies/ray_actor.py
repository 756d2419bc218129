"""A policy served from a Ray actor (:class:`PolicyActor`), and its caller's side (:class:`RemotePolicy`).

:class:`PolicyActor` hosts any backend (``hf``, ``vllm``, ``scripted``, or a factory of your own, see
:func:`~agentrl.policies.make_policy`) and serves many requests at once from its event loop; the backend batches
them. :class:`RemotePolicy` is an ordinary :class:`~agentrl.policies.Policy` that awaits the actor, so
anything that takes a policy (a rollout in an env worker, the trainer's weight sync) takes a
remote one unchanged. A generation its caller gives up on is cancelled on the actor with
``ray.cancel``; the engine then stops the request (vLLM aborts it, ``hf`` stops its row). The env
workers and the controller that use these are in :mod:`agentrl.rollout.ray`.

>>> actor = PolicyActor.options(num_gpus=1).remote("vllm", "path/to/checkpoint")  # doctest: +SKIP
>>> policy = RemotePolicy(actor, tokenizer)                                       # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, cast

try:
    import ray
except ImportError as e:  # an optional dependency: say which extra brings it
    raise ImportError(
        "agentrl.policies.ray_actor needs Ray: pip install -e '.[cpu]' (or '.[gpu]'), or ray==2.60.0."
    ) from e
from ray.actor import ActorHandle
from ray.exceptions import RayActorError

from agentrl.policies.base import Generation, Pingable, Policy, Sampling
from agentrl.policies.make import make_policy


class WorkerLocation(NamedTuple):
    """Where an actor runs."""

    node_id: str
    """The Ray node id (hex) of its node."""
    pid: int
    """Its process id on that node."""


def share_of_cores(k: int, n: int, cores: Sequence[int]) -> str:
    """The k-th of n disjoint ranges of ``cores`` as ``VLLM_CPU_OMP_THREADS_BIND`` writes it
    (``"0-1"``, ``"2,5"``); more sharers than cores take one core each, round robin."""
    cores = sorted(cores)
    if n > len(cores):
        return str(cores[k % len(cores)])
    return ",".join(str(c) for c in cores[k * len(cores) // n : (k + 1) * len(cores) // n])


def current_location() -> WorkerLocation:
    """Where the calling process runs (inside a Ray worker or driver)."""
    return WorkerLocation(ray.get_runtime_context().get_node_id(), os.getpid())


class PolicyRequests(NamedTuple):
    """A :class:`PolicyActor`'s generation requests so far."""

    received: int
    cancelled: int
    """Cancelled by their caller (an episode that timed out) before they finished."""
    in_flight: int


@ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)
class PolicyActor:
    """One policy (any backend, see :func:`~agentrl.policies.make_policy`) served from a Ray actor.

    The methods are async, so Ray runs many requests at once on the actor's event loop (up to its
    ``max_concurrency``, 1000 by default) and the backend batches them. Pass Ray options as usual,
    e.g. ``PolicyActor.options(num_gpus=1).remote("vllm", path, {"max_model_len": 4096})``.
    """

    def __init__(
        self,
        backend: str | Callable[[], Policy],
        model: str | Path | None = None,
        options: Mapping[str, Any] | None = None,
        *,
        cores: tuple[int, int] | None = None,
    ):
        """``cores=(k, n)``: a CPU vLLM engine that shares its node with n - 1 others binds its
        worker to the k-th of n disjoint ranges of the cores this process may use."""
        if cores is not None and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = share_of_cores(*cores, os.sched_getaffinity(0))
        self.policy = make_policy(backend, model, options)
        self._received = self._cancelled = self._in_flight = 0
        self._offset = 0  # the version this actor reports minus the hosted policy's (set_version)

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Generation:
        """:meth:`Policy.generate <agentrl.policies.Policy.generate>` on the hosted policy.

        ``ray.cancel`` on this call (what :class:`RemotePolicy` does when its episode gives up)
        cancels the backend's generation, which aborts the request in the engine (vLLM's
        ``AsyncLLM`` aborts a request whose caller is cancelled).
        """
        self._received += 1
        self._in_flight += 1
        try:
            generation = await self.policy.generate(prompt_ids, sampling)
            return generation._replace(version=generation.version + self._offset)
        except asyncio.CancelledError:
            self._cancelled += 1
            raise
        finally:
            self._in_flight -= 1

    async def requests(self) -> PolicyRequests:
        """How many generations this actor has received, had cancelled, and is running now."""
        return PolicyRequests(self._received, self._cancelled, self._in_flight)

    async def update_weights(self, named_tensors: list[tuple[str, Any]]) -> int:
        """Load new weights into the hosted policy; return its new version. (Passed a
        :class:`SharedWeights`' reference, Ray hands this method the tensors it refers to.)"""
        # Awaited, so that requests keep arriving meanwhile (hf's update runs in a thread).
        return int(await self.policy.aupdate_weights(named_tensors)) + self._offset

    async def join_weights(self, host: str, port: int, world: int, member: int) -> None:
        """Join a trainer's weight broadcast group (:meth:`VLLMPolicy.join_weights
        <agentrl.policies.vllm.VLLMPolicy.join_weights>`; the vllm backend only)."""
        await self.policy.join_weights(host, port, world, member)  # type: ignore[attr-defined]

    async def leave_weights(self) -> None:
        await self.policy.leave_weights()  # type: ignore[attr-defined]

    async def receive_weights(self, spec: list[Any]) -> int:
        """Load the weights the group's member 0 broadcasts; return the new version."""
        return int(await self.policy.receive_weights(spec)) + self._offset  # type: ignore[attr-defined]

    async def version(self) -> int:
        """The hosted policy's version (as :meth:`set_version` last set it)."""
        return self.policy.version + self._offset

    async def ping(self) -> None:
        """Return if the hosted engine is alive (the backend's own ``ping``, where it has one)."""
        if isinstance(self.policy, Pingable):
            await asyncio.to_thread(self.policy.ping)

    async def set_version(self, version: int) -> None:
        """Count versions on from ``version``: a new actor that took over a dead one's weights
        reports the version those had, and its generations carry it."""
        self._offset = version - self.policy.version

    async def location(self) -> WorkerLocation:
        """The node and process this actor runs in."""
        return current_location()

    async def sleep(self) -> None:
        """Free the engine's device memory while a colocated trainer steps (vLLM's sleep mode, level 1:
        weights offloaded to host memory, KV cache dropped; the engine needs ``enable_sleep_mode``)."""
        await self.policy.sleep()  # type: ignore[attr-defined]

    async def wake_up(self) -> None:
        """Undo :meth:`sleep`."""
        await self.policy.wake_up()  # type: ignore[attr-defined]

    async def close(self) -> None:
        """Free the engine (the actor stays up; ``ray.kill`` it to end it)."""
        self.policy.close()


def start_policy_actor(
    backend: str | Callable[[], Policy],
    model: str | Path | None = None,
    options: Mapping[str, Any] | None = None,
    *,
    name: str | None = None,
    name_timeout: float = 60.0,
) -> ActorHandle:
    """Start a :class:`PolicyActor` (the one way agentrl starts one), on a GPU when the backend is
    ``vllm`` and the cluster has one; the caller owns it (``ray.kill`` it when done).

    ``name`` registers it under that name, which a :class:`RemotePolicy` made with the name follows
    to a replacement. A replacement started right after its predecessor was killed waits, up to
    ``name_timeout`` seconds, for Ray to release the name.
    """
    gpus = 1 if backend == "vllm" and ray.cluster_resources().get("GPU", 0) >= 1 else 0
    deadline = time.monotonic() + name_timeout
    while True:
        try:
            return PolicyActor.options(num_gpus=gpus, name=name).remote(backend, model, options)  # type: ignore[attr-defined]
        except ValueError as e:  # "already taken": the dead actor still holds the name
            if name is None or "already taken" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class SharedWeights:
    """Named tensors put once in Ray's object store, for several engines to fetch.

    A :class:`RemotePolicy` passes the reference on, so each :class:`PolicyActor` fetches the
    tensors from the store (from the node that put them) and the caller never holds them; iterating
    fetches them here, so any other :class:`~agentrl.policies.Policy` takes it as it takes a list.
    """

    def __init__(self, ref: ray.ObjectRef):
        self.ref = ref

    @classmethod
    def put(cls, named_tensors: Iterable[tuple[str, Any]]) -> SharedWeights:
        """Put ``named_tensors`` in the object store (one copy, however many engines read it)."""
        return cls(ray.put(list(named_tensors)))

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(ray.get(self.ref))


class RemotePolicy:
    """A :class:`~agentrl.policies.Policy` whose engine is a :class:`PolicyActor`, for the caller's side.

    Anything that takes a policy takes this one, which is how an :class:`~agentrl.rollout.ray.EnvWorker` runs the local
    engine unchanged. ``tokenizer`` is the served model's (loaded on this side: tokenizers do not
    travel through Ray). ``version`` is the newest version this side has seen, from a generation or
    an update made through it; the actor's own is ``await actor.version.remote()``.

    ``actor`` is a handle, or the name of a named actor (:func:`start_policy_actor`): then, once the
    actor died, the next generation waits for a new actor under that name (its caller's time
    limits bound the wait) and goes to it, which is how env workers follow a policy actor that
    :class:`~agentrl.policies.supervisor.EngineSupervisor` replaced.
    """

    def __init__(self, actor: ActorHandle | str, tokenizer: Any, *, owns_actor: bool = False):
        self.name = actor if isinstance(actor, str) else None
        self.actor: ActorHandle = ray.get_actor(actor) if isinstance(actor, str) else actor
        self.tokenizer = tokenizer
        self.owns_actor = owns_actor
        """Whether :meth:`close` ends the actor (it was started for this policy alone)."""
        self._version = 0
        self._dead: ActorHandle | None = None  # a named actor's handle that died

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        actor = await self._live_actor()
        ref: ray.ObjectRef[Generation] = actor.generate.remote(list(prompt_ids), sampling)
        try:
            generation: Generation = await ref
        except asyncio.CancelledError:
            ray.cancel(ref)  # the episode gave up on it (a timeout): free the engine's slot too
            raise
        except RayActorError:
            if self.name is not None:
                self._dead = actor  # the next generation looks the name up again
            raise
        self._version = max(self._version, generation.version)
        return generation

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """Send new weights to the actor and wait for it to load them; return the new version. A
        :class:`SharedWeights` goes as its reference: the actor fetches the tensors from the store."""
        version = cast(int, ray.get(self.actor.update_weights.remote(_payload(named_tensors))))
        self._version = version
        return version

    async def aupdate_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        """:meth:`update_weights` without blocking the caller's event loop."""
        self._version = int(await self.actor.update_weights.remote(_payload(named_tensors)))
        return self._version

    async def join_weights(self, host: str, port: int, world: int, member: int) -> None:
        """:meth:`PolicyActor.join_weights`."""
        await self.actor.join_weights.remote(host, port, world, member)

    async def leave_weights(self) -> None:
        """:meth:`PolicyActor.leave_weights`."""
        await self.actor.leave_weights.remote()

    async def receive_weights(self, spec: list[Any]) -> int:
        """:meth:`PolicyActor.receive_weights`; the new version."""
        self._version = int(await self.actor.receive_weights.remote(spec))
        return self._version

    async def sleep(self) -> None:
        """:meth:`PolicyActor.sleep`."""
        await self.actor.sleep.remote()

    async def wake_up(self) -> None:
        """:meth:`PolicyActor.wake_up`."""
        await self.actor.wake_up.remote()

    def ping(self, timeout: float = 60.0) -> None:
        """Return if the actor and its engine are alive; raise Ray's ``RayActorError`` if the actor
        died (the engine's own error, wrapped, if the engine died inside it)."""
        try:
            ray.get(self.actor.ping.remote(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:  # busy, not dead: the next ping asks again
            pass

    def set_version(self, version: int) -> None:
        """Have the actor count versions on from ``version`` (see :meth:`PolicyActor.set_version`)."""
        ray.get(self.actor.set_version.remote(version))
        self._version = version

    def close(self) -> None:
        """Kill the actor if this policy owns it; otherwise nothing: it belongs to whoever started it."""
        if self.owns_actor:
            ray.kill(self.actor)

    async def _live_actor(self) -> ActorHandle:
        """The actor to ask: a named one's successor once it died (waiting for it to appear)."""
        while self._dead is not None:
            try:
                actor = await asyncio.to_thread(ray.get_actor, self.name)
            except ValueError:  # not registered yet
                actor = None
            if actor is not None and actor._actor_id != self._dead._actor_id:
                self.actor, self._dead = actor, None
            else:
                await asyncio.sleep(0.5)
        return self.actor


def _payload(named_tensors: Iterable[tuple[str, Any]]) -> Any:
    """What an actor's ``update_weights`` is called with: a shared reference as it is (Ray resolves
    it in the actor), else the tensors."""
    return named_tensors.ref if isinstance(named_tensors, SharedWeights) else list(named_tensors)
