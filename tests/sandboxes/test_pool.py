"""SandboxPool on both backends: reuse, reset between users, replacement of broken sandboxes, close."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.sandboxes import DEFAULT_IMAGE, DockerSandbox, LocalSandbox, Sandbox, SandboxError, SandboxPool


def factory_of(backend: str):
    def factory() -> Sandbox:
        return DockerSandbox(DEFAULT_IMAGE) if backend == "docker" else LocalSandbox()

    return factory


def test_a_sandbox_is_reused_and_reset_between_users(backend):
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


def test_users_beyond_the_size_wait_for_a_free_sandbox(backend):
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


def test_a_broken_sandbox_is_replaced(backend):
    async def main() -> None:
        async with SandboxPool(1, factory_of(backend)) as pool:
            async with pool.sandbox() as broken:
                broken.close()  # as good as a sandbox whose engine went away
            async with pool.sandbox() as fresh:
                assert fresh is not broken
                assert (await fresh.aexec("echo works")).stdout == "works\n"
            assert pool.stats.replaced == 1 and pool.stats.created == 2

    asyncio.run(main())


def test_a_failed_replacement_is_reported_to_the_next_user_and_retried(backend):
    real = factory_of(backend)
    failing = {"on": False}

    def factory() -> Sandbox:
        if failing["on"]:
            raise SandboxError("the engine is down (simulated by the test's factory)")
        return real()

    async def main() -> None:
        async with SandboxPool(1, factory) as pool:
            async with pool.sandbox() as sb:
                failing["on"] = True
                sb.close()
            await asyncio.sleep(0)  # let the pool try (and fail) to replace it
            with pytest.raises(SandboxError, match="could not replace a broken sandbox: the engine is down"):
                async with pool.sandbox():
                    pass
            failing["on"] = False
            async with pool.sandbox() as sb:  # the slot is retried, not lost
                assert (await sb.aexec("echo back")).ok

    asyncio.run(asyncio.wait_for(main(), 120))


def test_close_removes_every_sandbox_in_use_or_not(backend):
    async def main() -> list[Sandbox]:
        pool = SandboxPool(2, factory_of(backend))
        await pool.start()
        async with pool.sandbox() as held:
            await pool.close()
            assert held.closed
        with pytest.raises(SandboxError, match="closed"):
            async with pool.sandbox():
                pass
        await pool.close()  # idempotent
        return [held]

    (held,) = asyncio.run(main())
    if isinstance(held, DockerSandbox):
        assert held.container is None


def test_a_pool_that_cannot_start_says_why():
    def factory() -> Sandbox:
        raise SandboxError("no backend here (the test's factory)")

    async def main() -> None:
        with pytest.raises(SandboxError, match="could start only 0 of 2 sandboxes: no backend here"):
            await SandboxPool(2, factory).start()

    asyncio.run(main())
    with pytest.raises(ValueError, match="size must be >= 1"):
        SandboxPool(0, factory)
