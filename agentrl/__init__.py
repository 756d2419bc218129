"""agentrl: train LLM agents with reinforcement learning.

The public contract lives in a few short modules: :mod:`agentrl.types` (messages, tool calls,
trajectories), :mod:`agentrl.env` (the env base class), :mod:`agentrl.registry` (register / make),
:mod:`agentrl.tools` (typed tools), :mod:`agentrl.checker` (``check_env``) and
:mod:`agentrl.multiagent` (PettingZoo envs in messages, policy mapping).
"""

from agentrl.checker import EnvCheckError, check_env
from agentrl.env import AgentEnv, Feedback, MessagesSpace, ReplySpace, ResetResult, StepResult
from agentrl.multiagent import make_multiagent, multiagent_ids, policy_mapping, register_multiagent
from agentrl.registry import UnknownEnvError, describe, make, register, registered_ids, spec
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
    "check_env",
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
