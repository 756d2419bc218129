"""The per-shape template layouts of ChatAgent: the fast path gives exactly the full path's ids.

``prompt_ids`` and ``observation_ids`` render a message shape once and then only encode the text
around each new content. Whatever the contents, the ids must be those of rendering the template in
full and encoding the result, on every template the agent layer supports: ChatML with tools (the
tiny tokenizer's own), a Llama-3-shaped one and a Qwen3-shaped one. Templates that transform
contents, and contents that would merge with the template's special tokens, must fall back to the
full path rather than come out wrong.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_chat import LLAMA_STYLE_TEMPLATE, THINKING_TEMPLATE  # this folder is on sys.path (pytest rootdir import)
from tokenizers import AddedToken

from agentrl import Message, tool
from agentrl.agents import ChatAgent
from agentrl.agents.layouts import message_shape
from agentrl.testing import build_tiny_tokenizer


@tool
def calculate(expression: str) -> str:
    """Add up the integers of a sum.

    Args:
        expression: A sum of integers, e.g. "2 + 3".
    """
    return expression


def llama_tokenizer():
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_special_tokens(
        {"additional_special_tokens": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]}
    )
    return tokenizer


@pytest.fixture(scope="module")
def agents():
    """One agent per template family, each with a tool and a system prompt."""
    tiny, llama = build_tiny_tokenizer(), llama_tokenizer()
    return {
        "chatml": ChatAgent(tiny, [calculate], system_prompt="Be exact."),
        "llama": ChatAgent(llama, [calculate], chat_template=LLAMA_STYLE_TEMPLATE, system_prompt="Be exact."),
        "qwen3": ChatAgent(tiny, chat_template=THINKING_TEMPLATE),
    }


def _marked(agent: ChatAgent, messages: list[Message]) -> list[Message]:
    return [replace(m, content=agent.guard.mark(m.content)) for m in messages]


def full_observation_ids(agent: ChatAgent, messages: list[Message], closed: bool) -> list[int]:
    """The full path: render, encode (special-token strings in contents as text, agents.guard)."""
    text = agent.observation_text(_marked(agent, messages), turn_closed=closed)
    return agent.guard.encode(text, agent.encode)


def full_prompt_ids(agent: ChatAgent, messages: list[Message]) -> list[int]:
    text = agent.render(_marked(agent, agent.conversation(messages)), add_generation_prompt=True)
    return agent.guard.encode(text, agent.encode)


# Text with the things that break naive splicing: whitespace at the edges, newlines, markup, the
# templates' own special tokens, non-ASCII.
PIECES = ["\n", "\n\n", " ", "  ", "\t", "x", "5", "!", "Try again.", "<|im_end|>", "<|im_start|>", "<|eot_id|>",
          "<tool_response>", "{{ x }}", "é", "🙂", "</think>", "user", "assistant"]  # fmt: skip
contents = st.lists(st.sampled_from(PIECES) | st.text(max_size=6), max_size=8).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    family=st.sampled_from(["chatml", "llama", "qwen3"]),
    observation=st.lists(st.tuples(st.sampled_from(["user", "tool", "system"]), contents), max_size=3),
    closed=st.booleans(),
    prompt=st.tuples(contents, contents),
)
def test_fast_ids_equal_the_full_rendering(agents, family, observation, closed, prompt):
    agent = agents[family]
    messages = [Message(role, text, tool_call_id="c1" if role == "tool" else None) for role, text in observation]
    ids = agent.observation_ids(messages, turn_closed=closed)
    assert ids == full_observation_ids(agent, messages, closed)
    assert agent.tokenizer.decode(ids) == agent.observation_text(messages, turn_closed=closed)
    first = [Message("system", prompt[0]), Message("user", prompt[1])]
    assert agent.prompt_ids(first) == full_prompt_ids(agent, first)
    assert agent.prompt_ids(first[1:]) == full_prompt_ids(agent, first[1:])


def test_a_known_shape_is_encoded_without_rendering(agents, monkeypatch):
    for agent in agents.values():
        agent.observation_ids([Message("user", "warm up")])
        agent.prompt_ids([Message("system", "warm"), Message("user", "up")])
        renders = []
        monkeypatch.setattr(agent, "_render", lambda *args, renders=renders: renders.append(args))
        observation = [Message("user", "  Try again, with\n\nmore care. </b>")]
        prompt = [Message("system", "Answer with a number."), Message("user", "What is 2 + 3?\n")]
        fast = agent.observation_ids(observation), agent.prompt_ids(prompt)
        assert renders == [], "a known shape was rendered again"
        monkeypatch.undo()
        assert fast == (full_observation_ids(agent, observation, True), full_prompt_ids(agent, prompt))


def test_every_supported_template_gets_layouts(agents):
    for agent in agents.values():
        agent.observation_ids([Message("user", "ok"), Message("tool", "5", tool_call_id="c1")], turn_closed=False)
        agent.prompt_ids([Message("system", "s"), Message("user", "u")])
        assert agent._layouts and all(layout is not None for layout in agent._layouts.values())


def test_a_template_that_trims_contents_is_rendered_in_full(tiny_tokenizer):
    trimming = LLAMA_STYLE_TEMPLATE.replace("(message.content or '')", "(message.content or '') | trim")
    tokenizer = llama_tokenizer()
    agent = ChatAgent(tokenizer, chat_template=trimming)
    for text in ["  padded  ", "plain", "\nnew lines\n"]:
        messages = [Message("user", text)]
        assert agent.observation_ids(messages) == full_observation_ids(agent, messages, True)
    assert list(agent._layouts.values()) == [None]


def test_a_content_that_merges_into_a_special_token_falls_back(tiny_tokenizer):
    tokenizer = build_tiny_tokenizer()
    # An added token that starts inside a content and ends in the template's <|im_end|> (matched
    # in the same pass as <|im_end|>, raw text, leftmost-longest).
    tokenizer.add_tokens([AddedToken("!<|im_end|>", normalized=False)])
    agent = ChatAgent(tokenizer)
    plain = [Message("user", "Fine.")]
    assert agent.observation_ids(plain) == full_observation_ids(agent, plain, True)
    assert list(agent._layouts.values()) != [None]  # the shape has a layout...
    loud = [Message("user", "Wow!")]
    ids = agent.observation_ids(loud)
    assert ids == full_observation_ids(agent, loud, True)  # ...which this content does not fit
    assert tokenizer.convert_tokens_to_ids("!<|im_end|>") in ids


def test_changed_settings_are_not_served_from_stale_layouts(tiny_tokenizer):
    agent = ChatAgent(tiny_tokenizer, system_prompt="Be brief.")
    prompt = [Message("user", "Hi")]
    before = agent.prompt_ids(prompt)
    agent.system_prompt = "Be thorough."
    agent.tool_schemas.append(calculate.schema)  # in place, as a user might
    after = agent.prompt_ids(prompt)
    assert after != before
    assert after == ChatAgent(tiny_tokenizer, [calculate], system_prompt="Be thorough.").prompt_ids(prompt)
    assert after == full_prompt_ids(agent, prompt)


def test_tokenizer_truncation_left_on_does_not_cut_the_ids(tiny_tokenizer):
    tokenizer = build_tiny_tokenizer()
    agent = ChatAgent(tokenizer)
    messages = [Message("user", "a long enough observation to be cut")]
    expected = agent.observation_ids(messages)
    tokenizer.backend_tokenizer.enable_truncation(4)  # as another caller's tokenizer(..., truncation=True) can leave it
    assert agent.observation_ids(messages) == expected


def test_the_system_run_with_the_tool_schemas_is_memoised_exactly(tiny_tokenizer):
    agent = ChatAgent(tiny_tokenizer, [calculate], system_prompt="Be exact.")
    prompts = [
        [Message("system", system), Message("user", user)]
        for system in ("Answer with a number.", "Show your work.")
        for user in ("2 + 3?", "7 * 6?")
    ]
    for prompt in prompts * 2:
        assert agent.prompt_ids(prompt) == full_prompt_ids(agent, prompt)
    layout = agent._layouts[("prompt", True, *map(message_shape, prompts[0]))]
    # Two system prompts (each behind the agent's own) met twice each: two memo entries, no more.
    assert layout is not None and len(layout._memo) == 2
