import json

import pytest

from agentrl import Message, ToolCall, Trajectory, read_jsonl, write_jsonl


def make_trajectory() -> Trajectory:
    return Trajectory(
        token_ids=[1, 2, 3, 4, 5, 6],
        loss_mask=[0, 0, 1, 1, 0, 1],
        logprobs=[0.0, 0.0, -0.5, -1.25, 0.0, -0.125],
        versions=[-1, -1, 3, 3, -1, 4],
        prompt_length=2,
        turn_ends=[3, 5],
        turn_rewards=[0.0, 1.0],
        reward=1.0,
        messages=[
            Message("user", "What is 2+3?"),
            Message("assistant", "", tool_calls=[ToolCall("calculate", {"expression": "2+3"}, id="call_0")]),
            Message("tool", "5", tool_call_id="call_0", name="calculate"),
            Message("assistant", "Answer: 5"),
        ],
        env_id="agentrl/Calculator-v0",
        group_id="g7",
        turns=2,
        terminated=True,
        info={"success": True},
    )


def test_trajectory_json_round_trip_is_exact():
    trajectory = make_trajectory()
    trajectory.validate()
    assert Trajectory.from_json(trajectory.to_json()) == trajectory
    assert trajectory.num_generated == 3


def test_jsonl_holds_one_trajectory_per_line(tmp_path):
    path = tmp_path / "out.jsonl"
    trajectories = [make_trajectory(), Trajectory(env_id="x", error="RuntimeError: boom")]
    assert write_jsonl(path, trajectories) == 2
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["env_id"] for line in lines)
    assert list(read_jsonl(path)) == trajectories


def test_read_jsonl_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(make_trajectory().to_json() + '\n{"not_a_field": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        list(read_jsonl(path))


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(loss_mask=[0, 0, 1]), "loss_mask has 3 entries"),
        (dict(loss_mask=[0, 1, 1, 1, 0, 1]), "0 over the prompt"),
        (dict(loss_mask=[0, 0, 2, 1, 0, 1]), "only 0 and 1"),
        (dict(turn_rewards=[1.0]), "one reward per generated turn"),
    ],
)
def test_validate_rejects_inconsistent_trajectories(change, message):
    trajectory = make_trajectory()
    for key, value in change.items():
        setattr(trajectory, key, value)
    with pytest.raises(ValueError, match=message):
        trajectory.validate()


def test_message_rejects_bad_roles_and_content():
    with pytest.raises(ValueError, match="role must be one of"):
        Message("robot", "hi")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="content must be a str"):
        Message("user", None)  # type: ignore[arg-type]


def test_message_dict_matches_chat_template_shape():
    message = Message("assistant", "", tool_calls=[ToolCall("f", {"x": 1}, id="call_0")])
    data = message.to_dict()
    assert data["tool_calls"][0] == {
        "type": "function",
        "id": "call_0",
        "function": {"name": "f", "arguments": {"x": 1}},
    }
    assert Message.from_dict(data) == message
    # OpenAI sends arguments as a JSON string.
    openai = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": '{"x": 1}'}}],
    }
    assert Message.from_dict(openai).tool_calls[0].arguments == {"x": 1}
