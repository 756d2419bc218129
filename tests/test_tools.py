"""Unit tests for agentrl.tools: schemas from hints and docstrings, argument checking, running calls."""

import asyncio
import dataclasses
import datetime
import doctest
import enum
import functools
import json
import subprocess
import sys
import threading
import time
from typing import Annotated, Any, Literal

import pytest

import agentrl.tools
import agentrl.tools.arguments
import agentrl.tools.schema
from agentrl.tools import (
    Tool,
    ToolResult,
    ToolSchemaError,
    acall_tool,
    as_tool,
    call_tool,
    check_arguments,
    tool,
)
from agentrl.types import Message, ToolCall


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Shape(enum.Enum):
    SQUARE = (1, 1)  # a value JSON cannot hold: the schema offers the member names
    LINE = (1, 0)


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


@tool
def everything(
    text: str,
    count: int,
    ratio: float,
    flag: bool,
    numbers: list[int],
    weights: dict[str, float],
    mode: Literal["fast", "slow"],
    color: Color,
    maybe: int | None,
    level: Level = Level.LOW,
    pair: tuple[int, str] = (0, ""),
    scale: float = 1.5,
    note: str | None = None,
) -> dict[str, Any]:
    """Exercise every supported kind of parameter.

    This second paragraph is not part of the description.

    Args:
        text (str): Some text, described over
            two lines.
        count: How many.
        ratio: A ratio.
        flag: A switch.
        numbers: Some integers.
        weights: A weight per name.
        mode: How to run.
        color: A colour.
        maybe: Perhaps an int.
        level: How high.
        pair: Two things.
        scale: A factor.
        note: An optional note.

    Returns:
        Everything it got, with the types it got.
    """
    return {k: type(v).__name__ for k, v in locals().items()}


# --- schemas ----------------------------------------------------------------------------------


def test_schema_has_the_openai_chat_template_shape_and_is_json():
    schema = add.schema
    assert schema == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "The first addend."},
                    "b": {"type": "integer", "description": "The second addend."},
                },
                "required": ["a", "b"],
            },
        },
    }
    assert json.loads(json.dumps(everything.schema)) == everything.schema
    assert add(2, 3) == 5  # a Tool still calls like the function


def test_schema_of_every_supported_type():
    p = everything.parameters["properties"]
    assert p["text"] == {"type": "string", "description": "Some text, described over two lines."}
    assert p["count"]["type"] == "integer" and p["ratio"]["type"] == "number" and p["flag"]["type"] == "boolean"
    assert p["numbers"] == {"type": "array", "items": {"type": "integer"}, "description": "Some integers."}
    assert p["weights"] == {
        "type": "object",
        "additionalProperties": {"type": "number"},
        "description": "A weight per name.",
    }
    assert p["mode"] == {"type": "string", "enum": ["fast", "slow"], "description": "How to run."}
    assert p["color"] == {"type": "string", "enum": ["red", "green"], "description": "A colour."}
    assert p["maybe"] == {"type": "integer", "nullable": True, "description": "Perhaps an int."}
    assert p["level"] == {"type": "integer", "enum": [1, 2], "description": "How high.", "default": 1}
    assert p["pair"]["prefixItems"] == [{"type": "integer"}, {"type": "string"}] and p["pair"]["default"] == [0, ""]
    assert p["scale"] == {"type": "number", "description": "A factor.", "default": 1.5}
    assert p["note"] == {"type": "string", "nullable": True, "description": "An optional note.", "default": None}
    assert everything.parameters["required"] == [
        "text",
        "count",
        "ratio",
        "flag",
        "numbers",
        "weights",
        "mode",
        "color",
        "maybe",
    ]


def test_description_is_the_first_paragraph_only():
    assert everything.description == "Exercise every supported kind of parameter."

    @tool
    def wrapped(x: int) -> int:
        """Do a thing that takes
        two lines to say.
        Args:
            x: The thing.
        """
        return x

    assert wrapped.description == "Do a thing that takes two lines to say."
    assert wrapped.parameters["properties"]["x"]["description"] == "The thing."

    @tool
    def bare(x: int) -> int:
        return x

    assert bare.description == "" and "description" not in bare.parameters["properties"]["x"]


def test_args_section_ends_at_the_next_section_and_keeps_continuations():
    @tool
    def f(x: int, y: int = 0) -> int:
        """Sum.

        Args:
            x: First line.
                Note: a continuation that looks like an entry.
            y: Second.
        Returns:
            x: not a parameter.
        """
        return x + y

    p = f.parameters["properties"]
    assert p["x"]["description"] == "First line. Note: a continuation that looks like an entry."
    assert p["y"]["description"] == "Second."


def test_annotated_description_and_other_supported_hints():
    @tool
    def f(
        x: Annotated[int, "An annotated int."],
        xs: tuple[float, ...],
        anything: Any,
        either: int | str,
        shape: Shape = Shape.SQUARE,
        items: list = [],  # noqa: B006 - the schema of a mutable default is what is tested
    ) -> str:
        """F."""
        return ""

    p = f.parameters["properties"]
    assert p["x"] == {"type": "integer", "description": "An annotated int."}
    assert p["xs"] == {"type": "array", "items": {"type": "number"}}
    assert p["anything"] == {}
    assert p["either"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert p["shape"] == {"type": "string", "enum": ["SQUARE", "LINE"], "default": "SQUARE"}
    assert p["items"] == {"type": "array", "items": {}, "default": []}


def test_async_functions_partials_and_named_tools():
    @tool(name="fetch-page", timeout=3)
    async def fetch(url: str) -> str:
        """Fetch a page."""
        return url

    assert fetch.name == "fetch-page" and fetch.timeout == 3 and fetch.parameters["required"] == ["url"]
    assert asyncio.run(fetch.fn(url="u")) == "u"

    def power(base: int, exponent: int) -> int:
        """Raise base to exponent."""
        return base**exponent

    square = tool(functools.partial(power, exponent=2))
    assert square.name == "power" and square.parameters["properties"]["exponent"]["default"] == 2
    assert call_tool({"power": square}, ToolCall("power", {"base": 7})).content == "49"
    assert as_tool(add) is add and as_tool(power).name == "power"


@pytest.mark.parametrize(
    "source, message",
    [
        ("def f(x): return x", r"f\(x\) has no type hint; add one, e.g. 'x: str'"),
        ("def f(*xs: int): return xs", r"takes \*xs; tools need named, typed parameters"),
        ("def f(**kw: int): return kw", r"takes \*\*kw"),
        ("def f(x: bytes): return x", r"f\(x\) has type <class 'bytes'>, which has no JSON schema here; use str"),
        ("def f(x: complex): return x", r"which has no JSON schema"),
        ("def f(x: dict[int, str]): return x", r"JSON object keys are strings, use dict\[str, ...\]"),
        ("def f(x: int, /): return x", r"positional-only"),
        ("def f(x: 'Undefined'): return x", r"Cannot read the type hints of tool 'f': NameError"),
        ("def f(x: Literal[b'raw']): return x", r"Literal values must be str, int, float, bool or None"),
        ("f = lambda x: x", r"Tool name '<lambda>' is not allowed.*@tool\(name=...\)"),
    ],
)
def test_functions_that_cannot_be_tools_get_a_clear_schema_error(source, message):
    namespace: dict[str, Any] = {"Literal": Literal}
    exec(source, namespace)
    with pytest.raises(ToolSchemaError, match=message):
        tool(namespace["f"])
    assert issubclass(ToolSchemaError, TypeError)


def test_bad_timeouts_are_refused():
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="positive number of seconds"):
            tool(timeout=bad)


def test_schema_renders_through_a_transformers_chat_template():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "user", "tool", "What", "is", "2", "+", "3", "?"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    # Every newline is an explicit string: transformers renders with trim_blocks and lstrip_blocks.
    template = (
        "{%- if tools %}{{ '<tools>\\n' }}"
        "{%- for t in tools %}{{ t.function.name + ': ' + t.function.description + '\\n' }}"
        "{%- for name, p in t.function.parameters.properties.items() %}"
        "{{ '  ' + name + ' (' + p.type }}{% if name in t.function.parameters.required %}{{ ', required' }}{% endif %}"
        "{{ '): ' + p.description + '\\n' }}{%- endfor %}"
        "{{ 'JSON: ' + (t | tojson) + '\\n' }}{%- endfor %}{{ '</tools>\\n' }}{%- endif %}"
        "{%- for m in messages %}{{ '<' + m.role + '>' + m.content + '</' + m.role + '>' }}{%- endfor %}"
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", chat_template=template)
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    prompt = tokenizer.apply_chat_template(messages, tools=[add.schema, everything.schema], tokenize=False)
    assert isinstance(prompt, str)
    assert "add: Add two integers." in prompt
    assert "  a (integer, required): The first addend." in prompt
    assert "  note (string): An optional note." in prompt
    assert "everything: Exercise every supported kind of parameter." in prompt
    rendered = [json.loads(line[len("JSON: ") :]) for line in prompt.splitlines() if line.startswith("JSON: ")]
    assert rendered == [add.schema, everything.schema]
    assert prompt.endswith("<user>What is 2 + 3?</user>")
    ids = tokenizer.apply_chat_template(messages, tools=[add.schema], tokenize=True)
    assert len(ids) > 0


# --- checking arguments -----------------------------------------------------------------------


def test_check_arguments_coerces_numbers_by_the_documented_rules():
    @tool
    def f(i: int, x: float, xs: list[int], w: dict[str, float]) -> None:
        """F."""

    assert check_arguments(f, {"i": 2.0, "x": 3, "xs": [1, 2.0], "w": {"a": 1}}) == {
        "i": 2,
        "x": 3.0,
        "xs": [1, 2],
        "w": {"a": 1.0},
    }
    checked = check_arguments(f, {"i": 2.0, "x": 3, "xs": [], "w": {}})
    assert type(checked["i"]) is int and type(checked["x"]) is float
    assert check_arguments(f, {"i": 1e300, "x": float("inf"), "xs": [], "w": {}})["i"] == int(1e300)
    for bad, expected in [
        ({"i": 2.5}, "argument 'i': expected an integer, got 2.5"),
        ({"i": "2"}, "argument 'i': expected an integer, got \"2\""),
        ({"i": True}, "argument 'i': expected an integer, got true"),
        ({"i": float("inf")}, "argument 'i': expected an integer"),
        ({"x": False}, "argument 'x': expected a number, got false"),
        ({"x": "1.5"}, "argument 'x': expected a number"),
        ({"x": 10**400}, "argument 'x': the number"),
        ({"xs": [1, "2"]}, "argument 'xs': item 1: expected an integer, got \"2\""),
        ({"xs": {"0": 1}}, "argument 'xs': expected a list"),
        ({"w": {"a": "heavy"}}, "argument 'w': key 'a': expected a number"),
        ({"w": [1]}, "argument 'w': expected an object"),
    ]:
        arguments = {"i": 1, "x": 1.0, "xs": [], "w": {}, **bad}
        assert expected in check_arguments(f, arguments)


def test_check_arguments_reports_unknown_missing_and_non_object_arguments():
    assert check_arguments(add, {"a": 1, "b": 2, "c": 3}) == "unknown argument(s) ['c']; add takes ['a', 'b']"
    assert check_arguments(add, {"a": 1}) == "missing required argument(s) ['b']"
    assert check_arguments(add, [1, 2]) == "arguments must be a JSON object, got list"
    assert check_arguments(add, {"a": 1, 5: 2, "b": 2}) == "unknown argument(s) ['5']; add takes ['a', 'b']"


def test_literals_enums_tuples_unions_and_nulls():
    arguments = {
        "text": "t", "count": 1, "ratio": 1, "flag": True, "numbers": [], "weights": {},
        "mode": "fast", "color": "green", "maybe": None, "level": 2.0, "pair": [1, "x"],
    }  # fmt: skip
    checked = check_arguments(everything, arguments)
    assert checked["color"] is Color.GREEN and checked["level"] is Level.HIGH
    assert checked["pair"] == (1, "x") and checked["maybe"] is None
    assert (
        json.loads(call_tool({"everything": everything}, ToolCall("everything", arguments)).content)["color"] == "Color"
    )
    for bad, expected in [
        ({"mode": "medium"}, "argument 'mode': must be one of ['fast', 'slow'], got \"medium\""),
        ({"color": "RED"}, "argument 'color': must be one of ['red', 'green'], got \"RED\""),
        ({"level": True}, "argument 'level': must be one of [1, 2], got true"),
        ({"pair": [1]}, "argument 'pair': expected a list of exactly 2 items, got 1"),
        ({"pair": [1, 2]}, "argument 'pair': item 1: expected a string, got 2"),
        ({"count": None}, "argument 'count': expected an integer, got null"),
    ]:
        assert check_arguments(everything, {**arguments, **bad}) == expected

    @tool
    def g(x: int | str | None, y: int = None, s: Shape = Shape.LINE) -> str:  # type: ignore[assignment]
        """G."""
        return f"{x!r} {y!r} {s!r}"

    assert check_arguments(g, {"x": None, "y": None}) == {"x": None, "y": None}
    assert check_arguments(g, {"x": "a", "s": "SQUARE"}) == {"x": "a", "s": Shape.SQUARE}
    assert check_arguments(g, {"x": [1]}) == "argument 'x': [1] matches none of the allowed types"


# --- running calls ----------------------------------------------------------------------------


def tools_by_name(*tools: Tool) -> dict[str, Tool]:
    return {t.name: t for t in tools}


@tool
def explode(reason: str) -> str:
    """Always fails."""
    raise ZeroDivisionError(f"cannot divide: {reason}")


@tool
def quit_program() -> str:
    """Calls sys.exit, which must not end the episode."""
    sys.exit(3)


def assert_error(result: ToolResult, kind: str, *fragments: str) -> None:
    assert isinstance(result, ToolResult) and result.error_kind == kind and result.error
    assert result.content.startswith("Error: ") and result.content.startswith(f"Error: {result.error}. ")
    advice = result.content[len(f"Error: {result.error}. ") :]
    assert len(advice) > 10, "every error tells the model what to do"
    for fragment in fragments:
        assert fragment in result.content, (fragment, result.content)
    message = result.to_message()
    assert isinstance(message, Message) and message.role == "tool" and message.tool_call_id == result.call.id


@pytest.mark.parametrize("runner", ["sync", "async"])
def test_every_kind_of_bad_call_is_an_error_result(runner):
    tools = tools_by_name(add, explode, quit_program)

    def run(call: ToolCall) -> ToolResult:
        if runner == "sync":
            return call_tool(tools, call, timeout=5)
        return asyncio.run(acall_tool(tools, call, timeout=5))

    assert_error(
        run(ToolCall("mul", {}, id="c1")),
        "unknown_tool",
        "unknown tool 'mul'; available tools: add, explode, quit_program",
        "Call one of them",
    )
    assert_error(run(ToolCall("ad", {})), "unknown_tool", "Did you mean 'add'?")
    assert_error(
        run(ToolCall("add", {"a": 1})),
        "bad_arguments",
        "missing required argument(s) ['b']",
        "add takes a (integer), b (integer)",
    )
    assert_error(run(ToolCall("add", {"a": 1, "b": 2, "c": 3})), "bad_arguments", "unknown argument(s) ['c']")
    assert_error(
        run(ToolCall("add", {"a": "one", "b": 2})),
        "bad_arguments",
        "argument 'a': expected an integer, got \"one\"",
        "call it again",
    )
    assert_error(
        run(ToolCall("explode", {"reason": "zero"})), "raised", "explode raised ZeroDivisionError: cannot divide: zero"
    )
    assert_error(run(ToolCall("quit_program", {})), "raised", "quit_program raised SystemExit: 3")
    assert_error(
        run(ToolCall("add", {"a": 1, "b": 2}, error="bad JSON")),
        "parse",
        "could not parse the tool call: bad JSON",
        '"arguments"',
    )
    good = run(ToolCall("add", {"a": 1, "b": 2}, id="c9"))
    assert (good.content, good.error, good.error_kind, good.timed_out) == ("3", None, None, False)
    assert good.to_message() == Message("tool", "3", tool_call_id="c9", name="add")


def test_a_call_with_a_parse_error_is_never_executed():
    ran = []

    @tool
    def record(x: int) -> int:
        """Record x."""
        ran.append(x)
        return x

    for result in (
        call_tool({"record": record}, ToolCall("record", {"x": 1}, error="unclosed block")),
        asyncio.run(acall_tool({"record": record}, ToolCall("record", {"x": 1}, error="unclosed block"))),
    ):
        assert_error(result, "parse", "unclosed block")
    assert ran == []


def test_the_tool_raising_timeouterror_is_not_reported_as_a_time_limit():
    @tool
    def flaky() -> str:
        """Its own network call timed out."""
        raise TimeoutError("upstream timed out")

    result = call_tool({"flaky": flaky}, ToolCall("flaky", {}), timeout=5)
    assert_error(result, "raised", "flaky raised TimeoutError: upstream timed out")
    assert not result.timed_out


def test_a_sync_tool_past_its_limit_returns_quickly_and_is_abandoned():
    release = threading.Event()

    @tool(timeout=0.2)
    def hang() -> str:
        """Wait far past the limit."""
        release.wait(30)
        return "late"

    try:
        for run in (
            lambda: call_tool({"hang": hang}, ToolCall("hang", {}), timeout=60),
            lambda: asyncio.run(acall_tool({"hang": hang}, ToolCall("hang", {}))),
        ):
            started = time.perf_counter()
            result = run()
            assert time.perf_counter() - started < 1.5
            assert result.timed_out
            assert_error(result, "timeout", "hang ran longer than its limit of 0.2 s", "different approach")
    finally:
        release.set()


def test_the_call_timeout_applies_when_the_tool_sets_none():
    release = threading.Event()

    @tool
    def wait() -> str:
        """Wait."""
        release.wait(30)
        return "late"

    try:
        result = call_tool({"wait": wait}, ToolCall("wait", {}), timeout=0.1)
        assert result.timed_out and "limit of 0.1 s" in result.content
    finally:
        release.set()


def test_an_async_tool_past_its_limit_is_cancelled():
    cancelled = threading.Event()

    @tool(timeout=0.2)
    async def sleepy() -> str:
        """Sleep far past the limit."""
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "late"

    async def main() -> tuple[ToolResult, float]:
        started = time.perf_counter()
        result = await acall_tool({"sleepy": sleepy}, ToolCall("sleepy", {}))
        return result, time.perf_counter() - started

    result, elapsed = asyncio.run(main())
    assert result.timed_out and elapsed < 1.5 and cancelled.is_set()
    assert_error(result, "timeout", "sleepy ran longer than its limit of 0.2 s")

    cancelled.clear()
    started = time.perf_counter()
    result = call_tool({"sleepy": sleepy}, ToolCall("sleepy", {}))  # in its own loop, from sync code
    assert result.timed_out and time.perf_counter() - started < 1.5
    assert cancelled.wait(3), "the private loop cancels the coroutine soon after the limit"


def test_acall_tool_runs_sync_and_async_tools_without_blocking_the_loop():
    @tool
    def slow_sync(x: int) -> int:
        """Sleep a little in a thread."""
        time.sleep(0.3)
        return x

    @tool
    async def slow_async(x: int) -> int:
        """Sleep a little on the loop."""
        await asyncio.sleep(0.3)
        return x

    tools = tools_by_name(slow_sync, slow_async)

    async def main() -> tuple[list[ToolResult], float]:
        started = time.perf_counter()
        calls = [ToolCall(name, {"x": i}) for i in range(4) for name in ("slow_sync", "slow_async")]
        results = await asyncio.gather(*(acall_tool(tools, c, timeout=5) for c in calls))
        return list(results), time.perf_counter() - started

    results, elapsed = asyncio.run(main())
    assert [r.content for r in results] == ["0", "0", "1", "1", "2", "2", "3", "3"]
    assert elapsed < 1.0, "eight 0.3 s calls ran concurrently"


def test_cancelling_acall_tool_cancels_an_async_tool():
    cancelled = threading.Event()

    @tool
    async def forever() -> str:
        """Never ends by itself."""
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return ""

    async def main() -> None:
        task = asyncio.create_task(acall_tool({"forever": forever}, ToolCall("forever", {})))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert cancelled.is_set()


def test_sync_tools_returning_awaitables_and_async_callables():
    async def later(x: int) -> int:
        return x + 1

    @tool
    def deferred(x: int) -> Any:
        """Returns a coroutine."""
        return later(x)

    class Doubler:
        __name__ = "double"

        async def __call__(self, x: int) -> int:
            return 2 * x

    double = tool(Doubler())
    tools = tools_by_name(deferred, double)
    assert call_tool(tools, ToolCall("deferred", {"x": 1})).content == "2"
    assert asyncio.run(acall_tool(tools, ToolCall("deferred", {"x": 1}))).content == "2"
    assert call_tool(tools, ToolCall("double", {"x": 4})).content == "8"
    assert asyncio.run(acall_tool(tools, ToolCall("double", {"x": 4}))).content == "8"


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no")

    __repr__ = __str__


def deep_list(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def cyclic() -> list[Any]:
    value: list[Any] = [1]
    value.append(value)
    return value


@pytest.mark.parametrize(
    "value, expected",
    [
        ("plain text", "plain text"),
        (None, "null"),
        ({"a": [1, 2.5, True]}, '{"a": [1, 2.5, true]}'),
        ({3, 1, 2}, "[1, 2, 3]"),
        (Point(1, 2), '{"x": 1, "y": 2}'),
        (b"caf\xc3\xa9 \xff", "café \ufffd"),
        (Color.RED, "red"),
        ({"when": datetime.date(2024, 1, 2)}, '{"when": "2024-01-02"}'),
        (object, "<class 'object'>"),
        (10**5000, "an integer with thousands of digits"),
        (cyclic(), "[1, [...]]"),
        (Unprintable(), "<Unprintable instance at"),
        ("snow ☃ \x00 nul", "snow ☃ \x00 nul"),
        (["lone \ud800"], '["lone \ufffd"]'),
    ],
    ids=[
        "str",
        "None",
        "dict",
        "set",
        "dataclass",
        "bytes",
        "enum",
        "date",
        "class",
        "huge-int",
        "cycle",
        "unprintable",
        "nul",
        "surrogate",
    ],
)
def test_return_values_of_any_kind_become_text(value, expected):
    @tool
    def give() -> Any:
        """Return the value."""
        return value

    for result in (
        call_tool({"give": give}, ToolCall("give", {})),
        call_tool({"give": give}, ToolCall("give", {}), timeout=5),
    ):
        assert result.error is None and result.content.startswith(expected)
        assert len(result.content) == len(expected) or isinstance(value, Unprintable)


def test_a_deeply_nested_return_value_does_not_escape():
    @tool
    def deep() -> Any:
        """Return 100 000 nested lists."""
        return deep_list(100_000)

    result = call_tool({"deep": deep}, ToolCall("deep", {}))
    assert result.error is None and isinstance(result.content, str) and result.content.startswith("[[")


def test_error_texts_stay_short_whatever_the_model_sent():
    huge = "x" * 1_000_000
    result = call_tool(tools_by_name(add, explode), ToolCall("add", {"a": huge, "b": 10**5000}))
    assert result.error_kind == "bad_arguments" and len(result.content) < 400
    result = call_tool(tools_by_name(add, explode), ToolCall("explode", {"reason": huge}))
    assert result.error_kind == "raised" and len(result.content) < 500
    result = call_tool(tools_by_name(add), ToolCall(huge, {}))
    assert result.error_kind == "unknown_tool" and len(result.content) < 300


def test_tool_threads_are_reused_and_never_delay_interpreter_exit():
    before = threading.active_count()
    for i in range(200):
        assert call_tool({"add": add}, ToolCall("add", {"a": i, "b": 1}), timeout=5).content == str(i + 1)
    assert threading.active_count() - before <= 2

    script = (
        "import time\n"
        "from agentrl.tools import tool, call_tool\n"
        "from agentrl.types import ToolCall\n"
        "@tool(timeout=0.1)\n"
        "def hang() -> str:\n"
        "    '''Hang.'''\n"
        "    time.sleep(60)\n"
        "    return 'late'\n"
        "print(call_tool({'hang': hang}, ToolCall('hang', {})).timed_out)\n"
    )
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr
    assert time.perf_counter() - started < 30, "a hung tool thread held up interpreter exit"


def test_docstring_examples():
    for module in (agentrl.tools, agentrl.tools.schema, agentrl.tools.arguments):
        assert doctest.testmod(module).failed == 0, module.__name__
