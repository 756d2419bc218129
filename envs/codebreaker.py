"""``agentrl/CodeBreaker-v0``: crack a secret code of distinct digits from bulls-and-cows feedback.

The env draws a secret of ``code_length`` (default 4) distinct digits, ``0`` allowed first. The agent
guesses with ``Guess: 1234``; the env answers how many digits are right and in the right place
(bulls) and how many are right but in the wrong place (cows). Winning takes several turns of
reasoning over the feedback so far, which makes this the multi-turn game among the built-ins.

Rules of an episode:

- Each reply is one turn. The last ``Guess:`` in a reply counts.
- An invalid reply (no ``Guess:``, the wrong number of digits, a repeated digit) is told what was
  wrong and still uses up the turn; the episode goes on.
- Cracking the code ends the episode with reward 1.0. Running out of the ``max_turns`` guesses
  (default 10) ends it with reward 0.0 and reveals the code. The guess limit is a rule of the game,
  so that end is ``terminated``, not ``truncated``.

The final step's ``info`` holds ``success`` (bool) and ``code``. No tools.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from agentrl.env import AgentEnv, Feedback, Observation
from agentrl.envs._split import Split, check_split, draw
from agentrl.registry import register
from agentrl.types import Message

MIN_LENGTH, MAX_LENGTH = 3, 6
_GUESS = re.compile(r"guess[*\s]*:[*\s`]*([^\n]*)", re.IGNORECASE)


def score(secret: str, guess: str) -> tuple[int, int]:
    """``(bulls, cows)`` of ``guess`` against ``secret``, two strings of distinct digits.

    >>> score("1234", "1325")
    (1, 2)
    """
    bulls = sum(s == g for s, g in zip(secret, guess))
    return bulls, len(set(secret) & set(guess)) - bulls


def parse_guess(text: str, length: int) -> str:
    """The code guessed in ``text`` (its last ``Guess:``), or raise ``ValueError`` saying what is wrong.

    Digits may be separated by spaces or commas (``Guess: 1 2 3 4``).
    """
    matches = _GUESS.findall(text)
    if not matches:
        raise ValueError(f"I could not find 'Guess: <{length} distinct digits>' in your reply.")
    # Keep the leading run of digits and separators only, so "Guess: 1234 (my second try)" works.
    run = re.match(r"[\d ,]*", matches[-1]).group(0)  # type: ignore[union-attr]
    digits = re.sub(r"[ ,]", "", run)
    if len(digits) != length:
        shown = matches[-1].strip()[:40]
        raise ValueError(f"A guess must be exactly {length} digits; {shown!r} is not.")
    repeated = sorted({d for d in digits if digits.count(d) > 1})
    if repeated:
        raise ValueError(f"The digits of a guess must be distinct; {digits} repeats {', '.join(repeated)}.")
    return digits


class CodeBreakerEnv(AgentEnv):
    """Bulls and cows: find a secret code of distinct digits with 'Guess: 1234' replies."""

    def __init__(
        self,
        split: Split = "train",
        code_length: int = 4,
        max_turns: int | None = 10,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.split = check_split(split)
        if not MIN_LENGTH <= code_length <= MAX_LENGTH:
            raise ValueError(f"code_length must be between {MIN_LENGTH} and {MAX_LENGTH}, got {code_length}.")
        self.code_length = code_length
        self.code = ""
        self.guesses: list[str] = []

    def start(self, options: dict[str, Any] | None) -> Observation:
        """Draw a secret code of this env's split and explain the game."""
        self.code = draw(self.np_random, self._generate, self.split)
        self.guesses = []
        n = self.code_length
        limit = f"You have {self.max_turns} guesses." if self.max_turns else "You have unlimited guesses."
        rules = (
            f"We play bulls and cows. I have a secret code of {n} distinct digits (0-9; it may start "
            "with 0). Each turn, reply with one guess on a line of its own, in the form\n"
            f"Guess: {'0123456789'[1 : n + 1]}\n"
            f"using {n} distinct digits. I answer with the number of bulls (right digit in the right "
            "place) and cows (right digit in the wrong place). You may think before your guess; "
            f"only the last 'Guess:' line of a reply counts, and an invalid guess still uses a turn. {limit}"
        )
        return [Message("system", rules), Message("user", f"The secret code has {n} digits. Make your first guess.")]

    def respond(self, reply: Message) -> Feedback:
        """Score the reply's guess; end the episode on a win or when guesses run out."""
        # With no tools offered, a reply parsed as a tool call is still graded on its text.
        out_of_turns = self.max_turns is not None and self.turn >= self.max_turns
        try:
            guess = parse_guess(reply.content, self.code_length)
        except ValueError as e:
            return self._answer(str(e), out_of_turns)
        self.guesses.append(guess)
        bulls, cows = score(self.code, guess)
        if bulls == self.code_length:
            text = f"{guess} is correct! You cracked the code in {self.turn} turns."
            return Feedback([Message("user", text)], 1.0, True, {"success": True, "code": self.code})
        return self._answer(f"{guess}: {_count(bulls, 'bull')}, {_count(cows, 'cow')}.", out_of_turns)

    def _answer(self, text: str, out_of_turns: bool) -> Feedback:
        if out_of_turns:
            text += f" You are out of guesses. The code was {self.code}."
            return Feedback([Message("user", text)], 0.0, True, {"success": False, "code": self.code})
        if self.max_turns is not None:
            left = self.max_turns - self.turn
            text += f" {_count(left, 'guess', 'guesses')} left."
        return Feedback([Message("user", text)])

    def _generate(self, rng: np.random.Generator) -> tuple[str, str]:
        digits = rng.permutation(10)[: self.code_length]
        code = "".join(str(int(d)) for d in digits)
        return f"codebreaker:{code}", code


def _count(k: int, word: str, plural: str | None = None) -> str:
    return f"{k} {word if k == 1 else plural or word + 's'}"


register("agentrl/CodeBreaker-v0", entry_point="agentrl.envs.codebreaker:CodeBreakerEnv", kwargs={"max_turns": 10})
