"""TextArena's games as agentrl multi-agent envs (envs/textarena.py), on textarena itself.

Every two-player game that runs offline passes PettingZoo's ``api_test`` and ``seed_test`` and our
checker; a game played move by move pays, counts and shows what TextArena says; seeds replay a game
whatever else runs beside it; the games that cannot run offline are refused saying why; two policies
train on one game, each on its own seat only.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import agentrl
from agentrl.checker import EnvCheckError
from agentrl.cli import app
from agentrl.config import load_config
from agentrl.dashboard import read_trajectories, sample_files
from agentrl.envs.textarena import GameStuck, GameUnavailable, TextArenaEnv, game_ids, game_metrics
from agentrl.faults import RunStalled
from agentrl.metrics import read_metrics
from agentrl.train import TrainConfig, train
from agentrl.types import Trajectory


def _two_player_games() -> list[str]:
    """The ids ``textarena/`` makes that run here with two players (the default of every game
    that allows two)."""
    playable = []
    for game in game_ids():
        try:
            env = TextArenaEnv(game)
        except (GameUnavailable, ValueError):
            continue
        if env.num_players == 2:
            playable.append(game)
    return playable


TWO_PLAYER = _two_player_games()


def test_the_offline_two_player_games_are_most_of_textarenas_two_player_games():
    # textarena 0.7.4 on Python 3.11: 110 of its ids run offline with two players; the rest of its
    # two-player games need OpenRouter, an NLTK download or Python 3.12 (refused below).
    assert len(TWO_PLAYER) >= 100
    assert {"TicTacToe-v0", "KuhnPoker-v0", "ConnectFour-v0", "Nim-v0", "SimpleNegotiation-v0"} <= set(TWO_PLAYER)


STUCK = {"PublicGoodsGame-v0", "MarketEntryGame-v0"}
"""Games whose state, under the checker's random replies, eliminates both players without ending
(TextArena 0.7.4's FFAMultiPlayerState.step would then loop forever): GameStuck fails the episode."""


@pytest.mark.parametrize("game", TWO_PLAYER)
def test_every_offline_two_player_game_passes_pettingzoos_api_test_and_our_checker(game):
    # max_moves: TextArena's Poker deals on forever to a player with no chips who keeps replying
    # with invalid moves, as the checker's random replies do (test_a_game_that_runs_on_...).
    make = lambda: agentrl.make_multiagent(f"textarena/{game}", max_moves=150)  # noqa: E731
    if game in STUCK:
        with pytest.raises((GameStuck, EnvCheckError), match="eliminated every player without ending"):
            agentrl.check_multiagent_env(make, seed=0, cycles=100)
        return
    agentrl.check_multiagent_env(make, seed=0, cycles=100)


def test_a_game_that_runs_on_without_end_is_cut_at_max_moves():
    env = agentrl.make_multiagent("textarena/Poker-v0-small", max_moves=40)
    env.reset(seed=1)
    moves = 0
    while not any(env.truncations.values()):
        env.step("I raise the stakes")  # no poker action: refused, then folded for, hand after hand
        moves += 1
    assert moves == 40 and not any(env.terminations.values())
    assert env.rewards == {"player_0": 0.0, "player_1": 0.0}
    info = env.infos["player_0"]["textarena"]
    assert info["outcome"] == "unfinished" and info["reason"] == "cut after 40 moves (max_moves)"
    assert not env.infos["player_0"]["success"]


def test_a_game_stuck_by_textarenas_bug_fails_the_episode_instead_of_hanging():
    env = agentrl.make_multiagent("textarena/PublicGoodsGame-v0")
    env.reset(seed=1)  # random replies get both players eliminated in the 55th move
    with pytest.raises(GameStuck, match="eliminated every player"):
        for _ in range(100):
            env.step(env.action_space(env.agent_selection).sample())


def _play(env: TextArenaEnv, moves: list[str]) -> None:
    for move in moves:
        env.step(move)


def test_a_game_of_tic_tac_toe_pays_the_winner_and_counts_each_players_moves():
    env = agentrl.make_multiagent("textarena/TicTacToe-v0", system_prompt="Reply with your move only.")
    env.reset(seed=3)
    assert env.possible_agents == ["player_0", "player_1"] and env.agent_selection == "player_0"
    first = env.observe("player_0")
    assert [m.role for m in first] == ["system", "user"]
    assert first[0].content == "Reply with your move only."
    assert "You are Player 0 in Tic Tac Toe" in first[1].content and "[GAME]" in first[1].content

    env.step("[4]")  # player 0 takes the centre
    seen = env.observe("player_1")[-1].content
    assert "[Player 0] [4]" in seen and "placed their symbol" in seen
    assert env.observe("player_0") == []  # handed over: player 0 saw its messages

    env.step("I pick the middle square")  # no [n]: ActionFormattingWrapper brackets it, still no cell
    assert env.agent_selection == "player_1"  # TextArena allows one invalid move per turn
    assert "invalid move" in env.observe("player_1")[-1].content
    assert "[Player 1] I pick" not in env.observe("player_1")[-1].content  # its own move is not echoed
    _play(env, ["[0]", "[3]", "[1]", "[5]"])  # player 0: 4, 3, 5 -> the middle row

    assert all(env.terminations.values())
    assert env.rewards == {"player_0": 1.0, "player_1": -1.0}
    assert env.infos["player_0"]["success"] and not env.infos["player_1"]["success"]
    assert env.infos["player_0"]["textarena"] == {
        "game": "TicTacToe-v0",
        "reward": 1.0,
        "outcome": "win",
        "moves": 3,
        "invalid_moves": 0,
        "lost_by_invalid_move": False,
        "reason": "Player 0 has won!",
    }
    assert env.infos["player_1"]["textarena"]["moves"] == 3
    assert env.infos["player_1"]["textarena"]["invalid_moves"] == 1
    assert "has won" in env.observe("player_1")[-1].content  # each player is told the result
    json.dumps(env.infos)
    for _ in list(env.agents):  # PettingZoo's dead steps
        env.step(None)
    assert env.agents == []


def test_a_second_invalid_move_loses_the_game_and_is_counted():
    env = agentrl.make_multiagent("textarena/TicTacToe-v0")
    env.reset(seed=0)
    _play(env, ["pass", "pass"])

    assert env.rewards == {"player_0": -1.0, "player_1": 1.0}
    info = env.infos["player_0"]["textarena"]
    assert info["invalid_moves"] == 2 and info["lost_by_invalid_move"] and info["outcome"] == "loss"
    assert info["moves"] == 2 and env.infos["player_1"]["textarena"]["moves"] == 0


def test_game_metrics_report_outcomes_and_invalid_moves_of_the_games_played():
    games = []
    for moves in (["[4]", "[0]", "[3]", "[1]", "[5]"], ["pass", "pass"]):  # player 0 wins, then loses by invalid moves
        env = agentrl.make_multiagent("textarena/TicTacToe-v0")
        env.reset(seed=0)
        _play(env, moves)
        games += [Trajectory(agent_id=a, policy_id=a, info=env.infos[a]) for a in env.possible_agents]
    player_0 = [t for t in games if t.agent_id == "player_0"]

    report = game_metrics("player_0", [*player_0, Trajectory(info={"success": False})], [])

    assert report == {"win": 0.5, "draw": 0.0, "loss": 0.5, "invalid_move_rate": 2 / 5, "lost_by_invalid_move": 0.5}
    assert game_metrics("player_0", [Trajectory()], []) == {}  # no game ended (a failed episode)


def _kuhn_transcript(env: TextArenaEnv, seed: int) -> list[str]:
    env.reset(seed=seed)
    return [m.content for agent in env.possible_agents for m in env.observe(agent)]


def test_a_seed_replays_the_same_deal_whatever_else_draws_from_random_meanwhile():
    a, b = (agentrl.make_multiagent("textarena/KuhnPoker-v0") for _ in range(2))
    alone = [_kuhn_transcript(a, seed) for seed in range(6)]
    interleaved = []
    for seed in range(6):
        random.seed(1234 + seed)  # someone else's use of the global stream
        interleaved.append(_kuhn_transcript(b, seed))
        _kuhn_transcript(a, seed + 100)  # another env dealing in between
    assert interleaved == alone
    assert len(set(map(tuple, alone))) > 1  # the seeds deal different cards
    state = random.getstate()
    _kuhn_transcript(a, 0)
    assert random.getstate() == state  # the game's draws do not move the process's own stream


@pytest.mark.parametrize(
    ("game", "reason"),
    [
        ("Debate-v0", "paid model on OpenRouter"),
        ("Wordle-v0", "NLTK corpora"),
        ("DontSayIt-v0", "NLTK corpora"),  # its module would call nltk.download on import
        ("ScorableGames-v0", "lacks its data"),
    ],
)
def test_games_that_cannot_run_offline_are_refused_with_the_reason(game, reason):
    with pytest.raises(GameUnavailable, match=reason):
        agentrl.make_multiagent(f"textarena/{game}")


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="these games import on Python 3.12")
def test_games_written_for_a_newer_python_are_refused_saying_so():
    with pytest.raises(GameUnavailable, match="needs a newer Python"):
        agentrl.make_multiagent("textarena/Chess-v0")


def test_an_unknown_game_names_the_closest_ones():
    with pytest.raises(ValueError, match="TicTacToe-v0"):
        TextArenaEnv("TicTacToo-v0")
    with pytest.raises(agentrl.registry.UnknownEnvError, match="textarena/TicTacToe-v0"):
        agentrl.make_multiagent("textarena/TicTacToo-v0")


def test_the_games_are_listed_with_their_players_and_textarena_is_not_imported_by_agentrl():
    ids = agentrl.multiagent_ids("textarena")
    assert "textarena/TicTacToe-v0" in ids and "textarena/TicTacToe-v0-train" not in ids
    assert agentrl.make_multiagent("textarena/Taboo-v0").possible_agents == [f"player_{i}" for i in range(4)]
    assert agentrl.make_multiagent("textarena/Sudoku-v0").possible_agents == ["player_0"]
    code = "import sys, agentrl; agentrl.make('agentrl/Calculator-v0'); print('textarena' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_agentrl_envs_lists_the_games_when_asked_for_their_namespace():
    runner = CliRunner()
    everything = runner.invoke(app, ["envs"])
    assert everything.exit_code == 0, everything.output
    assert "agentrl/Waltz-v0" in everything.output and "textarena/TicTacToe-v0" not in everything.output
    assert f"textarena/: {len(game_ids())} more multi-agent envs: agentrl envs -n textarena" in everything.output

    games = runner.invoke(app, ["envs", "-n", "textarena"])
    assert games.exit_code == 0, games.output
    lines = games.output.splitlines()
    row = next(i for i, line in enumerate(lines) if "textarena/TicTacToe-v0 " in line)
    assert "player_0," in lines[row] and "player_1" in lines[row] + lines[row + 1]  # the column may wrap
    assert "Generated puzzle" not in games.output  # what games print as they are made is not shown
    chess = next(line for line in lines if "textarena/Chess-v0 " in line)
    assert "could not" in chess or sys.version_info >= (3, 12)  # load: GameUnavailable ... (wrapped)


def test_two_policies_train_against_each_other_each_on_its_own_seat(tiny_model_dir, tmp_path):
    config = load_config(
        TrainConfig,
        None,
        [
            # Both players move in every round of the Prisoner's Dilemma (in TicTacToe a random
            # first player loses by invalid moves before the second ever moves).
            "rollout.env_id=textarena/IteratedPrisonersDilemma-v0",
            'rollout.env_kwargs={"num_rounds": 2}',
            f"rollout.model={tiny_model_dir}",
            "rollout.backend=hf",
            "rollout.group_size=2",
            "rollout.max_tokens=4",
            "rollout.max_length=1024",
            "rollout.max_turns=12",
            "trainer.micro_batch_size=4",
            "mapping=individual",
            'policies={"player_0": {"weights": "full"}, "player_1": {"weights": "full"}}',
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

    assert result.policies == ["player_0", "player_1"]
    for policy in result.policies:
        steps = [m for m in read_metrics(result.run_dir) if f"train/{policy}/policy_version" in m]
        assert [m[f"train/{policy}/policy_version"] for m in steps] == [1.0, 2.0]
    seen = set()
    for kind, _, path in sample_files(result.run_dir):
        policy = kind.removeprefix("train.")
        for record in read_trajectories(path):
            assert record["policy_id"] == policy and record["agent_id"] == policy  # its own seat only
            seen.add(policy)
    assert seen == {"player_0", "player_1"}


def test_a_seat_that_never_moves_stops_the_run_saying_so(tiny_model_dir, tmp_path):
    # The tiny model writes no legal TicTacToe move: player 0 loses by two invalid moves in every
    # game, player 1 never moves, and player 1's trainer would wait for a batch for ever.
    config = load_config(
        TrainConfig,
        None,
        [
            "rollout.env_id=textarena/TicTacToe-v0",
            f"rollout.model={tiny_model_dir}",
            "rollout.backend=hf",
            "rollout.group_size=2",
            "rollout.max_tokens=4",
            "rollout.max_length=1024",
            "trainer.micro_batch_size=4",
            "mapping=individual",
            'policies={"player_0": {"weights": "full"}, "player_1": {"weights": "full"}}',
            "groups_per_step=2",
            "steps=1",
            "eval_episodes=0",
            "checkpoint_every=0",
            "export=false",
            "torch_threads=1",
            f"run_dir={tmp_path / 'run'}",
        ],
    )
    with pytest.raises(RunStalled, match="policy player_1 got no sample from the last 32 groups in a row"):
        train(config)


def test_the_textarena_example_config_loads(tmp_path):
    config = load_config(TrainConfig, Path(__file__).parents[2] / "examples" / "textarena.yaml", [])
    assert config.rollout.env_id.startswith("textarena/")
