"""GEM's text envs as agentrl envs (envs/gem.py), with gem-llm 0.1 itself, offline."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import agentrl
from agentrl.cli import app
from agentrl.config import load_config
from agentrl.metrics import read_metrics
from agentrl.train import TrainConfig, train

pytest.importorskip("gem", reason="gem-llm is an optional extra (pip install 'agentrl-platform[gem]')")
from agentrl.envs.gem import BROKEN, NEEDS_NETWORK, GemUnavailable, agentrl_id, game_ids  # noqa: E402

# Sokoban's random and hard levels take 30-75 s to make and reset a few times: left to a hand run of
# `agentrl check gem/game.Sokoban-v0-hard`; Sokoban-v0-easy is checked here.
SLOW = {"game:Sokoban-v0-random", "game:Sokoban-v0-hard"}


def offline_ids() -> list[str]:
    return [
        i
        for i in game_ids()
        if i not in BROKEN and i not in SLOW and not any(i.startswith(prefix) for prefix in NEEDS_NETWORK)
    ]


def test_every_offline_gem_env_passes_check_env():
    ids = offline_ids()
    assert len(ids) == 126  # gem-llm 0.1.0: 172 ids, 40 need the network, 4 are broken, 2 are slow (above)
    failures = {}
    for gem_id in ids:
        env = agentrl.make(agentrl_id(gem_id))
        try:
            agentrl.check_env(env, episodes=1, max_steps=4)
        except Exception as e:  # noqa: BLE001 - every id is reported, not only the first
            failures[gem_id] = f"{type(e).__name__}: {e}"
        finally:
            env.close()
    assert not failures, failures


def test_guess_the_number_is_played_to_a_win():
    env = agentrl.make("gem/game.GuessTheNumber-v0-easy", system_prompt="Play.")
    observation, _ = env.reset(seed=0)
    assert [m.role for m in observation] == ["system", "user"]
    assert "Guess The Number" in observation[1].content and observation[1].content.endswith("Enter your next guess.")
    low, high = 1, 10
    for _ in range(4):
        guess = (low + high) // 2
        step = env.step(f"My guess: \\boxed{{{guess}}}")
        text = step.observation[0].content if step.observation else ""
        if step.terminated:
            break
        assert step.reward == 0.0 and f"you guessed {guess}" in text
        low, high = (guess + 1, high) if "higher" in text else (low, guess - 1)
    assert step.terminated and step.reward == 1.0 and step.info["success"] is True
    assert step.info["gem"]  # GEM's own info, as it gave it


def test_a_reply_gem_cannot_read_ends_the_game():
    env = agentrl.make("gem/game.GuessTheNumber-v0-easy")
    env.reset(seed=0)
    step = env.step("five")
    assert (step.reward, step.terminated, step.info["success"]) == (-0.1, True, False)


def test_a_single_turn_task_is_scored_on_its_one_reply():
    env = agentrl.make("gem/rg.basic_arithmetic")
    (question,) = env.reset(seed=1).observation
    assert question.role == "user" and "Calculate" in question.content
    answer = env.unwrapped.game.data["answer"]  # reasoning-gym's item for this seed
    step = env.step("\\boxed{not a number}")
    assert (step.terminated, step.observation, step.reward, step.info["success"]) == (True, [], 0.0, False)
    assert env.reset(seed=1).observation[0].content == question.content
    step = env.step(f"\\boxed{{{answer}}}")
    assert step.reward == 1.0 and step.info["success"] is True


def test_seeds_replay_and_gems_global_seeding_stays_inside_the_env():
    env = agentrl.make("gem/game.Minesweeper-v0-easy")
    random.seed(123)
    expected = [random.random() for _ in range(3)]
    random.seed(123)
    first = env.reset(seed=7).observation[-1].content
    env.step("\\boxed{reveal 1 1}")
    assert [random.random() for _ in range(3)] == expected  # GEM's reset(seed) reseeded only the env's own stream
    assert env.reset(seed=7).observation[-1].content == first
    assert any(env.reset(seed=s).observation[-1].content != first for s in range(8, 12))


def test_what_cannot_run_offline_is_refused_saying_why():
    with pytest.raises(GemUnavailable, match="reads a Hugging Face dataset at make"):
        agentrl.make("gem/math.GSM8K")
    with pytest.raises(GemUnavailable, match="NLTK's word list"):
        agentrl.make("gem/game.Wordle-v0-easy")
    with pytest.raises(GemUnavailable, match="boxnet scorer raises"):
        agentrl.make("gem/rg.boxnet")
    from agentrl.envs.gem import GemEnv

    with pytest.raises(ValueError, match="GEM has no env 'rg:basic_arithmetc'. Did you mean 'rg:basic_arithmetic'"):
        GemEnv("rg:basic_arithmetc")


def test_a_dataset_env_plays_offline_with_rows_given():
    datasets = pytest.importorskip("datasets")
    rows = datasets.Dataset.from_list([{"problem": "What is 6 times 7?", "answer": "42"}])
    env = agentrl.make("gem/math.GSM8K", dataset=rows, use_mp=False)
    assert "6 times 7" in env.reset(seed=0).observation[0].content
    assert env.step("The answer is \\boxed{42}.").reward == 1.0
    env.reset(seed=0)
    assert env.step("\\boxed{41}").reward == 0.0
    env.close()


def test_gem_is_listed_on_request_and_not_imported_by_agentrl():
    code = "import sys, agentrl; print('gem' in sys.modules or 'reasoning_gym' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )
    runner = CliRunner()
    everything = runner.invoke(app, ["envs"], env={"COLUMNS": "200"})
    assert f"gem/: {len(game_ids())} more envs: agentrl envs -n gem" in everything.output
    assert "gem/rg.basic_arithmetic" not in everything.output
    listed = runner.invoke(app, ["envs", "-n", "gem"], env={"COLUMNS": "200"})
    assert "gem/rg.basic_arithmetic" in listed.output and "gem/game.Sudoku-v0-easy" in listed.output


def test_a_policy_trains_on_a_gem_env(tiny_model_dir, tmp_path):
    config = load_config(
        TrainConfig,
        None,
        [
            "rollout.env_id=gem/game.GuessTheNumber-v0-easy",
            f"rollout.model={tiny_model_dir}",
            "rollout.backend=hf",
            "rollout.group_size=2",
            "rollout.max_tokens=8",
            "rollout.max_length=1024",
            "rollout.max_turns=2",
            "trainer.micro_batch_size=4",
            "groups_per_step=2",
            "steps=2",
            "eval_episodes=4",
            "checkpoint_every=0",
            "export=false",
            "torch_threads=1",
            f"run_dir={tmp_path / 'run'}",
        ],
    )
    result = train(config)
    versions = [m["train/policy_version"] for m in read_metrics(result.run_dir) if "train/policy_version" in m]
    assert versions == [1.0, 2.0]
