"""Several agents: policy mapping, the Negotiation env under PettingZoo's own conformance tests,
generations routed to each agent's policy, faults, and two tiny real models playing each other."""

import asyncio
import math
import random
import re
import time
import warnings
from pathlib import Path

import pytest
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test, seed_test

import agentrl
from agentrl.agents import ChatAgent
from agentrl.checker import GARBAGE_REPLIES
from agentrl.envs._split import split_of
from agentrl.envs.negotiation import NegotiationEnv, parse_claim
from agentrl.multiagent import (
    MultiAgentRollout,
    make_multiagent,
    multiagent_ids,
    policy_mapping,
    register_multiagent,
    run_multiagent_episode,
)
from agentrl.policies import Sampling
from agentrl.registry import UnknownEnvError
from agentrl.rollout import EpisodeLimits, RolloutSettings, TrajectoryBuffer
from agentrl.testing import ScriptedPolicy

NEGOTIATION = "agentrl/Negotiation-v0"
GIVE = "You take it all.\nClaim: 0 books, 0 hats, 0 balls"


def greedy(prompt: str) -> str:
    """Claim the whole pool, read from the system prompt."""
    pool = re.search(r"split this pool of items: ([^.]*)\.", prompt).group(1)
    return f"I want everything.\nClaim: {pool}"


def greedy_then_give(prompt: str) -> str:
    last_user_turn = prompt.split("<|im_start|>user")[-1]
    return GIVE if "Round 2 of" in last_user_turn else greedy(prompt)


def play(env, agents, policies, mapping, limits=EpisodeLimits(), **kwargs):
    return asyncio.run(run_multiagent_episode(env, agents, policies, mapping, Sampling(), limits, **kwargs))


def generated_text(tokenizer, trajectory):
    return tokenizer.decode([t for t, m in zip(trajectory.token_ids, trajectory.loss_mask) if m])


# --- policy mapping -------------------------------------------------------------------------------


def test_mapping_presets_follow_marllib():
    ids = ["adversary_0", "adversary_1", "agent_0"]
    assert [policy_mapping("all")(a) for a in ids] == ["default"] * 3
    assert [policy_mapping("group")(a) for a in ids] == ["adversary_", "adversary_", "agent_"]
    assert [policy_mapping("individual")(a) for a in ids] == ids
    group = policy_mapping("group")
    assert (group("red_tank_12"), group("judge"), group("player2")) == ("red_tank_", "judge", "player2")

    def custom(agent_id: str) -> str:
        return "attack" if agent_id.startswith("adversary") else "defend"

    assert policy_mapping(custom) is custom
    with pytest.raises(ValueError, match="Unknown policy mapping 'gruop'.*Did you mean 'group'"):
        policy_mapping("gruop")


# --- the Negotiation env --------------------------------------------------------------------------


def test_negotiation_passes_pettingzoo_conformance_tests():
    with warnings.catch_warnings():
        # PettingZoo recommends Box/Discrete spaces and numpy observations; messages are neither.
        warnings.simplefilter("ignore")
        parallel_api_test(make_multiagent(NEGOTIATION), num_cycles=50)
        api_test(make_multiagent(NEGOTIATION, api="aec"), num_cycles=50)
        parallel_seed_test(lambda: make_multiagent(NEGOTIATION), num_cycles=20)
        seed_test(lambda: make_multiagent(NEGOTIATION, api="aec"), num_cycles=20)
    env = make_multiagent(NEGOTIATION)
    assert isinstance(env, NegotiationEnv) and isinstance(make_multiagent(NEGOTIATION, api="aec"), AECEnv)
    assert env.observation_space("trader_0") is env.observation_space("trader_0")


def test_negotiation_is_deterministic_under_seed_and_varies_across_seeds():
    first, _ = NegotiationEnv().reset(seed=7)
    again, _ = NegotiationEnv().reset(seed=7)
    assert first == again
    pools = {NegotiationEnv().reset(seed=s)[0]["trader_0"][0].content for s in range(20)}
    assert len(pools) > 10


def test_splits_are_disjoint():
    keys = {}
    for split in ("train", "test"):
        env = NegotiationEnv(split=split)
        keys[split] = set()
        for seed in range(150):
            env.reset(seed=seed)
            task = env.task
            keys[split].add(f"negotiation:{task.pool}:{task.values[0]}:{task.values[1]}")
        assert all(split_of(k) == split for k in keys[split])
    assert keys["train"] and keys["test"] and not keys["train"] & keys["test"]
    with pytest.raises(ValueError, match="Unknown split"):
        NegotiationEnv(split="validation")


def test_deal_rewards_and_no_deal():
    env = NegotiationEnv(max_rounds=2)
    env.reset(seed=3)
    pool, values = env.task.pool, env.task.values
    _, rewards, terminations, _, infos = env.step({"trader_0": greedy_claim(pool), "trader_1": GIVE})
    assert rewards == {"trader_0": 1.0, "trader_1": 0.0} and all(terminations.values()) and env.agents == []
    assert infos["trader_0"] == {
        "round": 1,
        "valid_claim": True,
        "success": True,
        "value": 10,
        "deal": infos["trader_1"]["deal"],
    }
    env.reset(seed=3)
    books, rest = f"Claim: {pool[0]} books", f"Claim: {pool[1]} hats, {pool[2]} balls"
    _, rewards, _, _, _ = env.step({"trader_0": books, "trader_1": rest})
    assert rewards["trader_0"] == pool[0] * values[0][0] / 10
    assert rewards["trader_1"] == (pool[1] * values[1][1] + pool[2] * values[1][2]) / 10
    env.reset(seed=3)
    observations, _, terminations, _, infos = env.step({"trader_0": "no claim here", "trader_1": greedy_claim(pool)})
    assert not any(terminations.values()) and infos["trader_0"] == {"round": 1, "valid_claim": False}
    assert "no valid claim: I could not find a line 'Claim:" in observations["trader_0"][0].content
    assert "trader_1 claimed" in observations["trader_0"][0].content
    _, rewards, terminations, _, infos = env.step({"trader_0": greedy_claim(pool), "trader_1": greedy_claim(pool)})
    assert rewards == {"trader_0": 0.0, "trader_1": 0.0} and all(terminations.values())
    assert infos["trader_1"]["success"] is False
    with pytest.raises(RuntimeError, match="call reset"):
        env.step({"trader_0": GIVE, "trader_1": GIVE})


def greedy_claim(pool) -> str:
    return "Claim: {} books, {} hats, {} balls".format(*pool)


def test_claims_are_parsed_leniently_and_explained():
    assert parse_claim("Let us share.\nCLAIM: 2 Hats and 1 book", (3, 2, 1)) == (1, 2, 0)
    assert parse_claim("Claim: 1 book\nno wait\nClaim: 1 ball", (3, 2, 1)) == (0, 0, 1)
    assert parse_claim("Claim: nothing", (3, 2, 1)) == (0, 0, 0)
    for reply, why in [
        ("I'll take the hats", "could not find"),
        ("Claim: 4 books", "pool has only 3"),
        ("Claim: 1 book, 2 books", "books twice"),
        ("Claim: 1 2 0", "no item names"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_claim(reply, (3, 2, 1))


def test_garbage_replies_never_raise():
    rng = random.Random(0)
    alphabet = "Claim: 0123456789 books hats balls,\n<>{}[]\"'\\\x00☃"
    for api in ("parallel", "aec"):
        env = make_multiagent(NEGOTIATION, api=api)
        for seed in range(6):
            env.reset(seed=seed)
            replies = [*GARBAGE_REPLIES, *("".join(rng.choices(alphabet, k=rng.randint(0, 60))) for _ in range(8))]
            if api == "parallel":
                while env.agents:
                    env.step({a: rng.choice(replies) for a in env.agents})
            else:
                for _agent in env.agent_iter():
                    _, _, terminated, truncated, _ = env.last()
                    env.step(None if terminated or truncated else rng.choice(replies))


# --- the registry ---------------------------------------------------------------------------------


def test_registry_mirrors_agentrl_make_and_stays_out_of_gymnasium():
    assert NEGOTIATION in multiagent_ids("agentrl") and NEGOTIATION not in agentrl.registered_ids()
    with pytest.raises(UnknownEnvError, match="Did you mean 'agentrl/Negotiation-v0'"):
        make_multiagent("agentrl/Negociation-v0")
    with pytest.raises(UnknownEnvError, match="Did you mean 'agentrl/Negotiation-v0'"):
        make_multiagent("negotiation")
    with pytest.raises(UnknownEnvError, match=r"single-agent env; make it with agentrl.make"):
        make_multiagent("agentrl/Calculator-v0")
    with pytest.raises(ValueError, match="already a single-agent env id"):
        register_multiagent("agentrl/Calculator-v0", NegotiationEnv)
    assert make_multiagent(NEGOTIATION, max_rounds=2, split="test").max_rounds == 2
    # An env comes as registered by default; an AEC entry point is converted with PettingZoo's own
    # wrapper when a ParallelEnv is asked for.
    register_multiagent("tests/NegotiationAEC-v0", "agentrl.envs.negotiation:env")
    assert isinstance(make_multiagent("tests/NegotiationAEC-v0"), AECEnv)
    assert isinstance(make_multiagent("tests/NegotiationAEC-v0", api="parallel"), ParallelEnv)
    with pytest.raises(ValueError, match="api must be"):
        make_multiagent(NEGOTIATION, api="turns")


# --- rollout: routing ------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["parallel", "aec"])
def test_each_agent_is_played_by_its_own_policy(tiny_tokenizer, api):
    policies = {
        "trader_0": ScriptedPolicy(tiny_tokenizer, greedy),
        "trader_1": ScriptedPolicy(tiny_tokenizer, greedy_then_give),
    }
    env = make_multiagent(NEGOTIATION, api=api)
    out = play(env, ChatAgent(tiny_tokenizer), policies, "individual", seed=0, env_id=NEGOTIATION, group_id="g")
    assert set(out) == {"trader_0", "trader_1"}
    assert [policies[p].calls for p in ("trader_0", "trader_1")] == [2, 2]
    t0, t1 = out["trader_0"], out["trader_1"]
    for agent_id, t in out.items():
        t.validate()
        assert (t.agent_id, t.policy_id, t.group_id, t.env_id) == (agent_id, agent_id, f"g/{agent_id}", NEGOTIATION)
        assert (t.turns, t.terminated, t.truncated, t.error, t.info["success"]) == (2, True, False, None, True)
    prompt0 = tiny_tokenizer.decode(t0.token_ids[: t0.prompt_length])
    assert generated_text(tiny_tokenizer, t0) == 2 * (greedy(prompt0) + "<|im_end|>")
    assert generated_text(tiny_tokenizer, t1) == greedy(prompt0) + "<|im_end|>" + GIVE + "<|im_end|>"
    assert (t0.reward, t1.reward, t0.turn_rewards, t1.turn_rewards) == (1.0, 0.0, [0.0, 1.0], [0.0, 0.0])
    assert t1.messages[-1].content.startswith("Deal! You get 0 books")
    if api == "aec":  # the same game either way, down to the token ids
        parallel = play(make_multiagent(NEGOTIATION), ChatAgent(tiny_tokenizer), policies, "individual", seed=0)
        assert [parallel[a].token_ids for a in out] == [out[a].token_ids for a in out]


def test_all_and_individual_mappings_route_calls(tiny_tokenizer):
    shared = ScriptedPolicy(tiny_tokenizer, greedy)
    out = play(
        make_multiagent(NEGOTIATION, max_rounds=2), ChatAgent(tiny_tokenizer), {"default": shared}, "all", seed=1
    )
    assert shared.calls == 4 and {t.policy_id for t in out.values()} == {"default"}
    assert all(t.terminated and not t.info["success"] and t.reward == 0.0 for t in out.values())
    team = ScriptedPolicy(tiny_tokenizer, GIVE)
    out = play(make_multiagent(NEGOTIATION), ChatAgent(tiny_tokenizer), {"trader_": team}, "group", seed=1)
    assert team.calls == 2 and {t.policy_id for t in out.values()} == {"trader_"}
    with pytest.raises(ValueError, match="maps to policy 'trader_1', but policies has only"):
        play(make_multiagent(NEGOTIATION), ChatAgent(tiny_tokenizer), {"trader_0": shared}, "individual")
    with pytest.raises(ValueError, match="No ChatAgent for agent 'trader_1'"):
        play(make_multiagent(NEGOTIATION), {"trader_0": ChatAgent(tiny_tokenizer)}, {"default": shared}, "all")


def test_turn_and_context_limits_truncate_every_agent(tiny_tokenizer):
    stubborn = {"default": ScriptedPolicy(tiny_tokenizer, greedy)}
    for api in ("parallel", "aec"):
        env = make_multiagent(NEGOTIATION, api=api)
        out = play(env, ChatAgent(tiny_tokenizer), stubborn, "all", EpisodeLimits(max_turns=2), seed=0)
        assert [(t.turns, t.truncated, t.terminated, t.info["truncated_by"]) for t in out.values()] == [
            (2, True, False, "max_turns")
        ] * 2, api
    chatty = {"default": ScriptedPolicy(tiny_tokenizer, "word " * 300)}
    out = play(
        make_multiagent(NEGOTIATION), ChatAgent(tiny_tokenizer), chatty, "all", EpisodeLimits(max_length=600), seed=0
    )
    for t in out.values():
        assert t.truncated and t.info["truncated_by"] == "max_length" and len(t.token_ids) <= 600
        assert t.info["cut_turns"] == [0] and t.error is None


# --- rollout: the engine and faults ------------------------------------------------------------------


class FlakyNegotiation(NegotiationEnv):
    """Negotiation that breaks on chosen seeds: raises in reset or step, or hangs in step."""

    def reset(self, seed=None, options=None):
        self.seed_used = seed
        if seed == 4:
            raise OSError("the env could not start")
        return super().reset(seed=seed, options=options)

    def step(self, actions):
        if self.seed_used == 1:
            raise RuntimeError("the env broke")
        if self.seed_used == 3:
            time.sleep(3)
        return super().step(actions)


def test_engine_groups_agents_and_runs_episodes_concurrently(tiny_tokenizer):
    policy = ScriptedPolicy(tiny_tokenizer, greedy_then_give, delay=0.05)
    buffer = TrajectoryBuffer(group_size=2)
    engine = MultiAgentRollout(
        lambda: make_multiagent(NEGOTIATION),
        ChatAgent(tiny_tokenizer),
        {"default": policy},
        RolloutSettings(env_id="tests/Neg", group_size=2, concurrency=4),
    )
    trajectories = asyncio.run(engine.collect(num_groups=2, buffer=buffer))
    assert len(trajectories) == 8 and policy.max_in_flight == 8  # 4 episodes x 2 agents at once
    groups = buffer.get_nowait(10)
    assert sorted(g[0].group_id for g in groups) == [f"tests/Neg#0-{i}/trader_{a}" for i in (0, 1) for a in (0, 1)]
    for group in groups:  # one agent's samples of one task: the same prompt
        assert (
            len({tuple(t.token_ids[: t.prompt_length]) for t in group}) == 1 and len({t.agent_id for t in group}) == 1
        )
    assert engine.episodes == 4 and engine.stats.episodes == 8 and set(engine.policy_stats) == {"default"}


def test_engine_streams_whole_episodes_of_the_groups_it_is_given(tiny_tokenizer):
    policies = {a: ScriptedPolicy(tiny_tokenizer, GIVE) for a in ("trader_0", "trader_1")}
    engine = MultiAgentRollout(
        lambda: make_multiagent(NEGOTIATION),
        ChatAgent(tiny_tokenizer),
        policies,
        RolloutSettings(mapping="individual", env_id="tests/Neg"),
    )
    assert engine.roster == {"trader_0": "trader_0", "trader_1": "trader_1"}

    async def play(**kwargs):
        return [episode async for episode in engine.stream_episodes(**kwargs)]

    episodes = asyncio.run(play(groups=[5, 2]))
    assert sorted(tuple(t.group_id for t in e) for e in episodes) == [
        (f"tests/Neg#0-{g}/trader_0", f"tests/Neg#0-{g}/trader_1") for g in (2, 5)
    ]
    assert all(t.error is None and t.policy_id == t.agent_id for e in episodes for t in e)
    # The numbering of num_groups calls is not moved by named groups, and goes on from first_group.
    assert [e[0].group_id for e in asyncio.run(play(num_groups=1))] == ["tests/Neg#0-0/trader_0"]
    assert [e[0].group_id for e in asyncio.run(play(num_groups=1, first_group=9))] == ["tests/Neg#0-9/trader_0"]
    assert engine.episodes == 4 and engine.stats.episodes == 8


def test_engine_raises_setup_errors_instead_of_counting_them(tiny_tokenizer):
    agents = {a: ChatAgent(tiny_tokenizer) for a in ("trader_0", "trader_1")}
    policy = {"default": ScriptedPolicy(tiny_tokenizer, GIVE)}
    with pytest.raises(ValueError, match="maps to policy 'trader_0'"):
        MultiAgentRollout(NegotiationEnv, agents, policy, RolloutSettings(mapping="individual"))

    class WithJudge(NegotiationEnv):
        def __init__(self):
            super().__init__()
            self.possible_agents = [*self.possible_agents, "judge_0"]

    envs = iter([NegotiationEnv(), WithJudge()])  # the second episode at once needs a second env
    engine = MultiAgentRollout(lambda: next(envs), agents, policy, RolloutSettings(group_size=2))
    with pytest.raises(ValueError, match="No ChatAgent for agent 'judge_0'"):  # raised, not hung
        asyncio.run(engine.collect(num_groups=1))


def test_faults_end_only_their_episode_and_are_counted(tiny_tokenizer):
    policies = {"trader_0": ScriptedPolicy(tiny_tokenizer, greedy), "trader_1": ScriptedPolicy(tiny_tokenizer, GIVE)}
    engine = MultiAgentRollout(
        FlakyNegotiation,
        ChatAgent(tiny_tokenizer),
        policies,
        RolloutSettings(mapping="individual", concurrency=1, limits=EpisodeLimits(turn_timeout=0.5)),
    )
    started = time.perf_counter()
    trajectories = asyncio.run(engine.collect(num_groups=6))
    assert time.perf_counter() - started < 3, "a hung env held up the run"
    assert len(trajectories) == 12 and engine.episodes == 6 and engine.failed_episodes == 3
    by_seed = {}
    for t in trajectories:
        by_seed.setdefault(t.info["seed"], []).append(t)
    for seed, cause, during in [(1, "RuntimeError", "step"), (3, "EpisodeTimeout", "step"), (4, "OSError", "reset")]:
        assert [t.error.split(":")[0] for t in by_seed[seed]] == [cause, cause], seed
        assert all(t.info["failed_during"].startswith(during) for t in by_seed[seed])
    assert all(not t.info["took_part"] and not t.token_ids for t in by_seed[4])
    assert sum(t.reward for t in trajectories) == 3.0  # trader_0 wins the three good episodes
    assert engine.stats.failed == 6
    assert dict(engine.stats.failure_causes) == {"RuntimeError": 2, "EpisodeTimeout": 2, "OSError": 2}
    assert engine.policy_stats["trader_1"].failed == 3


def test_a_hanging_aec_env_and_a_hanging_policy_time_out(tiny_tokenizer):
    env = FlakyNegotiation()
    from pettingzoo.utils.conversions import parallel_to_aec

    policies = {"default": ScriptedPolicy(tiny_tokenizer, GIVE)}
    out = play(
        parallel_to_aec(env), ChatAgent(tiny_tokenizer), policies, "all", EpisodeLimits(turn_timeout=0.3), seed=3
    )
    assert all(t.error.startswith("EpisodeTimeout") and "step (trader_1, turn 0)" in t.error for t in out.values())
    slow = {"trader_0": ScriptedPolicy(tiny_tokenizer, GIVE), "trader_1": ScriptedPolicy(tiny_tokenizer, GIVE, delay=5)}
    out = play(NegotiationEnv(), ChatAgent(tiny_tokenizer), slow, "individual", EpisodeLimits(turn_timeout=0.2), seed=0)
    assert all(t.error.startswith("EpisodeTimeout") and "generate (turn 0)" in t.error for t in out.values())
    assert slow["trader_1"].in_flight == 0  # the slow generation was cancelled, not left running


# --- two real (tiny) models -------------------------------------------------------------------------


def test_two_hf_policies_play_a_short_episode(tiny_model_dir):
    from agentrl.policies.hf import HFPolicy

    policies = {"trader_0": HFPolicy(tiny_model_dir), "trader_1": HFPolicy(tiny_model_dir)}
    agent = ChatAgent(policies["trader_0"].tokenizer)
    try:
        out = asyncio.run(
            run_multiagent_episode(
                make_multiagent(NEGOTIATION, max_rounds=2),
                agent,
                policies,
                "individual",
                Sampling(max_tokens=8, seed=0),
                EpisodeLimits(),
                seed=0,
                group_id="hf",
            )
        )
    finally:
        for policy in policies.values():
            policy.close()
    for agent_id, t in out.items():
        t.validate()
        assert t.error is None and t.policy_id == agent_id and t.turns == 2
        generated = [(lp, v) for lp, v, m in zip(t.logprobs, t.versions, t.loss_mask) if m]
        assert 2 <= len(generated) <= 2 * 9  # at most max_tokens, plus an inserted end-of-turn if cut
        assert all(math.isfinite(lp) and lp <= 0 and v == 0 for lp, v in generated)
        context = [(lp, v) for lp, v, m in zip(t.logprobs, t.versions, t.loss_mask) if not m]
        assert all(lp == 0.0 and v == -1 for lp, v in context)
        assert sum(t.loss_mask[: t.prompt_length]) == 0 and t.loss_mask[t.turn_ends[0]] == 1


def test_readme_example_runs():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Several agents", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    exec(compile(block, "README.md", "exec"), {})
