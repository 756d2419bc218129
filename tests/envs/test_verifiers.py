"""verifiers v1 envs played and trained by agentrl (envs/verifiers.py), offline, with verifiers 0.4 itself.

The env under test is ``verifiers_duo`` (beside this file: a taskset and a two-seat ``Env`` on
verifiers' public API) and verifiers' own bundled ``user-sim`` env over that taskset.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import agentrl
from agentrl.checker import check_multiagent_env
from agentrl.config import load_config
from agentrl.dashboard import read_trajectories, sample_files
from agentrl.metrics import read_metrics
from agentrl.train import TrainConfig, train

pytest.importorskip("verifiers.v1", reason="verifiers is an optional extra (pip install 'agentrl-platform[verifiers]')")
from agentrl.envs.verifiers import VerifiersEnv, VerifiersEpisodeError  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def plugins_on_the_path(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))  # verifiers imports a taskset by its module name


def play(env, replies, seed):
    """Play one episode, each seat answering ``replies[seat](observation)``: the observations each
    seat saw, in order, and each seat's final reward and info."""
    env.reset(seed=seed)
    seen, rewards, infos = [], {}, {}
    for agent in env.agent_iter(max_iter=50):
        observation, reward, terminated, truncated, info = env.last()
        if terminated or truncated:
            rewards[agent], infos[agent] = reward, info
            env.step(None)
            continue
        seen.append((agent, [(m.role, m.content) for m in observation]))
        env.step(replies[agent](observation))
    return seen, rewards, infos


def test_a_two_seat_env_is_played_seat_by_seat_and_paid_at_the_end():
    env = agentrl.make_multiagent("verifiers/Env-v0", taskset="verifiers_duo")
    assert env.possible_agents == ["solver", "critic"]
    seen, rewards, infos = play(env, {"solver": lambda o: "4", "critic": lambda o: "Looks right."}, seed=0)
    assert seen == [
        ("solver", [("system", "Answer with a number."), ("user", "2+2?")]),
        ("critic", [("system", "You critique answers."), ("user", "Critique this answer: 4")]),
        ("solver", [("user", "Looks right.")]),  # only what is new since its last reply
    ]
    assert rewards == pytest.approx({"solver": 1.1, "critic": 1.0})  # exact + 0.1 brief; solver_right
    solver, critic = infos["solver"]["verifiers"], infos["critic"]["verifiers"]
    assert solver["rewards"] == {"exact": 1.0, "brief": 0.1} and solver["trainable"] is True and solver["turns"] == 2
    assert critic["rewards"] == {"solver_right": 1.0} and critic["trainable"] is False
    assert infos["solver"]["success"] and not infos["critic"]["verifiers"]["metrics"]
    # The seed picks the task: seed 1 is 3+3, where "4" is wrong; seed 4 is 2+2 again.
    _, rewards, _ = play(env, {"solver": lambda o: "4", "critic": lambda o: "No."}, seed=1)
    assert rewards == pytest.approx({"solver": 0.1, "critic": 0.0})
    assert play(env, {"solver": lambda o: "4", "critic": lambda o: "No."}, seed=4)[0][0][1][1] == ("user", "2+2?")
    env.close()


def test_it_passes_pettingzoos_api_test_and_our_checker():
    check_multiagent_env(lambda: VerifiersEnv(taskset="verifiers_duo"))


def test_verifiers_own_user_sim_env_plays_with_its_user_seat_untrainable():
    env = VerifiersEnv(taskset="verifiers_duo", env="user-sim", config={"user": {"max_turns": 4}})
    assert env.possible_agents == ["assistant", "user"]

    def user(observation):
        asked = any(m.role == "user" and "How can I help" in m.content for m in observation)
        return "What is 2+2? Reply with the number." if asked else "###DONE###"

    seen, rewards, infos = play(env, {"assistant": lambda o: "4", "user": user}, seed=0)
    assert [agent for agent, _ in seen] == ["user", "assistant", "user"]
    assert "2+2?" in seen[0][1][0][1]  # the scenario is in the user's system prompt
    assert rewards["assistant"] == pytest.approx(1.1)
    assert infos["user"]["verifiers"]["trainable"] is False and infos["assistant"]["verifiers"]["trainable"]
    env.close()


def test_errors_are_said():
    with pytest.raises(ValueError, match="plays a verifiers taskset: make it with taskset=MODULE"):
        VerifiersEnv()
    with pytest.raises(ModuleNotFoundError, match="taskset 'no_such_taskset' not found"):
        VerifiersEnv(taskset="no_such_taskset")
    env = VerifiersEnv(taskset="verifiers_duo", reply_timeout=5)
    env.reset(seed=0)
    env.close()  # mid-episode: the episode is cancelled and its waiting request failed, not left hanging
    code = "import sys; sys.modules['verifiers'] = None; from agentrl.envs.verifiers import VerifiersEnv; VerifiersEnv(taskset='x')"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "pip install 'agentrl-platform[verifiers]'" in run.stderr
    light = "import sys, agentrl; print('verifiers/Env-v0' in agentrl.multiagent_ids(), 'verifiers' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", light], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["True", "False"]  # listed without importing verifiers (about 9 s)


def test_a_failed_episode_raises_with_the_envs_errors():
    env = VerifiersEnv(taskset="verifiers_duo", env="user-sim", config={"user": {"max_turns": 4}})
    env.reset(seed=0)
    env.unwrapped._bridge.env.config.persona = None  # the env's run() fails on its first line
    with pytest.raises(VerifiersEpisodeError, match="The verifiers episode failed"):
        env.reset(seed=0)
        for _ in env.agent_iter(max_iter=10):
            env.step("x")
    env.close()


def test_its_trainable_seat_trains_and_its_untrainable_seat_plays_frozen(tiny_model_dir, tmp_path, monkeypatch):
    config = load_config(
        TrainConfig,
        None,
        [
            "rollout.env_id=verifiers/Env-v0",
            'rollout.env_kwargs={"taskset": "verifiers_duo"}',
            f"rollout.model={tiny_model_dir}",
            "rollout.backend=hf",
            "rollout.group_size=2",
            "rollout.max_tokens=4",
            "rollout.max_length=1024",
            "trainer.micro_batch_size=4",
            "mapping=individual",
            'policies={"solver": {"weights": "full"}, "critic": {"weights": "full", "trainable": false}}',
            "groups_per_step=2",
            "steps=2",
            "eval_episodes=0",
            "checkpoint_every=0",
            "export=false",
            "torch_threads=1",
            f"run_dir={tmp_path / 'run'}",
        ],
    )
    result = train(config)

    assert sorted(result.policies) == ["critic", "solver"]
    steps = [m for m in read_metrics(result.run_dir) if "train/solver/policy_version" in m]
    assert [m["train/solver/policy_version"] for m in steps] == [1.0, 2.0]
    assert not any("train/critic/policy_version" in m for m in read_metrics(result.run_dir))
    kinds = {kind for kind, _, _ in sample_files(result.run_dir)}
    assert kinds == {"train.solver"}
    for _, _, path in sample_files(result.run_dir):
        assert {record["agent_id"] for record in read_trajectories(path)} == {"solver"}
