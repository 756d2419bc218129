"""``agentrl/Explain-v0``: explain the answer to a word problem in full sentences, against a reference.

Each episode draws a word problem from one of eight families (change from a purchase, a journey in
two legs, sharing with a remainder, a garden's area and perimeter, ages, a film's end time, weeks
of saving, scaling a recipe) with fresh names and numbers, and holds a **long-form reference
answer**: two or three sentences that work the numbers out. No exact match can grade an
explanation (the same answer can be written a hundred ways), which is what the env is for: RL on
answers that cannot be verified (JEPO, docs/algorithms.md).

Two ways to play it, the ``reward`` argument:

- ``likelihood`` (the default, for ``trainer.algorithm=jepo``): the agent is asked to think the
  problem through first; its reply is the chain of thought, the episode ends after it with
  reward 0.0, and the env asks for the final answer and gives the reference in
  ``info["reference"]``. The rollout records the reference after the episode
  (``Trajectory.reference_ids``) and the trainer's reward is the log-likelihood the policy gives it.
- ``soft_match``: the agent answers straight away, and the reward is the ROUGE-L F1 between its
  reply and the reference (:func:`rouge_l`): the usual stand-in grader for free text, and the
  baseline JEPO is measured against.

The final step's ``info`` holds ``family`` and, with ``soft_match``, ``soft_match`` (the F1).
After ``reset``, :attr:`ExplainEnv.question` and :attr:`ExplainEnv.reference` hold the task.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from agentrl.env import AgentEnv, Feedback, Observation
from agentrl.envs._split import Split, check_split, draw
from agentrl.registry import register
from agentrl.types import Message

Reward = Literal["likelihood", "soft_match"]
REWARDS: tuple[str, ...] = ("likelihood", "soft_match")

THINK_RULES = (
    "You solve word problems. Think the problem through step by step and work out the numbers. "
    "You will be asked for your final answer afterwards."
)
ANSWER_REQUEST = "Now write your final answer: explain it in full sentences."
DIRECT_RULES = "You solve word problems. Explain the answer in full sentences, working out the numbers."

NAMES = ("Mia", "Tom", "Ava", "Leo", "Zoe", "Sam", "Ivy", "Ben", "Lia", "Max", "Eva", "Noah", "Ruth", "Omar")
ITEMS = ("pencil", "notebook", "apple", "ticket", "candle", "postcard", "marker", "sandwich")
_WORD = re.compile(r"[a-z0-9]+")


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 of two texts: the longest common subsequence of their lower-cased words (runs of
    letters and digits), as a harmonic mean of its share of each text. 0.0 when either is empty.

    >>> round(rouge_l("the cost is 21 dollars", "It costs 21 dollars in all"), 3)
    0.364
    """
    a, b = _WORD.findall(candidate.lower()), _WORD.findall(reference.lower())
    if not a or not b:
        return 0.0
    previous = [0] * (len(b) + 1)
    for word in a:
        current = [0]
        for j, other in enumerate(b):
            current.append(previous[j] + 1 if word == other else max(previous[j + 1], current[j]))
        previous = current
    common = previous[-1]
    if common == 0:
        return 0.0
    precision, recall = common / len(a), common / len(b)
    return 2 * precision * recall / (precision + recall)


# --- the families: each draws numbers and returns (key, (question, reference)) ---------------------

Task = tuple[str, str, str]  # family, question, reference


def _change(rng: np.random.Generator) -> tuple[str, Task]:
    name, item = _pick(rng, NAMES), _pick(rng, ITEMS)
    count, price = int(rng.integers(2, 10)), int(rng.integers(2, 13))
    cost = count * price
    note = next(n for n in (20, 50, 100, 200) if n > cost)
    question = (
        f"{name} buys {count} {item}s at {price} dollars each and pays with a {note}-dollar note. "
        f"How much change does {name} get?"
    )
    reference = (
        f"{count} {item}s at {price} dollars each cost {count} × {price} = {cost} dollars. Paying with "
        f"{note} dollars leaves {note} − {cost} = {note - cost} dollars, so {name} gets {note - cost} "
        "dollars in change."
    )
    return f"change:{name}:{item}:{count}:{price}", ("change", question, reference)


def _journey(rng: np.random.Generator) -> tuple[str, Task]:
    speed, hours = int(rng.integers(3, 13)) * 10, int(rng.integers(1, 5))
    speed2, hours2 = int(rng.integers(3, 13)) * 10, int(rng.integers(1, 5))
    first, second = speed * hours, speed2 * hours2
    question = (
        f"A train travels at {speed} km per hour for {hours} hours, then at {speed2} km per hour for "
        f"{hours2} more hours. How far does it travel in all?"
    )
    reference = (
        f"In the first {hours} hours the train covers {speed} × {hours} = {first} km. In the next {hours2} "
        f"hours it covers {speed2} × {hours2} = {second} km. Altogether it travels {first} + {second} = "
        f"{first + second} km."
    )
    return f"journey:{speed}:{hours}:{speed2}:{hours2}", ("journey", question, reference)


def _sharing(rng: np.random.Generator) -> tuple[str, Task]:
    name, friends = _pick(rng, NAMES), int(rng.integers(3, 9))
    each, left = int(rng.integers(2, 12)), int(rng.integers(1, friends))
    total = friends * each + left
    question = (
        f"{name} shares {total} stickers equally among {friends} friends and keeps the stickers left over. "
        f"How many stickers does each friend get, and how many does {name} keep?"
    )
    reference = (
        f"{total} divided by {friends} is {each} with a remainder of {left}, because {friends} × {each} = "
        f"{friends * each} and {total} − {friends * each} = {left}. Each friend gets {each} stickers and "
        f"{name} keeps {left}."
    )
    return f"sharing:{name}:{friends}:{each}:{left}", ("sharing", question, reference)


def _garden(rng: np.random.Generator) -> tuple[str, Task]:
    length, width = int(rng.integers(4, 21)), int(rng.integers(2, 13))
    question = f"A garden is {length} m long and {width} m wide. What are its area and its perimeter?"
    reference = (
        f"The area is the length times the width: {length} × {width} = {length * width} square metres. "
        f"The perimeter is twice the sum of the sides: 2 × ({length} + {width}) = {2 * (length + width)} metres."
    )
    return f"garden:{length}:{width}", ("garden", question, reference)


def _ages(rng: np.random.Generator) -> tuple[str, Task]:
    name, age = _pick(rng, NAMES), int(rng.integers(5, 40))
    older, years = int(rng.integers(2, 12)), int(rng.integers(2, 15))
    now = age + older
    question = (
        f"{name} is {age} years old, and {name}'s cousin is {older} years older. How old will the cousin "
        f"be in {years} years?"
    )
    reference = (
        f"The cousin is {age} + {older} = {now} years old now. In {years} years the cousin will be "
        f"{now} + {years} = {now + years} years old."
    )
    return f"ages:{name}:{age}:{older}:{years}", ("ages", question, reference)


def _film(rng: np.random.Generator) -> tuple[str, Task]:
    hour, minute = int(rng.integers(1, 10)), int(rng.integers(0, 12)) * 5
    length = int(rng.integers(70, 160))
    hours, minutes = divmod(length, 60)
    end = hour * 60 + minute + length
    end_hour, end_minute = divmod(end, 60)
    question = f"A film starts at {hour}:{minute:02d} and lasts {length} minutes. At what time does it end?"
    reference = (
        f"{length} minutes is {hours} {'hour' if hours == 1 else 'hours'} and {minutes} minutes. Adding "
        f"that to {hour}:{minute:02d} gives {end_hour}:{end_minute:02d}, so the film ends at "
        f"{end_hour}:{end_minute:02d}."
    )
    return f"film:{hour}:{minute}:{length}", ("film", question, reference)


def _savings(rng: np.random.Generator) -> tuple[str, Task]:
    name, weekly = _pick(rng, NAMES), int(rng.integers(3, 16))
    price = int(rng.integers(40, 200))
    weeks = -(-price // weekly)
    question = (
        f"{name} saves {weekly} dollars every week. How many weeks does {name} need to save to buy a "
        f"bike that costs {price} dollars?"
    )
    reference = (
        f"After {weeks - 1} weeks {name} has {weekly} × {weeks - 1} = {weekly * (weeks - 1)} dollars, which "
        f"is not enough, and after {weeks} weeks {weekly} × {weeks} = {weekly * weeks} dollars, which is. "
        f"So {name} needs {weeks} weeks."
    )
    return f"savings:{name}:{weekly}:{price}", ("savings", question, reference)


def _recipe(rng: np.random.Generator) -> tuple[str, Task]:
    people, per_person = int(rng.integers(2, 7)), int(rng.integers(3, 16)) * 10
    guests = int(rng.integers(2, 13))
    flour = people * per_person
    question = (
        f"A recipe for {people} people needs {flour} grams of flour. How much flour is needed for {guests} people?"
    )
    reference = (
        f"Each person needs {flour} ÷ {people} = {per_person} grams of flour. For {guests} people that is "
        f"{per_person} × {guests} = {per_person * guests} grams of flour."
    )
    return f"recipe:{people}:{per_person}:{guests}", ("recipe", question, reference)


FAMILIES: tuple[Callable[[np.random.Generator], tuple[str, Task]], ...] = (
    _change,
    _journey,
    _sharing,
    _garden,
    _ages,
    _film,
    _savings,
    _recipe,
)
"""The problem families; a task's family is drawn first, uniformly."""


def _pick(rng: np.random.Generator, options: tuple[str, ...]) -> str:
    return options[int(rng.integers(len(options)))]


def _generate(rng: np.random.Generator) -> tuple[str, Task]:
    return FAMILIES[int(rng.integers(len(FAMILIES)))](rng)


class ExplainEnv(AgentEnv):
    """Explain a word problem's answer in full sentences; graded by a reference's likelihood or by ROUGE-L."""

    def __init__(
        self,
        split: Split = "train",
        reward: Reward = "likelihood",
        max_turns: int | None = 1,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if reward not in REWARDS:
            raise ValueError(
                f"reward must be one of {REWARDS} (likelihood: for trainer.algorithm=jepo; soft_match: ROUGE-L "
                f"against the reference), got {reward!r}."
            )
        self.split = check_split(split)
        self.reward = reward
        self.family = self.question = self.reference = ""

    def start(self, options: dict[str, Any] | None) -> Observation:
        """Draw a problem of this env's split and ask it."""
        self.family, self.question, self.reference = draw(self.np_random, _generate, self.split)
        rules = THINK_RULES if self.reward == "likelihood" else DIRECT_RULES
        return [Message("system", rules), Message("user", self.question)]

    def respond(self, reply: Message) -> Feedback:
        """End the episode: ask for the answer and hand over the reference, or score the reply."""
        if self.reward == "likelihood":
            info = {"family": self.family, "reference": self.reference}
            return Feedback([Message("user", ANSWER_REQUEST)], 0.0, True, info)
        score = rouge_l(reply.content, self.reference)
        info = {"family": self.family, "soft_match": score}
        return Feedback([Message("user", f"ROUGE-L against the reference answer: {score:.2f}.")], score, True, info)

    def direct_prompt(self) -> Observation:
        """The messages that ask this episode's problem for an answer straight away (the
        ``soft_match`` prompt), whichever ``reward`` the env plays: what a reference's likelihood
        without a chain of thought, and supervised fine-tuning on the references, are taken after."""
        return [Message("system", DIRECT_RULES), Message("user", self.question)]


register("agentrl/Explain-v0", entry_point="agentrl.envs.explain:ExplainEnv", kwargs={"max_turns": 1})
