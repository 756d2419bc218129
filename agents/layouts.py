"""Message layouts: a chat template rendered once per message *shape*, then only contents encoded.

A message's shape is everything of it a template may render except its content (role, name,
tool-call id and calls, whether the content is empty). :func:`compile_layout` renders a shape with
placeholder contents, cuts the text at the tokenizer's added tokens, and keeps a :class:`Layout`:
the token ids of the fixed text, and the text runs that hold a content. Encoding a later message
list of that shape then encodes only those runs with the real contents in place, which is what
makes a turn of :class:`~agentrl.agents.chat.ChatAgent` cheap (a Jinja render with tool schemas
costs more than the rest of a turn).

A layout is trusted only after it reproduces the full rendering id for id on probe contents
(whitespace at the ends, markup and Jinja syntax, newlines, the end-of-turn text inside a content);
a shape whose template transforms contents, or where a content could merge into a special token,
gets no layout and is rendered in full every time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from agentrl.types import Message

# Plain words again: the placeholder contents a shape is rendered with, one per message.
_SLOT = "agentrl content slot {}"
# Most shapes kept per agent; past it the cache starts over (shapes with fresh ids every episode,
# e.g. random tool-call ids, would otherwise grow it without end).
MAX_LAYOUTS = 256
# Runs whose template text is at least this long are memoised by their contents (see Layout), up
# to this many contents per layout.
_LONG_RUN = 256
_MAX_MEMO = 64


def _probes(count: int, end_of_turn: str) -> list[list[str]]:
    """Contents a shape's layout must reproduce exactly before it is trusted: whitespace at both
    ends (a template that trims shows here), markup and Jinja syntax (one that escapes), newlines
    next to the template's own (merges across the edge of a content), and the end-of-turn text
    inside a content (special tokens in the middle of a run)."""
    return [
        [f"  spaced {i}  \n" for i in range(count)],
        [f"\n\n{{{{ not jinja }}}} <b>&amp;</b> 'q' \"dq\" \\ ü 🙂 {i}\n" for i in range(count)],
        [f"{end_of_turn}{i}{end_of_turn}" for i in range(count)],
    ]


class _Run(NamedTuple):
    """The text between two added tokens (or an end of the text) that holds one or more contents."""

    left: str
    """The added token before the run, as text ("" at the start of the text)."""
    left_id: int | None
    texts: tuple[str, ...]
    """The template's own text around the contents: ``texts[0] content texts[1] ... texts[-1]``."""
    slots: tuple[int, ...]
    """Which message's content goes in each place."""
    right: str
    """The added token after the run, as text ("" at the end of the text)."""
    right_id: int | None


class Layout:
    """One message shape's rendering, ready to be filled: token ids, and runs to encode.

    Tokenizers split their input at added tokens (``<|im_start|>``, ``<|eot_id|>``...) before
    anything else, and encode the pieces between them independently. So the ids of a rendering are
    the ids of its fixed pieces, kept here, and of the pieces that hold a content, which are
    encoded with the contents in place, each with the added tokens on both sides of it included so
    that a content that would merge with one of them (or hold part of one) is caught: those ids
    must come back unchanged, or the caller falls back to rendering in full.

    A run whose own text is long (a system message's run holds the tool schemas too) is also
    memoised by its contents: envs send the same system prompt episode after episode, and encoding
    a kilobyte of schemas again each time would cost more than all the rest of the prompt.
    """

    def __init__(self, parts: list[list[int] | _Run], backend: Any):
        self.parts = parts
        self.backend = backend
        self._memo: dict[tuple[int, tuple[str, ...]], list[int]] = {}
        self._memoised = {i for i, p in enumerate(parts) if isinstance(p, _Run) and len("".join(p.texts)) >= _LONG_RUN}

    def ids(self, contents: Sequence[str]) -> list[int] | None:
        """The token ids of the shape with ``contents`` (one per message) in place, or ``None`` if
        an added token around a content did not survive (then render in full)."""
        backend = self.backend
        if backend.truncation is not None or backend.padding is not None:
            return None  # left on by someone's tokenizer(..., truncation=True): would cut the runs
        out: list[int] = []
        for index, part in enumerate(self.parts):
            if type(part) is list:
                out += part
                continue
            run: _Run = part  # type: ignore[assignment]
            key = (index, tuple(contents[slot] for slot in run.slots)) if index in self._memoised else None
            ids = self._memo.get(key) if key is not None else None
            if ids is None:
                ids = self._encode(run, contents)
                if ids is None:
                    return None
                if key is not None:
                    if len(self._memo) >= _MAX_MEMO:
                        self._memo.clear()
                    self._memo[key] = ids
            out += ids
        return out

    def forget(self) -> None:
        """Empty the memo."""
        self._memo.clear()

    def _encode(self, run: _Run, contents: Sequence[str]) -> list[int] | None:
        if len(run.slots) == 1:  # the usual run: one message's content between two added tokens
            text = f"{run.left}{run.texts[0]}{contents[run.slots[0]]}{run.texts[1]}{run.right}"
        else:
            pieces = [run.left, run.texts[0]]
            for slot, between in zip(run.slots, run.texts[1:]):
                pieces += (contents[slot], between)
            pieces.append(run.right)
            text = "".join(pieces)
        ids: list[int] = self.backend.encode(text, add_special_tokens=False).ids
        start, stop = 0, len(ids)
        if run.left_id is not None:
            if not ids or ids[0] != run.left_id:
                return None
            start = 1
        if run.right_id is not None:
            if stop <= start or ids[-1] != run.right_id:
                return None
            stop -= 1
        return ids[start:stop]


def message_shape(message: Message) -> tuple[Any, ...]:
    """Everything of a message a template may render, except its content (whether it is empty
    stays: templates often skip empty contents)."""
    calls = repr(message.tool_calls) if message.tool_calls else ""
    return (message.role, message.tool_call_id, message.name, not message.content, calls)


def compile_layout(
    render: Callable[[Sequence[Message]], str],
    encode: Callable[[str], list[int]],
    tokenizer: Any,
    messages: Sequence[Message],
    end_of_turn: str,
) -> Layout | None:
    """The layout of ``messages``' shape under ``render``, or ``None`` if it cannot be trusted.

    ``render`` is the full path (messages to text) and ``encode`` the reference encoder: the layout
    is kept only if, for every probe content, ``render`` places the contents verbatim and the
    layout's ids equal ``encode(render(...))``. What probes cannot rule out is a template that
    treats some contents differently by their text (one that branches on a content's words); no
    common chat template does that to the roles an env sends (user, tool, system).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow (pure Python) tokenizer: no offsets, and nothing to gain
        return None
    slots = [i for i, m in enumerate(messages) if m.content]

    def filled(contents: Sequence[str]) -> list[Message]:
        values = dict(zip(slots, contents))
        return [replace(m, content=values[i]) if i in values else m for i, m in enumerate(messages)]

    text = render(filled([_SLOT.format(i) for i in slots]))
    spans = _content_spans(text, slots)
    if spans is None:
        return None
    parts = _split_at_added_tokens(text, spans, backend.encode(text, add_special_tokens=False), tokenizer)
    if parts is None:
        return None
    layout = Layout(parts, backend)
    for probe in _probes(len(slots), end_of_turn):
        by_slot = dict(zip(slots, probe))
        rendered = render(filled(probe))
        pieces: list[str] = []
        cursor = 0
        for start, stop, slot in spans:
            pieces += (text[cursor:start], by_slot[slot])
            cursor = stop
        pieces.append(text[cursor:])
        if rendered != "".join(pieces):
            return None  # the template transforms contents (trims, escapes, ...)
        if layout.ids([by_slot.get(i, m.content) for i, m in enumerate(messages)]) != encode(rendered):
            return None
    layout.forget()  # the probes' contents never come again
    return layout


def _content_spans(text: str, slots: Sequence[int]) -> list[tuple[int, int, int]] | None:
    """Where each slot's placeholder content lies in ``text``: (start, end, message index) in text
    order, or ``None`` if one is missing or repeated (the template drops, repeats or rewrites it)."""
    spans = []
    for slot in slots:
        sentinel = _SLOT.format(slot)
        at = text.find(sentinel)
        if at < 0 or text.find(sentinel, at + 1) >= 0:
            return None
        spans.append((at, at + len(sentinel), slot))
    return sorted(spans)


def _split_at_added_tokens(
    text: str, spans: list[tuple[int, int, int]], encoding: Any, tokenizer: Any
) -> list[list[int] | _Run] | None:
    """``text``'s ids cut at its added tokens: the runs between them that hold a content span
    become :class:`_Run` s, everything else stays as ids. ``None`` if an added token overlaps a
    content (the placeholder text itself matched one)."""
    added = set(getattr(tokenizer, "added_tokens_decoder", {}))
    parts: list[list[int] | _Run] = []
    fixed: list[int] = []  # ids since the last run
    run_ids: list[int] = []  # ids since the last added token
    left: tuple[int, int, int] | None = None  # (start, end, id) of the added token before the run
    run_start = 0

    def close_run(end: int, right: tuple[int, int, int] | None) -> None:
        inside = [span for span in spans if run_start <= span[0] and span[1] <= end]
        if not inside:
            fixed.extend(run_ids)
            return
        texts, cursor = [], run_start
        for start, stop, _ in inside:
            texts.append(text[cursor:start])
            cursor = stop
        texts.append(text[cursor:end])
        if fixed:
            parts.append(list(fixed))
            fixed.clear()
        parts.append(
            _Run(
                text[left[0] : left[1]] if left else "",
                left[2] if left else None,
                tuple(texts),
                tuple(span[2] for span in inside),
                text[right[0] : right[1]] if right else "",
                right[2] if right else None,
            )
        )

    for token, (start, end) in zip(encoding.ids, encoding.offsets):
        if token not in added:
            run_ids.append(token)
            continue
        if any(span[0] < end and start < span[1] for span in spans):
            return None
        anchor = (start, end, token)
        close_run(start, anchor)
        fixed.append(token)
        run_ids, left, run_start = [], anchor, end
    close_run(len(text), None)
    if fixed:
        parts.append(fixed)
    if sum(len(p.slots) for p in parts if isinstance(p, _Run)) != len(spans):
        return None
    return parts
