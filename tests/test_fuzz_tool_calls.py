"""Fuzz the tool-call path: random and adversarial completions through parse_reply (every format),
call_tool / acall_tool and an AgentEnv's step / astep. Nothing may escape, every call gets exactly
one tool message answering it, every error message starts with "Error:", and no call is read from
inside a reasoning block.

The hypothesis budgets keep this file at about 10-20 s; ``benchmarks/fuzz_tool_calls.py`` runs the
same checks over 100 000 seeded completions.
"""

import asyncio
import enum
import importlib.util
import pathlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.env import AgentEnv, Observation
from agentrl.tool_calls import THINK_TAGS, TOOL_FORMATS, format_tool_calls, parse_reply
from agentrl.tools import Tool, ToolResult, acall_tool, call_tool, tool
from agentrl.types import Message, ToolCall


class Mood(enum.Enum):
    CALM = "calm"
    LOUD = "loud"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def ratio(x: float, y: float = 1.0) -> float:
    """Divide x by y (raises on zero)."""
    return x / y


@tool
def join(parts: list[str], sep: str | None = None, weights: dict[str, float] | None = None) -> str:
    """Join strings."""
    return (sep or "").join(parts)


@tool
def feel(mood: Mood, times: tuple[int, ...] = ()) -> Any:
    """Return something JSON cannot hold as it is."""
    return {mood, len(times)} if times else mood


@tool
async def later(text: str) -> str:
    """An async tool."""
    await asyncio.sleep(0)
    return text[::-1]


TOOLS: list[Tool] = [add, ratio, join, feel, later]
BY_NAME = {t.name: t for t in TOOLS}
LOOP = asyncio.new_event_loop()


class ToolEnv(AgentEnv):
    """Answers tool calls (the base class does); any other reply ends the episode."""

    tools = TOOLS

    def start(self, options: dict[str, Any] | None) -> Observation:
        return [Message("user", "Use the tools.")]


ENV = ToolEnv()


def check_answers(calls: list[ToolCall], messages: list[Any]) -> None:
    cap = ENV.max_tool_calls
    if len(calls) > cap and len(messages) == cap + 1:  # an env runs the first few and says so
        assert messages[-1].content.startswith(f"Error: too many tool calls in one reply ({len(calls)})")
        calls, messages = calls[:cap], messages[:cap]
    assert len(messages) == len(calls), "every call gets exactly one tool message"
    for call, message in zip(calls, messages):
        assert isinstance(message, Message) and message.role == "tool"
        assert message.tool_call_id == call.id and isinstance(message.content, str)
        message.content.encode("utf-8")  # no lone surrogates: a tokenizer must be able to read it
        if call.error is not None:
            assert message.content.startswith("Error: could not parse the tool call")


def check_results(calls: list[ToolCall], results: list[ToolResult]) -> None:
    for result in results:
        assert isinstance(result, ToolResult)
        assert (result.error is None) == (result.error_kind is None)
        if result.error is not None:
            assert result.content.startswith(f"Error: {result.error}. ")
    check_answers(calls, [r.to_message() for r in results])


def exercise(text: str, env_too: bool = True) -> None:
    """One completion through every stage; any exception fails the test with the completion shown."""
    replies = {f: parse_reply(text, f) for f in TOOL_FORMATS}
    for reply in replies.values():
        assert isinstance(reply, Message) and reply.role == "assistant" and isinstance(reply.content, str)
        assert [c.id for c in reply.tool_calls] == [f"call_{i}" for i in range(len(reply.tool_calls))]
        for call in reply.tool_calls:
            assert isinstance(call, ToolCall) and isinstance(call.arguments, dict)
            assert call.error is None or (isinstance(call.error, str) and call.arguments == {})
    for format, reply in replies.items():
        check_reasoning(text, format, reply)
    calls = replies["auto"].tool_calls
    check_results(calls, [call_tool(BY_NAME, c) for c in calls])
    check_results(calls[:3], [call_tool(BY_NAME, c, timeout=10) for c in calls[:3]])  # the thread path

    async def run_async() -> list[ToolResult]:
        return [await acall_tool(BY_NAME, c, timeout=10) for c in calls]

    check_results(calls, LOOP.run_until_complete(run_async()))
    if env_too:
        for step in (lambda: ENV.step(text), lambda: LOOP.run_until_complete(ENV.astep(text))):
            ENV.reset(seed=0)
            observation, _, terminated, _, _ = step()
            if calls:
                check_answers(calls, observation)
                assert not terminated
            else:
                assert observation == [] and terminated


def check_reasoning(text: str, format: str, alone: Message) -> None:
    """After a closed reasoning block holding it, ``text`` reads as alone; inside an unclosed one
    it is a plain reply, as written."""
    opening, closing = THINK_TAGS
    thought = text
    while closing in thought:
        thought = thought.replace(closing, "")
    after = parse_reply(f"{opening}{thought}{closing}{text}", format)
    assert [(c.name, c.arguments, c.error) for c in after.tool_calls] == [
        (c.name, c.arguments, c.error) for c in alone.tool_calls
    ], "a call was read from inside a reasoning block"
    assert parse_reply(opening + thought, format) == Message("assistant", opening + thought)


# --- strategies -------------------------------------------------------------------------------

FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<tool_", "call>", "{", "}", "[", "]", ":", ",", '"', "\\",
    '"name"', '"arguments"', '"parameters"', '"add"', '"ratio"', '"join"', '"feel"', '"later"', '"a"',
    '"x"', '"parts"', '"mood"', '"calm"', "1", "-0", "2.5", "1e999999", "-1e999999", "NaN", "Infinity",
    "null", "true", "9" * 5000, "\x00", "\ud800", "\\ud800", "\\u0000", "```json", "```", " ", "\n",
    '{"name": "add", "arguments": {"a": 1, "b": 2}}', "[" * 2000, "{" * 2000, "☃", "\u202e",
    "<think>", "</think>", "<think>\n", "\n</think>\n\n", "<thi", "</think",
]  # fmt: skip
any_char = st.characters(exclude_categories=())  # surrogates and NUL included
any_text = st.text(any_char, max_size=60)
soup = st.lists(st.sampled_from(FRAGMENTS) | st.text(any_char, max_size=4), max_size=25).map("".join)
json_scalars = (
    st.none() | st.booleans() | st.integers() | st.integers(min_value=10**300, max_value=10**400)
    | st.floats() | st.text(any_char, max_size=10)
)  # fmt: skip
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
arg_names = st.sampled_from(["a", "b", "x", "y", "parts", "sep", "weights", "mood", "times", "text"]) | st.text(
    max_size=4
)
calls = st.builds(
    ToolCall,
    name=st.sampled_from([t.name for t in TOOLS] + ["nope", "Add", "ad"]) | st.text(any_char, min_size=1, max_size=8),
    arguments=st.dictionaries(arg_names, json_values, max_size=4),
)


@st.composite
def written_calls(draw: st.DrawFn) -> str:
    """Calls with random (often wrong) arguments, written in a format, then perhaps cut or spliced."""
    text = format_tool_calls(draw(st.lists(calls, min_size=1, max_size=3)), draw(st.sampled_from(["hermes", "json"])))
    if draw(st.booleans()):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(["", *FRAGMENTS])) + text[at + draw(st.integers(0, 3)) :]
    prefix = draw(st.sampled_from(["", "Let me see.\n", "```json\n", "<think>\n", "<think>\nHm.\n</think>\n\n"]))
    return prefix + text


completions = any_text | soup | written_calls()
fuzz = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@fuzz
@given(text=completions)
def test_random_completions_never_escape(text):
    exercise(text)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=written_calls())
def test_written_calls_with_wrong_arguments_never_escape(text):
    exercise(text, env_too=False)


@settings(max_examples=150, deadline=None)
@given(call=calls)
def test_any_parsed_call_gets_one_result(call):
    """ToolCalls straight from hypothesis, unhindered by JSON: huge ints, NaN, odd names."""
    call.id = "call_0"
    check_results([call], [call_tool(BY_NAME, call)])
    check_results([call], [LOOP.run_until_complete(acall_tool(BY_NAME, call, timeout=10))])


ADVERSARIAL = {
    "deep lists": "[" * 100_000,
    "deep objects": '{"a":' * 50_000,
    "deep inside a block": "<tool_call>" + "[" * 100_000 + "</tool_call>",
    "deep arguments": '<tool_call>{"name": "add", "arguments": ' + "{" * 5000 + "</tool_call>",
    "deep double-encoded": '<tool_call>{"name": "add", "arguments": "' + "[" * 5000 + '"}</tool_call>',
    "5000-digit int": '<tool_call>{"name": "add", "arguments": {"a": ' + "9" * 5000 + ', "b": 1}}</tool_call>',
    "400-digit int as float": '<tool_call>{"name": "ratio", "arguments": {"x": 1' + "0" * 400 + "}}</tool_call>",
    "4000-digit ints summed": '<tool_call>{"name": "add", "arguments": {"a": '
    + "9" * 4000
    + ', "b": '
    + "9" * 4000
    + "}}</tool_call>",
    "infinite floats": '<tool_call>{"name": "ratio", "arguments": {"x": 1e999999, "y": -1e999999}}</tool_call>',
    "NaN": '<tool_call>{"name": "ratio", "arguments": {"x": NaN, "y": 0}}</tool_call>',
    "int as float, exact": '<tool_call>{"name": "add", "arguments": {"a": 1e300, "b": 2.0}}</tool_call>',
    "json huge int": '{"name": "add", "arguments": {"a": ' + "9" * 5000 + "}}",
    "tag spam": "<tool_call>" * 3000,
    "closing tag spam": "</tool_call>" * 3000 + "<tool_call>",
    "fence and whitespace": "```" + " " * 100_000 + "x",
    "fence and newlines": "```json" + "\n" * 50_000,
    "huge name": '<tool_call>{"name": "' + "n" * 100_000 + '", "arguments": {}}</tool_call>',
    "huge argument": '<tool_call>{"name": "join", "arguments": {"parts": ["' + "x" * 100_000 + '"]}}</tool_call>',
    "NUL bytes": "\x00" * 10_000 + '<tool_call>{"name": "later", "arguments": {"text": "\\u0000\x00"}}</tool_call>',
    "surrogates": '<tool_call>{"name": "later", "arguments": {"text": "\\ud800\ud800"}}</tool_call>' + "\udfff" * 100,
    "truncated tags": "<tool_call" + "</tool_call" + "<tool_call>{" + "</tool_",
    "enum and tuple": '<tool_call>{"name": "feel", "arguments": {"mood": "loud", "times": [1, 2.0]}}</tool_call>',
    "zero division": '<tool_call>{"name": "ratio", "arguments": {"x": 1, "y": 0}}</tool_call>',
    "wrong types": '<tool_call>{"name": "join", "arguments": {"parts": "abc", "sep": 1, "weights": {"a": "b"}}}</tool_call>',
    "prose with braces": 'Sets look like {1, 2} and lists like [1, 2]; a call is {"name": ...}.',
    "think spam": "<think>" * 5000 + '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
    "closing think spam": "</think>" * 5000 + '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
    "think and call spam": "<think></think><tool_call>" * 1000,
    "calls inside thinking": "<think>" + '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>' * 50,
}


@pytest.mark.parametrize("text", list(ADVERSARIAL.values()), ids=list(ADVERSARIAL))
def test_adversarial_completions_never_escape(text):
    exercise(text)


def test_the_fuzz_benchmark_corpus_runs_clean():
    """The benchmark script, with a tiny budget: 1000 seeded completions, nothing escapes."""
    path = pathlib.Path(__file__).parents[1] / "benchmarks" / "fuzz_tool_calls.py"
    spec = importlib.util.spec_from_file_location("fuzz_tool_calls", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tally = module.run(1000, seed=1, env_every=10)
    assert tally.completions == 1000 and tally.calls > 300
    assert tally.escaped == [] and tally.broken == []
    assert {"ok", "parse", "bad_arguments", "unknown_tool", "raised"} <= set(tally.results)
    assert tally.reasoning_checks == 3000 and tally.calls_from_reasoning == 0
    assert tally.context_checks == 100 and tally.control_from_env == 0
