"""Unit tests for agentrl.tool_calls: reading tool calls out of completions, and writing them."""

import doctest
import json
import math
import re
import time

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import agentrl.tool_calls
from agentrl.tool_calls import (
    THINK_TAGS,
    TOOL_CALL_FORMATS,
    TOOL_FORMATS,
    ToolCallFormat,
    format_tool_calls,
    parse_reply,
)
from agentrl.types import Message, ToolCall

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def calls_of(text: str, format: str = "auto") -> list[tuple[str, dict, str | None]]:
    return [(c.name, c.arguments, c.error) for c in parse_reply(text, format).tool_calls]


# --- hermes -----------------------------------------------------------------------------------


def test_hermes_single_call_moves_out_of_the_content():
    reply = parse_reply("Let me add.\n" + CALL + "\n")
    assert reply == Message("assistant", "Let me add.", tool_calls=[ToolCall("add", {"a": 1, "b": 2}, id="call_0")])


def test_hermes_multiple_calls_are_numbered_in_order():
    text = 'First.<tool_call>{"name": "a", "arguments": {}}</tool_call> then <tool_call>{"name": "b", "arguments": {"x": [1]}}</tool_call> done.'
    reply = parse_reply(text)
    assert [(c.name, c.arguments, c.id) for c in reply.tool_calls] == [("a", {}, "call_0"), ("b", {"x": [1]}, "call_1")]
    assert reply.content == "First. then  done."


def test_hermes_unclosed_block_at_the_end_is_read_when_its_json_is_complete():
    # vLLM and most servers drop a `</tool_call>` stop string from the returned text.
    assert calls_of('<tool_call>{"name": "add", "arguments": {"a": 1}}') == [("add", {"a": 1}, None)]
    assert calls_of('<tool_call>{"name": "add", "arguments": {"a": 1}}\n  ') == [("add", {"a": 1}, None)]
    ((_, _, error),) = calls_of('<tool_call>{"name": "add", "argu')
    assert "not valid JSON" in error and "not closed" in error and "cut off" in error


def test_hermes_block_left_open_before_the_next_one_is_an_error_and_does_not_swallow_it():
    text = '<tool_call>{"name": "a", "arguments": {}}\n<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    (a_name, _, a_error), (b_name, _, b_error) = calls_of(text)
    assert a_name == "a" and "not closed with </tool_call> before the next <tool_call>" in a_error
    assert (b_name, b_error) == ("b", None)


@pytest.mark.parametrize(
    "body, expected",
    [
        ("{oops", "the text inside <tool_call> is not valid JSON"),
        ("", "the text inside <tool_call> is not valid JSON"),
        ("[1, 2]", "a tool call must be a JSON object with 'name' and 'arguments', got a list"),
        ('"add"', "got a string"),
        ('{"arguments": {}}', "a tool call needs a 'name' string, got none"),
        ('{"name": 3, "arguments": {}}', "a tool call needs a 'name' string, got a number"),
        ('{"name": "", "arguments": {}}', "a tool call needs a 'name' string"),
        ('{"name": "f", "arguments": [1, 2]}', "'arguments' of f must be a JSON object, got a list"),
        ('{"name": "f", "arguments": 7}', "'arguments' of f must be a JSON object, got a number"),
        ('{"name": "f", "arguments": "{not json"}', "'arguments' of f is a string that is not valid JSON"),
        ('{"name": "f", "arguments": "[1]"}', "'arguments' of f must be a JSON object, got a list"),
        ('{"name": "f", "arguments": {"x": 1}', "not valid JSON"),
        ("[" * 100_000, "not valid JSON"),
        ('{"name": "f", "arguments": {"x": ' + "9" * 5000 + "}}", "not valid JSON"),
    ],
    ids=lambda v: v[:40] if isinstance(v, str) else None,
)
def test_hermes_bad_blocks_become_error_calls_that_keep_the_order(body, expected):
    reply = parse_reply(f"Hi <tool_call>{body}</tool_call>{CALL}")
    bad, good = reply.tool_calls
    assert expected in bad.error and bad.arguments == {} and bad.id == "call_0"
    assert (good.name, good.arguments, good.error, good.id) == ("add", {"a": 1, "b": 2}, None, "call_1")
    assert reply.content == "Hi"


def test_hermes_accepts_double_encoded_arguments_parameters_and_null():
    assert calls_of('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>') == [("f", {"x": 1}, None)]
    assert calls_of('<tool_call>{"name": "f", "arguments": "  "}</tool_call>') == [("f", {}, None)]
    assert calls_of('<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>') == [("f", {"x": 1}, None)]
    assert calls_of('<tool_call>{"name": "f", "arguments": null}</tool_call>') == [("f", {}, None)]
    assert calls_of('<tool_call>{"name": "f"}</tool_call>') == [("f", {}, None)]
    wrapped = '<tool_call>{"type": "function", "function": {"name": "f", "arguments": {"x": 2}}}</tool_call>'
    assert calls_of(wrapped) == [("f", {"x": 2}, None)]


def test_huge_numbers_parse_without_raising():
    ((name, arguments, error),) = calls_of(
        '<tool_call>{"name": "f", "arguments": {"x": 1e999999, "y": -1e999999}}</tool_call>'
    )
    assert error is None and arguments == {"x": math.inf, "y": -math.inf}
    ((_, arguments, error),) = calls_of('<tool_call>{"name": "f", "arguments": {"x": 1' + "0" * 4000 + "}}</tool_call>")
    assert error is None and arguments["x"] == 10**4000


def test_lone_surrogate_escapes_become_replacement_characters():
    # json.loads turns "\\ud800" into a lone surrogate, which tokenizers and UTF-8 files refuse.
    text = '<tool_call>{"name": "f\\udc00", "arguments": {"x": "\\ud800 ok \\ud83d\\ude00", "\\udfff": ["\\ud800"]}}</tool_call>'
    ((name, arguments, error),) = calls_of(text)
    assert error is None and name == "f\ufffd"
    assert arguments == {"x": "\ufffd ok 😀", "\ufffd": ["\ufffd"]}
    double = '{"name": "f", "arguments": "{\\"x\\": \\"\\\\ud800\\"}"}'
    assert calls_of(double, "json") == [("f", {"x": "\ufffd"}, None)]


def test_tag_spam_gives_one_error_call_per_tag_in_linear_time():
    started = time.perf_counter()
    reply = parse_reply("<tool_call>" * 20_000)
    assert len(reply.tool_calls) == 20_000 and all(c.error for c in reply.tool_calls)
    assert reply.tool_calls[-1].id == "call_19999" and reply.content == ""
    reply = parse_reply("</tool_call>" * 20_000 + "<tool_call>" + "x" * 200_000)
    assert len(reply.tool_calls) == 1 and reply.content == "</tool_call>" * 20_000
    assert time.perf_counter() - started < 5


def test_stray_closing_tag_and_prose_mentioning_the_tag():
    assert parse_reply("done </tool_call>") == Message("assistant", "done </tool_call>")
    ((_, _, error),) = calls_of("I could use <tool_call> tags here.")
    assert error and "not valid JSON" in error


# --- json -------------------------------------------------------------------------------------


@pytest.mark.parametrize("format", ["auto", "json"])
def test_json_bare_object_list_and_fence(format):
    one = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    assert parse_reply(one, format) == Message(
        "assistant", "", tool_calls=[ToolCall("add", {"a": 1, "b": 2}, id="call_0")]
    )
    two = f'  [{one}, {{"name": "neg", "parameters": {{"x": 3}}}}]\n'
    assert calls_of(two, format) == [("add", {"a": 1, "b": 2}, None), ("neg", {"x": 3}, None)]
    assert [c.id for c in parse_reply(two, format).tool_calls] == ["call_0", "call_1"]
    for fenced in (f"```json\n{one}\n```", f"```\n{one}\n```", f"```JSON {one}```", f"```json\n{one}"):
        assert calls_of(fenced, format) == [("add", {"a": 1, "b": 2}, None)], fenced


@pytest.mark.parametrize(
    "text",
    [
        "{x} is a set and [1, 2] is a list.",
        "{",
        "[citation needed]",
        "```python\nprint({'a': 1})\n```",
        '{"answer": 42}',
        '{"name": "Ada", "age": 36}',
        '[{"name": "Ada"}, {"name": "Bob"}]',
        "[]",
        "{}",
        'The call would be {"name": ...} but I won\'t make it.',
        '{"name" is the key I need}',
        "```" + " " * 50_000 + "x",
    ],
    ids=lambda v: v[:30],
)
def test_auto_leaves_prose_and_json_answers_alone(text):
    started = time.perf_counter()
    assert parse_reply(text) == Message("assistant", text)
    assert time.perf_counter() - started < 1


def test_auto_reports_broken_json_that_clearly_tried_to_be_a_call():
    text = '{"name": "add", "arguments": {"a": 1,}}'
    reply = parse_reply(text)
    assert reply.content == text and len(reply.tool_calls) == 1
    assert "looks like a JSON tool call but is not valid JSON" in reply.tool_calls[0].error


def test_json_format_is_strict_about_json_but_lets_prose_through():
    assert parse_reply("The answer is 5.", "json") == Message("assistant", "The answer is 5.")
    for text, expected in [
        ('{"answer": 42}', "a tool call needs a 'name' string"),
        ("{x} is a set", "not valid JSON"),
        ("[]", "empty JSON list"),
        ('[{"name": "a", "arguments": {}}, 3]', "got a number"),
        ("[" * 100_000, "not valid JSON"),
    ]:
        reply = parse_reply(text, "json")
        assert reply.content == text and any(expected in (c.error or "") for c in reply.tool_calls), (text, reply)
    # Only the shape differs from auto: a call without arguments is still a call here.
    assert calls_of('{"name": "now"}', "json") == [("now", {}, None)]
    assert calls_of('{"name": "now"}', "auto") == []


def test_formats_choose_their_readers():
    json_call = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    assert parse_reply(json_call, "hermes") == Message("assistant", json_call)
    assert parse_reply(CALL, "json") == Message("assistant", CALL)  # tags are plain text to the json reader
    assert calls_of(CALL, "hermes") == calls_of(CALL, "auto") == [("add", {"a": 1, "b": 2}, None)]
    with pytest.raises(ValueError, match="Unknown tool-call format 'xml'"):
        parse_reply("x", "xml")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a str, got bytes"):
        parse_reply(b"x")  # type: ignore[arg-type]
    assert TOOL_FORMATS == ("auto", "hermes", "json")


def test_plain_text_and_odd_characters_pass_through_unchanged():
    for text in ("", "   ", "hello", "\x00\ud800 ☃ 🎲", "x" * 100_000):
        for format in TOOL_FORMATS:
            assert parse_reply(text, format) == Message("assistant", text)


# --- reasoning blocks -------------------------------------------------------------------------

THINKING = "<think>\nShould I add? " + CALL + " No, I know it.\n</think>"
ADD = [("add", {"a": 1, "b": 2}, None)]


def test_every_format_declares_its_reasoning_tags():
    assert THINK_TAGS == ("<think>", "</think>")
    assert {name: f.reasoning_tags for name, f in TOOL_CALL_FORMATS.items()} == {
        "auto": (THINK_TAGS,),
        "hermes": (THINK_TAGS,),
        "json": (THINK_TAGS,),
    }
    assert all(isinstance(f, ToolCallFormat) and f.name == name for name, f in TOOL_CALL_FORMATS.items())


@pytest.mark.parametrize("format", TOOL_FORMATS)
def test_a_call_inside_reasoning_is_not_read_and_the_reply_is_kept_as_written(format):
    for text in (
        THINKING + "\n\n3",
        THINKING,
        "  " + THINKING + " 3 ",
        '<think>{"name": "add", "arguments": {}}</think>',
    ):
        assert parse_reply(text, format) == Message("assistant", text), (format, text)


@pytest.mark.parametrize("format", ["auto", "hermes"])
def test_a_call_after_reasoning_is_read_and_the_reasoning_stays_in_the_content(format):
    reply = parse_reply(THINKING + "\n\n" + CALL, format)
    assert calls_of(THINKING + "\n\n" + CALL, format) == ADD
    assert reply.content == THINKING  # only the call's block leaves the content
    text = f"{THINKING}\nLet me add.\n{CALL}\nDone."
    assert parse_reply(text, format).content == f"{THINKING}\nLet me add.\n\nDone."


@pytest.mark.parametrize("format", ["auto", "json"])
def test_json_reads_the_text_after_reasoning(format):
    one = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    text = f"<think>\nI need {one} here.\n</think>\n\n{one}"
    assert parse_reply(text, format) == Message(
        "assistant",
        f"<think>\nI need {one} here.\n</think>",
        tool_calls=[ToolCall("add", {"a": 1, "b": 2}, id="call_0")],
    )
    fenced = f"<think>ok</think>\n```json\n[{one}, {one}]\n```"
    assert calls_of(fenced, format) == ADD * 2
    # Only reasoning and prose: a final answer; JSON only inside reasoning: not read.
    for plain in (f"<think>{one}</think>\nThe answer is 3.", f"<think>\n{one}", f"Maybe <think>{one}</think>"):
        assert parse_reply(plain, format) == Message("assistant", plain)


def test_auto_reads_json_when_the_only_tool_call_tag_is_inside_reasoning():
    one = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    text = f"<think>Not {CALL}.</think>\n{one}"
    assert calls_of(text) == ADD and calls_of(text, "hermes") == []


@pytest.mark.parametrize("format", ["auto", "hermes"])
def test_an_unclosed_reasoning_block_runs_to_the_end(format):
    for text in ("<think>\nFirst " + CALL, "Answer: 3. <think> then " + CALL + CALL, "<think>" + "</tool_call>" + CALL):
        assert parse_reply(text, format) == Message("assistant", text), text
    # A call before the block is read; the block and all after it stay in the content.
    reply = parse_reply(CALL + "\n<think>and " + CALL, format)
    assert calls_of(CALL + "\n<think>and " + CALL, format) == ADD and reply.content == "<think>and " + CALL


@pytest.mark.parametrize("format", ["auto", "hermes"])
def test_several_reasoning_blocks_each_hide_their_calls(format):
    neg = '<tool_call>{"name": "neg", "arguments": {"x": 1}}</tool_call>'
    text = f"<think>a {neg}</think>{CALL}<think>b {neg}</think> {neg} <think>c {CALL}"
    reply = parse_reply(text, format)
    assert [(c.name, c.id) for c in reply.tool_calls] == [("add", "call_0"), ("neg", "call_1")]
    assert reply.content == f"<think>a {neg}</think><think>b {neg}</think>  <think>c {CALL}"


@pytest.mark.parametrize("format", ["auto", "hermes"])
def test_a_reasoning_block_ends_at_its_first_closing_tag(format):
    # As vLLM's reasoning parsers and Qwen3's template read it: an opening tag inside reasoning is
    # text (the model may muse about the tag), so a call after the first </think> is read, and a
    # second </think> is stray text.
    text = f"<think>outer <think>inner {CALL}</think> {CALL} </think> done"
    reply = parse_reply(text, format)
    assert calls_of(text, format) == ADD
    assert reply.content == f"<think>outer <think>inner {CALL}</think>  </think> done"


def test_stray_reasoning_tags_and_tags_inside_a_call():
    # A closing tag outside a block is text; reasoning tags inside a <tool_call> block are its JSON.
    assert calls_of("</think>" + CALL) == ADD
    assert parse_reply("</think>" + CALL).content == "</think>"
    inside = '<tool_call>{"name": "echo", "arguments": {"text": "<think>"}}</tool_call> and ' + CALL
    assert calls_of(inside) == [("echo", {"text": "<think>"}, None), *ADD]
    closing = '<tool_call>{"name": "echo", "arguments": {"text": "</think>"}}</tool_call>'
    assert calls_of("<think>no</think>" + closing) == [("echo", {"text": "</think>"}, None)]


def test_reasoning_tags_can_be_given_or_turned_off():
    assert calls_of(THINKING) == []
    assert [(c.name, c.error) for c in parse_reply(THINKING, reasoning_tags=()).tool_calls] == [("add", None)]
    kimi = ("◁think▷", "◁/think▷")
    text = f"◁think▷{CALL}◁/think▷ <think>{CALL}</think>"
    reply = parse_reply(text, "hermes", reasoning_tags=[kimi])
    assert len(reply.tool_calls) == 1 and reply.content == f"◁think▷{CALL}◁/think▷ <think></think>"
    assert parse_reply(text, reasoning_tags=[kimi, THINK_TAGS]) == Message("assistant", text)
    for bad in ([("<think>",)], [("<think>", "")], ["<think></think>"], [("<a>", 3)]):
        with pytest.raises(ValueError, match=r"reasoning_tags must be \(opening, closing\) pairs of non-empty strings"):
            parse_reply("x", reasoning_tags=bad)  # type: ignore[arg-type]


def test_reasoning_tag_spam_parses_in_linear_time():
    started = time.perf_counter()
    assert parse_reply("<think>" * 20_000 + CALL).tool_calls == []
    assert calls_of("</think>" * 20_000 + CALL) == ADD
    reply = parse_reply("<think></think><tool_call></tool_call>" * 10_000)
    assert len(reply.tool_calls) == 10_000 and reply.content == "<think></think>" * 10_000
    reply = parse_reply("<think></think><tool_call>" * 10_000)  # an open block runs to the next one
    assert len(reply.tool_calls) == 10_000 and reply.content == "<think></think>"
    assert parse_reply("<think>" + "<tool_call>" * 20_000 + "</think>" + "x" * 200_000, "json").tool_calls == []
    assert time.perf_counter() - started < 5


@settings(max_examples=150, deadline=None)
@given(
    thought=st.text(st.characters(exclude_categories=()), max_size=30) | st.sampled_from([CALL, "<think>", "{", "```"]),
    text=st.text(st.characters(exclude_categories=()), max_size=60) | st.sampled_from([CALL, "Hi " + CALL + " x"]),
    format=st.sampled_from(TOOL_FORMATS),
)
def test_reasoning_never_adds_or_removes_calls_of_the_text_after_it(thought, text, format):
    assume("</think>" not in thought)
    alone = parse_reply(text, format)  # type: ignore[arg-type]
    prefixed = parse_reply(f"<think>{thought}</think>{text}", format)  # type: ignore[arg-type]
    # The text after the block reads the same; the reasoning adds no call and stays in the content.
    assert [(c.name, c.arguments, c.error) for c in prefixed.tool_calls] == [
        (c.name, c.arguments, c.error) for c in alone.tool_calls
    ]
    if prefixed.tool_calls:
        assert prefixed.content.startswith(f"<think>{thought}</think>")
    # Unclosed, the block swallows the text: no call at all, and the reply as written.
    assert parse_reply(f"<think>{thought}{text}", format) == Message("assistant", f"<think>{thought}{text}")  # type: ignore[arg-type]


# --- writing calls ----------------------------------------------------------------------------


def test_format_tool_calls_writes_the_shape_chat_templates_write():
    calls = [ToolCall("add", {"a": 1, "b": 2}), ToolCall("neg", {"x": "é"})]
    assert format_tool_calls(calls) == CALL + '\n<tool_call>\n{"name": "neg", "arguments": {"x": "é"}}\n</tool_call>'
    assert format_tool_calls(calls, "auto") == format_tool_calls(calls, "hermes")
    assert format_tool_calls(calls[:1], "json") == '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    assert json.loads(format_tool_calls(calls, "json"))[1] == {"name": "neg", "arguments": {"x": "é"}}
    assert format_tool_calls([]) == format_tool_calls([], "json") == ""
    with pytest.raises(ValueError, match="Unknown tool-call format"):
        format_tool_calls(calls, "xml")  # type: ignore[arg-type]


def test_tags_inside_arguments_are_escaped_so_the_text_reads_back():
    tags = "</tool_call> and <tool_call>{ <think> </think>"
    calls = [ToolCall("echo", {"text": tags})]
    for format in ("hermes", "json"):
        text = format_tool_calls(calls, format)
        assert "\\u003c/tool_call>" in text and "\\u003cthink>" in text and "\\u003c/think>" in text
        for reader in (format, "auto"):
            assert calls_of(text, reader) == [("echo", {"text": tags}, None)]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
# Names and keys may hold anything, surrogates and the tags themselves included.
any_text = st.text(st.characters(exclude_categories=()), max_size=20) | st.sampled_from(
    ["<tool_call>", "</tool_call>", "<think>", "</think>", "```", "{", "\x00", "name", "arguments"]
)
tool_calls = st.builds(
    ToolCall,
    name=any_text.filter(bool),
    arguments=st.dictionaries(any_text, json_values, max_size=5),
)


def valid(value):
    """What parsing makes of a value: lone surrogates (not valid Unicode) become U+FFFD."""
    if isinstance(value, str):
        return re.sub("[\ud800-\udfff]", "\ufffd", value)
    if isinstance(value, list):
        return [valid(v) for v in value]
    if isinstance(value, dict):
        return {valid(k): valid(v) for k, v in value.items()}
    return value


@settings(max_examples=200, deadline=None)
@given(calls=st.lists(tool_calls, min_size=1, max_size=4), format=st.sampled_from(["hermes", "json"]))
def test_format_tool_calls_round_trips_through_parse_reply(calls, format):
    text = format_tool_calls(calls, format)
    for reader in (format, "auto"):
        reply = parse_reply(text, reader)  # type: ignore[arg-type]
        assert reply.content == ""
        expected = [(valid(c.name), valid(c.arguments), None) for c in calls]
        assert [(c.name, c.arguments, c.error) for c in reply.tool_calls] == expected
        assert [c.id for c in reply.tool_calls] == [f"call_{i}" for i in range(len(calls))]


def test_docstring_examples():
    assert doctest.testmod(agentrl.tool_calls).failed == 0
