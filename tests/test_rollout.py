"""The rollout: concurrency, groups, limits and faults, with a scripted policy.

The policy here is a script so that the tests can pin down what the engine does around it; the
same engine against real backends is tested in test_policies.py.
"""

import asyncio
import random
import time

import pytest

import agentrl
from agentrl import AgentEnv, Feedback, Message
from agentrl.agents import ChatAgent
from agentrl.policies import Sampling
from agentrl.rollout import (
    EpisodeLimits,
    RolloutSettings,
    SingleAgentRollout,
    TrajectoryBuffer,
    fault_kind,
    run_episode,
)
from agentrl.testing import ScriptedPolicy


class Say(AgentEnv):
    """Say the number; a wrong number gets another try."""

    def __init__(self, fail_on: str | None = None, hang_on: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.fail_on, self.hang_on = fail_on, hang_on

    def start(self, options):
        self.n = int(self.np_random.integers(100))
        return [Message("user", f"Say {self.n}.")]

    def respond(self, reply):
        if self.fail_on and self.fail_on in reply.content:
            raise RuntimeError("the env broke")
        if self.hang_on and self.hang_on in reply.content:
            time.sleep(3)
        right = reply.content.strip() == str(self.n)
        return Feedback([Message("user", "Right." if right else "Try again.")], float(right), right, {"success": right})


def solver(prompt: str) -> str:
    return prompt.split("Say ")[-1].split(".")[0]


def engine_for(tokenizer, policy, make_env=Say, **kwargs):
    return SingleAgentRollout(make_env, ChatAgent(tokenizer), policy, RolloutSettings("tests/Say", **kwargs))


def test_a_solving_policy_gets_reward_and_exact_tokens(tiny_tokenizer):
    policy = ScriptedPolicy(tiny_tokenizer, solver)
    engine = engine_for(tiny_tokenizer, policy, group_size=2)
    trajectories = asyncio.run(engine.collect(num_groups=3))
    assert len(trajectories) == 6
    for t in trajectories:
        t.validate()
        assert (t.reward, t.terminated, t.error, t.turns, t.info["success"]) == (1.0, True, None, 1, True)
        generated = [tok for tok, m in zip(t.token_ids, t.loss_mask) if m]
        assert tiny_tokenizer.decode(generated) == t.messages[-2].content + "<|im_end|>"
        assert t.messages[-1] == Message("user", "Right.")  # kept, though not tokenised
    groups = {}
    for t in trajectories:
        groups.setdefault(t.group_id, []).append(t.token_ids[: t.prompt_length])
    assert len(groups) == 3 and all(len(p) == 2 and p[0] == p[1] for p in groups.values())
    assert engine.stats.summary()["rollout/success_rate"] == 1.0


def test_episodes_run_concurrently(tiny_tokenizer):
    policy = ScriptedPolicy(tiny_tokenizer, solver, delay=0.05)
    engine = engine_for(tiny_tokenizer, policy, group_size=4, concurrency=16)
    asyncio.run(engine.collect(num_groups=8))
    assert policy.max_in_flight == 16


def test_concurrency_caps_every_stream_of_an_engine_together(tiny_tokenizer):
    # A training controller streams each chunk of groups on its own; the cap is the engine's.
    policy = ScriptedPolicy(tiny_tokenizer, solver, delay=0.05)
    engine = engine_for(tiny_tokenizer, policy, group_size=4, concurrency=6)

    async def two_streams():
        return await asyncio.gather(engine.collect(num_groups=3), engine.collect(num_groups=3))

    first, second = asyncio.run(two_streams())
    assert len(first) == len(second) == 12 and policy.max_in_flight == 6


def test_turn_limit_and_context_limit_truncate(tiny_tokenizer):
    wrong = ScriptedPolicy(tiny_tokenizer, "no idea")
    (t,) = asyncio.run(engine_for(tiny_tokenizer, wrong, limits=EpisodeLimits(max_turns=3)).collect(1))
    assert (t.turns, t.truncated, t.terminated, t.info["truncated_by"], t.reward) == (3, True, False, "max_turns", 0.0)
    chatty = ScriptedPolicy(tiny_tokenizer, "word " * 200)
    (t,) = asyncio.run(engine_for(tiny_tokenizer, chatty, limits=EpisodeLimits(max_length=64)).collect(1))
    assert t.truncated and t.info["truncated_by"] == "max_length" and len(t.token_ids) <= 64
    assert t.info["cut_turns"] == [0]


def test_faults_end_only_their_episode_and_are_counted(tiny_tokenizer):
    # Episode replies alternate: good answers, a reply that breaks the env, one that hangs it.
    replies = iter(["BOOM", "HANG"] + ["ok"] * 100)

    def script(prompt):
        reply = next(replies)
        return solver(prompt) if reply == "ok" else reply

    policy = ScriptedPolicy(tiny_tokenizer, script)
    engine = engine_for(
        tiny_tokenizer,
        policy,
        make_env=lambda: Say(fail_on="BOOM", hang_on="HANG"),
        group_size=1,
        concurrency=1,
        episode_retries=0,
        limits=EpisodeLimits(turn_timeout=0.5),
    )
    started = time.perf_counter()
    trajectories = asyncio.run(engine.collect(num_groups=6))
    assert time.perf_counter() - started < 3, "a hung env held up the run"
    errors = sorted(t.error.split(":")[0] for t in trajectories if t.error)
    assert errors == ["EpisodeTimeout", "RuntimeError"]
    assert sum(t.reward for t in trajectories) == 4
    assert engine.stats.failed == 2 and dict(engine.stats.failure_causes) == {"EpisodeTimeout": 1, "RuntimeError": 1}
    failed = [t for t in trajectories if t.error]
    assert all(t.info["failed_during"].startswith("step") for t in failed)
    assert sorted(fault_kind(t.error) for t in failed) == ["env_error", "env_timeout"]


def test_a_failed_episode_is_played_again_in_a_fresh_env_with_the_same_seeds(tiny_tokenizer):
    # The first try of group 1 breaks its env and the first of group 2 hangs it; each is played
    # again in a new env, same task and sampler seed, and only the good try comes out.
    replies = iter(["ok", "BOOM", "ok", "HANG"] + ["ok"] * 100)  # the first tries of groups 1 and 2 fail
    seeds = []

    class Recording(ScriptedPolicy):
        async def generate(self, prompt_ids, sampling):
            seeds.append(sampling.seed)
            return await super().generate(prompt_ids, sampling)

    def script(prompt):
        reply = next(replies)
        return solver(prompt) if reply == "ok" else reply

    made = []

    def make_env():
        made.append(Say(fail_on="BOOM", hang_on="HANG"))
        return made[-1]

    policy = Recording(tiny_tokenizer, script)
    engine = engine_for(
        tiny_tokenizer,
        policy,
        make_env=make_env,
        concurrency=1,
        sampling=Sampling(seed=7),
        limits=EpisodeLimits(turn_timeout=0.5),
    )
    trajectories = asyncio.run(engine.collect(num_groups=4))
    assert [t.error for t in trajectories] == [None] * 4 and sum(t.reward for t in trajectories) == 4
    retried = [t.info.get("retried", []) for t in trajectories]
    assert [[e.split(":")[0] for e in r] for r in retried] == [[], ["RuntimeError"], ["EpisodeTimeout"], []]
    assert seeds[1] == seeds[2] and seeds[3] == seeds[4] and len(set(seeds)) == 4  # a retry repeats its seed
    assert len(made) == 3  # the first env served on; each failed one was replaced by a new one
    assert engine.stats.failed == 0 and engine.episodes == 4


def test_an_episode_that_fails_every_try_comes_out_failed(tiny_tokenizer):
    made = []

    def make_env():
        made.append(Say(fail_on="BOOM"))
        return made[-1]

    engine = engine_for(tiny_tokenizer, ScriptedPolicy(tiny_tokenizer, "BOOM"), make_env=make_env, episode_retries=2)
    (t,) = asyncio.run(engine.collect(num_groups=1))
    assert t.error.startswith("RuntimeError: the env broke") and len(t.info["retried"]) == 2
    assert len(made) == 3 and engine.stats.failed == 1


def test_a_hanging_policy_times_out(tiny_tokenizer):
    policy = ScriptedPolicy(tiny_tokenizer, solver, delay=5)
    limits = EpisodeLimits(turn_timeout=0.2)
    (t,) = asyncio.run(engine_for(tiny_tokenizer, policy, limits=limits).collect(1))
    assert t.error.startswith("EpisodeTimeout") and "generate" in t.error


def test_episode_timeout(tiny_tokenizer):
    policy = ScriptedPolicy(tiny_tokenizer, "wrong", delay=0.05)
    limits = EpisodeLimits(max_turns=100, episode_timeout=0.3)
    (t,) = asyncio.run(engine_for(tiny_tokenizer, policy, limits=limits).collect(1))
    assert t.error.startswith("EpisodeTimeout: the episode ran past its limit of 0.3 s")
    assert 2 <= t.turns < 100


@pytest.mark.docker  # agentrl/CodeSandbox-v0 among them
def test_garbage_completions_never_crash_builtin_envs(tiny_tokenizer):
    rng = random.Random(0)
    alphabet = "<>{}[]\"':,_ abc123\n\\" + "<tool_call></tool_call>"

    def garbage(prompt):
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))

    for env_id in agentrl.registered_ids("agentrl"):
        env_tools = agentrl.make(env_id).tools
        policy = ScriptedPolicy(tiny_tokenizer, garbage)
        engine = SingleAgentRollout(
            lambda env_id=env_id: agentrl.make(env_id),
            ChatAgent(tiny_tokenizer, env_tools),
            policy,
            RolloutSettings(env_id=env_id, group_size=2),
        )
        trajectories = asyncio.run(engine.collect(num_groups=4))
        assert len(trajectories) == 8 and all(t.error is None for t in trajectories), env_id


def test_redundant_episodes_fill_groups_in_the_buffer(tiny_tokenizer):
    policy = ScriptedPolicy(tiny_tokenizer, solver, delay=lambda call: 0.01 * (call % 3))
    buffer = TrajectoryBuffer(group_size=2)
    engine = engine_for(tiny_tokenizer, policy, group_size=2, redundancy=1)
    trajectories = asyncio.run(engine.collect(num_groups=3, buffer=buffer))
    assert len(trajectories) == 9
    groups = buffer.get_nowait(10)
    assert [len(g) for g in groups] == [2, 2, 2] and buffer.stats.redundant == 3


def test_run_episode_records_versions(tiny_tokenizer):
    policy = ScriptedPolicy(tiny_tokenizer, "7")
    policy.update_weights([])
    env = Say()
    t = asyncio.run(run_episode(env, ChatAgent(tiny_tokenizer), policy, Sampling(), EpisodeLimits(max_turns=2), seed=1))
    assert {v for v, m in zip(t.versions, t.loss_mask) if m} == {1}
    assert {v for v, m in zip(t.versions, t.loss_mask) if not m} == {-1}


def test_the_turn_limit_is_per_call_not_per_episode(tiny_tokenizer):
    # Four generations of 0.3 s each: every one is within the 0.5 s limit, the four together are not.
    policy = ScriptedPolicy(tiny_tokenizer, "wrong", delay=0.3)
    limits = EpisodeLimits(max_turns=4, turn_timeout=0.5, episode_timeout=None)
    (t,) = asyncio.run(engine_for(tiny_tokenizer, policy, limits=limits).collect(1))
    assert (t.error, t.turns, t.info["truncated_by"]) == (None, 4, "max_turns")
    assert t.info["seconds"] >= 1.2


def test_a_timeout_raised_by_the_env_itself_is_the_envs_fault(tiny_tokenizer):
    class Slow(Say):
        def respond(self, reply):
            raise TimeoutError("the backend took too long")

    policy = ScriptedPolicy(tiny_tokenizer, solver)
    (t,) = asyncio.run(engine_for(tiny_tokenizer, policy, make_env=Slow).collect(1))
    assert t.error == "TimeoutError: the backend took too long (during step (turn 0))"


def test_groups_are_numbered_on_or_named_outright(tiny_tokenizer):
    engine = engine_for(tiny_tokenizer, ScriptedPolicy(tiny_tokenizer, solver), group_size=2)

    def play(**kwargs):
        async def run():
            return [t async for t in engine.stream(**kwargs)]

        return {t.group_id: t.token_ids[: t.prompt_length] for t in asyncio.run(run())}

    first = play(num_groups=2)
    assert sorted(first) == ["tests/Say#0-0", "tests/Say#0-1"]
    assert list(play(num_groups=1)) == ["tests/Say#0-2"]
    assert list(play(num_groups=1, first_group=7)) == ["tests/Say#0-7"]
    assert list(play(num_groups=1)) == ["tests/Say#0-8"]
    replayed = play(groups=[1, 0])
    assert replayed == first  # a group number is the same task whenever it is played
    with pytest.raises(ValueError, match=r"\[3\] appear more than once"):
        play(groups=[3, 1, 3])
    with pytest.raises(ValueError, match="exactly one of num_groups and groups"):
        play(num_groups=1, groups=[1])


def test_episodes_stream_whole_and_envs_are_reused(tiny_tokenizer):
    made = []

    def make_env():
        made.append(Say())
        return made[-1]

    engine = engine_for(tiny_tokenizer, ScriptedPolicy(tiny_tokenizer, solver), make_env=make_env, concurrency=3)

    async def play():
        return [episode async for episode in engine.stream_episodes(num_groups=12)]

    episodes = asyncio.run(play())
    assert len(episodes) == 12 and all(len(e) == 1 and e[0].error is None for e in episodes)
    assert len(made) == 3  # one env per episode in flight, each reused for the next episode
    assert engine.stats.episodes == 12 and engine.stats.seconds > 0
