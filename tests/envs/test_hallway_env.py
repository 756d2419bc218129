"""Hallway-v0: move parsing, walls, the exit, the move limit, state keys and the split."""

import pytest

import agentrl
from agentrl.envs._split import split_of
from agentrl.envs.hallway import HallwayEnv, parse_move


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("left", -1),
        ("Move: right", 1),
        ("**Right**.", 1),
        ("Move: right\nNo, wait.\nMove: left", -1),
        ("Not right: left", -1),
    ],
)
def test_parse_move(text: str, expected: int) -> None:
    assert parse_move(text) == expected


@pytest.mark.parametrize("text", ["up", "Move: up", "leftwards or rightmost", "", "alright"])
def test_parse_move_explains_bad_replies(text: str) -> None:
    with pytest.raises(ValueError, match="could not find 'left' or 'right'"):
        parse_move(text)


def walk(env: HallwayEnv) -> list:
    """Always step toward the exit, reading only the messages; the step results."""
    results = []
    while True:
        text = env.messages[-1].content
        room = int(text.split("You are in room ")[1].split(".")[0])
        exit_room = int(text.split("The exit is in room ")[1].split(".")[0])
        result = env.step("right" if exit_room > room else "Move: left")
        results.append(result)
        if result.terminated or result.truncated:
            return results


def test_walking_toward_the_exit_wins_in_the_distance_of_moves() -> None:
    env = HallwayEnv()
    for seed in range(30):
        env.reset(seed=seed)
        distance = abs(env.exit - env.room)
        assert 1 <= distance <= 6 and 1 <= env.room <= env.rooms and 6 <= env.rooms <= 40
        results = walk(env)
        assert len(results) == distance
        assert (results[-1].reward, results[-1].info["success"], results[-1].info["moves"]) == (1.0, True, distance)
        keys = [r.info["state_key"] for r in results]
        assert keys[-1] == f"room {env.exit}" and len(set(keys)) == distance


def test_walls_invalid_replies_and_the_move_limit() -> None:
    env = HallwayEnv(max_turns=4)
    env.reset(seed=0)
    env.room, env.exit = 1, 3  # at the left wall
    wall = env.step("left")
    assert "There is a wall that way. You are in room 1." in wall.observation[0].content
    assert wall.info["state_key"] == "room 1" and not wall.terminated
    bad = env.step("I will go up.")
    assert "could not find" in bad.observation[0].content and bad.info["state_key"] == "room 1"
    assert env.step("Move: right").info["state_key"] == "room 2"
    last = env.step("Move: left")  # back to room 1 on the fourth and last move
    assert last.terminated and last.reward == 0.0
    assert (last.info["success"], last.info["moves"]) == (False, 4)
    assert "out of moves" in last.observation[0].content


def test_splits_are_disjoint_and_registered() -> None:
    for split in ("train", "test"):
        env = agentrl.make("agentrl/Hallway-v0", split=split)
        keys = set()
        for seed in range(40):
            env.reset(seed=seed)
            keys.add(f"hallway:{env.rooms}:{env.room}->{env.exit}")
        assert {split_of(k) for k in keys} == {split}
        assert len(keys) > 10  # many hallways, not a handful


def test_passes_the_env_checker() -> None:
    from agentrl.checker import check_env

    check_env(agentrl.make("agentrl/Hallway-v0"))
