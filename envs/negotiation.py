"""``agentrl/Negotiation-v0``: two traders split a pool of items that each values privately.

The pool holds 1 to 3 books, hats and balls. Each trader (``trader_0``, ``trader_1``) has private
integer values for the three kinds, such that the whole pool is worth exactly 10 to it; neither
knows the other's values. The game is played in rounds, both traders writing at the same time:

- A reply may say anything to the other trader and must end with one line
  ``Claim: <n> books, <n> hats, <n> balls``: the items the trader wants for itself (an item left
  out counts as 0; the last ``Claim:`` line of a reply counts).
- If both claims are valid and together fit in the pool, that is the deal: each trader gets what it
  claimed, and its reward is the worth of those items to it divided by 10 (so in [0, 1]).
- Otherwise both see what the other wrote and claimed, and the next round begins. A claim that
  cannot be read, or asks for more than the pool has, is explained to its writer and blocks a deal
  that round.
- After ``max_rounds`` rounds (default 4) without a deal both get 0. The round limit is a rule of
  the game, so that end is ``terminated``, not ``truncated``.

The final step's ``info`` holds ``success`` (a deal was made), ``value`` (the trader's points out of
10) and ``deal`` (each trader's items, or ``None``). Tasks come from a train or a held-out test
split (``split="test"``), disjoint by construction (:mod:`agentrl.envs._split`); ``reset(seed=...)``
is deterministic. :class:`NegotiationEnv` is the ``ParallelEnv``; :func:`env` gives the same game
as an ``AECEnv`` (PettingZoo's ``parallel_to_aec``), in which the traders still move
simultaneously: the round is scored after both have replied.

>>> from agentrl.multiagent import make_multiagent
>>> env = make_multiagent("agentrl/Negotiation-v0")
>>> observations, infos = env.reset(seed=0)
>>> _, rewards, terminations, _, infos = env.step(
...     {"trader_0": "Claim: 0 books, 0 hats, 0 balls", "trader_1": "Claim: 0 books, 0 hats, 0 balls"})
>>> rewards, infos["trader_0"]["success"]
({'trader_0': 0.0, 'trader_1': 0.0}, True)
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import parallel_to_aec

from agentrl.envs._split import Split, check_split, draw
from agentrl.multiagent import MessageList, MessageSpaces, register_multiagent
from agentrl.types import Message, Trajectory

ITEMS: tuple[str, ...] = ("book", "hat", "ball")
POOL_VALUE = 10
"""What the whole pool is worth to each trader; rewards are points divided by this."""
TRADERS: tuple[str, str] = ("trader_0", "trader_1")
MAX_QUOTE = 600
"""At most this many characters of a reply are shown to the other trader."""

Bundle = tuple[int, int, int]
_CLAIM = re.compile(r"claim[*\s]*:([^\n]*)", re.IGNORECASE)
_ITEM = re.compile(r"(\d+)\s*(book|hat|ball)s?\b", re.IGNORECASE)


@dataclass(frozen=True)
class Task:
    """One negotiation: the pool and each trader's private values per item kind."""

    pool: Bundle
    values: tuple[Bundle, Bundle]

    def worth(self, trader: int, bundle: Bundle) -> int:
        """Points ``bundle`` is worth to ``trader`` (0 or 1)."""
        return sum(n * v for n, v in zip(bundle, self.values[trader]))


def parse_claim(text: str, pool: Bundle) -> Bundle:
    """The items claimed in ``text`` (its last ``Claim:`` line), or raise ``ValueError`` saying why not.

    >>> parse_claim("I need hats.\\nClaim: 2 hats, 1 book", (2, 2, 1))
    (1, 2, 0)
    """
    lines = _CLAIM.findall(text)
    if not lines:
        raise ValueError("I could not find a line 'Claim: <n> books, <n> hats, <n> balls' in your reply.")
    claim = [0, 0, 0]
    named: set[int] = set()
    for count, item in _ITEM.findall(lines[-1]):
        kind = ITEMS.index(item.lower())
        if kind in named:
            raise ValueError(f"Your claim names {item.lower()}s twice.")
        named.add(kind)
        claim[kind] = int(count)
    if not named and re.search(r"\d", lines[-1]):
        raise ValueError("Your claim has numbers but no item names; write e.g. 'Claim: 1 book, 0 hats, 2 balls'.")
    for kind, (wanted, available) in enumerate(zip(claim, pool)):
        if wanted > available:
            raise ValueError(f"You claimed {_items(wanted, kind)}, but the pool has only {available}.")
    return (claim[0], claim[1], claim[2])


class NegotiationEnv(MessageSpaces, ParallelEnv[str, MessageList, "str | Message"]):
    """Two traders split a pool of books, hats and balls they value privately; one claim each per round."""

    metadata: dict[str, Any] = {"name": "negotiation_v0", "render_modes": ["ansi"], "is_parallelizable": True}

    def __init__(self, split: Split = "train", max_rounds: int = 4, render_mode: str | None = None):
        if max_rounds < 1:
            raise ValueError(f"max_rounds must be a positive int, got {max_rounds}.")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}.")
        self.split = check_split(split)
        self.max_rounds = max_rounds
        self.render_mode = render_mode
        self.possible_agents = list(TRADERS)
        self.agents: list[str] = []
        self._make_spaces(TRADERS)
        self.task: Task | None = None
        self.round = 0
        self.transcript: list[str] = []

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, MessageList], dict[str, dict[str, Any]]]:
        self._seed(seed)
        self.task = draw(self.np_random, _generate, self.split)
        self.agents = list(TRADERS)
        self.round = 0
        self.transcript = [f"Pool: {_bundle(self.task.pool)}."]
        observations = {
            agent: MessageList([Message("system", self._rules(i)), Message("user", self._prompt())])
            for i, agent in enumerate(TRADERS)
        }
        return observations, {agent: {"round": 0} for agent in TRADERS}

    def step(
        self, actions: dict[str, str | Message]
    ) -> tuple[dict[str, MessageList], dict[str, float], dict[str, bool], dict[str, bool], dict[str, dict[str, Any]]]:
        if self.task is None or not self.agents:
            raise RuntimeError("NegotiationEnv.step was called outside an episode; call reset() first.")
        missing = [a for a in self.agents if a not in actions]
        if missing:
            raise ValueError(f"NegotiationEnv.step needs an action for every live agent; missing {missing}.")
        task = self.task
        texts = [_reply_text(actions[agent]) for agent in TRADERS]
        claims: list[Bundle | None] = []
        problems: list[str] = []
        for text in texts:
            try:
                claims.append(parse_claim(text, task.pool))
                problems.append("")
            except ValueError as e:  # a bad claim is the writer's mistake, explained to it, never an error
                claims.append(None)
                problems.append(str(e))
        self.round += 1
        self.transcript += [f"[round {self.round}] {agent}: {_quote(text)}" for agent, text in zip(TRADERS, texts)]
        first, second = claims
        fits = first is not None and second is not None and all(a + b <= n for a, b, n in zip(first, second, task.pool))
        over = fits or self.round >= self.max_rounds
        deal = {a: _as_dict(c) for a, c in zip(TRADERS, claims) if c is not None} if fits else None
        observations: dict[str, MessageList] = {}
        rewards: dict[str, float] = {}
        infos: dict[str, dict[str, Any]] = {}
        for i, agent in enumerate(TRADERS):
            mine = claims[i]
            value = task.worth(i, mine) if fits and mine is not None else 0
            if fits:
                text = f"Deal! You get {_bundle(mine)}, worth {value} to you (out of {POOL_VALUE})."
            elif over:
                text = (
                    self._report(i, texts, claims, problems)
                    + " That was the last round: no deal, so you both get nothing."
                )
            else:
                text = self._report(i, texts, claims, problems) + " " + self._prompt()
            observations[agent] = MessageList([Message("user", text)])
            rewards[agent] = value / POOL_VALUE
            infos[agent] = {"round": self.round, "valid_claim": mine is not None}
            if over:
                infos[agent].update(success=fits, value=value, deal=deal)
        if over:
            self.transcript.append(f"Deal: {deal}." if fits else "No deal.")
        terminations = {agent: over for agent in TRADERS}
        truncations = {agent: False for agent in TRADERS}
        if over:
            self.agents = []
        return observations, rewards, terminations, truncations, infos

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n".join(self.transcript)

    def close(self) -> None:
        pass

    def _rules(self, trader: int) -> str:
        task = self.task
        assert task is not None
        me, other = TRADERS[trader], TRADERS[1 - trader]
        worth = ", ".join(f"a {item} is worth {v}" for item, v in zip(ITEMS, task.values[trader]))
        return (
            f"You are {me}, a trader. You and {other} must agree how to split this pool of items: "
            f"{_bundle(task.pool)}. To you, {worth}, so the whole pool is worth {POOL_VALUE} to you. "
            f"{other} values the items differently, and neither of you knows the other's values.\n\n"
            f"You have {self.max_rounds} rounds. In each round you both write at the same time: say "
            f"anything you like to {other}, then end your reply with one line\n"
            "Claim: <n> books, <n> hats, <n> balls\n"
            f"naming the items you want for yourself. If your claim and {other}'s fit in the pool "
            "together, that is the deal: each of you gets what they claimed and scores its worth to "
            "them. Otherwise you both see what the other wrote and claimed, and the next round "
            "begins. With no deal after the last round, you both score 0."
        )

    def _prompt(self) -> str:
        return f"Round {self.round + 1} of {self.max_rounds}: make your claim."

    def _report(self, trader: int, texts: list[str], claims: list[Bundle | None], problems: list[str]) -> str:
        """What ``trader`` hears after a round without a deal: the other's words and both claims."""
        assert self.task is not None
        other = TRADERS[1 - trader]
        mine, theirs = claims[trader], claims[1 - trader]
        parts = [f"Round {self.round}: {other} wrote:\n{_quote(texts[1 - trader]) or '(nothing)'}\n\n"]
        parts.append(
            f"You claimed {_bundle(mine)}."
            if mine is not None
            else f"Your reply had no valid claim: {problems[trader]}"
        )
        parts.append(f" {other} claimed {_bundle(theirs)}." if theirs is not None else f" {other} made no valid claim.")
        if mine is not None and theirs is not None:
            pool = self.task.pool
            over = [f"{ITEMS[k]}s ({a + b} of {n})" for k, (a, b, n) in enumerate(zip(mine, theirs, pool)) if a + b > n]
            parts.append(" Together that is more than the pool has of " + ", ".join(over) + ".")
        return "".join(parts)


def parallel_env(**kwargs: Any) -> NegotiationEnv:
    """The game as a ``ParallelEnv`` (PettingZoo's module convention)."""
    return NegotiationEnv(**kwargs)


def env(**kwargs: Any) -> AECEnv[str, MessageList, Any]:
    """The game as an ``AECEnv`` (PettingZoo's module convention): the traders reply in turn and
    each round is scored once both have replied."""
    return parallel_to_aec(NegotiationEnv(**kwargs))


@functools.cache
def _valuations(pool: Bundle) -> list[Bundle]:
    """Every value vector (0-10 per kind, at least two kinds worth something) making the pool worth 10."""
    return [
        (a, b, c)
        for a, b, c in itertools.product(range(POOL_VALUE + 1), repeat=3)
        if pool[0] * a + pool[1] * b + pool[2] * c == POOL_VALUE and (a > 0) + (b > 0) + (c > 0) >= 2
    ]


def _generate(rng: np.random.Generator) -> tuple[str, Task]:
    while True:  # a few pools (e.g. 3 of everything) cannot be worth exactly 10; draw again
        pool: Bundle = tuple(int(n) for n in rng.integers(1, 4, size=len(ITEMS)))  # type: ignore[assignment]
        options = _valuations(pool)
        if options:
            break
    values = (options[int(rng.integers(len(options)))], options[int(rng.integers(len(options)))])
    return f"negotiation:{pool}:{values[0]}:{values[1]}", Task(pool, values)


def _reply_text(action: Any) -> str:
    if isinstance(action, Message):
        return action.content
    if isinstance(action, str):
        return action
    raise TypeError(
        f"A Negotiation action must be the reply text or an assistant Message, got {type(action).__name__}."
    )


def _items(n: int, kind: int) -> str:
    return f"{n} {ITEMS[kind]}{'' if n == 1 else 's'}"


def _bundle(bundle: Bundle | None) -> str:
    assert bundle is not None
    return ", ".join(_items(n, k) for k, n in enumerate(bundle))


def _as_dict(bundle: Bundle) -> dict[str, int]:
    return dict(zip(ITEMS, bundle))


def _quote(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_QUOTE else text[:MAX_QUOTE] + " [...]"


_POOL = re.compile(r"this pool of items: ([^.]*)\.")


def claim_bonus(episode: Mapping[str, Trajectory], bonus: float = 0.1) -> dict[str, list[float]]:
    """A shaping reward for training small models (a ``reward_fn`` of ``agentrl train``): each
    trader's env rewards, plus at every turn a share of ``bonus`` for how close its reply came to a
    claim: the whole ``bonus`` for a claim the pool can hold, half for a ``Claim:`` line that is not
    one, a fifth for naming a claim at all. A deal pays at most 1; an untrained SmolLM2-135M writes
    a valid claim in about 4% of its turns, a ``Claim:`` line in 6%, the word in 26%, and makes no
    deal, so without the ladder a group rarely has a reward to compare.

    ``episode`` is each trader's :class:`~agentrl.types.Trajectory`; the pool is read from the
    rules in its first message, the replies from its assistant messages (one per turn).
    """
    rewards = {}
    for agent_id, trajectory in episode.items():
        rules = next((m.content for m in trajectory.messages if m.role == "system"), "")
        found = _POOL.search(rules)
        if found is None:
            raise ValueError(f"{agent_id}'s first message does not state the pool; is this a Negotiation episode?")
        pool = parse_claim(f"Claim: {found.group(1)}", (99, 99, 99))
        replies = [m.content for m in trajectory.messages if m.role == "assistant"][: len(trajectory.turn_rewards)]
        rewards[agent_id] = [
            reward + bonus * _claim_credit(reply, pool) for reward, reply in zip(trajectory.turn_rewards, replies)
        ]
    return rewards


def _claim_credit(text: str, pool: Bundle) -> float:
    """1 for a claim ``pool`` can hold, 0.5 for another ``Claim:`` line, 0.2 for the word, else 0."""
    if _valid_claim(text, pool):
        return 1.0
    if _CLAIM.search(text):
        return 0.5
    return 0.2 if "claim" in text.lower() else 0.0


def _valid_claim(text: str, pool: Bundle) -> bool:
    try:
        parse_claim(text, pool)
    except ValueError:
        return False
    return True


register_multiagent("agentrl/Negotiation-v0", "agentrl.envs.negotiation:NegotiationEnv", {"max_rounds": 4})
