"""Tool calls inside a reasoning block are not run: end to end, with a Qwen3-like chat template.

A scripted policy writes a ``<tool_call>`` inside ``<think> ... </think>`` and answers after it; the
rollout plays it against an env with a counting tool. The tool must not run, the reply must be
the final answer, and the trajectory must hold the generated tokens exactly as generated. A second
policy writes the same call after ``</think>``: that one runs, so the count can fail.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl import AgentEnv, Feedback, Message, Trajectory, tool
from agentrl.agents import ChatAgent
from agentrl.rollout import EpisodeLimits, RolloutSettings, SingleAgentRollout
from agentrl.testing import ScriptedPolicy, build_tiny_tokenizer
from agentrl.tools import Tool

# Qwen3's template in short: tools in the system turn; an assistant turn after the last real user
# query keeps its reasoning, split off its content at the *first* `</think>` and written back as
# `<think>\n...\n</think>\n\n`; earlier ones lose it; tool calls are `<tool_call>` blocks; tool results
# are `<tool_response>` blocks in one user turn; `enable_thinking=False` pre-fills an empty block.
QWEN3_LIKE_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\n<tools>' }}"
    "{%- for t in tools %}{{- '\\n' + (t | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nCall a function in a <tool_call></tool_call> block.<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages | length - 1) %}"
    "{%- for m in messages[::-1] %}"
    "{%- set index = (messages | length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and m.role == 'user' and not m.content.startswith('<tool_response>') %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- for m in messages %}"
    "{%- set content = m.content or '' %}"
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}"
    "{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- endif %}"
    "{%- for call in m.tool_calls or [] %}"
    "{%- set fn = call.function if call.function is defined else call %}"
    "{%- if (loop.first and content) or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' + (fn.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "answer"}}\n</tool_call>'
THINKING_CALL = f"<think>\nI could look it up:\n{CALL}\nbut I know it already.\n</think>\n\n42"
CALL_AFTER_THINKING = f"<think>\nI should look it up.\n</think>\n\n{CALL}"


def lookup_env(calls: list[str]) -> type[AgentEnv]:
    """An env whose one tool counts its calls in ``calls``; a plain reply ends the episode."""

    @tool
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: What to look up.
        """
        calls.append(key)
        return "42"

    class Lookup(AgentEnv):
        tools: list[Tool] = [lookup]

        def start(self, options: dict[str, Any] | None) -> list[Message]:
            return [Message("user", "What is the answer?")]

        def respond(self, reply: Message) -> Feedback:
            answer = reply.content.split("</think>")[-1].strip()
            return Feedback([], float(answer == "42"), True, {"success": answer == "42"})

    return Lookup


def qwen3_like_tokenizer():
    """The tiny tokenizer with Qwen3's reasoning and tool-call tags as single added tokens."""
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_tokens(["<think>", "</think>", "<tool_call>", "</tool_call>"])
    return tokenizer


@pytest.fixture(scope="module", params=["tiny", "tags as added tokens"])
def tokenizer(request):
    return build_tiny_tokenizer() if request.param == "tiny" else qwen3_like_tokenizer()


def play(tokenizer, reply, calls: list[str], **agent_kwargs: Any) -> Trajectory:
    env_class = lookup_env(calls)
    agent = ChatAgent.from_env(tokenizer, env_class(), chat_template=QWEN3_LIKE_TEMPLATE, **agent_kwargs)
    policy = ScriptedPolicy(tokenizer, reply, end_of_turn_ids=agent.end_of_turn_ids)
    engine = SingleAgentRollout(
        env_class, agent, policy, RolloutSettings(env_id="tests/Lookup", limits=EpisodeLimits(max_turns=3))
    )
    (trajectory,) = asyncio.run(engine.collect(num_groups=1))
    trajectory.validate()
    assert trajectory.error is None, trajectory.error
    return trajectory


def generated_turns(tokenizer, trajectory: Trajectory) -> list[str]:
    """The decoded generated tokens of each turn (the end-of-turn token included)."""
    turns, current = [], []
    for token, mask in zip(trajectory.token_ids, trajectory.loss_mask):
        if mask:
            current.append(token)
        elif current:
            turns.append(current)
            current = []
    if current:
        turns.append(current)
    return [tokenizer.decode(ids, skip_special_tokens=False) for ids in turns]


@pytest.mark.parametrize("tool_format", ["auto", "hermes"])
def test_a_call_inside_reasoning_is_not_run_and_the_reasoning_stays(tokenizer, tool_format):
    calls: list[str] = []
    trajectory = play(tokenizer, THINKING_CALL, calls, tool_format=tool_format)
    assert calls == []
    assert (trajectory.turns, trajectory.terminated, trajectory.reward) == (1, True, 1.0)
    reply = trajectory.messages[-1]
    assert reply == Message("assistant", THINKING_CALL)  # the whole reply, reasoning and call text included
    assert generated_turns(tokenizer, trajectory) == [THINKING_CALL + "<|im_end|>"]
    if "<think>" in tokenizer.get_added_vocab():  # the tags are the model's own tokens, kept as generated
        think, tool_call = tokenizer.convert_tokens_to_ids(["<think>", "<tool_call>"])
        generated = [t for t, m in zip(trajectory.token_ids, trajectory.loss_mask) if m]
        assert generated.count(think) == 1 and generated.count(tool_call) == 1


def test_the_same_call_after_reasoning_is_run(tokenizer):
    calls: list[str] = []

    def reply(prompt: str) -> str:
        return "<think>\nIt says 42.\n</think>\n\n42" if "<tool_response>" in prompt else CALL_AFTER_THINKING

    trajectory = play(tokenizer, reply, calls)
    assert calls == ["answer"]
    assert (trajectory.turns, trajectory.reward) == (2, 1.0)
    call_turn, tool_turn = trajectory.messages[-3:-1]
    assert call_turn.content == "<think>\nI should look it up.\n</think>" and call_turn.tool_calls[0].name == "lookup"
    assert tool_turn == Message("tool", "42", tool_call_id="call_0", name="lookup")
    assert generated_turns(tokenizer, trajectory) == [
        CALL_AFTER_THINKING + "<|im_end|>",
        "<think>\nIt says 42.\n</think>\n\n42<|im_end|>",
    ]
    # The observation between the turns is the template's tool turn, as a fresh rendering writes it.
    text = tokenizer.decode(trajectory.token_ids, skip_special_tokens=False)
    assert (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in text
    )


def test_a_reply_cut_off_while_thinking_runs_nothing(tokenizer):
    calls: list[str] = []
    cut = f"<think>\nFirst {CALL} then"
    trajectory = play(tokenizer, cut, calls)
    assert calls == [] and trajectory.messages[-1] == Message("assistant", cut)
    assert generated_turns(tokenizer, trajectory) == [cut + "<|im_end|>"]


# Qwen3-Thinking-2507 and the DeepSeek-R1 templates open the reasoning block in the generation
# prompt: the completion starts inside it and shows only its `</think>`.
PROMPT_OPENS_THINKING = QWEN3_LIKE_TEMPLATE.replace(
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}",
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}",
)


def test_a_call_in_reasoning_the_prompt_opened_is_not_run(tokenizer):
    calls: list[str] = []
    completion = f"I could look it up:\n{CALL}\nbut I know it already.\n</think>\n\n42"
    env_class = lookup_env(calls)
    agent = ChatAgent.from_env(tokenizer, env_class(), chat_template=PROMPT_OPENS_THINKING)
    assert agent.opens_reasoning == ("<think>", "</think>")
    policy = ScriptedPolicy(tokenizer, completion, end_of_turn_ids=agent.end_of_turn_ids)
    engine = SingleAgentRollout(env_class, agent, policy, RolloutSettings(limits=EpisodeLimits(max_turns=3)))
    (trajectory,) = asyncio.run(engine.collect(num_groups=1))
    assert calls == [] and trajectory.reward == 1.0
    assert trajectory.messages[-1] == Message("assistant", completion)  # as written, no tag added
    after = agent.parse(f"Let me look it up.\n</think>\n\n{CALL}")
    assert [c.name for c in after.tool_calls] == ["lookup"]  # a call after the block is run
    assert ChatAgent(tokenizer, chat_template=QWEN3_LIKE_TEMPLATE).opens_reasoning is None
