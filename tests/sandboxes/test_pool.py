"""SandboxPool: the pool's rules on a stand-in sandbox (fast), then on both real backends.

The stand-in tests pin what the env and rollout rely on: sync and async callers on several threads
and event loops share one pool, waiters are served first come first served, a caller that gives up
or is cancelled loses nothing to the pool, resets run in the background, broken sandboxes are
replaced, and close leaves no sandbox open. The real-backend tests check reuse, reset between users,
replacement and close against Docker and bubblewrap.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from agentrl.sandboxes import (
    DEFAULT_IMAGE,
    DockerSandbox,
    Lease,
    LocalSandbox,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxPool,
    SandboxSpec,
    close_pools,
    shared_pool,
)
from agentrl.sandboxes.base import ExecResult
from agentrl.sandboxes.shared import shared_pools

pytestmark = pytest.mark.docker  # the sandboxes' Docker backend


class FakeSandbox:
    """Just enough of the Sandbox protocol to watch what the pool does with it."""

    workdir = "/work"
    limits = SandboxLimits()

    def __init__(self, reset_seconds: float = 0.0) -> None:
        self.reset_seconds = reset_seconds
        self.resets = 0
        self.closed = False
        self.dirty = False
        self.broken = False

    def exec(self, command: object, *, timeout: float | None = None, stdin: object = None) -> ExecResult:
        assert not self.closed, "a closed sandbox was used"
        self.dirty = True
        return ExecResult("", "", 0)

    async def aexec(self, command: object, *, timeout: float | None = None, stdin: object = None) -> ExecResult:
        return self.exec(command)

    def reset(self) -> None:
        if self.broken or self.closed:
            raise SandboxError("the fake sandbox is broken")
        time.sleep(self.reset_seconds)
        self.resets += 1
        self.dirty = False

    def close(self) -> None:
        self.closed = True


class FakeFactory:
    """Makes FakeSandboxes and remembers them; ``failing`` makes it raise instead."""

    def __init__(self, reset_seconds: float = 0.0) -> None:
        self.reset_seconds = reset_seconds
        self.made: list[FakeSandbox] = []
        self.failing = False
        self._lock = threading.Lock()

    def __call__(self) -> FakeSandbox:
        if self.failing:
            raise SandboxError("the engine is down (simulated by the test's factory)")
        sandbox = FakeSandbox(self.reset_seconds)
        with self._lock:
            self.made.append(sandbox)
        return sandbox


def eventually(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Whether ``condition`` holds within ``seconds`` (the pool's background work is on threads)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# --- the rules, on a stand-in ------------------------------------------------------------------------


def test_sandboxes_are_made_on_demand_up_to_size_and_only_reset_ones_are_lent() -> None:
    factory = FakeFactory()
    pool = SandboxPool(2, factory)
    first = pool.acquire()
    assert len(factory.made) == 1 and pool.in_use == 1  # on demand: one, not two
    first.exec("touch junk")
    pool.release(first)
    assert pool.in_use == 0
    again = pool.acquire()
    assert again is first and not again.dirty and again.resets == 1  # reset before it was lent again
    pool.release(again)
    pool.close()
    assert first.closed and pool.stats.created == 1 and pool.stats.handed_out == 2


def test_release_returns_at_once_and_the_reset_runs_in_the_background() -> None:
    pool = SandboxPool(1, FakeFactory(reset_seconds=0.5))
    sandbox = pool.acquire()
    started = time.perf_counter()
    pool.release(sandbox)
    assert time.perf_counter() - started < 0.2
    assert pool.idle == 0 and pool.in_use == 0  # being reset: neither idle nor lent
    assert pool.acquire(timeout=5) is sandbox  # the next caller waits for the reset, not for a new one
    pool.close()


def test_start_makes_every_sandbox_now_in_parallel() -> None:
    factory = FakeFactory()

    def slow() -> FakeSandbox:
        time.sleep(0.3)
        return factory()

    started = time.perf_counter()
    with SandboxPool(4, slow) as pool:
        assert pool.idle == 4 and len(factory.made) == 4
        assert time.perf_counter() - started < 1.0, "the 4 starts did not overlap"
    assert all(sb.closed for sb in factory.made)


def test_a_full_pool_makes_callers_wait_in_turn_then_fail_clearly() -> None:
    pool = SandboxPool(1, FakeFactory())
    held = pool.acquire()
    with pytest.raises(SandboxError, match=r"within 0.2 s: all 1 are in use. Make the pool larger"):
        pool.acquire(timeout=0.2)
    order: list[int] = []

    def take(i: int) -> None:
        sandbox = pool.acquire(timeout=10)
        order.append(i)
        time.sleep(0.02)
        pool.release(sandbox)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
        time.sleep(0.05)  # queue them in order
    pool.release(held)
    for thread in threads:
        thread.join(10)
    assert order == [0, 1, 2]  # first come, first served
    assert pool.stats.created == 1 and eventually(lambda: pool.idle == 1)
    pool.close()


def test_sync_threads_and_several_event_loops_share_one_pool() -> None:
    factory = FakeFactory()
    pool = SandboxPool(3, factory)
    busy = 0
    peak = 0
    count = threading.Lock()
    errors: list[BaseException] = []

    def use(sandbox: Sandbox) -> None:
        nonlocal busy, peak
        with count:
            busy += 1
            peak = max(peak, busy)
        assert not sandbox.dirty  # type: ignore[attr-defined]
        sandbox.exec("work")
        time.sleep(0.01)
        with count:
            busy -= 1

    def sync_worker() -> None:
        try:
            for _ in range(10):
                with pool.sandbox(timeout=30) as sandbox:
                    use(sandbox)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def loop_worker() -> None:
        async def episode() -> None:
            async with pool.sandbox(timeout=30) as sandbox:
                use(sandbox)
                await asyncio.sleep(0.01)

        async def main() -> None:
            await asyncio.gather(*(episode() for _ in range(10)))

        try:
            asyncio.run(main())  # each thread its own loop
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=sync_worker) for _ in range(3)]
    threads += [threading.Thread(target=loop_worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert peak <= 3 and len(factory.made) <= 3
    assert pool.stats.handed_out == 60 and pool.in_use == 0
    pool.close()
    assert all(sb.closed for sb in factory.made)


def test_a_cancelled_or_timed_out_async_caller_loses_nothing_to_the_pool() -> None:
    factory = FakeFactory()
    pool = SandboxPool(1, factory)

    async def main() -> None:
        held = await pool.aacquire()
        waiting = asyncio.ensure_future(pool.aacquire())
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        with pytest.raises(SandboxError, match="in use"):
            await pool.aacquire(timeout=0.1)
        pool.release(held)
        again = await pool.aacquire(timeout=5)  # neither the cancelled nor the timed-out wait kept it
        assert again is held
        pool.release(again)
        # Cancelled while its sandbox is being made: the new sandbox comes back to the pool.
        slow = SandboxPool(1, lambda: (time.sleep(0.3), factory())[1])
        making = asyncio.ensure_future(slow.aacquire())
        await asyncio.sleep(0.05)
        making.cancel()
        with pytest.raises(asyncio.CancelledError):
            await making
        assert await asyncio.to_thread(eventually, lambda: slow.in_use == 0 and slow.idle == 1)
        await slow.aclose()

    asyncio.run(main())
    pool.close()
    assert all(sb.closed for sb in factory.made)


def test_a_broken_sandbox_is_closed_and_replaced() -> None:
    factory = FakeFactory()
    with SandboxPool(1, factory) as pool:  # started: replacements are made at once
        broken = pool.acquire()
        broken.broken = True  # type: ignore[attr-defined]
        pool.release(broken)
        fresh = pool.acquire(timeout=5)
        assert fresh is not broken and broken.closed
        assert (pool.stats.replaced, pool.stats.created) == (1, 2)
        pool.release(fresh)
    lazy = SandboxPool(1, factory)  # never started: the next caller makes the replacement
    sandbox = lazy.acquire()
    sandbox.close()  # closed by its user: as broken as it gets
    lazy.release(sandbox)
    assert eventually(lambda: lazy.stats.replaced == 1)
    assert lazy.acquire(timeout=5) is not sandbox
    lazy.close()


def test_a_failed_replacement_is_reported_to_the_next_caller_and_retried() -> None:
    factory = FakeFactory()
    with SandboxPool(1, factory) as pool:
        sandbox = pool.acquire()
        factory.failing = True
        sandbox.close()
        pool.release(sandbox)
        with pytest.raises(SandboxError, match="could not start a sandbox: the engine is down"):
            pool.acquire(timeout=5)
        factory.failing = False
        with pool.sandbox(timeout=5) as again:  # the slot is retried, not lost
            assert not again.closed  # type: ignore[attr-defined]


def test_discarded_sandboxes_are_closed_never_lent_and_free_their_slot_at_once() -> None:
    factory = FakeFactory()
    pool = SandboxPool(1, factory)
    tainted = pool.acquire()
    pool.release(tainted, discard=True)
    other = pool.acquire(timeout=1)
    assert other is not tainted and eventually(lambda: tainted.closed)
    assert pool.stats.discarded == 1
    with pytest.raises(ValueError, match="not lent by the sandbox pool"):
        pool.release(tainted)
    pool.close()


def test_close_closes_lent_and_idle_sandboxes_and_wakes_waiters() -> None:
    factory = FakeFactory(reset_seconds=0.3)
    pool = SandboxPool(2, factory)
    lent, resetting = pool.acquire(), pool.acquire()
    pool.release(resetting)  # being reset when the pool closes
    failures: list[BaseException] = []

    def wait() -> None:
        try:
            pool.acquire(timeout=30)
        except SandboxError as exc:
            failures.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.05)
    pool.close()
    assert lent.closed and resetting.closed  # close() waited for the background reset
    waiter.join(5)
    assert len(failures) == 1 and "closed" in str(failures[0])
    with pytest.raises(SandboxError, match="closed"):
        pool.acquire()
    pool.release(lent)  # giving back to a closed pool is fine
    pool.close()  # idempotent


def test_a_pool_that_cannot_start_says_why() -> None:
    def factory() -> Sandbox:
        raise SandboxError("no backend here (the test's factory)")

    async def main() -> None:
        with pytest.raises(SandboxError, match="could start only 0 of 2 sandboxes: no backend here"):
            await SandboxPool(2, factory).astart()

    asyncio.run(main())
    with pytest.raises(ValueError, match="size must be >= 1"):
        SandboxPool(0, factory)


def test_shared_pools_are_per_spec_and_role_and_grow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SandboxSpec, "make", lambda self: FakeSandbox())
    close_pools()
    spec, other = SandboxSpec("local"), SandboxSpec("local", limits=SandboxLimits(memory_mb=256))
    agents = shared_pool(spec, 2, "agent")
    assert shared_pool(spec, 1, "agent") is agents and agents.size == 2
    assert shared_pool(spec, 4, "agent") is agents and agents.size == 4
    assert shared_pool(spec, 2, "grader") is not agents and shared_pool(other, 2, "agent") is not agents
    assert len(shared_pools()) == 3
    lease = Lease(spec, 2, "agent")
    first = lease.renew()
    first.exec("dirty")
    assert lease.renew() is first and not first.dirty  # type: ignore[attr-defined]
    lease.taint()
    second = lease.renew()  # a tainted sandbox is never handed out again
    assert second is not first and eventually(lambda: first.closed)  # type: ignore[attr-defined]
    lease.release()
    lease.release()  # twice is fine
    close_pools()
    assert not shared_pools() and shared_pool(spec, 1, "agent") is not agents  # a new pool after close
    close_pools()


def test_two_threads_renewing_one_lease_at_once_hold_one_sandbox_between_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # renew() used to take from the pool outside its lock: two callers at once each took a sandbox,
    # and the one overwritten never went back (its pool slot was gone for good).
    made: list[FakeSandbox] = []

    def slow_make(self: SandboxSpec) -> FakeSandbox:
        time.sleep(0.3)  # the pool makes sandboxes on demand: a slow one keeps the window open
        made.append(FakeSandbox())
        return made[-1]

    monkeypatch.setattr(SandboxSpec, "make", slow_make)
    close_pools()
    spec = SandboxSpec("local")
    lease = Lease(spec, 2, "agent")
    got: list[Sandbox] = []
    threads = [threading.Thread(target=lambda: got.append(lease.renew())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(got) == 2 and got[0] is got[1] and len(made) == 1
    lease.release()
    pool = shared_pool(spec, 2, "agent")
    assert eventually(lambda: pool.idle == 1) and pool.in_use == 0  # given back, reset, for the next caller
    close_pools()


# --- on the real backends ------------------------------------------------------------------------


def factory_of(backend: str) -> Callable[[], Sandbox]:
    def factory() -> Sandbox:
        return DockerSandbox(DEFAULT_IMAGE) if backend == "docker" else LocalSandbox()

    return factory


def test_a_sandbox_is_reused_and_reset_between_users(backend: str) -> None:
    async def main() -> None:
        async with SandboxPool(1, factory_of(backend)) as pool:
            assert pool.idle == 1 and pool.stats.created == 1  # started ahead
            async with pool.sandbox() as first:
                first.write_file("left-over.txt", "from the last episode")
                await first.aexec("sleep 300 >/dev/null 2>&1 &")
                assert pool.in_use == 1
            async with pool.sandbox() as second:
                assert second is first  # the same warm sandbox, not a new start
                with pytest.raises(FileNotFoundError):
                    await second.aread_file("left-over.txt")
                listing = await second.aexec("ls /proc | grep -c '^[0-9]'")
                assert int(listing.stdout) <= 4, "the last user's sleep survived the reset"
            assert pool.stats.created == 1 and pool.stats.handed_out == 2

    asyncio.run(main())


def test_users_beyond_the_size_wait_for_a_free_sandbox(backend: str) -> None:
    async def main() -> None:
        async with SandboxPool(2, factory_of(backend)) as pool:
            busy = 0
            peak = 0

            async def episode(i: int) -> str:
                nonlocal busy, peak
                async with pool.sandbox() as sb:
                    busy += 1
                    peak = max(peak, busy)
                    result = await sb.aexec(f"sleep 0.1; echo {i}")
                    busy -= 1
                    return result.stdout

            outputs = await asyncio.gather(*(episode(i) for i in range(6)))
            assert outputs == [f"{i}\n" for i in range(6)]
            assert peak == 2 and pool.stats.created == 2

    asyncio.run(main())


def test_a_broken_real_sandbox_is_replaced(backend: str) -> None:
    with SandboxPool(1, factory_of(backend)) as pool:
        with pool.sandbox() as broken:
            broken.close()  # as good as a sandbox whose engine went away
        with pool.sandbox(timeout=60) as fresh:
            assert fresh is not broken
            assert fresh.exec("echo works").stdout == "works\n"
        assert pool.stats.replaced == 1 and pool.stats.created == 2


def test_close_removes_every_sandbox_in_use_or_not(backend: str) -> None:
    async def main() -> Sandbox:
        pool = SandboxPool(2, factory_of(backend))
        await pool.astart()
        async with pool.sandbox() as held:
            await pool.aclose()
            assert held.closed  # type: ignore[attr-defined]
        with pytest.raises(SandboxError, match="closed"):
            async with pool.sandbox():
                pass
        await pool.aclose()  # idempotent
        return held

    held = asyncio.run(main())
    if isinstance(held, DockerSandbox):
        assert held.container is None
