"""CodeBreaker-v0: scoring, guess parsing, and a consistent-guess solver that always wins in time."""

from itertools import permutations

import pytest

from agentrl.envs.codebreaker import CodeBreakerEnv, parse_guess, score


@pytest.mark.parametrize(
    ("secret", "guess", "expected"),
    [("1234", "1234", (4, 0)), ("1234", "4321", (0, 4)), ("1234", "1325", (1, 2)), ("1234", "5678", (0, 0))],
)
def test_score(secret: str, guess: str, expected: tuple[int, int]) -> None:
    assert score(secret, guess) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Guess: 0123", "0123"),
        ("Let me think.\nguess: 9 8 7 6", "9876"),
        ("**Guess:** `5,6,7,8`.", "5678"),
        ("Guess: 1234\nHmm, better:\nGuess: 4321 (second try)", "4321"),
    ],
)
def test_parse_guess(text: str, expected: str) -> None:
    assert parse_guess(text, 4) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("1234", "could not find"),
        ("Guess: 123", "exactly 4 digits"),
        ("Guess: 1123", "repeats 1"),
        ("Guess:", "exactly"),
    ],
)
def test_parse_guess_explains_bad_guesses(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_guess(text, 4)


def solve(env: CodeBreakerEnv) -> tuple[float, int, bool]:
    """Always guess the first code consistent with every answer so far, reading only the messages."""
    candidates = ["".join(p) for p in permutations("0123456789", env.code_length)]
    while True:
        guess = candidates[0]
        result = env.step(f"Consistent so far.\nGuess: {guess}")
        if result.terminated or result.truncated:
            return result.reward, env.turn, result.info["success"]
        text = result.observation[0].content
        bulls = int(text.split(" bull")[0].split()[-1])
        cows = int(text.split(" cow")[0].split()[-1])
        candidates = [c for c in candidates if score(c, guess) == (bulls, cows)]


def test_consistent_solver_wins_within_the_limit() -> None:
    env = CodeBreakerEnv()
    for seed in range(25):
        env.reset(seed=seed)
        reward, turns, success = solve(env)
        assert (reward, success) == (1.0, True), f"seed {seed}: lost to {env.code}"
        assert turns <= 10


def test_shorter_codes() -> None:
    env = CodeBreakerEnv(code_length=3, max_turns=8)
    obs, _ = env.reset(seed=0)
    assert "3 distinct digits" in obs[0].content and "Guess: 123" in obs[0].content
    assert len(env.code) == 3 and len(set(env.code)) == 3
    assert solve(env)[0] == 1.0


def test_bad_code_length() -> None:
    with pytest.raises(ValueError, match="code_length must be between 3 and 6"):
        CodeBreakerEnv(code_length=11)


def test_wrong_guesses_until_out_of_turns() -> None:
    env = CodeBreakerEnv(max_turns=3)
    env.reset(seed=0)
    wrong = next("".join(p) for p in permutations("0123456789", 4) if "".join(p) != env.code)
    first = env.step(f"Guess: {wrong}")
    assert not first.terminated and first.reward == 0.0 and "2 guesses left" in first.observation[0].content
    second = env.step("no idea")  # invalid, and still a turn
    assert not second.terminated and "could not find" in second.observation[0].content
    assert "1 guess left" in second.observation[0].content
    last = env.step(f"Guess: {wrong}")
    assert (last.reward, last.terminated, last.truncated, last.info["success"]) == (0.0, True, False, False)
    assert env.code in last.observation[0].content


def test_feedback_text() -> None:
    env = CodeBreakerEnv()
    env.reset(seed=0)
    guess = env.code[1] + env.code[0] + "".join(d for d in "0123456789" if d not in env.code)[:2]
    text = env.step(f"Guess: {guess}").observation[0].content
    assert text == f"{guess}: 0 bulls, 2 cows. 9 guesses left."
    env.step(f"Guess: {env.code}")
    assert env.guesses == [guess, env.code]
