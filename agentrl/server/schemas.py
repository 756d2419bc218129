"""The env server's request and response bodies, as pydantic models (the OpenAPI page shows them).

Messages travel in the shape :meth:`agentrl.Message.to_dict` writes (OpenAI's chat shape), so
:meth:`agentrl.Message.from_dict` reads them back unchanged on either side.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentrl.types import Message


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionBody(_Body):
    name: str
    arguments: dict[str, Any] = {}


class ToolCallBody(_Body):
    type: Literal["function"] = "function"
    id: str | None = None
    function: FunctionBody
    error: str | None = None


class MessageBody(_Body):
    """One chat message (``agentrl.Message.to_dict``)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCallBody] = []
    tool_call_id: str | None = None
    name: str | None = None

    def to_message(self) -> Message:
        return Message.from_dict(self.model_dump(exclude_none=True))


Reply = str | MessageBody
"""An action: the reply's raw text (the env parses its tool calls) or an assistant message."""


class AgentSpec(BaseModel):
    """What an agent is told about an env: its tools and how to call them."""

    tools: list[dict[str, Any]] = Field(description="OpenAI-style tool schemas")
    tool_format: str = "auto"
    reply_prefix: str = ""


class EnvSpec(BaseModel):
    """One served env."""

    id: str
    kind: Literal["single", "parallel", "aec"]
    description: str
    agents: dict[str, AgentSpec] = Field(description="``{'agent': ...}`` for a single-agent env, else one per agent")
    env_kwargs: list[str] = Field(description="the constructor arguments a session may set")
    takes_split: bool


class EnvList(BaseModel):
    envs: list[EnvSpec]


class CreateSession(_Body):
    env_id: str = Field(max_length=200)
    split: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,32}$", description="e.g. train or test")
    seed: int | None = Field(default=None, ge=0, description="the first reset's seed, if reset gives none")
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="only names the server allows")


class SessionCreated(BaseModel):
    session_id: str
    env_id: str
    kind: Literal["single", "parallel", "aec"]
    split_ignored: bool = Field(default=False, description="a split was asked for, but the env takes none")


class ResetRequest(_Body):
    seed: int | None = Field(default=None, ge=0, description="gymnasium's envs take no negative seed")
    options: dict[str, Any] | None = None


class StepRequest(_Body):
    """A single-agent step sets ``reply``; a parallel multi-agent step ``actions`` (one reply per
    live agent); a turn-based (AEC) step ``agent`` (the one whose turn it is) and ``reply``
    (``null`` for an agent that is done)."""

    reply: Reply | None = Field(default=None, union_mode="left_to_right")
    actions: dict[str, Reply] | None = None
    agent: str | None = None


class ResetResponse(BaseModel):
    observation: list[MessageBody]
    info: dict[str, Any]


class StepResponse(BaseModel):
    observation: list[MessageBody]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class ParallelResponse(BaseModel):
    """A parallel env's ``reset`` (rewards, terminations, truncations empty) or ``step``."""

    agents: list[str]
    observations: dict[str, list[MessageBody]]
    rewards: dict[str, float] = {}
    terminations: dict[str, bool] = {}
    truncations: dict[str, bool] = {}
    infos: dict[str, dict[str, Any]]


class AECResponse(BaseModel):
    """A turn-based env after ``reset`` or a ``step``: whose turn it is and what ``last()`` says."""

    agents: list[str]
    agent_selection: str | None
    observation: list[MessageBody] | None
    reward: float
    termination: bool
    truncation: bool
    info: dict[str, Any]


class SessionState(BaseModel):
    session_id: str
    env_id: str
    kind: Literal["single", "parallel", "aec"]
    split: str | None
    episode: Literal["not started", "running", "over"]
    episodes: int
    steps: int
    idle_seconds: float
    age_seconds: float
    broken: str | None


class ErrorBody(BaseModel):
    """Every error: what went wrong and what to do."""

    detail: Any
