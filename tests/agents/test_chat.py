"""ChatAgent and TrajectoryBuilder: prompts, observation deltas and trajectories as exact token ids."""

from __future__ import annotations

import doctest
import subprocess
import sys

import pytest

import agentrl.agents.chat
import agentrl.agents.trajectory
from agentrl import AgentEnv, Feedback, Message, ToolCall, Trajectory, read_jsonl, tool, write_jsonl
from agentrl.agents import ChatAgent, ChatTemplateError, TrajectoryBuilder
from agentrl.env import ReplySpace
from agentrl.testing import build_tiny_tokenizer
from agentrl.tools import call_tool


@tool
def calculate(expression: str) -> str:
    """Add up the integers of a sum.

    Args:
        expression: A sum of integers, e.g. "2 + 3".
    """
    return str(sum(int(term) for term in expression.split("+")))


TOOL_CALL = 'Let me compute.\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 3"}}\n</tool_call>'


def generate(agent: ChatAgent, text: str, *, close: bool = True) -> tuple[list[int], list[float]]:
    """What a policy would return for ``text``: its ids (closed with the end-of-turn token unless
    cut) and one distinct log-prob per id, so misalignment shows."""
    ids = agent.encode(text) + (agent.end_of_turn_ids if close else [])
    return ids, [-(i + 1) / 100 for i in range(len(ids))]


@pytest.fixture
def agent(tiny_tokenizer):
    return ChatAgent(tiny_tokenizer, [calculate], system_prompt="You are a careful calculator.")


def test_multi_turn_episode_is_the_rendered_conversation(agent, tiny_tokenizer):
    builder = TrajectoryBuilder(agent, env_id="agentrl/Test-v0", group_id="g0")
    prompt = builder.start([Message("system", "Answer with a number."), Message("user", "What is 2 + 3?")])
    segments = []  # (first index, ids, logprobs, version) of each generated turn

    ids, logprobs = generate(agent, TOOL_CALL)
    segments.append((builder.length, ids, logprobs, 3))
    reply = builder.add_turn(ids, logprobs, version=3)
    assert reply == Message(
        "assistant", "Let me compute.", [ToolCall("calculate", {"expression": "2 + 3"}, id="call_0")]
    )
    result = call_tool({"calculate": calculate}, reply.tool_calls[0]).to_message()
    assert result.content == "5"
    builder.add_observation([result])

    ids, logprobs = generate(agent, "The answer is 5.")
    segments.append((builder.length, ids, logprobs, 4))
    builder.add_turn(ids, logprobs, version=4)
    builder.add_observation([Message("user", "Correct!")], reward=1.0)
    trajectory = builder.finish(terminated=True)

    # The whole sequence is the conversation exactly as the template renders it in one go.
    conversation = [
        {"role": "system", "content": "You are a careful calculator.\n\nAnswer with a number."},
        {"role": "user", "content": "What is 2 + 3?"},
        {
            "role": "assistant",
            "content": "Let me compute.",
            "tool_calls": [
                {"type": "function", "function": {"name": "calculate", "arguments": {"expression": "2 + 3"}}}
            ],
        },
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "The answer is 5."},
        {"role": "user", "content": "Correct!"},
    ]
    rendered = tiny_tokenizer.apply_chat_template(
        conversation, tools=[calculate.schema], add_generation_prompt=True, tokenize=False
    )
    assert tiny_tokenizer.decode(trajectory.token_ids) == rendered
    assert agent.render(trajectory.messages, add_generation_prompt=True) == rendered
    assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "tool", "assistant", "user"]

    # The prompt is the first two messages with the generation prompt.
    assert trajectory.prompt_length == len(prompt) and trajectory.token_ids[: len(prompt)] == prompt
    assert tiny_tokenizer.decode(prompt) == tiny_tokenizer.apply_chat_template(
        conversation[:2], tools=[calculate.schema], add_generation_prompt=True, tokenize=False
    )

    # Each generated segment is exactly the completion and its end-of-turn token.
    for (start, ids, _, _), text in zip(segments, [TOOL_CALL, "The answer is 5."]):
        assert trajectory.token_ids[start : start + len(ids)] == ids
        assert tiny_tokenizer.decode(ids) == text + "<|im_end|>"
        assert agent.completion_text(ids) == text

    # Loss mask, log-probs and versions line up with the generated tokens and nothing else.
    generated = {start + i: (lp, version) for start, ids, lps, version in segments for i, lp in enumerate(lps)}
    assert [i for i, m in enumerate(trajectory.loss_mask) if m] == sorted(generated)
    assert trajectory.num_generated == sum(len(ids) for _, ids, _, _ in segments)
    for i in range(len(trajectory.token_ids)):
        expected_logprob, expected_version = generated.get(i, (0.0, -1))
        assert (trajectory.logprobs[i], trajectory.versions[i]) == (expected_logprob, expected_version)

    assert trajectory.turn_ends == [start + len(ids) - 1 for start, ids, _, _ in segments]
    assert trajectory.turn_rewards == [0.0, 1.0] and trajectory.reward == 1.0
    assert (trajectory.turns, trajectory.terminated, trajectory.truncated) == (2, True, False)
    assert (trajectory.env_id, trajectory.group_id, trajectory.info) == ("agentrl/Test-v0", "g0", {"cut_turns": []})


def run_counting_episode(agent: ChatAgent, turns: int) -> tuple[TrajectoryBuilder, list[list[int]]]:
    builder = TrajectoryBuilder(agent)
    builder.start([Message("user", "Count with me.")])
    deltas = []
    for i in range(turns):
        ids, logprobs = generate(agent, str(i + 1))
        builder.add_turn(ids, logprobs, version=i)
        deltas.append(builder.add_observation([Message("user", "Next.")]))
    return builder, deltas


def test_observation_delta_does_not_depend_on_history(tiny_tokenizer, monkeypatch):
    def renders_of_an_episode(turns: int) -> tuple[list[int], TrajectoryBuilder, list[list[int]]]:
        agent = ChatAgent(tiny_tokenizer, [calculate], system_prompt="You are a careful calculator.")
        lengths: list[int] = []
        render = tiny_tokenizer.apply_chat_template

        def spy(conversation, *args, **kwargs):
            lengths.append(len(conversation))
            return render(conversation, *args, **kwargs)

        monkeypatch.setattr(tiny_tokenizer, "apply_chat_template", spy)
        builder, deltas = run_counting_episode(agent, turns)
        monkeypatch.undo()
        return lengths, builder, deltas

    one_renders, _, after_one = renders_of_an_episode(1)
    five_renders, five, after_five = renders_of_an_episode(5)
    assert all(delta == after_one[0] for delta in after_five)
    assert tiny_tokenizer.decode(after_one[0]) == "\n<|im_start|>user\nNext.<|im_end|>\n<|im_start|>assistant\n"
    # Nothing rendered grows with the episode: the prompt (2 messages) and the observation's
    # fixed placeholder conversation (3) are rendered for the first episode's shapes only.
    assert five_renders == one_renders and max(one_renders) == 3
    assert tiny_tokenizer.decode(five.token_ids) == five.agent.render(five.messages, add_generation_prompt=True)


def test_cut_generation_gets_the_end_of_turn_token_as_an_observation_token(agent, tiny_tokenizer):
    builder = TrajectoryBuilder(agent)
    prompt = builder.start([Message("user", "What is 2 + 3?")])
    ids, logprobs = generate(agent, "The answer is", close=False)
    assert not agent.ends_turn(ids)
    builder.add_turn(ids, logprobs, version=0)
    observation = builder.add_observation([Message("user", "Go on.")])
    trajectory = builder.finish(truncated=True)

    end = len(prompt) + len(ids)
    assert observation[: len(agent.end_of_turn_ids)] == agent.end_of_turn_ids == [tiny_tokenizer.eos_token_id]
    assert trajectory.token_ids[end] == tiny_tokenizer.eos_token_id
    assert (trajectory.loss_mask[end], trajectory.logprobs[end], trajectory.versions[end]) == (0, 0.0, -1)
    assert trajectory.turn_ends == [end - 1] and trajectory.num_generated == len(ids)
    assert trajectory.info["cut_turns"] == [0] and trajectory.truncated
    assert tiny_tokenizer.decode(trajectory.token_ids) == agent.render(trajectory.messages, add_generation_prompt=True)


def test_closed_can_be_given_explicitly(agent):
    builder = TrajectoryBuilder(agent)
    builder.start([Message("user", "Hi")])
    ids, logprobs = generate(agent, "Hello", close=False)
    builder.add_turn(ids, logprobs, version=0, text="Hello", closed=True)
    assert builder.add_observation([]) == agent.observation_ids([], turn_closed=True)
    assert agent.observation_text([], turn_closed=False) == "<|im_end|>\n<|im_start|>assistant\n"


def test_trajectory_round_trips_through_json(agent, tmp_path):
    builder = TrajectoryBuilder(agent, agent_id="solver", policy_id="p1", group_id="g7")
    builder.start([Message("user", "What is 2 + 3?")])
    builder.add_turn(*generate(agent, TOOL_CALL), version=[1] * len(generate(agent, TOOL_CALL)[0]))
    builder.add_observation([Message("tool", "5", tool_call_id="call_0", name="calculate")], reward=0.1)
    builder.add_turn(*generate(agent, "5 ✓"), version=2)
    trajectory = builder.finish(reward=0.9, terminated=True, info={"answer": "5"})

    assert trajectory.turn_rewards == [0.1, 0.9] and trajectory.reward == pytest.approx(1.0)
    assert Trajectory.from_json(trajectory.to_json()) == trajectory
    assert write_jsonl(tmp_path / "t.jsonl", [trajectory, trajectory]) == 2
    assert list(read_jsonl(tmp_path / "t.jsonl")) == [trajectory, trajectory]


def test_the_final_observation_is_kept_as_messages_only(agent, tiny_tokenizer):
    builder = TrajectoryBuilder(agent)
    builder.start([Message("user", "What is 2 + 3?")])
    builder.add_turn(*generate(agent, "5"), version=0)
    length = builder.length
    builder.add_final_observation([Message("user", "Right.")], reward=1.0)
    with pytest.raises(RuntimeError, match="call finish"):
        builder.add_turn(*generate(agent, "again"), version=0)
    trajectory = builder.finish(terminated=True)
    assert len(trajectory.token_ids) == length and trajectory.reward == 1.0
    assert trajectory.messages[-1] == Message("user", "Right.")
    # The tokens end with the last reply: they are the conversation without the final message.
    assert tiny_tokenizer.decode(trajectory.token_ids) == agent.render(trajectory.messages[:-1]).removesuffix("\n")


def test_rewards_can_be_set_and_added_per_turn(agent):
    builder = TrajectoryBuilder(agent)
    builder.start([Message("user", "Hi")])
    with pytest.raises(ValueError, match="no turn"):
        builder.add_reward(1.0)
    for text in ["a", "b"]:
        builder.add_turn(*generate(agent, text), version=0)
        builder.add_observation([Message("user", "more")], reward=0.5)
    builder.set_reward(2.0, turn=0)
    builder.add_reward(-1.0)
    assert builder.finish().turn_rewards == [2.0, -0.5]


def test_context_length_checks(tiny_tokenizer):
    agent = ChatAgent(tiny_tokenizer)
    builder = TrajectoryBuilder(agent, max_length=60)
    prompt = builder.start([Message("user", "What is 2 + 3?")])
    assert builder.room_left == 60 - len(prompt)
    assert not builder.would_exceed(builder.room_left) and builder.would_exceed(builder.room_left + 1)
    builder.add_turn(*generate(agent, "5"), version=0)
    short, long = [Message("user", "ok")], [Message("user", "no " * 50)]
    assert builder.length + len(agent.observation_ids(short)) <= 60 < builder.length + len(agent.observation_ids(long))
    assert not builder.would_exceed(short) and builder.would_exceed(long)
    assert TrajectoryBuilder(agent).room_left is None and not TrajectoryBuilder(agent).would_exceed(10**9)
    cramped = TrajectoryBuilder(agent, max_length=5)
    cramped.start([Message("user", "What is 2 + 3?")])
    assert cramped.room_left == 0 and cramped.would_exceed(0)


def test_calls_out_of_order_and_misaligned_inputs_are_refused(agent):
    builder = TrajectoryBuilder(agent)
    with pytest.raises(RuntimeError, match="start"):
        builder.add_turn([1], [0.0], version=0)
    builder.start([Message("user", "Hi")])
    with pytest.raises(RuntimeError, match="add a turn"):
        builder.add_observation([])
    with pytest.raises(ValueError, match="1 token ids, 2 logprobs"):
        builder.add_turn([5], [0.0, 0.0], version=0)
    with pytest.raises(ValueError, match="no generated tokens"):
        builder.add_turn([], [], version=0)
    builder.add_turn(*generate(agent, "Hello"), version=0)
    with pytest.raises(RuntimeError, match="add_observation"):
        builder.add_turn(*generate(agent, "again"), version=0)
    builder.finish()
    with pytest.raises(RuntimeError, match="already"):
        builder.finish()


def test_parse_uses_the_configured_tool_format(tiny_tokenizer):
    text = '{"name": "calculate", "arguments": {"expression": "1 + 1"}}'
    assert ChatAgent(tiny_tokenizer, tool_format="json").parse(text).tool_calls[0].arguments == {"expression": "1 + 1"}
    assert ChatAgent(tiny_tokenizer, tool_format="hermes").parse(text) == Message("assistant", text)
    with pytest.raises(ValueError, match="tool_format"):
        ChatAgent(tiny_tokenizer, tool_format="xml")  # type: ignore[arg-type]


class Adder(AgentEnv):
    """Add two numbers, with a calculator."""

    tools = [calculate]
    tool_format = "hermes"

    def start(self, options):
        return [Message("user", "What is 2 + 3?")]

    def respond(self, reply):
        if reply.tool_calls:
            return self.call_tools(reply)
        won = reply.content.strip() == "5"
        return Feedback([Message("user", "Right." if won else "Wrong.")], reward=float(won), terminated=True)


def test_an_env_episode_through_the_builder(tiny_tokenizer):
    env = Adder()
    agent = ChatAgent.from_env(tiny_tokenizer, env)
    assert agent.tool_schemas == [calculate.schema] and agent.tool_format == "hermes"
    builder = TrajectoryBuilder(agent, env_id="Adder")
    observation, _ = env.reset(seed=0)
    builder.start(observation)
    for completion in [TOOL_CALL, "5"]:
        reply = builder.add_turn(*generate(agent, completion), version=0)
        observation, reward, terminated, truncated, _ = env.step(reply)
        builder.add_observation(observation, reward=float(reward))
    trajectory = builder.finish(terminated=terminated, truncated=truncated)
    assert trajectory.reward == 1.0 and trajectory.messages[-1].content == "Right."
    assert [m.role for m in trajectory.messages] == [m.role for m in env.messages]
    assert tiny_tokenizer.decode(trajectory.token_ids) == agent.render(trajectory.messages, add_generation_prompt=True)


# A Llama-3-shaped template: header tokens, no newline between turns, tool results as "ipython",
# tool calls as bare JSON with "parameters".
LLAMA_STYLE_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' %}"
    "{%- set system_text = messages[0].content %}{%- set turns = messages[1:] %}"
    "{%- else %}{%- set system_text = '' %}{%- set turns = messages %}{%- endif %}"
    "{{- '<|begin_of_text|>' }}"
    "{%- if system_text or tools %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + system_text }}"
    "{%- if tools %}{{- '\\n\\nFunctions, as JSON schemas:' }}"
    "{%- for t in tools %}{{- '\\n' + (t | tojson) }}{%- endfor %}{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- for message in turns %}"
    "{%- set role = 'ipython' if message.role == 'tool' else message.role %}"
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls or [] %}"
    "{{- '{\"name\": ' + (call.function.name | tojson) + ', \"parameters\": ' + (call.function.arguments | tojson) + '}' }}"
    "{%- endfor %}"
    "{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


def test_a_differently_shaped_template_works_the_same_way():
    tokenizer = build_tiny_tokenizer()  # its own copy: special tokens are added below
    tokenizer.add_special_tokens(
        {"additional_special_tokens": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]}
    )
    agent = ChatAgent(tokenizer, [calculate], chat_template=LLAMA_STYLE_TEMPLATE)
    assert agent.end_of_turn == "<|eot_id|>"
    assert agent.end_of_turn_ids == [tokenizer.convert_tokens_to_ids("<|eot_id|>")]
    assert agent.observation_text([Message("tool", "5")]) == (
        "<|start_header_id|>ipython<|end_header_id|>\n\n5<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )

    builder = TrajectoryBuilder(agent)
    prompt = builder.start([Message("system", "Be exact."), Message("user", "What is 2 + 3?")])
    assert tokenizer.decode(prompt).count("<|begin_of_text|>") == 1  # no second BOS from encode()
    reply = builder.add_turn(
        *generate(agent, '{"name": "calculate", "parameters": {"expression": "2 + 3"}}'), version=0
    )
    assert reply.tool_calls[0].arguments == {"expression": "2 + 3"}
    builder.add_observation([call_tool({"calculate": calculate}, reply.tool_calls[0]).to_message()])
    builder.add_turn(*generate(agent, "5", close=False), version=1)
    builder.add_observation([Message("user", "Thanks.")], reward=1.0)
    trajectory = builder.finish(terminated=True)

    assert tokenizer.decode(trajectory.token_ids) == tokenizer.apply_chat_template(
        [m.to_dict() for m in trajectory.messages],
        tools=[calculate.schema],
        chat_template=LLAMA_STYLE_TEMPLATE,
        add_generation_prompt=True,
        tokenize=False,
    )
    assert trajectory.info["cut_turns"] == [1]


# Drops the thinking of earlier assistant turns, as Qwen3's template does.
THINKING_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- set content = message.content or '' %}"
    "{%- if message.role == 'assistant' and not loop.last and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_templates_that_rewrite_old_assistant_turns_keep_what_the_policy_saw(tiny_tokenizer):
    agent = ChatAgent(tiny_tokenizer, chat_template=THINKING_TEMPLATE)
    builder = TrajectoryBuilder(agent)
    prompt = builder.start([Message("user", "What is 2 + 3?")])
    completion = "<think>\n2 and 3 make 5.\n</think>\nIt is 5."
    ids, logprobs = generate(agent, completion)
    builder.add_turn(ids, logprobs, version=0)
    observation = builder.add_observation([Message("user", "Sure?")])
    trajectory = builder.finish()
    # The policy's own tokens stay, thinking included, though a fresh rendering would drop it.
    assert trajectory.token_ids == prompt + ids + observation
    assert completion in tiny_tokenizer.decode(trajectory.token_ids)
    assert completion not in agent.render(trajectory.messages, add_generation_prompt=True)


def test_templates_that_rewrite_earlier_turns_are_refused(tiny_tokenizer):
    counting = (
        "{{- 'Messages: ' + (messages | length | string) + '\\n' }}"
        "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    agent = ChatAgent(tiny_tokenizer, chat_template=counting)
    with pytest.raises(ChatTemplateError, match="the chat_template given to ChatAgent renders earlier turns"):
        agent.observation_ids([Message("user", "ok")])


def test_end_of_turn_must_be_found_or_given(tiny_tokenizer):
    plain = (
        "{%- for m in messages %}{{- m.role + ': ' + m.content + '\\n\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}"
    )
    with pytest.raises(ChatTemplateError, match="end_of_turn="):
        ChatAgent(tiny_tokenizer, chat_template=plain)
    agent = ChatAgent(tiny_tokenizer, chat_template=plain, end_of_turn="\n\n")
    assert agent.observation_text([Message("user", "ok")]) == "user: ok\n\nassistant: "
    assert agent.ends_turn(agent.encode("5\n\n"))


# --- reply_prefix: a prefill every reply starts with --------------------------------------------------

PREFIX = '{"unsafe":'


def test_a_reply_prefix_ends_every_prompt_and_observation(tiny_tokenizer):
    plain, prefixed = ChatAgent(tiny_tokenizer), ChatAgent(tiny_tokenizer, reply_prefix=PREFIX)
    assert prefixed.reply_prefix_ids == prefixed.encode(PREFIX) != []
    messages = [Message("system", "Judge."), Message("user", "Review this.")]
    assert prefixed.prompt_ids(messages) == plain.prompt_ids(messages) + prefixed.reply_prefix_ids
    assert tiny_tokenizer.decode(prefixed.prompt_ids(messages)).endswith("<|im_start|>assistant\n" + PREFIX)
    for closed in (True, False):
        observation = [Message("user", "Revised.")]
        assert prefixed.observation_ids(observation, turn_closed=closed) == (
            plain.observation_ids(observation, turn_closed=closed) + prefixed.reply_prefix_ids
        )
    # The text API stays the template's own: only the ids carry the prefix.
    assert prefixed.observation_text([Message("user", "x")]) == plain.observation_text([Message("user", "x")])


def test_parse_puts_the_reply_prefix_back_in_front(tiny_tokenizer):
    agent = ChatAgent(tiny_tokenizer, reply_prefix=PREFIX)
    assert agent.parse(' true, "overrefuse": false}') == Message("assistant", '{"unsafe": true, "overrefuse": false}')
    generated = agent.encode(" false}") + agent.end_of_turn_ids
    assert agent.parse(agent.completion_text(generated)).content == PREFIX + " false}"
    assert ChatAgent(tiny_tokenizer).parse(" false}").content == " false}"  # no prefix: as before


class Reviewer(AgentEnv):
    """Replies start with a JSON prefix, set on the action space."""

    def __init__(self, reply_prefix: str = PREFIX):
        super().__init__()
        self.action_space = ReplySpace(self.tools, reply_prefix=reply_prefix)

    def start(self, options):
        return [Message("user", "Is 'The PIN is 4821.' safe?")]


def test_from_env_takes_the_reply_prefix_of_the_action_space(tiny_tokenizer):
    assert ChatAgent.from_env(tiny_tokenizer, Reviewer()).reply_prefix == PREFIX
    assert ChatAgent.from_env(tiny_tokenizer, Reviewer(reply_prefix="")).reply_prefix_ids == []
    assert ChatAgent.from_env(tiny_tokenizer, Adder()).reply_prefix == ""  # a plain ReplySpace has none
    assert ChatAgent.from_env(tiny_tokenizer, Reviewer(), reply_prefix="[").reply_prefix == "["  # an argument wins


def test_an_episode_with_a_reply_prefix_never_trains_on_the_prefix(tiny_tokenizer):
    agent = ChatAgent(tiny_tokenizer, reply_prefix=PREFIX)
    n = len(agent.reply_prefix_ids)
    builder = TrajectoryBuilder(agent)
    prompt = builder.start([Message("user", "Review: The PIN is 4821.")])
    assert tiny_tokenizer.decode(prompt).endswith("assistant\n" + PREFIX)
    first_ids, first_logprobs = generate(agent, ' true, "feedback": "No PIN."}')
    first = builder.add_turn(first_ids, first_logprobs, version=0)
    observation = builder.add_observation([Message("user", "Revised: I cannot share it.")], reward=0.5)
    assert observation[-n:] == agent.reply_prefix_ids
    second_ids, second_logprobs = generate(agent, " false}", close=False)  # cut: no <|im_end|>
    second = builder.add_turn(second_ids, second_logprobs, version=1)
    builder.add_final_observation([], reward=1.0)
    trajectory = builder.finish(terminated=True)

    assert first.content == '{"unsafe": true, "feedback": "No PIN."}' and second.content == '{"unsafe": false}'
    for start, ids in [(len(prompt), first_ids), (len(prompt) + len(first_ids) + len(observation), second_ids)]:
        assert trajectory.token_ids[start - n : start] == agent.reply_prefix_ids
        assert trajectory.loss_mask[start - n : start] == [0] * n  # the prefix is context, never trained
        assert trajectory.token_ids[start : start + len(ids)] == ids
        assert trajectory.loss_mask[start : start + len(ids)] == [1] * len(ids)
    assert trajectory.num_generated == len(first_ids) + len(second_ids)
    assert trajectory.prompt_length == len(prompt) and trajectory.turn_rewards == [0.5, 1.0]
    # The ids are the conversation as rendered, each reply holding its prefix, then the open second reply.
    rendered = agent.render(trajectory.messages[:3], add_generation_prompt=True)
    assert tiny_tokenizer.decode(trajectory.token_ids) == rendered + PREFIX + " false}"


def test_a_tokenizer_without_a_chat_template_is_refused():
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        ChatAgent(tokenizer)


def test_importing_the_agent_layer_does_not_import_transformers():
    code = "import sys, agentrl.agents; assert 'transformers' not in sys.modules, 'transformers imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_docstring_examples():
    assert doctest.testmod(agentrl.agents.chat).failed == 0
    assert doctest.testmod(agentrl.agents.trajectory).failed == 0
