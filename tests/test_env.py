import asyncio
import threading
import time

import gymnasium as gym
import pytest

import agentrl
from agentrl import AgentEnv, Feedback, Message, ToolCall


@agentrl.tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


@agentrl.tool(timeout=0.2)
def slow() -> str:
    """Sleep far past the limit."""
    time.sleep(5)
    return "late"


class SumEnv(AgentEnv):
    """Add two numbers with a tool and answer with the sum."""

    tools = [add, slow]

    def start(self, options):
        self.a, self.b = (int(x) for x in self.np_random.integers(0, 100, size=2))
        return [Message("system", "Use add."), Message("user", f"{self.a} + {self.b}?")]

    def respond(self, reply):
        right = reply.content.strip() == str(self.a + self.b)
        return Feedback(
            [Message("user", "Right." if right else "Wrong.")],
            reward=float(right),
            terminated=True,
            info={"success": right},
        )


def test_agent_env_is_a_gymnasium_env_with_message_spaces():
    env = SumEnv()
    assert isinstance(env, gym.Env)
    observation, info = env.reset(seed=3)
    assert env.observation_space.contains(observation)
    assert env.action_space.contains("any text") and not env.action_space.contains(3)
    assert info == {"turn": 0}


def test_seeded_reset_is_deterministic():
    env = SumEnv()
    assert env.reset(seed=5).observation == env.reset(seed=5).observation
    tasks = {env.reset(seed=s).observation[1].content for s in range(20)}
    assert len(tasks) > 10


def test_step_accepts_text_and_messages_and_runs_tools():
    env = SumEnv()
    env.reset(seed=1)
    result = env.step(f'<tool_call>{{"name": "add", "arguments": {{"a": {env.a}, "b": {env.b}}}}}</tool_call>')
    assert result.observation == [Message("tool", str(env.a + env.b), tool_call_id="call_0", name="add")]
    assert (result.reward, result.terminated, result.truncated) == (0.0, False, False)
    result = env.step(Message("assistant", str(env.a + env.b)))
    assert (result.reward, result.terminated, result.info["success"]) == (1.0, True, True)
    assert [m.role for m in env.messages] == ["system", "user", "assistant", "tool", "assistant", "user"]


@pytest.mark.parametrize(
    "reply, expected",
    [
        ('<tool_call>{"name": "mul", "arguments": {}}</tool_call>', "unknown tool 'mul'; available tools: add, slow"),
        ('<tool_call>{"name": "add", "arguments": {"a": "x", "b": 1}}</tool_call>', "expected an integer"),
        ('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', "missing required argument(s) ['b']"),
        ("<tool_call>{oops</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "slow", "arguments": {}}</tool_call>', "longer than its limit of 0.2 s"),
    ],
)
def test_bad_tool_calls_get_an_error_observation_and_the_episode_goes_on(reply, expected):
    env = SumEnv()
    env.reset(seed=0)
    started = time.perf_counter()
    observation, reward, terminated, truncated, info = env.step(reply)
    assert time.perf_counter() - started < 2
    assert len(observation) == 1 and observation[0].role == "tool"
    assert observation[0].content.startswith("Error:") and expected in observation[0].content
    assert not terminated and info["tool_errors"] == 1


def test_max_turns_truncates():
    env = SumEnv(max_turns=2)
    env.reset(seed=0)
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    assert env.step(call).truncated is False
    assert env.step(call).truncated is True


def test_async_methods_agree_with_sync_and_do_not_block_the_loop():
    env_a, env_b = SumEnv(), SumEnv()

    async def play():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        obs_a, _ = await env_a.areset(seed=4)
        # The slow tool runs for its full limit; the loop must keep ticking meanwhile.
        slow_result = await env_a.astep('<tool_call>{"name": "slow", "arguments": {}}</tool_call>')
        final = await env_a.astep(str(env_a.a + env_a.b))
        task.cancel()
        return obs_a, slow_result, final, ticks

    obs_a, slow_result, final, ticks = asyncio.run(play())
    assert ticks >= 5, "astep blocked the event loop"
    assert slow_result.observation[0].content.startswith("Error:")
    obs_b, _ = env_b.reset(seed=4)
    env_b.step('<tool_call>{"name": "slow", "arguments": {}}</tool_call>')
    assert obs_a == obs_b and final == env_b.step(str(env_b.a + env_b.b))


def test_wrong_action_types_and_roles_are_rejected_clearly():
    env = SumEnv()
    env.reset(seed=0)
    with pytest.raises(TypeError, match="expects the reply as a str or an assistant Message"):
        env.step(42)
    with pytest.raises(ValueError, match="role 'assistant'"):
        env.step(Message("user", "hi"))


def test_random_agent_samples_tool_calls_and_text():
    env = SumEnv()
    env.reset(seed=0)
    samples = [env.action_space.sample() for _ in range(200)]
    calls = [agentrl.agents.parse_reply(s).tool_calls for s in samples]
    assert any(c and c[0].error is None for c in calls)
    assert any(c and c[0].error is not None for c in calls)
    assert any(not c for c in calls)


def test_ansi_render_shows_the_conversation():
    env = SumEnv(render_mode="ansi")
    env.reset(seed=0)
    env.step("12")
    assert "[user]" in env.render() and "[assistant] 12" in env.render()


def test_respond_must_return_feedback():
    class Broken(SumEnv):
        def respond(self, reply):
            return [], 1.0, True

    env = Broken()
    env.reset(seed=0)
    with pytest.raises(TypeError, match="must return a Feedback"):
        env.step("x")


def test_toolcall_with_parse_error_is_never_executed():
    calls = []

    @agentrl.tool
    def record(x: int) -> int:
        """Record x."""
        calls.append(x)
        return x

    class RecordEnv(SumEnv):
        tools = [record]

    env = RecordEnv()
    env.reset(seed=0)
    reply = Message("assistant", "", tool_calls=[ToolCall("record", {"x": 1}, id="c", error="broken")])
    observation = env.step(reply).observation
    assert calls == [] and "could not parse the tool call: broken" in observation[0].content


def test_step_outside_an_episode_is_refused():
    env = SumEnv()
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("1")
    env.reset(seed=0)
    env.step("1")
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("1")


def test_truncation_reports_no_success_and_answer_tools_can_be_overridden():
    class SubmitEnv(SumEnv):
        def answer_tools(self, reply, results):
            feedback = super().answer_tools(reply, results)
            return feedback._replace(terminated=reply.tool_calls[0].name == "add", reward=0.5)

    env = SumEnv(max_turns=1)
    env.reset(seed=0)
    assert env.step('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>').info["success"] is False
    env = SubmitEnv()
    env.reset(seed=0)
    result = asyncio.run(env.astep('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'))
    assert (result.terminated, result.reward, result.observation[0].content) == (True, 0.5, "3")


def test_a_reply_with_too_many_tool_calls_runs_the_first_few():
    env = SumEnv()
    env.reset(seed=0)
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    observation = env.step(call * 1000).observation
    assert len(observation) == env.max_tool_calls + 1
    assert "too many tool calls in one reply (1000)" in observation[-1].content


def test_methods_listed_as_tools_are_bound_to_each_instance():
    class CounterEnv(SumEnv):
        def __init__(self, start: int):
            super().__init__()
            self.count = start

        def bump(self, by: int) -> int:
            """Add to this env's own counter.

            Args:
                by: How much to add.
            """
            self.count += by
            return self.count

        async def peek(self) -> int:
            """Read this env's own counter."""
            return self.count

        tools = (add, bump, peek)

    class Doubling(CounterEnv):
        def bump(self, by: int) -> int:
            """Add twice as much.

            Args:
                by: Half of what to add.
            """
            return super().bump(2 * by)

    a, b, c = CounterEnv(0), CounterEnv(100), Doubling(0)
    assert [t.name for t in a.tools] == ["add", "bump", "peek"]
    assert a.tools[0] is add  # a module-level tool is shared as it is
    assert a.tools[1].parameters["required"] == ["by"]  # no `self` in the schema
    for env in (a, b, c):
        env.reset(seed=0)
    bump = '<tool_call>{"name": "bump", "arguments": {"by": 5}}</tool_call>'
    peek = '<tool_call>{"name": "peek", "arguments": {}}</tool_call>'
    assert a.step(bump).observation[0].content == "5"
    assert asyncio.run(b.astep(bump)).observation[0].content == "105"
    assert c.step(bump).observation[0].content == "10"  # the subclass's override runs
    assert asyncio.run(a.astep(peek)).observation[0].content == "5" and b.count == 105


# --- the gymnasium way: overriding reset / step ----------------------------------------------------


class GymWaySum(AgentEnv):
    """SumEnv written the gymnasium way: reset and step overridden, plain tuples returned."""

    tools = (add,)

    def __init__(self):
        super().__init__()
        self.step_threads: list[str] = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.a, self.b = (int(x) for x in self.np_random.integers(0, 100, size=2))
        return [Message("user", f"{self.a} + {self.b}?")], {"task": (self.a, self.b)}

    def step(self, action):
        self.step_threads.append(threading.current_thread().name)
        reply = self.parse_reply(action)
        if reply.tool_calls:  # this env answers tool calls itself
            return [Message("tool", "use your head", tool_call_id=reply.tool_calls[0].id)], 0.0, False, False, {}
        right = reply.content.strip() == str(self.a + self.b)
        return [Message("user", "Right." if right else "Wrong.")], float(right), True, False, {"success": right}


def test_reset_and_step_overridden_the_gymnasium_way_work_sync_and_async():
    env = GymWaySum()
    assert env.reset(seed=8)[0] != env.reset(seed=7)[0] == env.reset(seed=7)[0]  # seeded by super().reset
    observation, info = env.reset(seed=7)
    assert info == {"task": (env.a, env.b)}
    tool_call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    sync = [env.step(tool_call), env.step(str(env.a + env.b))]

    async def play():
        first = await env.areset(seed=7)
        return first, [await env.astep(tool_call), await env.astep(str(env.a + env.b))]

    first, steps = asyncio.run(play())
    assert isinstance(first, agentrl.ResetResult) and first.observation == observation
    assert all(isinstance(s, agentrl.StepResult) for s in steps)  # the rollout reads fields by name
    assert [tuple(s) for s in steps] == [tuple(s) for s in sync]
    assert steps[0].observation[0].content == "use your head"  # the override ran, not the base's tools
    assert steps[1].reward == 1.0 and steps[1].info["success"] is True
    main = threading.current_thread().name
    assert env.step_threads[:2] == [main, main] and main not in env.step_threads[2:]  # off the loop


def test_an_env_without_start_or_reset_is_told_both_ways():
    class Nothing(AgentEnv):
        pass

    expected = r"must implement start\(options\) and respond.*or override reset and step"
    with pytest.raises(NotImplementedError, match=expected):
        Nothing().reset(seed=0)


def test_a_reset_override_over_start_still_starts():
    class Logged(SumEnv):
        def reset(self, *, seed=None, options=None):
            observation, info = super().reset(seed=seed, options=options)
            return observation, {**info, "logged": True}

    env = Logged()
    observation, info = env.reset(seed=3)
    assert observation == SumEnv().reset(seed=3).observation and info["logged"] is True
    assert asyncio.run(env.areset(seed=3)) == (observation, info)


def test_a_reset_override_that_skips_super_is_told_so():
    class NoSuper(SumEnv):
        def reset(self, *, seed=None, options=None):
            return [Message("user", "1 + 1?")], {}

    env = NoSuper()
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match=r"an overriding reset must call super\(\)\.reset\(seed=seed\)"):
        env.step("2")


def test_an_env_writing_step_and_astep_keeps_the_async_tool_path():
    # CodeSandbox's shape: step wraps super().step, astep wraps super().astep. The base astep must
    # not fall back to the sync step then (its tools would block a thread instead of being awaited).
    class Both(SumEnv):
        sync_steps = 0

        def step(self, action):
            Both.sync_steps += 1
            return super().step(action)

        async def astep(self, action):
            return await super().astep(action)

    class StepOnly(SumEnv):
        sync_steps = 0

        def step(self, action):
            StepOnly.sync_steps += 1
            return super().step(action)

    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    for cls, expected in ((Both, 1), (StepOnly, 2)):  # Both: only the reply without calls
        env = cls()
        env.reset(seed=0)
        assert asyncio.run(env.astep(call)).observation[0].content == "3"
        assert asyncio.run(env.astep("5")).terminated
        assert cls.sync_steps == expected, cls.__name__


def test_an_init_that_skips_super_init_is_told_so():
    class NoInit(SumEnv):
        def __init__(self, level: int):
            self.level = level

    with pytest.raises(TypeError, match=r"NoInit.__init__ must call super\(\).__init__\(\)"):
        NoInit(3).reset(seed=0)
