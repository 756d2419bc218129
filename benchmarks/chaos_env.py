"""``chaos/CodeSandbox-v0``: ``agentrl/CodeSandbox-v0`` whose steps raise or hang now and then.

``benchmarks/chaos.py`` serves it with ``agentrl serve chaos/CodeSandbox-v0 --import chaos_env``
(``benchmarks`` on ``PYTHONPATH``). Each step draws a fault with probability
``CHAOS_ENV_FAULT_RATE`` (default 0.05): half of them raise, half hang for ``CHAOS_ENV_HANG_S``
seconds (default 30, past the server's step timeout) before stepping. Every fault drawn is
appended to the file ``CHAOS_ENV_LOG`` (when set) as one line, ``raise`` or ``hang``, so that the
chaos run counts what it injected.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

import agentrl
from agentrl.envs.codesandbox import CodeSandboxEnv

_rng = random.Random(int(os.environ.get("CHAOS_SEED", "0")) * 1_000_003 + os.getpid())


def draw_fault() -> str | None:
    """``"raise"``, ``"hang"`` or None (no fault) for the next step; a fault is logged."""
    if _rng.random() >= float(os.environ.get("CHAOS_ENV_FAULT_RATE", "0.05")):
        return None
    fault = _rng.choice(("raise", "hang"))
    log = os.environ.get("CHAOS_ENV_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(fault + "\n")
    return fault


def hang_seconds() -> float:
    return float(os.environ.get("CHAOS_ENV_HANG_S", "30"))


class ChaosCodeSandbox(CodeSandboxEnv):
    """``agentrl/CodeSandbox-v0`` whose steps raise or hang at ``CHAOS_ENV_FAULT_RATE`` (on the
    async path, which the env server and the rollout take)."""

    async def astep(self, action: Any) -> Any:
        fault = draw_fault()
        if fault == "raise":
            raise RuntimeError("chaos: an injected env fault")
        if fault == "hang":  # a thread stuck in the env, as a wedged library call would be
            await asyncio.to_thread(time.sleep, hang_seconds())
        return await super().astep(action)


if "chaos/CodeSandbox-v0" not in agentrl.registered_ids():
    agentrl.register("chaos/CodeSandbox-v0", entry_point=ChaosCodeSandbox, kwargs={"max_turns": 8})
