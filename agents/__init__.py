"""The agent layer: :class:`ChatAgent` renders an env's messages into prompt token ids through the
chat template and parses completions back into messages, for one role; :class:`TrajectoryBuilder`
records an episode as exact token ids. The tool-call formats of the env contract
(:mod:`agentrl.tool_calls`) are re-exported here."""

from agentrl.agents.chat import ChatAgent, ChatTemplateError
from agentrl.agents.trajectory import TrajectoryBuilder, reference_trajectory
from agentrl.tool_calls import TOOL_FORMATS, format_tool_calls, parse_reply

__all__ = [
    "TOOL_FORMATS",
    "ChatAgent",
    "ChatTemplateError",
    "TrajectoryBuilder",
    "format_tool_calls",
    "parse_reply",
    "reference_trajectory",
]
