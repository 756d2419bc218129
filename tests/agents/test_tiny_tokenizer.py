"""The tiny offline tokenizer of agentrl.testing: size, special tokens, determinism, exact round
trips, saving, and the chat template's rendering of tools, tool calls and tool results."""

from __future__ import annotations

import doctest

from hypothesis import given, settings
from hypothesis import strategies as st

import agentrl.testing
from agentrl.testing import IM_END, IM_START, PAD_TOKEN, TINY_VOCAB_SIZE, build_tiny_tokenizer

CALCULATE = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


def test_vocabulary_and_special_tokens(tiny_tokenizer):
    assert len(tiny_tokenizer) == TINY_VOCAB_SIZE
    assert tiny_tokenizer.convert_tokens_to_ids([PAD_TOKEN, IM_START, IM_END]) == [0, 1, 2]
    assert (tiny_tokenizer.eos_token, tiny_tokenizer.eos_token_id) == (IM_END, 2)
    assert (tiny_tokenizer.pad_token, tiny_tokenizer.pad_token_id) == (PAD_TOKEN, 0)
    assert tiny_tokenizer.bos_token is None
    # Special tokens are never split, even glued to text.
    assert tiny_tokenizer.encode(f"a{IM_END}b", add_special_tokens=False)[1] == 2
    # Nothing is added around plain text.
    assert tiny_tokenizer.encode("hi", add_special_tokens=True) == tiny_tokenizer.encode("hi", add_special_tokens=False)


def test_build_is_deterministic(tiny_tokenizer):
    again = build_tiny_tokenizer()
    assert again.backend_tokenizer.to_str() == tiny_tokenizer.backend_tokenizer.to_str()
    assert again.get_vocab() == tiny_tokenizer.get_vocab()


def test_the_corpus_makes_common_text_compact(tiny_tokenizer):
    # Trained merges, not bytes: a tool call is far shorter in tokens than in characters.
    text = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 3"}}\n</tool_call>'
    assert len(tiny_tokenizer.encode(text, add_special_tokens=False)) < len(text) / 2


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_text_round_trips(tiny_tokenizer, text):
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids) == text
    assert all(0 <= i < TINY_VOCAB_SIZE for i in ids)


def test_text_with_special_tokens_round_trips(tiny_tokenizer):
    text = f"{IM_START}user\n  héllo 世界 🙂\t\r\n{IM_END}\n{PAD_TOKEN}  "
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text, add_special_tokens=False)) == text


def test_saves_and_reloads(tmp_path, tiny_tokenizer):
    # The concrete class, not AutoTokenizer: that one imports torch (seconds) to look up models.
    from transformers import PreTrainedTokenizerFast

    build_tiny_tokenizer(tmp_path)
    loaded = PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    assert loaded.get_vocab() == tiny_tokenizer.get_vocab()
    assert loaded.eos_token == IM_END and loaded.pad_token == PAD_TOKEN
    assert loaded.chat_template == tiny_tokenizer.chat_template
    text = "What is 2 + 3? ünïcode"
    assert loaded.encode(text, add_special_tokens=False) == tiny_tokenizer.encode(text, add_special_tokens=False)


def test_chat_template_renders_tools_calls_and_results(tiny_tokenizer):
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
        {
            "role": "assistant",
            "content": "Let me compute.",
            "tool_calls": [
                {
                    "type": "function",
                    "id": "call_0",
                    "function": {"name": "calculate", "arguments": {"expression": "2 + 3"}},
                },
                # OpenAI-style arguments arrive as a JSON string and are written as they are.
                {
                    "type": "function",
                    "id": "call_1",
                    "function": {"name": "calculate", "arguments": '{"expression": "1"}'},
                },
            ],
        },
        {"role": "tool", "content": "5", "tool_call_id": "call_0"},
        {"role": "tool", "content": "1", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "5."},
    ]
    text = tiny_tokenizer.apply_chat_template(
        conversation, tools=[CALCULATE], add_generation_prompt=True, tokenize=False
    )
    schema = (
        '{"type": "function", "function": {"name": "calculate", "description": "Evaluate an arithmetic '
        'expression.", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, '
        '"required": ["expression"]}}}'
    )
    assert text == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call the functions listed in <tools></tools> below.\n"
        f"<tools>\n{schema}\n</tools>\n\n"
        "To call a function, answer with a JSON object in a <tool_call></tool_call> block:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <arguments-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\nLet me compute.\n"
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 3"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "1"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n1\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n5.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_chat_template_without_tools_or_system(tiny_tokenizer):
    text = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], tokenize=False
    )
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"


def test_docstring_examples():
    assert doctest.testmod(agentrl.testing).failed == 0
