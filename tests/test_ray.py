"""Env workers and the policy as Ray actors: a local cluster, a killed worker, and two nodes on loopback.

The distributed rollout must give what the local engine gives (same group ids, prompts and, with a
scripted policy, the same tokens), spread its groups over the workers, and account for every episode
when a worker dies. The two-node cluster is started with ``ray start`` in its own temp dir, so it
never takes over another Ray user's default address, and stopped by signalling the processes this
fixture started (``ray stop`` would stop every Ray cluster on the machine).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter, defaultdict
from dataclasses import replace

import httpx
import pytest

ray = pytest.importorskip("ray", reason="the distributed rollout needs ray (pip install -e '.[cpu]')")


import agentrl  # noqa: E402
from agentrl import Message  # noqa: E402
from agentrl.agents import ChatAgent  # noqa: E402
from agentrl.multiagent import MultiAgentRollout, make_multiagent  # noqa: E402
from agentrl.policies import Sampling  # noqa: E402
from agentrl.policies.ray_actor import PolicyActor  # noqa: E402
from agentrl.rollout import (  # noqa: E402
    EpisodeLimits,
    RolloutSettings,
    SingleAgentRollout,
    TrajectoryBuffer,  # noqa: E402
)
from agentrl.rollout.ray import DistributedRollout, _runs, _split  # noqa: E402
from agentrl.run import RolloutConfig, rollout  # noqa: E402
from agentrl.server import ServerThread, make_app  # noqa: E402
from agentrl.testing import ScriptedPolicy, max_logprob_gap, reference_model  # noqa: E402

ENV_ID = "agentrl/Calculator-v0"
NEGOTIATION = "agentrl/Negotiation-v0"
TRADERS = ("trader_0", "trader_1")
REPLY = "Answer: 42"


def local_trajectories(tokenizer, num_groups, **engine_kwargs):
    """The same groups played by the local engine with the scripted policy, by group id."""
    agent = ChatAgent.from_env(tokenizer, agentrl.make(ENV_ID))
    policy = ScriptedPolicy(tokenizer, REPLY)
    engine = SingleAgentRollout(lambda: agentrl.make(ENV_ID), agent, policy, RolloutSettings(ENV_ID, **engine_kwargs))
    by_group = defaultdict(list)
    for t in asyncio.run(engine.collect(num_groups)):
        by_group[t.group_id].append(t)
    return by_group


def same_episode(a, b):
    return (a.token_ids, a.loss_mask, a.logprobs, a.versions, a.reward, a.messages) == (
        b.token_ids,
        b.loss_mask,
        b.logprobs,
        b.versions,
        b.reward,
        b.messages,
    )


def generated_runs(trajectory):
    """The generated tokens of each turn: the maximal runs of loss mask 1."""
    runs, current = [], []
    for token, mask in zip(trajectory.token_ids, trajectory.loss_mask):
        if mask:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


@pytest.fixture(scope="module", autouse=True)
def no_inherited_cluster():
    """Tests here choose their cluster; an address from the environment must not redirect them."""
    saved = os.environ.pop("RAY_ADDRESS", None)
    yield
    if saved is not None:
        os.environ["RAY_ADDRESS"] = saved


# --- without a cluster ------------------------------------------------------------------------------


def test_groups_split_into_contiguous_ranges_and_runs():
    assert _split(10, 7, 3) == [(10, 3), (13, 2), (15, 2)]
    assert _split(0, 1, 2) == [(0, 1), (1, 0)]
    assert _runs([7, 3, 4, 5, 9, 10]) == [(3, 3), (7, 1), (9, 2)]
    assert _runs([]) == []


# --- one local cluster ------------------------------------------------------------------------------


@pytest.fixture(scope="class")
def local_cluster(_session_ray):
    """The session's cluster (tests/conftest.py), which these tests use as a local one."""
    return _session_ray


@pytest.fixture(scope="class")
def hf_policy(local_cluster, tiny_model_dir):
    """The tiny model behind the hf backend, in a policy actor."""
    policy = PolicyActor.remote("hf", str(tiny_model_dir))
    yield policy
    ray.kill(policy)


@pytest.fixture(scope="class")
def scripted_rollout(local_cluster, tiny_model_dir):
    """Two env workers and a scripted policy actor that takes 0.3 s per reply."""
    policy = PolicyActor.remote("scripted", str(tiny_model_dir), {"reply": REPLY, "delay": 0.3})
    controller = DistributedRollout(
        policy,
        tiny_model_dir,
        RolloutSettings(ENV_ID, limits=EpisodeLimits(max_turns=2, max_length=1024), group_size=2, concurrency=2),
        num_workers=2,
    )
    yield controller
    controller.close()
    ray.kill(policy)


@pytest.mark.ray
@pytest.mark.usefixtures("local_cluster")
class TestLocalCluster:
    def test_hf_rollout_on_two_workers_is_token_exact_and_grouped_as_locally(
        self, hf_policy, tiny_model_dir, tiny_tokenizer
    ):
        with DistributedRollout(
            hf_policy,
            tiny_model_dir,
            RolloutSettings(
                ENV_ID,
                sampling=Sampling(max_tokens=16, seed=0),
                limits=EpisodeLimits(max_turns=2, max_length=1024),
                group_size=2,
            ),
            num_workers=2,
        ) as controller:
            trajectories = asyncio.run(controller.collect(num_groups=4))
            workers = list(controller.workers)

        assert len(trajectories) == 8 and all(t.error is None for t in trajectories)
        assert len({w.pid for w in workers}) == 2 and [w.episodes for w in workers] == [4, 4]
        reference = reference_model(tiny_model_dir)
        end = "<|im_end|>"
        checked = 0
        for t in trajectories:
            t.validate()
            replies = [m for m in t.messages if m.role == "assistant"]
            runs = generated_runs(t)
            assert len(runs) == len(replies) == t.turns >= 1
            for run, reply in zip(runs, replies):
                if not reply.tool_calls:  # a reply with calls has them moved out of its text
                    text = tiny_tokenizer.decode(run)
                    assert text == reply.content + end or (len(run) == 16 and text == reply.content)
                    checked += 1
            assert {v for v, m in zip(t.versions, t.loss_mask) if m} == {0}
        assert max_logprob_gap(reference, trajectories) < 1e-4
        assert checked >= 8
        # The same tasks as the local engine: same group ids, and each group's episodes share its prompt.
        local = local_trajectories(tiny_tokenizer, 4, group_size=2, limits=EpisodeLimits(max_turns=2, max_length=1024))
        groups = defaultdict(list)
        for t in trajectories:
            groups[t.group_id].append(t.token_ids[: t.prompt_length])
        assert set(groups) == set(local)
        for group_id, prompts in groups.items():
            reference_prompt = local[group_id][0].token_ids[: local[group_id][0].prompt_length]
            assert len(prompts) == 2 and prompts[0] == prompts[1] == reference_prompt

    def test_env_workers_play_their_episodes_on_an_env_server(self, scripted_rollout, tiny_model_dir):
        # rollout.env_url with ray_address: each worker's episodes are sessions of the one env server.
        with ServerThread(make_app([ENV_ID])) as url:
            settings = replace(scripted_rollout.settings, env_url=url)
            with DistributedRollout(scripted_rollout.policy, tiny_model_dir, settings, num_workers=2) as controller:
                trajectories = asyncio.run(controller.collect(num_groups=2))
            metrics = httpx.get(f"{url}/metrics").text
        assert len(trajectories) == 4 and all(t.error is None and t.turns >= 1 for t in trajectories)
        created = [line for line in metrics.splitlines() if line.startswith("agentrl_server_sessions_created_total")]
        assert created and float(created[0].split()[-1]) >= 4  # every episode (and each worker's probe env)

    def test_multiagent_episodes_play_on_workers_with_one_policy_actor_per_policy(self, tiny_model_dir, tiny_tokenizer):
        # Fractions of a CPU: the class's cluster has 4, and the hf_policy fixture holds one.
        traders = {pid: PolicyActor.options(num_cpus=0.25).remote("hf", str(tiny_model_dir)) for pid in TRADERS}
        limits = EpisodeLimits(max_turns=2, max_length=1024)
        try:
            with DistributedRollout(
                traders,
                tiny_model_dir,
                RolloutSettings(
                    NEGOTIATION,
                    mapping="individual",
                    sampling=Sampling(max_tokens=16, seed=0),
                    limits=limits,
                    group_size=2,
                ),
                num_workers=2,
                num_cpus_per_worker=0.25,
            ) as controller:
                trajectories = asyncio.run(controller.collect(num_groups=2))
                workers = list(controller.workers)
                roster, episodes = controller.roster, controller.episodes
            served = {pid: ray.get(actor.requests.remote()) for pid, actor in traders.items()}
        finally:
            for actor in traders.values():
                ray.kill(actor)

        assert roster == {"trader_0": "trader_0", "trader_1": "trader_1"} and episodes == 4
        assert [w.episodes for w in workers] == [2, 2] and len({w.pid for w in workers}) == 2
        assert len(trajectories) == 8 and all(t.error is None for t in trajectories)
        assert Counter((t.agent_id, t.policy_id) for t in trajectories) == {(a, a): 4 for a in TRADERS}
        assert Counter(t.group_id for t in trajectories) == {
            f"{NEGOTIATION}#0-{g}/{a}": 2 for g in range(2) for a in TRADERS
        }
        # Each agent's tokens came from its own policy's actor, and they are the model's own.
        for pid in TRADERS:
            turns = sum(t.turns for t in trajectories if t.policy_id == pid)
            assert served[pid].received == turns > 0 and served[pid].cancelled == 0
        assert max_logprob_gap(reference_model(tiny_model_dir), trajectories) < 1e-4
        # The same tasks as the local engine's: each agent's prompt in each group.
        local = MultiAgentRollout(
            lambda: make_multiagent(NEGOTIATION),
            ChatAgent(tiny_tokenizer),
            {pid: ScriptedPolicy(tiny_tokenizer, "Claim: 0 books") for pid in TRADERS},
            RolloutSettings(mapping="individual", env_id=NEGOTIATION, limits=limits, group_size=2),
        )
        expected = {t.group_id: t.token_ids[: t.prompt_length] for t in asyncio.run(local.collect(2))}
        assert all(t.token_ids[: t.prompt_length] == expected[t.group_id] for t in trajectories)

    def test_a_timed_out_generation_is_cancelled_on_the_actor_which_serves_on(self, tiny_model_dir):
        # The first generation would take a minute; the episode gives up on it after three seconds.
        slow_first = {"reply": REPLY, "delay": [60.0]}
        policy = PolicyActor.options(num_cpus=0.25).remote("scripted", str(tiny_model_dir), slow_first)
        try:
            # The turn limit must run out on the generation, not on the actor's start-up (slow on a
            # loaded machine): wait until the actor answers.
            assert ray.get(policy.requests.remote(), timeout=120) == (0, 0, 0)
            with DistributedRollout(
                policy,
                tiny_model_dir,
                RolloutSettings(
                    ENV_ID, limits=EpisodeLimits(max_turns=1, max_length=1024, turn_timeout=3.0), episode_retries=0
                ),
                num_workers=1,
                num_cpus_per_worker=0.25,
            ) as controller:
                started = time.monotonic()
                (timed_out,) = asyncio.run(controller.collect(num_groups=1))
                assert time.monotonic() - started < 30
                deadline = time.monotonic() + 20
                while (requests := ray.get(policy.requests.remote())).cancelled < 1 and time.monotonic() < deadline:
                    time.sleep(0.1)
                (served,) = asyncio.run(controller.collect(num_groups=1))
            after = ray.get(policy.requests.remote())
        finally:
            ray.kill(policy)
        assert timed_out.error.startswith("EpisodeTimeout: the generate (turn 0) ran past its limit of 3.0 s")
        assert requests == (1, 1, 0)  # received, cancelled, in flight: the actor stopped generating
        assert served.error is None and Message("assistant", REPLY) in served.messages
        assert after == (2, 1, 0)

    def test_killed_workers_are_replaced_and_every_episode_is_accounted_for(self, scripted_rollout, tiny_tokenizer):
        controller = scripted_rollout
        assert controller.next_group == 0, "this test compares with a local engine's first 16 groups: run it first"
        first_two = list(controller.workers)

        async def play():
            trajectories, killed = [], False
            async for t in controller.stream(num_groups=16):
                trajectories.append(t)
                if not killed and all(w.episodes >= 2 for w in first_two):
                    ray.kill(first_two[0].handle)  # as an operator would
                    os.kill(first_two[1].pid, signal.SIGKILL)  # as the OOM killer would
                    killed = True
            return trajectories

        trajectories = asyncio.run(play())
        assert len(trajectories) == 32 and controller.stats.episodes == 32
        counts = Counter(t.group_id for t in trajectories)
        assert sorted(counts) == sorted(f"{ENV_ID}#0-{g}" for g in range(16)) and set(counts.values()) == {2}
        failed = [t for t in trajectories if t.error is not None]
        # Only a group caught half done fails its missing episode: with 2 episodes in flight per
        # worker, at most 2 such groups per killed worker.
        assert len(failed) <= 4 and all(t.error.startswith("WorkerDied: ") for t in failed)
        assert controller.stats.failed == len(failed) and controller.stats.failure_causes["WorkerDied"] == len(failed)
        assert all(w.died for w in first_two) and sorted(w.slot for w in controller.retired) == [0, 1]
        replacements = controller.workers
        assert all(w.died is None and w.episodes > 0 for w in replacements) and len(replacements) == 2
        # The replacements played the untouched groups as the local engine would have: every
        # episode that did not fail is the local one.
        local = local_trajectories(tiny_tokenizer, 16, group_size=2, limits=EpisodeLimits(max_turns=2, max_length=1024))
        assert all(same_episode(t, local[t.group_id][0]) for t in trajectories if t.error is None)

    def test_without_replacements_lost_groups_fail_as_worker_died(self, scripted_rollout):
        controller = scripted_rollout
        controller.max_replacements = 0
        buffer = TrajectoryBuffer(group_size=2)
        victim = controller.workers[0]
        delivered_before = victim.episodes
        first = controller.next_group  # the module's controller has played other tests' groups

        async def play():
            trajectories = []
            async for t in controller.stream(num_groups=8, buffer=buffer):
                trajectories.append(t)
                if victim.died is None and victim.episodes - delivered_before == 1:
                    ray.kill(victim.handle)
            return trajectories

        trajectories = asyncio.run(play())
        # The numbering continues after the previous calls' groups, as a local engine's does.
        counts = Counter(t.group_id for t in trajectories)
        assert sorted(counts.items()) == sorted((f"{ENV_ID}#0-{g}", 2) for g in range(first, first + 8))
        failed = [t for t in trajectories if t.error is not None]
        # The first four groups were the victim's, and nothing may be played again: every episode
        # of them that it did not deliver is a WorkerDied failure.
        assert len(failed) == 8 - (victim.episodes - delivered_before) >= 2
        assert all(t.error.startswith("WorkerDied: ") for t in failed)
        assert {t.group_id for t in failed} <= {f"{ENV_ID}#0-{g}" for g in range(first, first + 4)}
        assert buffer.stats.failed == len(failed)
        assert buffer.stats.released_groups + buffer.stats.incomplete_groups == 8
        assert [len(g) for g in buffer.get_nowait(8)] == [2] * buffer.stats.released_groups
        controller.max_replacements = 2

    def test_agentrl_rollout_with_ray_address_plays_in_actors(
        self, hf_policy, tiny_model_dir, tiny_tokenizer, tmp_path
    ):
        config = RolloutConfig(
            env_id=ENV_ID,
            model=str(tiny_model_dir),
            backend="hf",
            episodes=4,
            group_size=2,
            max_turns=2,
            max_length=1024,
            max_tokens=16,
            ray_address=ray.get_runtime_context().gcs_address,
            out=str(tmp_path / "rollout.jsonl"),
        )
        seen = []
        trajectories, stats = rollout(config, hf_policy, on_episode=lambda episode, s: seen.append(s.episodes))
        assert len(trajectories) == 4 and stats.episodes == 4 and seen == [1, 2, 3, 4]
        assert all(t.error is None and t.group_id.startswith(ENV_ID) for t in trajectories)
        assert len((tmp_path / "rollout.jsonl").read_text().splitlines()) == 4
        # The caller's connection and policy actor are the caller's to end.
        assert ray.is_initialized() and ray.get(hf_policy.version.remote()) == 0
        with pytest.raises(ValueError, match="lives in this process"):
            rollout(config, ScriptedPolicy(tiny_tokenizer, REPLY))


# --- two nodes on loopback --------------------------------------------------------------------------


@pytest.fixture
def two_nodes(ray_cluster):
    """The session's cluster: a head node and a second node (with resource ``node_b``) on loopback."""
    return ray_cluster


@pytest.mark.ray
class TestTwoNodes:
    def test_workers_placed_on_both_nodes_play_every_group(self, two_nodes, tiny_model_dir):
        _, nodes = two_nodes
        policy = PolicyActor.remote("scripted", str(tiny_model_dir), {"reply": REPLY})
        try:
            with DistributedRollout(
                policy,
                tiny_model_dir,
                RolloutSettings(ENV_ID, group_size=2, concurrency=4),
                nodes=[nodes["head"], nodes["b"]],
            ) as controller:
                trajectories = asyncio.run(controller.collect(num_groups=6))
                workers = list(controller.workers)
                policy_node = ray.get(policy.location.remote()).node_id
        finally:
            ray.kill(policy)
        assert [w.node_id for w in workers] == [nodes["head"], nodes["b"]]
        assert [w.episodes for w in workers] == [6, 6] and policy_node in nodes.values()
        assert len(trajectories) == 12 and all(t.error is None and t.reward == 0.0 for t in trajectories)
        assert set(Counter(t.group_id for t in trajectories).values()) == {2}
