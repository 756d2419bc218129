"""Running tool calls: one parsed :class:`~agentrl.types.ToolCall` in, one :class:`ToolResult` out.

:func:`call_tool` and :func:`acall_tool` never raise: a malformed call, an unknown tool, wrong
argument types, a tool that raises or runs past its time limit all come back as a
:class:`ToolResult` with ``error`` set, whose text starts with ``Error:`` and tells the model what
went wrong and what to do, so the episode can go on.

Limits, said plainly: a plain function that runs past its time limit cannot be killed in Python. It
is abandoned in a daemon thread (which never delays interpreter exit) and its result is dropped.
An ``async`` tool is cancelled at its limit, but one that blocks the event loop cannot be, and one
that raises ``SystemExit`` stops the loop, as asyncio does for any task (a plain function's
``SystemExit`` is caught). Tools that run untrusted or unbounded code belong in a sandbox
(:mod:`agentrl.sandboxes`), which can be killed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import enum
import inspect
import json
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl.suggest import did_you_mean
from agentrl.threads import TOOL_THREADS
from agentrl.tools.arguments import check_arguments, exception_text, preview, quoted_name, signature_hint
from agentrl.tools.schema import Tool
from agentrl.types import Message, ToolCall

# Lone surrogates are not valid Unicode: tokenizers refuse them and UTF-8 files cannot hold them.
_SURROGATE = re.compile("[\ud800-\udfff]")
# A cancelled async tool gets this long to clean up before it is abandoned.
_CANCEL_GRACE_S = 1.0


ErrorKind = typing.Literal["parse", "unknown_tool", "bad_arguments", "raised", "timeout", "too_many_calls"]


@dataclass(frozen=True)
class ToolResult:
    """What one tool call returned: the text for the model, and what went wrong if anything.

    ``error`` is the reason (``content`` is ``"Error: " + reason`` plus advice); ``error_kind`` is
    one of ``parse``, ``unknown_tool``, ``bad_arguments``, ``raised``, ``timeout`` (for metrics).
    """

    call: ToolCall
    content: str
    error: str | None = None
    timed_out: bool = False
    error_kind: ErrorKind | None = None

    def to_message(self) -> Message:
        """The ``tool`` role message that answers the call."""
        return Message("tool", self.content, tool_call_id=self.call.id, name=self.call.name or None)


def _prepare(tools: dict[str, Tool], call: ToolCall) -> tuple[Tool, dict[str, Any]] | ToolResult:
    if call.error:
        return _error(
            call,
            "parse",
            f"could not parse the tool call: {call.error}",
            'Write each call as a JSON object {"name": "<tool name>", "arguments": {...}} and try again.',
        )
    if not isinstance(call.name, str) or call.name not in tools:
        known = ", ".join(sorted(tools)) or "none"
        advice = did_you_mean(call.name, tools, n=1) or "Call one of them by its exact name."
        return _error(call, "unknown_tool", f"unknown tool {quoted_name(call.name)}; available tools: {known}", advice)
    tool_ = tools[call.name]
    arguments = check_arguments(tool_, call.arguments)
    if isinstance(arguments, str):
        return _error(
            call,
            "bad_arguments",
            f"bad arguments for {call.name}: {arguments}",
            f"{call.name} takes {signature_hint(tool_)}; fix the arguments and call it again.",
        )
    return tool_, arguments


def _error(call: ToolCall, kind: ErrorKind, reason: str, advice: str) -> ToolResult:
    reason = _valid_unicode(reason)
    return ToolResult(call, f"Error: {reason}. {advice}", error=reason, timed_out=kind == "timeout", error_kind=kind)


def _valid_unicode(text: str) -> str:
    """``text`` with lone surrogates (from a tool, or quoted from a call) replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def _raised(call: ToolCall, error: BaseException) -> ToolResult:
    return _error(
        call,
        "raised",
        f"{call.name} raised {type(error).__name__}: {exception_text(error)}",
        "Check the arguments, or try a different approach.",
    )


def _timed_out(call: ToolCall, limit: float) -> ToolResult:
    return _error(
        call,
        "timeout",
        f"{call.name} ran longer than its limit of {limit:g} s and was stopped",
        "Try a smaller input or a different approach.",
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        try:
            return sorted(value)
        except TypeError:
            return list(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def _format(value: Any) -> str:
    """The tool's return value as text for the model; never raises."""
    if isinstance(value, str):
        return _valid_unicode(value)
    try:
        if not isinstance(value, (dict, list, tuple, int, float, bool, type(None))):
            value = _jsonable(value)  # a bare object reads better as its str than as a quoted one
            if isinstance(value, str):
                return _valid_unicode(value)
        return _valid_unicode(json.dumps(value, ensure_ascii=False, default=_jsonable))
    except Exception:  # a 5000-digit int, deep nesting, a cycle, a broken __str__
        pass
    try:
        return _valid_unicode(str(value))
    except Exception:
        return _valid_unicode(preview(value))


def _is_async(fn: Callable[..., Any]) -> bool:
    # An object whose __call__ is a coroutine function is async too; callable() cannot tell that.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


def _run_sync(fn: Callable[..., Any], arguments: dict[str, Any], limit: float | None) -> Any:
    """Call ``fn``; if it hands back an awaitable, run that in a private loop.

    The private loop cancels the awaitable a grace period after ``limit``: the caller has given up
    by then, and this frees the thread. A ``TimeoutError`` out of here is therefore the tool's own.
    """
    result = fn(**arguments)
    if inspect.isawaitable(result):
        cancel_after = None if limit is None else limit + _CANCEL_GRACE_S
        return asyncio.run(asyncio.wait_for(_awaited(result), cancel_after))
    return result


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def call_tool(tools: dict[str, Tool], call: ToolCall, timeout: float | None = None) -> ToolResult:
    """Run one tool call synchronously; never raises (see the module docstring).

    ``timeout`` (seconds) applies unless the tool sets its own. With a limit the tool runs in a
    daemon thread and is abandoned when the limit passes; with none, a plain function runs in the
    calling thread. ``async`` tools run in a private event loop and are cancelled at the limit.
    """
    prepared = _prepare(tools, call)
    if isinstance(prepared, ToolResult):
        return prepared
    tool_, arguments = prepared
    limit = tool_.timeout if tool_.timeout is not None else timeout
    try:
        if limit is None and not _is_async(tool_.fn):
            value = _run_sync(tool_.fn, arguments, None)
        else:
            future = TOOL_THREADS.submit(lambda: _run_sync(tool_.fn, arguments, limit))
            done, _ = concurrent.futures.wait([future], timeout=limit)
            if not done:
                TOOL_THREADS.abandon(future)
                return _timed_out(call, limit)  # type: ignore[arg-type]
            value = future.result()
    except (Exception, SystemExit) as e:  # KeyboardInterrupt still stops the program
        return _raised(call, e)
    return ToolResult(call, _format(value))


async def acall_tool(tools: dict[str, Tool], call: ToolCall, timeout: float | None = None) -> ToolResult:
    """Run one tool call without blocking the event loop; never raises.

    ``async`` tools are awaited and cancelled at the time limit; plain functions run in a daemon
    thread and are abandoned at it. Cancelling the caller cancels an ``async`` tool too.
    """
    prepared = _prepare(tools, call)
    if isinstance(prepared, ToolResult):
        return prepared
    tool_, arguments = prepared
    limit = tool_.timeout if tool_.timeout is not None else timeout
    if _is_async(tool_.fn):
        try:
            task = asyncio.ensure_future(tool_.fn(**arguments))
        except Exception as e:
            return _raised(call, e)
        try:
            done, _ = await asyncio.wait({task}, timeout=limit)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=_CANCEL_GRACE_S)  # let it clean up, but not forever
            return _timed_out(call, limit)  # type: ignore[arg-type]
        outcome: concurrent.futures.Future[Any] | asyncio.Future[Any] = task
    else:
        future = TOOL_THREADS.submit(lambda: _run_sync(tool_.fn, arguments, limit))
        wrapped = asyncio.wrap_future(future)
        try:
            done, _ = await asyncio.wait({wrapped}, timeout=limit)
        except asyncio.CancelledError:
            TOOL_THREADS.abandon(future)
            wrapped.cancel()
            raise
        if not done:
            TOOL_THREADS.abandon(future)
            wrapped.cancel()  # so the late result is not posted to this loop, which may be closed by then
            return _timed_out(call, limit)  # type: ignore[arg-type]
        outcome = wrapped
    try:
        value = outcome.result()
    except asyncio.CancelledError as e:  # the tool cancelled itself
        return _raised(call, e)
    except (Exception, SystemExit) as e:
        return _raised(call, e)
    return ToolResult(call, _format(value))
