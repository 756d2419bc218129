"""Chat agents: an env's messages and tools in, prompt token ids out; completions in, messages out.

A :class:`ChatAgent` is the glue between an environment and a policy for one role: the tokenizer
and its chat template, the tools rendered into the prompt, an optional system prompt, and the
tool-call format used to parse replies. A :class:`~agentrl.agents.trajectory.TrajectoryBuilder`
uses it to record one episode as the exact token ids the policy saw and produced
(:class:`~agentrl.types.Trajectory`).

History is never re-tokenised. The prompt is rendered and encoded once; after that, each turn
appends the policy's own generated ids, and each observation appends the chat template's *delta*:
the text the template writes after an assistant turn's end-of-turn token, the new messages, and
the generation prompt for the next turn. The delta is computed from a fixed three-message
placeholder conversation, so its cost does not grow with the episode.

Rendering a chat template is the slow part of all this (a Jinja render with the tool schemas costs
more than everything else in a turn), and its output changes with the messages' contents only
where the contents go. So the first prompt and every observation delta are rendered once per
message *shape* (roles, names, tool-call ids: everything but the contents) with placeholder
contents, and kept as a :class:`~agentrl.agents.layouts.Layout`: the token ids of the fixed text,
and the text runs that hold a content. Later messages of the same shape only encode those runs
with their contents in place. A shape whose rendering does not place the contents verbatim, or
where the fast path disagrees with the full one on probe contents, is always rendered in full
(see :mod:`agentrl.agents.layouts`).

Contents never become control tokens: a special-token string inside a message (a tool result that
prints ``<|im_end|>``) is encoded as its text, whichever path renders it, while the template's own
special tokens stay control ids (:mod:`agentrl.agents.guard`). Messages holding one take the full
path; the model's generated ids are never re-encoded at all.

>>> from agentrl.testing import build_tiny_tokenizer
>>> agent = ChatAgent(build_tiny_tokenizer())
>>> prompt = agent.prompt_ids([Message("user", "What is 2 + 3?")])
>>> agent.tokenizer.decode(prompt)
'<|im_start|>user\\nWhat is 2 + 3?<|im_end|>\\n<|im_start|>assistant\\n'
>>> generated = agent.encode("5") + agent.end_of_turn_ids
>>> agent.ends_turn(generated), agent.parse(agent.completion_text(generated)).content
(True, '5')
>>> agent.observation_text([Message("user", "Right.")])  # the delta appended after the reply
'\\n<|im_start|>user\\nRight.<|im_end|>\\n<|im_start|>assistant\\n'

Assumptions, true of the chat templates of the common chat models (ChatML / Qwen / SmolLM,
Llama 3, Mistral, Gemma, Phi) and checked where they can be:

- appending messages leaves the rendering of the earlier turns unchanged (checked on the
  placeholder's user turn; a template that re-renders *assistant* turns differently once they
  are no longer last, as Qwen3 drops old thinking blocks, is fine: those tokens are the policy's
  own and are kept as generated);
- an assistant turn ends with one end-of-turn text (found in the template, or given as
  ``end_of_turn``) on which the policy stops; a generation cut before it gets it appended as an
  observation token, so the next turn always starts from a closed one;
- what the template writes after that end-of-turn text depends only on the new messages.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentrl.agents.guard import SpecialTextGuard
from agentrl.agents.layouts import MAX_LAYOUTS, Layout, compile_layout, message_shape
from agentrl.tool_calls import TOOL_CALL_FORMATS, TOOL_FORMATS, ToolFormat, parse_reply
from agentrl.tools import Tool, as_tool
from agentrl.types import Message

if TYPE_CHECKING:  # transformers is heavy; the agent only calls methods on the tokenizer it is given
    from transformers import PreTrainedTokenizerBase

    from agentrl.env import AgentEnv

# Plain words, so no template rewrites them and no tokenizer has a special token inside them.
_QUESTION = "agentrl placeholder question"
_REPLY = "agentrl placeholder reply"
_FOLLOW_UP = "agentrl placeholder follow-up"


class ChatTemplateError(ValueError):
    """The chat template cannot append observations as a delta (see :mod:`agentrl.agents.chat`)."""


class ChatAgent:
    """Renders messages into prompt token ids and parses completions, for one agent role.

    Args:
        tokenizer: a ``transformers`` tokenizer with a chat template (or pass ``chat_template``).
        tools: the tools offered to the model (:class:`~agentrl.tools.Tool`, typed callables, or
            raw JSON schemas), rendered with ``apply_chat_template(tools=...)``.
        system_prompt: this role's system prompt. It is put before the env's own system message
            (one blank line apart) or, if the env sends none, becomes the system message.
        tool_format: how tool calls are read from completions (see
            :func:`~agentrl.tool_calls.parse_reply`).
        chat_template: a Jinja template to use instead of the tokenizer's own.
        chat_template_kwargs: extra template variables, e.g. ``{"enable_thinking": False}``.
        end_of_turn: the text that ends an assistant turn (a special token such as ``<|im_end|>``
            or ``<|eot_id|>``). By default it is read from the template: the first special or
            added token written after an assistant message.
        reply_prefix: text every reply of this agent starts with (a prefill, e.g. ``'{"unsafe": '``
            for a JSON verdict): its tokens end every prompt (so they are context, never trained),
            the policy writes the rest, and the parsed message holds the prefix and the rest.

    >>> from agentrl.testing import build_tiny_tokenizer
    >>> agent = ChatAgent(build_tiny_tokenizer(), system_prompt="Be brief.")
    >>> agent.render(agent.conversation([Message("user", "Hi")]), add_generation_prompt=True)
    '<|im_start|>system\\nBe brief.<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
    >>> agent.end_of_turn
    '<|im_end|>'
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        tools: Sequence[Tool | Callable[..., Any] | Mapping[str, Any]] = (),
        *,
        system_prompt: str | None = None,
        tool_format: ToolFormat = "auto",
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        end_of_turn: str | None = None,
        reply_prefix: str = "",
    ):
        if tool_format not in TOOL_FORMATS:
            raise ValueError(f"Unknown tool_format {tool_format!r}; expected one of {TOOL_FORMATS}.")
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                f"Tokenizer {_tokenizer_name(tokenizer)} has no chat template; pass chat_template=... "
                "or use an instruction-tuned model's tokenizer."
            )
        self.tokenizer = tokenizer
        self.tool_schemas: list[dict[str, Any]] = [
            dict(t) if isinstance(t, Mapping) else as_tool(t).schema for t in tools
        ]
        self.system_prompt = system_prompt
        self.tool_format: ToolFormat = tool_format
        self.chat_template = chat_template
        self.chat_template_kwargs: dict[str, Any] = dict(chat_template_kwargs or {})
        self.end_of_turn: str = end_of_turn if end_of_turn is not None else self._find_end_of_turn()
        #: The token ids of :attr:`end_of_turn`: one id for a special token, which the inference
        #: engine should stop on (vLLM ``stop_token_ids``); a multi-token text needs a stop string.
        self.end_of_turn_ids: list[int] = self.encode(self.end_of_turn)
        if not self.end_of_turn_ids:
            raise ValueError("end_of_turn must be a non-empty text.")
        self.reply_prefix = reply_prefix
        #: The token ids of :attr:`reply_prefix`, appended to every prompt and observation.
        self.reply_prefix_ids: list[int] = self.encode(reply_prefix) if reply_prefix else []
        #: Keeps special-token strings in contents as text (see :mod:`agentrl.agents.guard`).
        self.guard = SpecialTextGuard(tokenizer)
        # The placeholder question rendered alone, kept between observation_text calls (see there).
        self._head_text: str | None = None
        # Layouts by message shape (see Layout), and what they were rendered with: the settings
        # are public attributes, so a change to any of them (even in place) empties the cache.
        self._layouts: dict[tuple[Any, ...], Layout | None] = {}
        self._layouts_made_with: tuple[Any, ...] | None = None
        source = chat_template if chat_template is not None else tokenizer.chat_template
        # transformers' decode is its backend's plus a few checks that cost about as much as the
        # decoding itself (per turn); where the two agree on a probe with special tokens and the
        # spacing clean-up would touch, completions are decoded by the backend directly.
        self._backend_decodes = self._backend_decodes_alike()
        # A template that writes the date (Llama 3.1's strftime_now) renders differently tomorrow.
        self._uses_clock = "strftime_now" in str(source)
        #: The reasoning block the generation prompt leaves open (Qwen3-Thinking and DeepSeek-R1
        #: templates end it with ``<think>``): a completion then starts inside it, see :meth:`parse`.
        self.opens_reasoning: tuple[str, str] | None = self._find_open_reasoning()

    @classmethod
    def from_env(cls, tokenizer: PreTrainedTokenizerBase, env: AgentEnv, **kwargs: Any) -> ChatAgent:
        """An agent for ``env``: its tools and its tool-call format, plus any other arguments."""
        kwargs.setdefault("tool_format", env.tool_format)
        kwargs.setdefault("reply_prefix", getattr(env.action_space, "reply_prefix", ""))
        return cls(tokenizer, env.tools, **kwargs)

    @property
    def template_name(self) -> str:
        """Which template this agent renders with, for error messages."""
        if self.chat_template is not None:
            return "the chat_template given to ChatAgent"
        return f"the chat template of tokenizer {_tokenizer_name(self.tokenizer)}"

    # --- text -----------------------------------------------------------------------------------

    def conversation(self, messages: Sequence[Message]) -> list[Message]:
        """``messages`` with this agent's system prompt applied (see the class docstring)."""
        if self.system_prompt is None:
            return list(messages)
        if messages and messages[0].role == "system":
            env_system = messages[0].content
            content = f"{self.system_prompt}\n\n{env_system}" if env_system else self.system_prompt
            return [Message("system", content), *messages[1:]]
        return [Message("system", self.system_prompt), *messages]

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = False) -> str:
        """The chat template's text for ``messages`` as given (no system prompt added), with tools."""
        return self._render([m.to_dict() for m in messages], add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, with no BOS/EOS added: the template already wrote every special
        token the model expects, and adding them again would double a BOS (Llama) or append an
        EOS in the middle of a conversation."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # --- token ids ------------------------------------------------------------------------------

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of the first prompt: the system prompt, ``messages``, tools and the generation
        prompt, rendered by the chat template and encoded once (exactly
        ``encode(render(conversation(messages), add_generation_prompt=True))``, from the layout of
        the messages' shape when it has one), except that special-token strings in the contents are
        encoded as text; then the :attr:`reply_prefix` ids, if any."""
        return self._prompt_ids(messages) + self.reply_prefix_ids

    def _prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        conversation = self.conversation(messages)
        if any(self.guard.needs(m.content) for m in conversation):
            marked = [self._marked(m) for m in conversation]
            return self.guard.encode(self.render(marked, add_generation_prompt=True), self.encode)
        layout = self._layout("prompt", messages, True)
        if layout is not None:
            ids = layout.ids([m.content for m in messages])
            if ids is not None:
                return ids
        return self.encode(self._prompt_text(messages))

    def observation_text(self, messages: Sequence[Message], *, turn_closed: bool = True) -> str:
        """The text to append after an assistant turn so the conversation continues with
        ``messages`` and then a new assistant turn.

        It is what the template writes after the end-of-turn text of an assistant message (the
        ``"\\n"`` after ``<|im_end|>`` in ChatML), the messages, and the generation prompt. If the
        turn was not closed (the generation hit its token limit), it starts with the end-of-turn
        text itself.

        >>> from agentrl.testing import build_tiny_tokenizer
        >>> ChatAgent(build_tiny_tokenizer()).observation_text([Message("tool", "5")])
        '\\n<|im_start|>user\\n<tool_response>\\n5\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n'
        """
        head = [{"role": "user", "content": _QUESTION}]
        reply: dict[str, Any] = {"role": "assistant", "content": _REPLY}
        # Templates that pair tool results with the calls before them get matching calls.
        tool_messages = [m for m in messages if m.role == "tool"]
        calls = [
            {
                "type": "function",
                "id": m.tool_call_id or f"call_{i}",
                "function": {"name": m.name or "tool", "arguments": {}},
            }
            for i, m in enumerate(tool_messages)
        ]
        if calls:
            reply["tool_calls"] = calls
        after = self._render([*head, reply, *(m.to_dict() for m in messages)], add_generation_prompt=True)
        # The placeholder question alone renders the same every time, so it is rendered once and
        # reused while it still prefixes `after`; if it does not (tools changed after construction,
        # a template that writes today's date), it is rendered afresh and checked again, so the
        # result is exactly what rendering it on every call would give.
        before = self._head_text
        if before is None or not after.startswith(before):
            before = self._head_text = self._render(head, add_generation_prompt=False)
        if not after.startswith(before):
            raise ChatTemplateError(
                f"{self.template_name} renders earlier turns differently once messages are appended, "
                "so observations cannot be appended without re-tokenising the history. A user turn "
                f"rendered alone as {before!r} became {after[: len(before) + 40]!r}... "
                "Use a template whose rendering of a conversation is a prefix of the rendering of "
                "its continuations."
            )
        reply_at = after.find(_REPLY, len(before))
        end_at = after.find(self.end_of_turn, reply_at + len(_REPLY)) if reply_at >= 0 else -1
        if end_at < 0:
            raise ChatTemplateError(
                f"{self.template_name} did not write an assistant reply followed by the end-of-turn "
                f"text {self.end_of_turn!r}; it rendered {after!r}. Pass end_of_turn=... with the "
                "text the template closes assistant turns with."
            )
        tail = after[end_at + len(self.end_of_turn) :]
        return tail if turn_closed else self.end_of_turn + tail

    def observation_ids(self, messages: Sequence[Message], *, turn_closed: bool = True) -> list[int]:
        """Token ids of :meth:`observation_text`: what to append after a turn for ``messages``.

        ``turn_closed`` says whether the generated ids ended with :attr:`end_of_turn_ids`
        (see :meth:`ends_turn`); when not, the end-of-turn token is inserted first. The result is
        exactly ``encode(observation_text(...))``, taken from the layout of the messages' shape
        when it has one, except that special-token strings in the contents are encoded as text;
        then the :attr:`reply_prefix` ids, if any.
        """
        return self._observation_ids(messages, turn_closed) + self.reply_prefix_ids

    def _observation_ids(self, messages: Sequence[Message], turn_closed: bool) -> list[int]:
        if any(self.guard.needs(m.content) for m in messages):
            marked = [self._marked(m) for m in messages]
            return self.guard.encode(self.observation_text(marked, turn_closed=turn_closed), self.encode)
        layout = self._layout("observation", messages, turn_closed)
        if layout is not None:
            ids = layout.ids([m.content for m in messages])
            if ids is not None:
                return ids
        return self.encode(self.observation_text(messages, turn_closed=turn_closed))

    def reply_ids(self, text: str) -> list[int]:
        """Token ids of an assistant reply whose content is ``text``, as the policy would generate
        them: the text (special-token strings in it kept as text), then :attr:`end_of_turn_ids`.
        What a reference answer is teacher-forced as (see :meth:`TrajectoryBuilder.add_reference`).

        >>> from agentrl.testing import build_tiny_tokenizer
        >>> agent = ChatAgent(build_tiny_tokenizer())
        >>> agent.reply_ids("5") == agent.encode("5") + agent.end_of_turn_ids
        True
        """
        ids = self.guard.encode(self.guard.mark(text), self.encode) if self.guard.needs(text) else self.encode(text)
        return ids + self.end_of_turn_ids

    def ends_turn(self, token_ids: Sequence[int]) -> bool:
        """Whether generated ``token_ids`` end with the end-of-turn token (the policy stopped on it)."""
        n = len(self.end_of_turn_ids)
        return len(token_ids) >= n and list(token_ids[-n:]) == self.end_of_turn_ids

    def completion_text(self, token_ids: Sequence[int]) -> str:
        """The text of a generation without its closing end-of-turn or EOS token."""
        ids = list(token_ids)
        if self.ends_turn(ids):
            ids = ids[: -len(self.end_of_turn_ids)]
        elif ids and ids[-1] == getattr(self.tokenizer, "eos_token_id", None):
            ids = ids[:-1]
        if self._backend_decodes and not getattr(self.tokenizer, "clean_up_tokenization_spaces", False):
            return str(self.tokenizer.backend_tokenizer.decode(ids, skip_special_tokens=False))
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def parse(self, completion_text: str) -> Message:
        """The assistant message of a completion, tool calls parsed with :attr:`tool_format`.

        Where the generation prompt opened a reasoning block (:attr:`opens_reasoning`), the
        completion is read as starting inside it, so a call before its ``</think>`` is not run;
        the message's content is still the completion as written. A :attr:`reply_prefix` is
        put back in front of the completion first."""
        completion_text = self.reply_prefix + completion_text
        if self.opens_reasoning is None:
            return parse_reply(completion_text, self.tool_format)
        opening = self.opens_reasoning[0]
        reply = parse_reply(opening + completion_text, self.tool_format)
        content = reply.content[len(opening) :] if reply.content.startswith(opening) else reply.content
        return dataclasses.replace(reply, content=content)

    # --- internals ------------------------------------------------------------------------------

    def _marked(self, message: Message) -> Message:
        return dataclasses.replace(message, content=self.guard.mark(message.content))

    def _prompt_text(self, messages: Sequence[Message]) -> str:
        return self.render(self.conversation(messages), add_generation_prompt=True)

    def _layout(self, kind: str, messages: Sequence[Message], turn_closed: bool) -> Layout | None:
        """The layout of ``messages``' shape for ``kind`` (``prompt`` or ``observation``), compiled
        on first use; ``None`` where the shape must be rendered in full."""
        made_with = (
            self.chat_template,
            getattr(self.tokenizer, "chat_template", None),
            self.system_prompt,
            self.end_of_turn,
            self.chat_template_kwargs,
            self.tool_schemas,
            len(self.tokenizer),
            time.strftime("%Y-%m-%d %H:%M") if self._uses_clock else None,
        )
        if made_with != self._layouts_made_with or len(self._layouts) >= MAX_LAYOUTS:
            self._layouts.clear()
            self._layouts_made_with = copy.deepcopy(made_with)
        key = (kind, turn_closed, *map(message_shape, messages))
        try:
            return self._layouts[key]
        except KeyError:
            pass
        render: Callable[[Sequence[Message]], str] = (
            self._prompt_text if kind == "prompt" else functools.partial(self.observation_text, turn_closed=turn_closed)
        )
        try:
            layout = compile_layout(render, self.encode, self.tokenizer, messages, self.end_of_turn)
        except Exception:  # the full path renders these messages itself, and raises what is wrong
            layout = None
        self._layouts[key] = layout
        return layout

    def _render(self, conversation: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        tools: list[Any] | None = list(self.tool_schemas) or None  # templates test `if tools`
        text = self.tokenizer.apply_chat_template(
            conversation,
            tools=tools,
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self.chat_template_kwargs,
        )
        if not isinstance(text, str):  # a list when given a batch; never for one conversation
            raise ChatTemplateError(f"{self.template_name} rendered {type(text).__name__}, not text.")
        return text

    def _backend_decodes_alike(self) -> bool:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:
            return False
        probe = self.encode("Hi , it 's 5 . Don 't ! <b>ü 🙂</b>\n\t x") + self.end_of_turn_ids
        fast = backend.decode(probe, skip_special_tokens=False)
        return bool(fast == self.tokenizer.decode(probe, skip_special_tokens=False))

    def _find_open_reasoning(self) -> tuple[str, str] | None:
        """The reasoning tags of :attr:`tool_format` whose opening tag the generation prompt leaves
        open, if any."""
        try:
            prompt = self._render([{"role": "user", "content": _QUESTION}], add_generation_prompt=True)
        except Exception:  # a template that needs more than a user turn: its first prompt says so later
            return None
        tail = prompt[prompt.find(_QUESTION) + len(_QUESTION) :]
        for opening, closing in TOOL_CALL_FORMATS[self.tool_format].reasoning_tags:
            at = tail.rfind(opening)
            if at >= 0 and closing not in tail[at:]:
                return opening, closing
        return None

    def _find_end_of_turn(self) -> str:
        conversation = [
            {"role": "user", "content": _QUESTION},
            {"role": "assistant", "content": _REPLY},
            {"role": "user", "content": _FOLLOW_UP},
        ]
        text = self._render(conversation, add_generation_prompt=False)
        start = text.find(_REPLY)
        stop = text.find(_FOLLOW_UP, start)
        between = text[start + len(_REPLY) : stop] if 0 <= start < stop else ""
        added = getattr(self.tokenizer, "added_tokens_decoder", {}).values()
        special = {str(t) for t in added if getattr(t, "special", False)}
        special |= set(getattr(self.tokenizer, "all_special_tokens", []))
        # Special tokens first: a plain added token (some vocabularies add "\n\n") is a weaker guess.
        for candidates in (special, {str(t) for t in added}):
            found = [(between.find(t), -len(t), t) for t in candidates if t and t in between]
            if found:
                return min(found)[2]  # the first one; the longest if several start there
        raise ChatTemplateError(
            f"{self.template_name} writes {between!r} between an assistant reply and the next "
            "message, and no special token in it could serve as the end of the turn. Pass "
            "end_of_turn=... with the text the policy stops on."
        )


def _tokenizer_name(tokenizer: Any) -> str:
    return repr(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
