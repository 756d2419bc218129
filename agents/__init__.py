"""The agent layer: chat templates, tool-call formats and role prompts."""

from agentrl.agents.chat import ChatAgent, ChatTemplateError, TrajectoryBuilder
from agentrl.agents.tool_formats import TOOL_FORMATS, format_tool_calls, parse_reply

__all__ = ["TOOL_FORMATS", "ChatAgent", "ChatTemplateError", "TrajectoryBuilder", "format_tool_calls", "parse_reply"]
