"""One episode, and the engine that plays many: each an asyncio task, all sharing the policy's engine.

One episode is a straight loop (:func:`run_episode`): render the observation, generate, let the env
answer, repeat. The :class:`SingleAgentRollout` runs many of them concurrently. A slow env call in one
episode never blocks another: env calls go through ``areset`` / ``astep`` (a thread unless the env
is natively async), and the policy batches the concurrent generation requests.

How groups of episodes are scheduled (numbering, env seeds, concurrency, reusing envs, filling a
:class:`~agentrl.rollout.buffer.TrajectoryBuffer`) is :class:`~agentrl.rollout.scheduler.GroupScheduler`,
which the multi-agent engine shares: an engine only gives it the function that plays one episode.

Nothing one episode does can stop the run. An env that raises, an env or a policy that runs past
its time limit, or a context that fills up ends *that* episode: its trajectory comes back with
``error`` (for failures) or ``truncated`` (for limits) set, and the engine counts it. An env that
failed or hung is thrown away and a fresh one is made for the next episode, since it may be stuck in
a thread that cannot be killed. The one exception is :class:`~agentrl.faults.RunFailed` (a policy
whose engine is gone for good raises it): that ends the run, not the episode.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from agentrl.agents.chat import ChatAgent
from agentrl.agents.trajectory import TrajectoryBuilder
from agentrl.env import AgentEnv, as_agent_env
from agentrl.faults import RunFailed
from agentrl.policies.base import Policy, Sampling
from agentrl.rollout.scheduler import EpisodeTask, GroupScheduler, sample_sampling
from agentrl.rollout.settings import EpisodeLimits, RolloutSettings
from agentrl.types import Trajectory


class EpisodeTimeout(TimeoutError):
    """An env call, a generation or a whole episode ran past its time limit."""


class EpisodeClock:
    """An episode's two time limits (per awaited call, and in all) as one asyncio timeout scope.

    Use it as ``async with clock:`` around the episode and call :meth:`start_call` before each
    awaited env call or generation; when a limit passes, the awaited call is cancelled and the
    ``async with`` raises :class:`EpisodeTimeout`, with :attr:`expired` saying which limit it was.

    Why not one ``asyncio.timeout`` per call: each costs a scope object and a timer scheduled and
    cancelled, twice per turn, a visible share of the engine's own time per turn
    (``benchmarks/rollout_overhead.py``; figures in ``benchmarks/README.md``). Here a call's
    deadline is a number; one timer checks the current deadline when it fires and re-arms itself
    if the deadline has moved on. Each call's deadline ("now + turn_timeout", capped by the
    episode's) is later than the last one's, so the timer only has to be moved earlier once, at
    the first call, from the episode's end.
    """

    def __init__(self, limits: EpisodeLimits):
        self.turn_timeout = limits.turn_timeout
        self.episode_timeout = limits.episode_timeout
        self.expired: str | None = None
        """``"turn"`` or ``"episode"`` once a limit has passed, else ``None``."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scope: asyncio.Timeout | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._deadline: float | None = None
        self._episode_end: float | None = None

    async def __aenter__(self) -> EpisodeClock:
        self._loop = asyncio.get_running_loop()
        self._scope = asyncio.timeout(None)
        await self._scope.__aenter__()
        if self.episode_timeout is not None:
            self._episode_end = self._deadline = self._loop.time() + self.episode_timeout
            self._arm(self._episode_end)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> bool | None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        assert self._scope is not None
        try:
            await self._scope.__aexit__(kind, error, tb)
        except TimeoutError as e:
            if self.expired is None:  # not ours (asyncio only converts its own cancellation)
                raise
            limit = self.episode_timeout if self.expired == "episode" else self.turn_timeout
            raise EpisodeTimeout(f"the {self.expired} limit of {limit} s passed") from e
        return None

    def start_call(self) -> None:
        """The next awaited call starts now: it may take ``turn_timeout`` seconds (within the
        episode's limit)."""
        if self.turn_timeout is None:
            return  # only the episode's own deadline, already armed
        assert self._loop is not None
        deadline = self._loop.time() + self.turn_timeout
        if self._episode_end is not None and self._episode_end < deadline:
            deadline = self._episode_end
        self._deadline = deadline
        if self._timer is None or deadline < self._timer_at:
            self._arm(deadline)

    def _arm(self, when: float) -> None:
        assert self._loop is not None
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = self._loop.call_at(when, self._check), when

    def _check(self) -> None:
        assert self._loop is not None and self._scope is not None
        self._timer = None
        now = self._loop.time()
        if self._deadline is None:
            return
        if now < self._deadline:  # the deadline moved on since this timer was set
            self._arm(self._deadline)
            return
        ended = self._episode_end is not None and now >= self._episode_end
        self.expired = "episode" if ended else "turn"
        self._scope.reschedule(now)  # cancels whatever the episode awaits


async def run_episode(
    env: AgentEnv,
    agent: ChatAgent,
    policy: Policy,
    sampling: Sampling,
    limits: EpisodeLimits,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    env_id: str = "",
    group_id: str = "",
    agent_id: str = "agent",
    policy_id: str = "default",
) -> Trajectory:
    """Play one episode and return its trajectory; never raises except on cancellation and
    :class:`~agentrl.faults.RunFailed`.

    The final step's ``info`` (``success`` and the like) lands in ``trajectory.info``.
    """
    builder = TrajectoryBuilder(
        agent, max_length=limits.max_length, env_id=env_id, agent_id=agent_id, policy_id=policy_id, group_id=group_id
    )
    started = time.perf_counter()
    state = _EpisodeState()
    clock = EpisodeClock(limits)
    try:
        async with clock:
            await _play(env, builder, policy, sampling, limits, seed, options, state, clock)
    except EpisodeTimeout:
        state.error = timeout_error(clock, state.phase)
    except RunFailed:  # the run cannot go on (its engine is gone for good): not this episode's fault
        raise
    except Exception as e:  # one bad episode is counted, never fatal
        state.error = f"{type(e).__name__}: {e} (during {state.phase})"
    info = {**state.info, "seconds": time.perf_counter() - started, "seed": seed}
    if state.error is not None:
        info["failed_during"] = state.phase
    return builder.finish(terminated=state.terminated, truncated=state.truncated, error=state.error, info=info)


def timeout_error(clock: EpisodeClock, phase: str) -> str:
    """The ``error`` of an episode whose ``clock`` ran out during ``phase``."""
    scope, limit = ("episode", clock.episode_timeout) if clock.expired == "episode" else (phase, clock.turn_timeout)
    return f"EpisodeTimeout: the {scope} ran past its limit of {limit} s (during {phase})"


@dataclass
class _EpisodeState:
    phase: str = "reset"
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


async def _play(
    env: AgentEnv,
    builder: TrajectoryBuilder,
    policy: Policy,
    sampling: Sampling,
    limits: EpisodeLimits,
    seed: int | None,
    options: dict[str, Any] | None,
    state: _EpisodeState,
    clock: EpisodeClock,
) -> None:
    clock.start_call()
    observation, reset_info = await env.areset(seed=seed, options=options)
    builder.start(observation, state_key=_state_key(reset_info))
    turn_sampling = turn_sampling_of(sampling, builder.agent)
    for turn in range(limits.max_turns):
        room = builder.room_left
        if room is not None and room <= 0:
            state.truncated, state.info["truncated_by"] = True, "max_length"
            return
        state.phase = f"generate (turn {turn})"
        clock.start_call()
        generation = await policy.generate(builder.token_ids, fit_to_room(turn_sampling, room))
        reply = builder.add_turn(generation.token_ids, generation.logprobs, generation.version)
        state.phase = f"step (turn {turn})"
        clock.start_call()
        result = await env.astep(reply)
        state.info.update(result.info)
        if result.terminated or result.truncated:
            # The last answer is kept in the conversation but not tokenised: nothing follows it.
            builder.add_final_observation(result.observation, float(result.reward))
            if "reference" in result.info:  # an answer to score, not to verify (JEPO)
                builder.add_reference(result.observation, result.info["reference"])
            state.terminated, state.truncated = result.terminated, result.truncated
            if result.truncated:
                state.info["truncated_by"] = "env"
            return
        if builder.would_exceed(result.observation):
            builder.add_final_observation(result.observation, float(result.reward))
            state.truncated, state.info["truncated_by"] = True, "max_length"
            return
        builder.add_observation(result.observation, float(result.reward), state_key=_state_key(result.info))
    state.truncated, state.info["truncated_by"] = True, "max_turns"


def _state_key(info: Any) -> str | None:
    """The env's own name for the state it shows (``info["state_key"]``), if it gives one (GiGPO)."""
    key = info.get("state_key") if isinstance(info, dict) else None
    return None if key is None else str(key)


def turn_sampling_of(sampling: Sampling, agent: ChatAgent) -> Sampling:
    """``sampling`` for an agent's turns: it also stops on the agent's end-of-turn token."""
    stop_ids = tuple(dict.fromkeys([*sampling.stop_token_ids, *agent.end_of_turn_ids]))
    return sampling if stop_ids == tuple(sampling.stop_token_ids) else replace(sampling, stop_token_ids=stop_ids)


def fit_to_room(sampling: Sampling, room: int | None) -> Sampling:
    """``sampling`` with ``max_tokens`` cut to the ``room`` left in the context, if it is less."""
    return sampling if room is None or room >= sampling.max_tokens else replace(sampling, max_tokens=room)


class SingleAgentRollout(GroupScheduler[AgentEnv]):
    """Runs groups of episodes of a single-agent env concurrently against one policy.

    A :class:`~agentrl.rollout.scheduler.GroupScheduler` whose play function is :func:`run_episode`
    with the group's env seed and the sample's own sampler seed (:func:`sample_sampling`), and the
    sampling, limits and policy id of ``settings``; the scheduling (groups, ``redundancy``,
    ``concurrency``, :meth:`stream` and its arguments) and the counting (:attr:`stats`) are the
    scheduler's.

    ``make_env`` may also make plain gymnasium envs that speak messages: each is adapted with
    :func:`~agentrl.env.as_agent_env`.

    >>> engine = SingleAgentRollout(lambda: agentrl.make("agentrl/Calculator-v0"), agent, policy)  # doctest: +SKIP
    >>> trajectories = asyncio.run(engine.collect(num_groups=8))  # doctest: +SKIP
    """

    def __init__(
        self,
        make_env: Callable[[], Any],
        agent: ChatAgent,
        policy: Policy,
        settings: RolloutSettings = RolloutSettings(),
    ):
        self.agent = agent
        self.policy = policy
        self.roster = {"agent": settings.policy_id}
        """``{agent_id: policy_id}`` of the one agent, as a multi-agent engine's roster."""
        super().__init__(lambda: as_agent_env(make_env()), self.play_episode, settings)

    async def play_episode(self, env: AgentEnv, task: EpisodeTask) -> list[Trajectory]:
        """The play function: one :func:`run_episode`."""
        trajectory = await run_episode(
            env,
            self.agent,
            self.policy,
            sample_sampling(self.settings.sampling, task.env_seed, task.sample),
            self.settings.limits,
            seed=task.env_seed,
            env_id=self.settings.env_id,
            group_id=task.group_id,
            policy_id=self.settings.policy_id,
        )
        return [trajectory]
