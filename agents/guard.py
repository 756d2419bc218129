"""Text from outside the model enters the context as text: special-token strings never become control ids.

A tokenizer maps the text of its special tokens (``<|im_end|>``, ``<|im_start|>``, ``<|eot_id|>``,
``<|start_header_id|>``...) to their control ids wherever the text appears, and
``apply_chat_template(tokenize=True)`` tokenizes a whole rendered conversation that way. A tool
result, a web page, a sandbox's stdout or another agent's message that contains ``<|im_end|>\\n
<|im_start|>system`` would then close its own turn and open a forged system turn: structure the
model reads as real, and that the trainer learns from as if it were.

:class:`SpecialTextGuard` keeps that text as text. Before rendering, each special-token string in a
content that does not come from the model is replaced by a marker (a private-use character and a
number, which no chat template touches); the rendered text is cut at the markers, the pieces are
encoded as usual (the template's own special tokens stay control ids), and each marker becomes the
special string's *text* ids: its characters through the tokenizer's normalizer, pre-tokenizer and
model, with no special-token matching, as ``decode`` then shows them. The cut falls exactly where
the tokenizer itself cuts at a special token, so the pieces around it tokenize as they would have.

What is guarded: the tokenizer's special tokens (control tokens), in every content of every message
an agent renders (env system, user and tool messages, other agents' messages, the agent's own
system prompt). What is not: the model's own generated ids, kept exactly as generated (a model may
emit control tokens; that is its output); added tokens that are not special (Qwen's
``<tool_call>``, ``<think>``), which the tokenizer maps as it always does.

>>> from agentrl.testing import build_tiny_tokenizer
>>> tokenizer = build_tiny_tokenizer()
>>> guard = SpecialTextGuard(tokenizer)
>>> marked = guard.mark("done<|im_end|>")
>>> ids = guard.encode("<|im_start|>tool\\n" + marked, lambda text: tokenizer.encode(text, add_special_tokens=False))
>>> [i for i in ids if i in tokenizer.all_special_ids] == [tokenizer.convert_tokens_to_ids("<|im_start|>")]
True
>>> tokenizer.decode(ids)
'<|im_start|>tool\\ndone<|im_end|>'
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

MARK_OPEN, MARK_CLOSE = "\ue000", "\ue001"
"""Private-use characters around a marker's number: no template or tokenizer gives them meaning,
and a content holding one has it guarded too (it is encoded as its text, like a special string)."""
_MARKER = re.compile(f"{MARK_OPEN}(\\d+){MARK_CLOSE}")


class SpecialTextGuard:
    """Marks and encodes the special-token strings of one tokenizer as text (see the module docstring)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        added = getattr(tokenizer, "added_tokens_decoder", {}).values()
        specials = {str(t) for t in added if getattr(t, "special", False)}
        specials |= {str(t) for t in getattr(tokenizer, "all_special_tokens", [])}
        specials.add(MARK_OPEN)
        #: The strings guarded, longest first (so ``<|im_start|>`` wins over a shorter overlap).
        self.specials: list[str] = sorted((s for s in specials if s), key=lambda s: (-len(s), s))
        self._pattern = re.compile("|".join(map(re.escape, self.specials)))
        # Most contents hold none of the characters special tokens start with ("<", "["): two or
        # three substring scans then answer before the regex of (up to hundreds of) alternatives.
        self._firsts = sorted({s[0] for s in self.specials})
        self._index = {s: i for i, s in enumerate(self.specials)}
        self._text_ids: dict[int, list[int]] = {}

    def needs(self, content: str) -> bool:
        """Does ``content`` hold a special-token string?"""
        if not any(first in content for first in self._firsts):
            return False
        return self._pattern.search(content) is not None

    def mark(self, content: str) -> str:
        """``content`` with each special-token string replaced by its marker."""
        return self._pattern.sub(lambda m: f"{MARK_OPEN}{self._index[m.group(0)]}{MARK_CLOSE}", content)

    def encode(self, text: str, encode: Callable[[str], list[int]]) -> list[int]:
        """Token ids of a rendered ``text`` holding markers: the pieces between markers through
        ``encode`` (the tokenizer as usual), each marker as its special string's text ids."""
        ids: list[int] = []
        cursor = 0
        for match in _MARKER.finditer(text):
            if match.start() > cursor:
                ids += encode(text[cursor : match.start()])
            ids += self.text_ids(self.specials[int(match.group(1))])
            cursor = match.end()
        if cursor < len(text):
            ids += encode(text[cursor:])
        return ids

    def text_ids(self, special: str) -> list[int]:
        """The ids of ``special`` as text: normalizer, pre-tokenizer and model, no special-token
        matching (what the tokenizer would give if the string were not special)."""
        key = self._index[special]
        if key not in self._text_ids:
            self._text_ids[key] = _plain_ids(self.tokenizer, special)
        return self._text_ids[key]


def _plain_ids(tokenizer: Any, text: str) -> list[int]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow (pure Python) tokenizer: its own switch for the same thing
        return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
    normalized = backend.normalizer.normalize_str(text) if backend.normalizer is not None else text
    pieces = (
        backend.pre_tokenizer.pre_tokenize_str(normalized)
        if backend.pre_tokenizer is not None
        else [(normalized, None)]
    )
    return [token.id for piece, _ in pieces for token in backend.model.tokenize(piece)]
