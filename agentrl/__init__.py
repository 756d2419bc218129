"""agentrl: train LLM agents with reinforcement learning.

The public contract lives in a few short modules: :mod:`agentrl.types` (messages, tool calls,
trajectories), :mod:`agentrl.env` (the env base class), :mod:`agentrl.registry` (register / make,
single- and multi-agent), :mod:`agentrl.tools` (typed tools), :mod:`agentrl.checker`
(``check_env``), :mod:`agentrl.mapping` (agents to policies) and :mod:`agentrl.multiagent` (PettingZoo
envs in messages). The machinery is named after the trajectory's stages: :mod:`agentrl.policies`,
:mod:`agentrl.rollout`, :mod:`agentrl.trainers`, joined once by :mod:`agentrl.build`.
"""

from agentrl.checker import EnvCheckError, check_env, check_multiagent_env
from agentrl.env import AgentEnv, Feedback, MessagesSpace, ReplySpace, ResetResult, StepResult, as_agent_env
from agentrl.mapping import policy_mapping
from agentrl.registry import (
    UnknownEnvError,
    describe,
    make,
    make_multiagent,
    multiagent_ids,
    register,
    register_multiagent,
    registered_ids,
    spec,
)
from agentrl.tools import Tool, ToolResult, tool
from agentrl.types import Message, ToolCall, Trajectory, read_jsonl, write_jsonl

__version__ = "0.1.0"

__all__ = [
    "AgentEnv",
    "EnvCheckError",
    "Feedback",
    "Message",
    "MessagesSpace",
    "ReplySpace",
    "ResetResult",
    "StepResult",
    "Tool",
    "ToolCall",
    "ToolResult",
    "Trajectory",
    "UnknownEnvError",
    "as_agent_env",
    "check_env",
    "check_multiagent_env",
    "describe",
    "make",
    "make_multiagent",
    "multiagent_ids",
    "policy_mapping",
    "read_jsonl",
    "register",
    "register_multiagent",
    "registered_ids",
    "spec",
    "tool",
    "write_jsonl",
]

# The built-in envs register themselves on import, as gymnasium's do.
import agentrl.envs  # noqa: E402,F401
