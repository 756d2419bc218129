"""Orchestration overhead of the rollout per turn, with an instant policy and an instant env.

    python benchmarks/rollout_overhead.py            # full size: 5 repeats x 2048 turns, about 40 s on 2 cores
    python benchmarks/rollout_overhead.py --quick    # smoke test, a few seconds
    python benchmarks/rollout_overhead.py --no-tools --tokenizer ~/.cache/agentrl/models/SmolLM2-135M-Instruct

The policy answers at once with precomputed token ids and the env answers at once on the event
loop (``areset`` / ``astep`` are native coroutines, no thread), so everything the run spends is the
machinery around them: :class:`~agentrl.rollout.SingleAgentRollout` scheduling episodes as asyncio
tasks, :func:`~agentrl.rollout.run_episode`'s loop (time limits, context room, phases),
:class:`~agentrl.agents.TrajectoryBuilder` rendering each observation as the chat template's delta
and encoding it, decoding and parsing each reply, and the env's own step contract.

Printed side by side, as the median (and range) of ``--repeats`` interleaved runs of
``--episodes`` x ``--turns`` turns, in microseconds per turn = time / turns played (so per-episode
costs such as the first prompt are spread over the episode's turns), of wall time
(``time.perf_counter``) and of this process's CPU time (``time.process_time``, which other jobs on
a shared machine disturb less):

- ``bare asyncio``: the same episodes as asyncio tasks under a semaphore, with the same awaits
  (reset, then generate and step each turn) and no agentrl code;
- ``agentrl, no time or length limits``: the engine with ``max_length``, ``turn_timeout`` and
  ``episode_timeout`` off;
- ``agentrl, default limits``: the engine as users run it (the headline figure; target < 200 µs);

and the headline split into parts, measured inside one more run by timing wrappers around the
agent's and env's methods (the engine loop is what is left): the chat-template delta and its
encoding (``ChatAgent.observation_ids``), the first prompt (``prompt_ids``), reply decoding and
parsing (``completion_text`` + ``parse``), the env (``areset`` + ``astep``), the policy, and the
engine loop with asyncio scheduling and trajectory bookkeeping.

The prompt carries one tool schema (``--no-tools`` for none) and the tokenizer is agentrl's tiny
test tokenizer (``--tokenizer`` for a local one). Timings are of whatever else the machine is doing
too; on a shared machine, run it twice.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from agentrl.agents.chat import ChatAgent
from agentrl.env import AgentEnv, Feedback, ResetResult, StepResult
from agentrl.policies import Generation, Sampling
from agentrl.rollout import EpisodeLimits, RolloutSettings, SingleAgentRollout
from agentrl.testing import build_tiny_tokenizer
from agentrl.tools import tool
from agentrl.types import Message, Trajectory

TARGET_US = 200.0


@tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression to evaluate, e.g. "2 + 3".
    """
    return expression


class InstantEnv(AgentEnv):
    """Asks a question and says "Try again." until the episode has had ``turns`` replies."""

    tools = (calculate,)

    def __init__(self, turns: int):
        super().__init__()
        self.turns = turns

    def start(self, options: dict[str, Any] | None) -> list[Message]:
        return [Message("system", "You are a careful calculator."), Message("user", "What is 2 + 3 * 4?")]

    def respond(self, reply: Message) -> Feedback:
        done = self.turn >= self.turns
        return Feedback([Message("user", "Right." if done else "Try again.")], float(done), done)

    # Natively async and instant: no thread hop, so the timings are the machinery's alone.
    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResult:
        return self.reset(seed=seed, options=options)

    async def astep(self, action: Any) -> StepResult:
        return self.step(action)


class InstantPolicy:
    """A :class:`~agentrl.policies.Policy` that returns the same precomputed reply ids at once."""

    def __init__(self, reply_ids: Sequence[int]):
        self.reply_ids = list(reply_ids)
        self.logprobs = [-1.0] * len(self.reply_ids)
        self.version = 0

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        return Generation(self.reply_ids, self.logprobs, self.version, "stop")

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> int:
        self.version += 1
        return self.version

    def close(self) -> None:
        pass


class Timing(NamedTuple):
    """One timed run."""

    wall: float
    """Wall seconds (``time.perf_counter``)."""
    cpu: float
    """CPU seconds of this process (``time.process_time``): less disturbed by other processes."""
    turns: int
    """Turns played."""


def timed(run: Callable[[], int]) -> Timing:
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    turns = run()
    return Timing(time.perf_counter() - wall, time.process_time() - cpu, turns)


def run_engine(
    agent: ChatAgent,
    policy: Any,
    make_env: Callable[[], AgentEnv],
    episodes: int,
    turns: int,
    concurrency: int,
    limits: EpisodeLimits,
) -> Timing:
    """Play ``episodes`` episodes through the SingleAgentRollout."""
    engine = SingleAgentRollout(
        make_env, agent, policy, RolloutSettings(env_id="bench/Instant", limits=limits, concurrency=concurrency)
    )
    timing = timed(lambda: sum(t.turns for t in check(asyncio.run(engine.collect(num_groups=episodes)))))
    engine.close()
    if timing.turns != episodes * turns:
        raise RuntimeError(f"the benchmark's episodes played {timing.turns} turns, not {episodes * turns}")
    return timing


def check(trajectories: list[Trajectory]) -> list[Trajectory]:
    failed = [t.error for t in trajectories if t.error]
    if failed:
        raise RuntimeError(f"{len(failed)} of the benchmark's episodes failed, e.g. {failed[0]}")
    return trajectories


def run_bare(episodes: int, turns: int, concurrency: int) -> Timing:
    """The same episodes as tasks under a semaphore, with the same awaits and no agentrl code."""
    reply = [1, 2, 3]

    async def generate(prompt: list[int]) -> list[int]:
        return reply

    async def step(action: list[int]) -> bool:
        return False

    async def reset() -> list[int]:
        return [0]

    async def episode(slots: asyncio.Semaphore) -> int:
        async with slots:
            prompt = await reset()
            for _ in range(turns):
                action = await generate(prompt)
                await step(action)
            return turns

    async def main() -> int:
        slots = asyncio.Semaphore(concurrency)
        tasks = [asyncio.create_task(episode(slots)) for _ in range(episodes)]
        return sum([await t for t in asyncio.as_completed(tasks)])

    return timed(lambda: asyncio.run(main()))


class Split:
    """Accumulates the seconds spent inside wrapped methods, by part."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, part: str, fn: Callable[..., Any], *, count: bool = True) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - started
                self.calls[part] += count

        return timed

    def wrap_async(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        # Only for instant coroutines: a suspension inside would count other tasks' time too.
        @functools.wraps(fn)
        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - started
                self.calls[part] += 1

        return timed


PARTS = (
    ("delta", "chat-template delta + encode (observation_ids)"),
    ("prompt", "first prompt render + encode (prompt_ids)"),
    ("reply", "reply decode + parse (completion_text, parse)"),
    ("env", "env call (areset, astep)"),
    ("policy", "policy call (generate)"),
)


def run_split(
    make_agent: Callable[[], ChatAgent],
    reply_ids: list[int],
    episodes: int,
    turns: int,
    concurrency: int,
    limits: EpisodeLimits,
) -> tuple[Timing, Split]:
    """One more run of the default path with every part's methods wrapped in timers."""
    split = Split()
    agent = make_agent()
    agent.observation_ids = split.wrap("delta", agent.observation_ids)  # type: ignore[method-assign]
    agent.prompt_ids = split.wrap("prompt", agent.prompt_ids)  # type: ignore[method-assign]
    agent.completion_text = split.wrap("reply", agent.completion_text)  # type: ignore[method-assign]
    agent.parse = split.wrap("reply", agent.parse, count=False)  # type: ignore[method-assign]
    policy = InstantPolicy(reply_ids)
    policy.generate = split.wrap_async("policy", policy.generate)  # type: ignore[method-assign]

    def make_env() -> AgentEnv:
        env = InstantEnv(turns)
        env.areset = split.wrap_async("env", env.areset)  # type: ignore[method-assign]
        env.astep = split.wrap_async("env", env.astep)  # type: ignore[method-assign]
        return env

    return run_engine(agent, policy, make_env, episodes, turns, concurrency, limits), split


def per_turn(values: Iterable[float]) -> str:
    values = list(values)
    return f"{statistics.median(values):>10.1f}{min(values):>10.1f}{max(values):>10.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=256, help="episodes per repeat")
    parser.add_argument("--turns", type=int, default=8, help="turns per episode")
    parser.add_argument("--concurrency", type=int, default=64, help="episodes in flight at once")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported")
    parser.add_argument("--tokenizer", help="a local tokenizer folder (default: agentrl's tiny ChatML tokenizer)")
    parser.add_argument("--no-tools", action="store_true", help="no tool schema in the prompt")
    parser.add_argument("--quick", action="store_true", help="a tiny budget, for the smoke test")
    args = parser.parse_args(argv)
    if args.quick:
        args.episodes, args.turns, args.repeats = 16, 4, 1

    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        tokenizer = build_tiny_tokenizer()
    tools = [] if args.no_tools else list(InstantEnv.tools)

    def make_agent() -> ChatAgent:
        return ChatAgent(tokenizer, tools)

    agent = make_agent()
    reply_ids = agent.encode("Let me think. The answer is 14.") + agent.end_of_turn_ids
    policy = InstantPolicy(reply_ids)
    turns = args.turns

    def make_env() -> AgentEnv:
        return InstantEnv(turns)

    default_limits = EpisodeLimits(max_turns=turns + 1)
    no_limits = EpisodeLimits(max_turns=turns + 1, max_length=None, turn_timeout=None, episode_timeout=None)
    shape = (args.episodes, turns, args.concurrency)
    paths: dict[str, Callable[[], Timing]] = {
        "bare asyncio (same awaits)": lambda: run_bare(*shape),
        "agentrl, no time or length limits": lambda: run_engine(agent, policy, make_env, *shape, no_limits),
        "agentrl, default limits": lambda: run_engine(agent, policy, make_env, *shape, default_limits),
    }
    paths["agentrl, default limits"]()  # warm-up: template compilation, the tokenizer's caches
    runs: dict[str, list[Timing]] = defaultdict(list)
    for _ in range(args.repeats):  # interleaved, so a busy spell on the machine hits every path
        for name, run in paths.items():
            runs[name].append(run())
    splits = [run_split(make_agent, reply_ids, *shape, default_limits) for _ in range(args.repeats)]

    name = args.tokenizer or "tiny ChatML tokenizer"
    print(
        f"rollout overhead: {args.episodes} episodes x {turns} turns, {args.concurrency} in flight, "
        f"{args.repeats} repeats, {name}, {len(tools)} tool(s) in the prompt"
    )
    print(f"{'µs per turn':<40}{'wall median':>12}{'min':>10}{'max':>10}{'CPU median':>12}{'min':>10}{'max':>10}")
    for path, timings in runs.items():
        wall_us = per_turn(t.wall / t.turns * 1e6 for t in timings)
        cpu_us = per_turn(t.cpu / t.turns * 1e6 for t in timings)
        print(f"{path:<40}{wall_us:>32}{cpu_us:>32}")
    print()
    total = statistics.median(t.wall / t.turns * 1e6 for t, _ in splits)
    print(
        f"{f'split of the default path (instrumented runs, {total:.1f} µs/turn)':<68}{'µs/turn':>8}{'calls/turn':>12}"
    )
    accounted = 0.0
    for part, label in PARTS:
        us = statistics.median(split.seconds[part] / t.turns * 1e6 for t, split in splits)
        calls = statistics.median(split.calls[part] / t.turns for t, split in splits)
        accounted += us
        print(f"  {label:<66}{us:>8.1f}{calls:>12.2f}")
    print(f"  {'engine loop, asyncio scheduling, trajectory bookkeeping (the rest)':<66}{total - accounted:>8.1f}")
    headline = statistics.median(t.wall / t.turns * 1e6 for t in runs["agentrl, default limits"])
    cpu = statistics.median(t.cpu / t.turns * 1e6 for t in runs["agentrl, default limits"])
    bare = statistics.median(t.wall / t.turns * 1e6 for t in runs["bare asyncio (same awaits)"])
    verdict = "met" if headline < TARGET_US else "MISSED"
    print(
        f"\noverhead per turn: {headline:.1f} µs wall, {cpu:.1f} µs CPU (bare asyncio {bare:.1f} µs); "
        f"target < {TARGET_US:.0f} µs: {verdict}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
