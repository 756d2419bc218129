"""Fuzz the tool-call path with a large, seeded corpus of random and adversarial completions.

    python benchmarks/fuzz_tool_calls.py --n 100000            # about a minute on 2 cores
    python benchmarks/fuzz_tool_calls.py --n 2000 --seed 7     # a quick look

Every completion goes through ``parse_reply`` in each format; every call parsed in ``auto`` goes
through ``call_tool`` (in the calling thread) and ``acall_tool`` (on an event loop); every
``--env-every``-th completion also goes through an ``AgentEnv``'s ``step`` and ``astep``. Every
completion is also hidden in a reasoning block, in each format: after a closed ``<think>`` block
holding it the completion must read exactly as alone, and inside an unclosed one it must give no
call and stay as written (a call read from inside reasoning breaks the invariant). The script prints
how many completions it tried, how many calls they held, the results by error kind, the calls read
from inside reasoning, the control token ids that came from env text (every ``--env-every``-th
completion and its calls' results are encoded as an observation by a ChatML agent, whose control
ids must be those of the same messages with plain text), the exceptions that escaped and broken
invariants (all must be 0) and the throughput, and exits 1 if anything escaped or broke. No hypothesis needed: the corpus is drawn
from ``random.Random(seed)``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import enum
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from agentrl.env import AgentEnv, Observation
from agentrl.tool_calls import THINK_TAGS, TOOL_FORMATS, format_tool_calls, parse_reply
from agentrl.tools import Tool, ToolResult, acall_tool, call_tool, tool
from agentrl.types import Message, ToolCall


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def divide(a: float, b: float) -> float:
    """Divide a by b (raises on zero)."""
    return a / b


@tool
def concat(parts: list[str], sep: str = "") -> str:
    """Join strings."""
    return sep.join(parts)


@tool
def lookup(table: dict[str, int], key: str) -> int:
    """Look a key up (raises KeyError when it is missing)."""
    return table[key]


@tool
def paint(color: Color, shade: int | None = None) -> Color:
    """Return the colour (an Enum, so the result needs converting to text)."""
    return color


@tool
def bag(items: tuple[str, ...] = (), n: int = 0) -> Any:
    """Return things JSON cannot hold as they are."""
    return {"set": set(items), "n": n, "obj": object()} if n % 2 else set(items) | {n}


@tool
async def shout(text: str) -> str:
    """An async tool."""
    await asyncio.sleep(0)
    return text.upper()


TOOLS: list[Tool] = [add, divide, concat, lookup, paint, bag, shout]
TOOLS_BY_NAME: dict[str, Tool] = {t.name: t for t in TOOLS}
ARG_NAMES = sorted({k for t in TOOLS for k in t.parameters["properties"]} | {"x", "", "arguments"})


class FuzzEnv(AgentEnv):
    """Any reply: tool calls are answered by the base class, anything else ends the episode."""

    tools = TOOLS

    def start(self, options: dict[str, Any] | None) -> Observation:
        return [Message("user", "Use the tools.")]


# --- the corpus -------------------------------------------------------------------------------

FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<tool_call>\n", "\n</tool_call>", "<tool_", "call>", "</tool",
    "{", "}", "[", "]", ":", ",", '"', "\\", '"name"', '"arguments"', '"parameters"', '"function"',
    '"add"', '"a"', '"b"', "1", "-0", "2.5", "1e999999", "-1e999999", "NaN", "Infinity", "null", "true",
    "9" * 5000, "\x00", "\ud800", "\udfff", "\\ud800", "\\u0000", "```json", "```", " ", "\n", "\t", "é",
    "☃", "🎲", "\u202e", "\ufeff", '{"name": "add", "arguments": {"a": 1, "b": 2}}',
    "<think>", "</think>", "<think>\n", "\n</think>\n\n", "<thi", "nk>", "</think",
    "<|im_end|>", "<|im_start|>system\n", "<|im_start|>", "<|endoftext|>", "<|im_", "end|>", "<|eot_id|>",
]  # fmt: skip
ADVERSARIAL = [
    "[" * 100_000,
    "{" * 100_000,
    '{"a":' * 50_000,
    "<tool_call>" + "[" * 100_000 + "</tool_call>",
    '<tool_call>{"name": "add", "arguments": ' + "{" * 5000 + "</tool_call>",
    '<tool_call>{"name": "add", "arguments": {"a": ' + "9" * 10_000 + ', "b": 1}}</tool_call>',
    '<tool_call>{"name": "divide", "arguments": {"a": 1' + "0" * 400 + ', "b": 3}}</tool_call>',
    '<tool_call>{"name": "add", "arguments": {"a": 1e999999, "b": -1e999999}}</tool_call>',
    '{"name": "add", "arguments": {"a": ' + "9" * 5000 + "}}",
    "<tool_call>" * 1000,
    "</tool_call>" * 1000,
    "```" + " " * 100_000 + "x",
    "```json" + "\n" * 50_000,
    '<tool_call>{"name": "concat", "arguments": {"parts": ["' + "x" * 100_000 + '"]}}</tool_call>',
    '<tool_call>{"name": "' + "n" * 100_000 + '", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "add", "arguments": "' + '\\"' * 10_000 + '"}</tool_call>',
    "\x00" * 10_000,
    "\ud800\udc00\udbff" * 1000,
    '<tool_call>{"name": "lookup", "arguments": {"table": {"k": 1}, "key": "missing"}}</tool_call>',
    '<tool_call>{"name": "divide", "arguments": {"a": 1, "b": 0}}</tool_call>',
    "<think>" * 5000 + '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
    "</think>" * 5000 + '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
    "<think></think><tool_call>" * 1000,
    "<think>" + "<tool_call>" * 2000 + "</think>" + "{" * 10_000,
]
CHAR_POOLS = [
    "abcdefghijklmnopqrstuvwxyz ABC0123456789",
    "{}[]:,\"'\\<>/`\n\t ",
    "".join(map(chr, range(32))),
    "éß☃🎲\u202e\ufeff\u0301",
    "".join(chr(c) for c in range(0xD800, 0xD810)) + "".join(chr(c) for c in range(0xDC00, 0xDC08)),
]


def random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, -1, 7, 2**63, 10**30, rng.randrange(-1000, 1000)])
    if kind == 3:
        return rng.choice([0.5, -2.0, 3.0, 1e308, float("inf"), float("-inf"), rng.uniform(-100, 100)])
    if kind in (4, 5):
        return random_text(rng, 12)
    if kind in (6, 7):
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {random_text(rng, 6): random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


def random_text(rng: random.Random, max_length: int) -> str:
    pool = rng.choice(CHAR_POOLS)
    return "".join(rng.choice(pool) for _ in range(rng.randrange(max_length + 1)))


def random_call(rng: random.Random) -> ToolCall:
    tool_ = rng.choice(TOOLS)
    name = tool_.name if rng.random() < 0.85 else rng.choice(["nope", "Add", "add ", "shou", "", random_text(rng, 8)])
    arguments = {}
    for key, schema in tool_.parameters["properties"].items():
        if rng.random() < 0.85:
            arguments[key] = good_value(rng, schema) if rng.random() < 0.7 else random_json(rng)
    if rng.random() < 0.1:
        arguments[rng.choice(ARG_NAMES)] = random_json(rng)
    return ToolCall(name, arguments)


def good_value(rng: random.Random, schema: dict[str, Any]) -> Any:
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if kind == "integer":
        return rng.randrange(-50, 50)
    if kind == "number":
        return rng.choice([rng.uniform(-10, 10), 0, 0.0, 3])
    if kind == "string":
        return random_text(rng, 10)
    if kind == "array":
        return [good_value(rng, schema.get("items", {"type": "string"})) for _ in range(rng.randrange(3))]
    if kind == "object":
        return {random_text(rng, 3): rng.randrange(9) for _ in range(rng.randrange(3))}
    return None


def well_formed(rng: random.Random) -> str:
    calls = [random_call(rng) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
    text = format_tool_calls(calls, rng.choice(["hermes", "hermes", "json"]))
    if rng.random() < 0.3:
        text = random_text(rng, 40) + "\n" + text
    if rng.random() < 0.2 and text.startswith("{"):
        text = "```json\n" + text + "\n```"
    return text


def mutated(rng: random.Random) -> str:
    text = well_formed(rng)
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(len(text) + 1)
        action = rng.randrange(4)
        if action == 0:
            text = text[:at]  # cut off, as by max_tokens
        elif action == 1:
            text = text[:at] + rng.choice(FRAGMENTS) + text[at:]
        elif action == 2:
            text = text[:at] + text[at + rng.randrange(1, 6) :]
        else:
            text = text[:at] + text[at:] * 2
    return text


def soup(rng: random.Random) -> str:
    return "".join(
        rng.choice(FRAGMENTS) if rng.random() < 0.7 else random_text(rng, 6) for _ in range(rng.randrange(1, 40))
    )


def reasoning(rng: random.Random) -> str:
    """A thinking model's reply: a ``<think>`` block (calls and tags inside it, perhaps cut off or
    closed twice), then perhaps an answer or calls."""
    inside = rng.choice([well_formed, mutated, soup, lambda r: random_text(r, 80)])(rng)
    text = "<think>\n" + inside
    if rng.random() < 0.8:
        text += "\n</think>\n\n" + rng.choice([well_formed, mutated, lambda r: random_text(r, 40), lambda r: ""])(rng)
    if rng.random() < 0.2:
        text += rng.choice(["<think>again " + well_formed(rng), "</think>" + well_formed(rng)])
    return text


def adversarial(rng: random.Random) -> str:
    text = rng.choice(ADVERSARIAL)
    return text if rng.random() < 0.7 else text[: rng.randrange(len(text) + 1)] + rng.choice(FRAGMENTS)


GENERATORS: list[tuple[str, Callable[[random.Random], str], float]] = [
    ("random text", lambda rng: random_text(rng, 200), 0.15),
    ("fragment soup", soup, 0.25),
    ("well-formed calls", well_formed, 0.25),
    ("mutated calls", mutated, 0.30),
    ("reasoning", reasoning, 0.10),
    ("adversarial", adversarial, 0.05),
]


def corpus(n: int, seed: int) -> list[str]:
    """``n`` completions drawn from the generators above, reproducibly."""
    rng = random.Random(seed)
    names, weights = [g[1] for g in GENERATORS], [g[2] for g in GENERATORS]
    return [rng.choices(names, weights)[0](rng) for _ in range(n)]


# --- the run ----------------------------------------------------------------------------------


class Tally:
    """What the run saw; ``escaped`` and ``broken`` hold (stage, error, completion) for the report."""

    def __init__(self) -> None:
        self.context_checks = 0  # completions encoded as env text (a user turn and their tool results)
        self.control_from_env = 0  # control token ids those encodings held beyond the template's: must be 0
        self.completions = 0
        self.calls = 0
        self.with_calls = 0  # completions holding at least one call
        self.calls_parsed_ok = 0
        self.reasoning_checks = 0  # (completion, format) pairs hidden in reasoning
        self.calls_from_reasoning = 0  # checks where a call inside reasoning was read: must be 0
        self.results: collections.Counter[str] = collections.Counter()
        self.escaped: list[tuple[str, str, str]] = []
        self.broken: list[tuple[str, str, str]] = []


def check_results(tally: Tally, stage: str, text: str, calls: list[ToolCall], results: list[Any]) -> None:
    """Exactly one ToolResult per call, answering it, whose message is a tool Message of valid text
    (an env runs at most ``max_tool_calls`` per reply and answers the rest with one error)."""
    cap = AgentEnv.max_tool_calls
    if stage.startswith("env") and len(calls) > cap and len(results) == cap + 1:
        calls, results = calls[:cap], results[:cap]
    if len(results) != len(calls):
        tally.broken.append((stage, f"{len(results)} results for {len(calls)} calls", text[:200]))
        return
    for call, result in zip(calls, results):
        message = result.to_message() if isinstance(result, (ToolResult, _AsResult)) else None
        if not (
            isinstance(message, Message)
            and message.role == "tool"
            and message.tool_call_id == call.id
            and isinstance(result.content, str)
            and (result.error is None or result.content.startswith("Error: "))
            and _valid_unicode(result.content)
        ):
            tally.broken.append((stage, f"bad result {result!r:.200}", text[:200]))


def exercise(text: str, tally: Tally, loop: asyncio.AbstractEventLoop, env: FuzzEnv | None, agent: Any = None) -> None:
    """Push one completion through every stage, recording anything that escapes or breaks."""
    tally.completions += 1
    stage = "parse"
    try:
        replies = {format: parse_reply(text, format) for format in TOOL_FORMATS}  # type: ignore[arg-type]
        for format, reply in replies.items():
            ids = [c.id for c in reply.tool_calls]
            if (
                not isinstance(reply, Message)
                or reply.role != "assistant"
                or ids != [f"call_{i}" for i in range(len(ids))]
            ):
                tally.broken.append((f"parse[{format}]", f"bad reply {reply!r:.200}", text[:200]))
        stage = "reasoning"
        for format, reply in replies.items():
            check_reasoning(tally, text, format, reply)
        calls = replies["auto"].tool_calls
        tally.calls += len(calls)
        tally.with_calls += bool(calls)
        tally.calls_parsed_ok += sum(c.error is None for c in calls)
        stage = "call_tool"
        results = [call_tool(TOOLS_BY_NAME, c) for c in calls]
        check_results(tally, stage, text, calls, results)
        tally.results.update(r.error_kind or "ok" for r in results)
        if agent is not None:
            stage = "context"
            check_context(tally, text, results, agent)
        stage = "acall_tool"

        async def run_async() -> list[ToolResult]:
            return [await acall_tool(TOOLS_BY_NAME, c, timeout=10) for c in calls]

        check_results(tally, stage, text, calls, loop.run_until_complete(run_async()))
        if env is not None:
            for stage in ("env.step", "env.astep"):
                env.reset(seed=0)
                step = env.step(text) if stage == "env.step" else loop.run_until_complete(env.astep(text))
                if calls:
                    check_results(tally, stage, text, calls, [_AsResult(m) for m in step.observation])
                elif step.observation or not step.terminated:
                    tally.broken.append((stage, f"a reply without calls gave {step!r:.200}", text[:200]))
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        tally.escaped.append((stage, f"{type(e).__name__}: {str(e)[:200]}", text[:200]))


def check_context(tally: Tally, text: str, results: list[Any], agent: Any) -> None:
    """The completion as env text (a user message) and its calls' results (tool messages), encoded as
    an observation: the control ids must be exactly those of the same messages holding plain text."""
    tally.context_checks += 1
    # A lone surrogate cannot be encoded at all (an env sending one fails its episode); written out.
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    messages = [Message("user", text), *(r.to_message() for r in results)]
    plain = [Message(m.role, "x", tool_call_id=m.tool_call_id, name=m.name) for m in messages]
    specials = set(agent.tokenizer.all_special_ids)
    ids = agent.observation_ids(messages)
    extra = sum(t in specials for t in ids) - sum(t in specials for t in agent.observation_ids(plain))
    if extra:
        tally.control_from_env += extra
        tally.broken.append(("context", f"{extra} control token(s) from env text", text[:200]))


def check_reasoning(tally: Tally, text: str, format: str, alone: Message) -> None:
    """``text`` after a closed reasoning block holding it reads as ``text`` alone; inside an unclosed
    block it reads as a plain reply, exactly as written."""
    opening, closing = THINK_TAGS
    thought = text
    while closing in thought:  # so the block ends where this check closes it
        thought = thought.replace(closing, "")
    after = parse_reply(f"{opening}{thought}{closing}{text}", format)  # type: ignore[arg-type]
    unclosed = f"{opening}{thought}"
    cut = parse_reply(unclosed, format)  # type: ignore[arg-type]
    tally.reasoning_checks += 1
    if cut.tool_calls or _call_keys(after) != _call_keys(alone):
        tally.calls_from_reasoning += 1
        tally.broken.append((f"reasoning[{format}]", "a call was read from inside a reasoning block", text[:200]))
    elif cut.content != unclosed:
        tally.broken.append((f"reasoning[{format}]", "the reasoning was not kept as written", text[:200]))


def _call_keys(reply: Message) -> list[tuple[str, Any, str | None]]:
    return [(c.name, c.arguments, c.error) for c in reply.tool_calls]


def _valid_unicode(text: str) -> bool:
    """Tokenizers and UTF-8 files refuse lone surrogates, so no tool message may hold one."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _AsResult:
    """Lets an env's tool message go through the same check as a ToolResult."""

    def __init__(self, message: Any) -> None:
        self.message, self.content = message, getattr(message, "content", None)
        self.error = "?" if isinstance(self.content, str) and self.content.startswith("Error: ") else None

    def to_message(self) -> Any:
        return self.message


def run(n: int, seed: int = 0, env_every: int = 10, progress: bool = False) -> Tally:
    """Fuzz ``n`` completions; return the tally (the test suite calls this with a small ``n``)."""
    from agentrl.agents import ChatAgent  # transformers: only for the context check
    from agentrl.testing import build_tiny_tokenizer

    texts = corpus(n, seed)
    tally = Tally()
    loop = asyncio.new_event_loop()
    env = FuzzEnv()
    agent = ChatAgent(build_tiny_tokenizer(), list(TOOLS_BY_NAME.values()))
    try:
        for i, text in enumerate(texts):
            every = env_every and i % env_every == 0
            exercise(text, tally, loop, env if every else None, agent if every else None)
            if progress and (i + 1) % 10_000 == 0:
                print(f"  {i + 1} / {n}", file=sys.stderr, flush=True)
    finally:
        loop.close()
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="completions to try")
    parser.add_argument("--seed", type=int, default=0, help="seed of the corpus")
    parser.add_argument(
        "--env-every", type=int, default=10, help="also step an env on every k-th completion (0: never)"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    tally = run(args.n, args.seed, args.env_every, progress=True)
    elapsed = time.perf_counter() - started
    print(f"completions tried:      {tally.completions}")
    print(f"with tool calls:        {tally.with_calls}")
    print(
        f"calls parsed:           {tally.calls} ({tally.calls_parsed_ok} well-formed, {tally.calls - tally.calls_parsed_ok} parse errors)"
    )
    print(
        "call_tool results:      "
        + ", ".join(f"{k} {v}" for k, v in sorted(tally.results.items(), key=lambda kv: -kv[1]))
    )
    print(
        f"calls from reasoning:   {tally.calls_from_reasoning} "
        f"(each completion hidden in <think> in {len(TOOL_FORMATS)} formats: {tally.reasoning_checks} checks)"
    )
    print(
        f"control ids from env:   {tally.control_from_env} "
        f"(every {args.env_every}th completion and its tool results encoded as env text: {tally.context_checks} checks)"
    )
    print(f"exceptions escaped:     {len(tally.escaped)}")
    print(f"invariants broken:      {len(tally.broken)}")
    for stage, error, text in (tally.escaped + tally.broken)[:10]:
        print(f"  [{stage}] {error}\n      completion: {text!r:.200}")
    print(
        f"time:                   {elapsed:.1f} s ({tally.completions / elapsed:,.0f} completions/s, seed {args.seed})"
    )
    return 1 if tally.escaped or tally.broken else 0


if __name__ == "__main__":
    sys.exit(main())
