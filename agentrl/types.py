"""The data every part of agentrl speaks: chat messages, tool calls and trajectories.

Read this module first. An environment observes and answers in :class:`Message` lists; the agent
layer turns them into token ids; the rollout records one :class:`Trajectory` per agent per
episode with the exact token ids the policy saw and produced; the trainer reads trajectories.

All three types round-trip through plain JSON (``to_dict`` / ``from_dict``), and trajectories are
stored one per line in JSONL files (:func:`write_jsonl`, :func:`read_jsonl`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


@dataclass
class ToolCall:
    """One call of a tool, as parsed out of a completion.

    ``error`` is set when the call could not be parsed (for example invalid JSON inside a
    ``<tool_call>`` block); such a call is never executed, and the environment answers it with an
    error observation instead.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolCall:
        return cls(
            name=data["name"],
            arguments=dict(data.get("arguments") or {}),
            id=data.get("id"),
            error=data.get("error"),
        )


@dataclass
class Message:
    """One chat message, in the shape chat templates and OpenAI-style APIs use.

    >>> Message("user", "What is 2 + 3?")
    Message(role='user', content='What is 2 + 3?', tool_calls=[], tool_call_id=None, name=None)
    """

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Message role must be one of {ROLES}, got {self.role!r}.")
        if not isinstance(self.content, str):
            raise TypeError(f"Message content must be a str, got {type(self.content).__name__}: {self.content!r:.80}")

    def to_dict(self) -> dict[str, Any]:
        """The message as a chat-template / OpenAI style dict (empty optional fields left out)."""
        data: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            data["tool_calls"] = [
                {
                    "type": "function",
                    "id": call.id,
                    "function": {"name": call.name, "arguments": call.arguments},
                    **({"error": call.error} if call.error else {}),
                }
                for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            data["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            data["name"] = self.name
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        calls = []
        for raw in data.get("tool_calls") or []:
            function = raw.get("function", raw)
            arguments = function.get("arguments") or {}
            if isinstance(arguments, str):  # OpenAI sends arguments as a JSON string
                arguments = json.loads(arguments)
            calls.append(ToolCall(name=function["name"], arguments=arguments, id=raw.get("id"), error=raw.get("error")))
        return cls(
            role=data["role"],
            content=data.get("content") or "",
            tool_calls=calls,
            tool_call_id=data.get("tool_call_id"),
            name=data.get("name"),
        )


@dataclass
class Trajectory:
    """One agent's view of one episode, as the exact token ids the policy saw and produced.

    ``token_ids`` is the whole sequence: the prompt, then for each turn the generated tokens
    followed by the observation tokens the environment answered with. The per-token lists all have
    the length of ``token_ids``:

    - ``loss_mask`` is 1 exactly on generated tokens, 0 on prompt and observation tokens;
    - ``logprobs`` holds the behaviour log-prob of each generated token (0.0 elsewhere);
    - ``versions`` holds the policy version that generated each token (-1 elsewhere).

    ``turn_ends[i]`` is the index of the last generated token of turn ``i``: per-turn rewards
    ``turn_rewards[i]`` are placed there (PPO/GAE). ``reward`` is the episode's return, the sum of
    the per-turn rewards. Trajectories sampled from the same prompt and seed share ``group_id``
    (the GRPO baseline).

    An env that holds a reference answer it cannot verify against (``info["reference"]`` at the
    end of the episode) gets it recorded after the episode: ``reference_ids`` are the tokens that
    would follow ``token_ids`` if the policy answered with the reference (the env's last
    observation, then the reference as the next assistant reply), and ``reference_mask`` is 1 on
    the reply's own tokens (its text and the end-of-turn token). They are not part of
    ``token_ids``: nobody generated them. JEPO scores them (``log pi(reference | prompt, episode)``).
    """

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    prompt_length: int = 0
    turn_ends: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    turn_states: list[str] = field(default_factory=list)
    """The state each turn answered, as a key: the env's ``info["state_key"]`` for the observation
    before the turn, else a digest of that observation's messages (GiGPO's anchor states; empty in
    trajectories recorded without them)."""
    reference_ids: list[int] = field(default_factory=list)
    """Tokens to append after ``token_ids`` to teacher-force the env's reference answer (empty
    without one)."""
    reference_mask: list[int] = field(default_factory=list)
    """Per token of ``reference_ids``: 1 on the reference reply's own tokens, 0 on the template
    around them."""
    reward: float = 0.0
    messages: list[Message] = field(default_factory=list)
    env_id: str = ""
    agent_id: str = "agent"
    policy_id: str = "default"
    group_id: str = ""
    turns: int = 0
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ``ValueError`` if the per-token lists disagree in length or the mask is malformed."""
        n = len(self.token_ids)
        for name in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"Trajectory.{name} has {len(getattr(self, name))} entries but token_ids has {n}; "
                    "every per-token list must have one entry per token."
                )
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("Trajectory.loss_mask must hold only 0 and 1.")
        if any(self.loss_mask[: self.prompt_length]):
            raise ValueError("Trajectory.loss_mask must be 0 over the prompt tokens.")
        if len(self.turn_rewards) != len(self.turn_ends):
            raise ValueError(
                f"Trajectory has {len(self.turn_ends)} turn_ends but {len(self.turn_rewards)} "
                "turn_rewards; give one reward per generated turn."
            )
        if len(self.reference_mask) != len(self.reference_ids) or any(m not in (0, 1) for m in self.reference_mask):
            raise ValueError(
                f"Trajectory.reference_mask must hold one 0 or 1 per reference id; got {len(self.reference_mask)} "
                f"entries for {len(self.reference_ids)} reference ids."
            )
        if self.turn_states and len(self.turn_states) != len(self.turn_ends):
            raise ValueError(
                f"Trajectory has {len(self.turn_ends)} turn_ends but {len(self.turn_states)} turn_states; give "
                "one state key per generated turn, or none."
            )

    @property
    def num_generated(self) -> int:
        """How many tokens the policy generated in this episode."""
        return sum(self.loss_mask)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["messages"] = [m.to_dict() for m in self.messages]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        fields = dict(data)
        fields["messages"] = [Message.from_dict(m) for m in data.get("messages", [])]
        known = set(cls.__dataclass_fields__)
        unknown = set(fields) - known
        if unknown:
            raise ValueError(f"Unknown Trajectory fields {sorted(unknown)}; expected some of {sorted(known)}.")
        return cls(**fields)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Trajectory:
        return cls.from_dict(json.loads(line))


def write_jsonl(path: str | Path, trajectories: Iterable[Trajectory], append: bool = False) -> int:
    """Write one trajectory per line; return how many were written."""
    count = 0
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for trajectory in trajectories:
            f.write(trajectory.to_json() + "\n")
            count += 1
    return count


def read_jsonl(path: str | Path) -> Iterator[Trajectory]:
    """Yield the trajectories of a JSONL file, one per non-empty line."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield Trajectory.from_json(line)
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{number}: not a trajectory ({e}).") from e
