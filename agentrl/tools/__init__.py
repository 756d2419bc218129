"""Tools: typed Python callables that an environment offers to the agent.

:func:`tool` turns a function with type hints and a docstring into a :class:`Tool` with a JSON
schema (:mod:`agentrl.tools.schema`); :func:`check_arguments` checks a call's arguments against it
(:mod:`agentrl.tools.arguments`); :func:`call_tool` and :func:`acall_tool` run one parsed
:class:`~agentrl.types.ToolCall` and never raise, answering every failure with a
:class:`ToolResult` whose text tells the model what went wrong and what to do
(:mod:`agentrl.tools.call`, which also says what a time limit can and cannot stop).

>>> from agentrl.types import ToolCall
>>> @tool
... def add(a: int, b: int) -> int:
...     '''Add two integers.
...
...     Args:
...         a: The first addend.
...         b: The second addend.
...     '''
...     return a + b
>>> add.schema["function"]["parameters"]["required"]
['a', 'b']
>>> print(call_tool({"add": add}, ToolCall("add", {"a": 2, "b": "3"})).content)
Error: bad arguments for add: argument 'b': expected an integer, got "3". add takes a (integer), b (integer); fix the arguments and call it again.
"""

from agentrl.tools.arguments import check_arguments
from agentrl.tools.call import ErrorKind, ToolResult, acall_tool, call_tool
from agentrl.tools.schema import Tool, ToolSchemaError, as_tool, tool

__all__ = [
    "ErrorKind",
    "Tool",
    "ToolResult",
    "ToolSchemaError",
    "acall_tool",
    "as_tool",
    "call_tool",
    "check_arguments",
    "tool",
]
