"""``agentrl/Hallway-v0``: walk down a hallway of numbered rooms to the exit, one move per turn.

The env draws a hallway of 6 to 40 rooms numbered from 1, a start room and an exit room 1 to 6 rooms
apart (the distance is the task's difficulty: an exit next door is found by chance, one 6 rooms away
takes 6 of the 8 moves in the right direction). Each turn the agent replies ``left`` (to go to the
room numbered one lower) or ``right`` (one higher); the env says which room it is in now. The walk is the multi-turn task whose states
repeat: an agent that turns back visits a room again, and the episodes of a group (same seed, same
hallway) pass through the same rooms, which is what GiGPO's step groups compare
(docs/algorithms.md). Each step's ``info["state_key"]`` names the room.

Rules of an episode:

- Each reply is one turn; the last word ``left`` or ``right`` in it counts (``Move: left`` is fine).
- A reply without a valid move, or a move into the wall at either end, leaves the agent where it
  is, says so and uses up the turn.
- Reaching the exit ends the episode with reward 1.0. Running out of the ``max_turns`` moves
  (default 8) ends it with reward 0.0; the limit is a rule of the game, so that end is
  ``terminated``.

The final step's ``info`` holds ``success`` (bool) and ``moves`` (the turns it took).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from agentrl.env import AgentEnv, Feedback, Observation
from agentrl.envs._split import Split, check_split, draw
from agentrl.registry import register
from agentrl.types import Message

MIN_ROOMS, MAX_ROOMS = 6, 40
MIN_DISTANCE, MAX_DISTANCE = 1, 6
_MOVE = re.compile(r"\b(left|right)\b", re.IGNORECASE)

RULES = (
    "You walk down a hallway of numbered rooms to its exit. Each turn, reply with one word: 'left' goes to "
    "the room numbered one lower, 'right' to the room numbered one higher. If your reply has both words, "
    "the last one counts; a reply with neither still uses a turn."
)


def parse_move(text: str) -> int:
    """``-1`` if the last of the words ``left`` / ``right`` in ``text`` is ``left``, ``+1`` if it is
    ``right``; ``ValueError`` without either.

    >>> parse_move("Not left: the exit is higher, so right.")
    1
    """
    matches = _MOVE.findall(text)
    if not matches:
        raise ValueError("I could not find 'left' or 'right' in your reply.")
    return -1 if matches[-1].lower() == "left" else 1


class HallwayEnv(AgentEnv):
    """Reach the exit room with 'left' / 'right' replies; the room is the state."""

    def __init__(self, split: Split = "train", max_turns: int | None = 8, render_mode: str | None = None):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.split = check_split(split)
        self.rooms = self.room = self.exit = 0

    def start(self, options: dict[str, Any] | None) -> Observation:
        """Draw a hallway of this env's split and put the agent in its start room."""
        self.rooms, self.room, self.exit = draw(self.np_random, _generate, self.split)
        limit = f" You have {self.max_turns} moves." if self.max_turns else ""
        first = f"The hallway has rooms 1 to {self.rooms}.{limit} {self._where()}"
        return [Message("system", RULES), Message("user", first)]

    def respond(self, reply: Message) -> Feedback:
        """Move (or not) and say where the agent is; end at the exit or when the moves run out."""
        try:
            step = parse_move(reply.content)
        except ValueError as e:
            text = f"{e} {self._where()}"
        else:
            target = self.room + step
            if 1 <= target <= self.rooms:
                self.room = target
                text = self._where()
            else:
                text = f"There is a wall that way. {self._where()}"
        info: dict[str, Any] = {"state_key": f"room {self.room}"}
        if self.room == self.exit:
            info.update(success=True, moves=self.turn)
            return Feedback([Message("user", f"You reached the exit in {self.turn} moves.")], 1.0, True, info)
        if self.max_turns is not None and self.turn >= self.max_turns:
            info.update(success=False, moves=self.turn)
            return Feedback([Message("user", f"{text} You are out of moves.")], 0.0, True, info)
        return Feedback([Message("user", text)], info=info)

    def _where(self) -> str:
        return f"You are in room {self.room}. The exit is in room {self.exit}. Left or right?"


def _generate(rng: np.random.Generator) -> tuple[str, tuple[int, int, int]]:
    rooms = int(rng.integers(MIN_ROOMS, MAX_ROOMS + 1))
    start = int(rng.integers(1, rooms + 1))
    exits = [r for r in range(1, rooms + 1) if MIN_DISTANCE <= abs(r - start) <= MAX_DISTANCE]
    exit_room = int(rng.choice(exits))
    return f"hallway:{rooms}:{start}->{exit_room}", (rooms, start, exit_room)


register("agentrl/Hallway-v0", entry_point="agentrl.envs.hallway:HallwayEnv", kwargs={"max_turns": 8})
