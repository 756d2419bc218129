"""EngineSupervisor's logic around a fake engine: a death fails the requests running on it, starts one
new engine with the last weights and versions counted on, and past max_restarts ends the run.
The real deaths (vLLM's engine core killed, a Ray policy actor killed) are in tests/test_faults.py."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from agentrl.faults import EngineLost, RunFailed
from agentrl.policies import EngineClosed, Generation, Sampling
from agentrl.policies.supervisor import EngineSupervisor, engine_died
from agentrl.policies.vllm import changed_units
from agentrl.rollout import EpisodeLimits, run_episode
from agentrl.testing import ScriptedPolicy


class EngineDeadError(Exception):
    """Named as vLLM's: the supervisor tells deaths by the exception's name."""


class FakeEngine:
    """A policy whose requests wait for ``release`` and fail at once when it is ``kill``ed."""

    def __init__(self, number: int, started: threading.Event | None = None):
        self.number = number
        self.tokenizer = "tokenizer"
        self.version = 0
        self.loaded: dict[str, torch.Tensor] | None = None
        self.dead = False
        self.closed = False
        self.release = threading.Event()
        self.release.set()
        if started is not None:
            started.wait(10)

    async def generate(self, prompt_ids, sampling):
        while not self.release.is_set():
            if self.dead:
                raise EngineDeadError("EngineCore encountered an issue.")
            await asyncio.sleep(0.005)
        if self.dead:
            raise EngineDeadError("EngineCore encountered an issue.")
        return Generation([self.number], [0.0], self.version, "stop")

    def update_weights(self, named_tensors):
        if self.dead:
            raise EngineDeadError("dead")
        self.loaded = {name: tensor.clone() for name, tensor in named_tensors}
        self.version += 1
        return self.version

    async def aupdate_weights(self, named_tensors):
        return self.update_weights(named_tensors)

    def close(self):
        self.closed = True


class Factory:
    def __init__(self, gate: threading.Event | None = None, fail_after: int | None = None):
        self.engines: list[FakeEngine] = []
        self.gate = gate
        self.fail_after = fail_after

    def __call__(self) -> FakeEngine:
        if self.fail_after is not None and len(self.engines) >= self.fail_after:
            raise OSError("no memory for a new engine")
        engine = FakeEngine(len(self.engines), self.gate if self.engines else None)
        self.engines.append(engine)
        return engine


SAMPLING = Sampling(max_tokens=4)


async def wait_until(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_deaths_are_told_by_name_through_the_chain():
    assert engine_died(EngineDeadError("x"))
    ray_death = type("ActorDiedError", (type("RayActorError", (Exception,), {}),), {})
    assert engine_died(ray_death("the actor died"))
    try:
        try:
            raise EngineDeadError("dead")
        except EngineDeadError as e:
            raise RuntimeError("generation failed") from e
    except RuntimeError as outer:
        assert engine_died(outer)
    assert not engine_died(RuntimeError("a bad request")) and not engine_died(TimeoutError())


def test_a_request_cancelled_while_waiting_for_the_new_engine_leaves_the_others_waiting():
    # An abandoned episode's request gives up its wait; the restart, and every other request
    # waiting for it, go on (a cancelled shared wait once cancelled them all, and the run hung).
    gate = threading.Event()
    factory = Factory(gate)
    policy = EngineSupervisor(factory, max_restarts=1, watch_every=0)

    async def scenario():
        factory.engines[0].dead = True
        with pytest.raises(EngineDeadError):
            await policy.generate([1], SAMPLING)  # the death: a new engine starts, held at the gate
        waiting = [asyncio.create_task(policy.generate([1], SAMPLING)) for _ in range(2)]
        await asyncio.sleep(0.05)
        waiting[0].cancel()
        await asyncio.gather(waiting[0], return_exceptions=True)
        gate.set()
        return await asyncio.wait_for(waiting[1], 10)

    generation = asyncio.run(scenario())
    assert generation.token_ids == [1] and policy.restarts == 1 and len(factory.engines) == 2


def test_a_death_fails_the_running_requests_and_a_new_engine_serves_the_last_weights_at_the_same_version():
    factory = Factory()
    policy = EngineSupervisor(factory, max_restarts=2)
    weight = torch.ones(2)
    assert policy.update_weights([("w", weight)]) == 1
    weight += 1  # the trainer's next step changes its tensors in place
    assert asyncio.run(policy.aupdate_weights([("w", weight)])) == 2
    weight += 1

    async def scenario():
        first = factory.engines[0]
        first.release.clear()
        running = [asyncio.create_task(policy.generate([1], SAMPLING)) for _ in range(3)]
        await asyncio.sleep(0.02)
        first.dead = True
        results = await asyncio.gather(*running, return_exceptions=True)
        assert all(isinstance(r, EngineDeadError) for r in results)  # each episode fails with its cause
        after = await policy.generate([1], SAMPLING)  # waits for the new engine, then runs on it
        return after

    generation = asyncio.run(scenario())
    assert len(factory.engines) == 2 and factory.engines[0].closed
    new = factory.engines[1]
    assert torch.equal(new.loaded["w"], torch.full((2,), 2.0))  # the last update, not the trainer's tensor now
    assert generation.token_ids == [1] and generation.version == 2 == policy.version  # one restart, not three
    assert policy.restarts == 1 and policy.metrics()["fault/engine_seconds_lost"] > 0
    assert asyncio.run(policy.aupdate_weights([("w", weight)])) == 3
    assert asyncio.run(policy.generate([1], SAMPLING)).version == 3 and new.version == 2


def test_requests_made_while_the_new_engine_starts_wait_for_it():
    gate = threading.Event()
    factory = Factory(gate=gate)
    policy = EngineSupervisor(factory, max_restarts=1)

    async def scenario():
        factory.engines[0].dead = True
        with pytest.raises(EngineDeadError):
            await policy.generate([1], SAMPLING)
        waiting = asyncio.create_task(policy.generate([1], SAMPLING))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # the new engine is still starting
        gate.set()
        return await waiting

    assert asyncio.run(scenario()).token_ids == [1]


def test_an_update_that_meets_a_dead_engine_goes_to_the_new_one():
    factory = Factory()
    policy = EngineSupervisor(factory, max_restarts=1)
    policy.update_weights([("w", torch.zeros(1))])
    factory.engines[0].dead = True
    assert asyncio.run(policy.aupdate_weights([("w", torch.ones(1))])) == 2
    new = factory.engines[1]
    assert torch.equal(new.loaded["w"], torch.ones(1)) and new.version == 2  # the old weights first, then these
    assert asyncio.run(policy.generate([1], SAMPLING)).version == 2


def test_an_update_running_when_the_dead_engine_is_closed_goes_to_the_new_one():
    # vLLM: the engine core dies during a weight push, a request notices first, and the restart closes
    # the dead engine, which cancels the push; the push must be retried, not end the run.
    class Pushing(FakeEngine):
        async def aupdate_weights(self, named_tensors):
            pushing.set()
            while not self.closed:
                await asyncio.sleep(0.005)
            raise EngineClosed("the vLLM engine was shut down while this call ran on it")

    pushing = threading.Event()
    engines: list[FakeEngine] = []
    policy = EngineSupervisor(
        lambda: engines.append((Pushing if not engines else FakeEngine)(len(engines))) or engines[-1], max_restarts=1
    )

    async def scenario():
        update = asyncio.create_task(policy.aupdate_weights([("w", torch.ones(1))]))
        await asyncio.to_thread(pushing.wait, 5)
        engines[0].dead = True
        with pytest.raises(EngineDeadError):
            await policy.generate([1], SAMPLING)
        return await update

    assert asyncio.run(scenario()) == 1
    assert engines[0].closed and torch.equal(engines[1].loaded["w"], torch.ones(1)) and policy.restarts == 1
    assert engine_died(EngineClosed("closed"))


def test_one_death_more_than_allowed_ends_the_run_with_engine_lost():
    factory = Factory()
    policy = EngineSupervisor(factory, max_restarts=0)
    factory.engines[0].dead = True

    async def scenario():
        with pytest.raises(EngineDeadError):
            await policy.generate([1], SAMPLING)
        with pytest.raises(EngineLost, match="max_engine_restarts=0 allows no more new engines") as lost:
            await policy.generate([1], SAMPLING)
        return lost.value

    lost = asyncio.run(scenario())
    assert isinstance(lost.__cause__, EngineDeadError) and len(factory.engines) == 1
    with pytest.raises(EngineLost):
        policy.update_weights([("w", torch.ones(1))])


def test_a_new_engine_that_fails_to_start_ends_the_run():
    factory = Factory(fail_after=1)
    policy = EngineSupervisor(factory, max_restarts=3)
    factory.engines[0].dead = True

    async def scenario():
        with pytest.raises(EngineDeadError):
            await policy.generate([1], SAMPLING)
        await wait_until(lambda: policy.failure is not None)
        with pytest.raises(EngineLost, match="a new one failed to start: no memory"):
            await policy.generate([1], SAMPLING)

    asyncio.run(scenario())


def test_other_errors_pass_through_without_a_restart():
    class Broken(FakeEngine):
        async def generate(self, prompt_ids, sampling):
            raise ValueError("prompt too long")

    engines = []
    policy = EngineSupervisor(lambda: engines.append(Broken(len(engines))) or engines[-1], max_restarts=1)
    with pytest.raises(ValueError, match="prompt too long"):
        asyncio.run(policy.generate([1], SAMPLING))
    assert len(engines) == 1 and policy.restarts == 0


def test_an_episode_counts_an_engine_death_but_passes_engine_lost_on(tiny_tokenizer):
    import agentrl
    from agentrl.agents import ChatAgent

    env = agentrl.make("agentrl/Calculator-v0")
    agent = ChatAgent.from_env(tiny_tokenizer, env)

    class Dying(ScriptedPolicy):
        def __init__(self, error):
            super().__init__(tiny_tokenizer, "Answer: 1")
            self.error = error

        async def generate(self, prompt_ids, sampling):
            raise self.error

    limits = EpisodeLimits(max_turns=2, max_length=None)
    counted = asyncio.run(run_episode(env, agent, Dying(EngineDeadError("dead")), SAMPLING, limits, seed=0))
    assert counted.error.startswith("EngineDeadError: dead")
    with pytest.raises(RunFailed):
        asyncio.run(run_episode(env, agent, Dying(EngineLost("gone")), SAMPLING, limits, seed=0))


def test_only_tensors_changed_since_the_last_update_are_copied_again():
    policy = EngineSupervisor(Factory(), max_restarts=1)
    frozen, trained = torch.zeros(3), torch.zeros(3)
    first = dict(policy._keep([("frozen", frozen), ("trained", trained)]))
    trained.add_(1.0)  # an optimizer step: in place
    second = dict(policy._keep([("frozen", frozen), ("trained", trained)]))
    assert second["frozen"] is first["frozen"] and second["trained"] is not first["trained"]
    assert torch.equal(first["trained"], torch.zeros(3)) and torch.equal(second["trained"], torch.ones(3))
    assert second["frozen"].data_ptr() != frozen.data_ptr()  # a copy, not the trainer's tensor


class ServingEngine(FakeEngine):
    """Sent only the tensors that changed since it was told what it serves, as VLLMPolicy."""

    held: dict = {}

    def serves(self, named_tensors):
        self.held = changed_units({}, named_tensors)[1]

    def update_weights(self, named_tensors):
        named_tensors = list(named_tensors)
        self.sent, self.held = changed_units(self.held, named_tensors)
        return super().update_weights(named_tensors)


def test_an_engine_told_what_it_serves_is_passed_the_copies_the_first_update_reuses():
    policy = EngineSupervisor(lambda: ServingEngine(0), max_restarts=1)
    frozen, trained = torch.zeros(3), torch.zeros(3)
    weights = [("model.layers.0.weight", frozen), ("model.layers.1.weight", trained)]
    policy.serves(weights)
    trained.add_(1.0)
    policy.update_weights(weights)
    assert [name for name, _ in policy.policy.sent] == ["model.layers.1.weight"]
    assert torch.equal(policy.policy.loaded["model.layers.1.weight"], torch.ones(3))


def test_a_tensor_changed_past_its_version_counter_or_new_is_copied_again():
    policy = EngineSupervisor(Factory(), max_restarts=1)
    weight = torch.zeros(256, 1024)
    policy.update_weights([("weight", weight)])
    weight.data.add_(1.0)  # as a fused optimizer writes: the version counter does not move
    policy.update_weights([("weight", weight)])
    assert torch.equal(policy.policy.loaded["weight"], torch.ones(256, 1024))
    # LoRA-merged weights are new tensors at every update, and may be given the last one's memory.
    for value in range(5):
        policy.update_weights([("merged", torch.full((256, 1024), float(value)))])
        assert torch.equal(policy.policy.loaded["merged"], torch.full((256, 1024), float(value)))


def test_a_death_nobody_asked_about_is_found_by_the_ping_and_the_new_engine_counts_our_versions():
    class Pinged(FakeEngine):
        def ping(self):
            if self.dead:
                raise EngineDeadError("found by the ping")

        def set_version(self, version):  # as a Ray policy actor does, for the env workers that reach it
            self.version = version

    engines: list[Pinged] = []
    policy = EngineSupervisor(
        lambda: engines.append(Pinged(len(engines))) or engines[-1], max_restarts=1, watch_every=0.02
    )
    try:
        policy.update_weights([("w", torch.ones(1))])
        policy.update_weights([("w", torch.ones(1))])
        engines[0].dead = True  # no request, no update: only the ping can tell
        deadline = time.monotonic() + 5
        while policy.restarts == 0 or policy._restarting is not None:
            assert time.monotonic() < deadline, "the ping did not find the death"
            time.sleep(0.01)
        assert engines[1].version == 2 == policy.version  # what a worker reaching it directly sees
        assert asyncio.run(policy.generate([1], SAMPLING)).version == 2
    finally:
        policy.close()
