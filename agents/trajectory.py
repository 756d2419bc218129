"""Recording an episode: :class:`TrajectoryBuilder` writes one agent's turns as exact token ids;
cutting one into a training sample: :func:`first_turns` (part of an episode) and :func:`one_turn`
(one turn, the turns before it as context), for a ``samples_fn`` of ``agentrl train``. The cuts
keep the exact tokens of the trajectory (nothing is re-tokenised) and its invariants.

The rollout drives it turn by turn: the prompt from the first observation, the policy's own
generated ids with their log-probs and policy versions, then each observation as the chat
template's delta, rendered by a :class:`~agentrl.agents.chat.ChatAgent` (history is never
re-tokenised). :meth:`TrajectoryBuilder.finish` returns the validated
:class:`~agentrl.types.Trajectory`, whose per-token lists the trainer reads as they stand.

>>> from agentrl.testing import build_tiny_tokenizer
>>> agent = ChatAgent(build_tiny_tokenizer())
>>> builder = TrajectoryBuilder(agent)
>>> prompt = builder.start([Message("user", "What is 2 + 3?")])
>>> reply = builder.add_turn(agent.encode("5") + agent.end_of_turn_ids, [-0.5, -0.1], version=0)
>>> reply.content
'5'
>>> _ = builder.add_observation([Message("user", "Right.")], reward=1.0)
>>> trajectory = builder.finish(terminated=True)
>>> trajectory.reward, trajectory.num_generated
(1.0, 2)
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.agents.chat import ChatAgent
from agentrl.types import Message, Trajectory


class TrajectoryBuilder:
    """Records one agent's episode as a :class:`~agentrl.types.Trajectory`, one step at a time.

    Call :meth:`start` with the first observation, then alternate :meth:`add_turn` (the policy's
    generated ids) and :meth:`add_observation` (the env's answer), and end with :meth:`finish`,
    after :meth:`add_final_observation` if the env answered the last turn and the episode ended.
    :attr:`token_ids` is always the whole context to send for the next generation, and
    :attr:`room_left` how many tokens may still be generated within ``max_length``.

    >>> from agentrl.testing import build_tiny_tokenizer
    >>> agent = ChatAgent(build_tiny_tokenizer())
    >>> builder = TrajectoryBuilder(agent, max_length=64)
    >>> _ = builder.start([Message("user", "Hi")])
    >>> builder.room_left, builder.would_exceed([Message("user", "x " * 100)])
    (54, True)
    """

    def __init__(
        self,
        agent: ChatAgent,
        *,
        max_length: int | None = None,
        env_id: str = "",
        agent_id: str = "agent",
        policy_id: str = "default",
        group_id: str = "",
    ):
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be a positive int or None, got {max_length}.")
        self.agent = agent
        self.max_length = max_length
        self._trajectory = Trajectory(env_id=env_id, agent_id=agent_id, policy_id=policy_id, group_id=group_id)
        self._cut_turns: list[int] = []
        self._turn_closed = True
        # The observation would_exceed last rendered (a snapshot of its messages, whether the turn
        # was closed, its ids), so that add_observation for equal messages does not render and
        # encode them a second time.
        self._rendered: tuple[list[tuple[Any, ...]], bool, list[int]] | None = None
        self._state = ""  # the key of the state the next turn answers (Trajectory.turn_states)
        # What may come next: "start", then "turn" and "observation" alternately, then "finished".
        self._expect = "start"

    @property
    def token_ids(self) -> list[int]:
        """The whole sequence so far: the context for the next generation."""
        return list(self._trajectory.token_ids)

    @property
    def length(self) -> int:
        """How many tokens the sequence holds."""
        return len(self._trajectory.token_ids)

    @property
    def room_left(self) -> int | None:
        """Tokens left before ``max_length`` (``None`` if unlimited, 0 if already over); use it as
        the next generation's ``max_tokens``."""
        return None if self.max_length is None else max(0, self.max_length - self.length)

    @property
    def messages(self) -> list[Message]:
        """The conversation so far, system prompt and parsed replies included."""
        return list(self._trajectory.messages)

    def would_exceed(self, extra: int | Sequence[Message]) -> bool:
        """Whether appending ``extra`` tokens, or the observation for these messages, would make
        the sequence longer than ``max_length`` (the rollout then ends the episode as
        truncated)."""
        if self.max_length is None:
            return False
        if isinstance(extra, int):
            return self.length + extra > self.max_length
        ids = self.agent.observation_ids(extra, turn_closed=self._turn_closed)
        self._rendered = (_snapshot(extra), self._turn_closed, ids)
        return self.length + len(ids) > self.max_length

    def start(self, messages: Sequence[Message], state_key: str | None = None) -> list[int]:
        """Begin with the first observation; return the prompt ids. ``state_key`` names the state
        it shows (the env's ``info["state_key"]``; a digest of the messages by default)."""
        self._check_order("start")
        self._state = state_key if state_key is not None else observation_key(messages)
        ids = self.agent.prompt_ids(messages)
        self._append_context(ids)
        self._trajectory.prompt_length = len(ids)
        self._trajectory.messages = self.agent.conversation(messages)
        self._expect = "turn"
        return ids

    def add_turn(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        version: int | Sequence[int],
        *,
        text: str | None = None,
        closed: bool | None = None,
    ) -> Message:
        """Record one generation and return the assistant message parsed from it.

        Args:
            token_ids: the generated ids, the end-of-turn token included if the policy stopped on it.
            logprobs: the behaviour log-prob of each generated id.
            version: the policy version that generated the ids, or one version per id (a
                generation may span a weight update).
            text: the completion text if the engine already decoded it (without the end-of-turn
                token); decoded here otherwise.
            closed: whether the turn ended with the end-of-turn token; read from ``token_ids`` by
                default. An unclosed turn gets the token inserted before the next observation.
        """
        self._check_order("turn")
        n = len(token_ids)
        if n == 0:
            raise ValueError("add_turn got no generated tokens; a turn must generate at least one.")
        versions = list(version) if isinstance(version, Sequence) else [int(version)] * n
        if len(logprobs) != n or len(versions) != n:
            raise ValueError(
                f"add_turn got {n} token ids, {len(logprobs)} logprobs and {len(versions)} versions; "
                "give one logprob (and one version, or a single int) per generated token."
            )
        self._turn_closed = self.agent.ends_turn(token_ids) if closed is None else closed
        message = self.agent.parse(text if text is not None else self.agent.completion_text(token_ids))
        trajectory = self._trajectory
        trajectory.token_ids.extend(token_ids)
        trajectory.loss_mask.extend([1] * n)
        trajectory.logprobs.extend(map(float, logprobs))  # map: cheaper than a generator, once per token
        trajectory.versions.extend(map(int, versions))
        trajectory.turn_ends.append(len(trajectory.token_ids) - 1)
        trajectory.turn_rewards.append(0.0)
        trajectory.turn_states.append(self._state)
        trajectory.messages.append(message)
        if not self._turn_closed:
            self._cut_turns.append(trajectory.turns)
        trajectory.turns += 1
        self._expect = "observation"
        return message

    def add_observation(
        self, messages: Sequence[Message], reward: float = 0.0, state_key: str | None = None
    ) -> list[int]:
        """Append the env's answer to the last turn (an empty list if it sent nothing but the
        episode goes on) and add ``reward`` to that turn; return the appended ids. ``state_key``
        names the state the next turn answers (as in :meth:`start`)."""
        self._check_order("observation")
        self._state = state_key if state_key is not None else observation_key(messages)
        rendered, self._rendered = self._rendered, None
        if rendered is not None and rendered[1] == self._turn_closed and rendered[0] == _snapshot(messages):
            ids = rendered[2]
        else:
            ids = self.agent.observation_ids(messages, turn_closed=self._turn_closed)
        self._append_context(ids)
        self._trajectory.messages.extend(messages)
        self.add_reward(reward)
        self._turn_closed = True
        self._expect = "turn"
        return ids

    def add_final_observation(self, messages: Sequence[Message], reward: float = 0.0) -> None:
        """Record the env's last answer when the episode ends after a turn: the messages join the
        conversation and ``reward`` goes to the last turn, but no tokens are appended, since
        nothing is generated after them. Only :meth:`finish` may follow."""
        self._check_order("observation")
        self._trajectory.messages.extend(messages)
        self.add_reward(reward)
        self._expect = "finish"

    def add_reference(self, messages: Sequence[Message], reference: str) -> None:
        """Record the env's reference answer after the episode's last turn (``info["reference"]``):
        the tokens that would follow if the env's last answer, ``messages``, were appended and the
        policy replied with ``reference`` (:attr:`Trajectory.reference_ids`; the reply's own tokens
        are marked in :attr:`Trajectory.reference_mask`). Call it after
        :meth:`add_final_observation`, with the same messages; only :meth:`finish` may follow."""
        self._check_order("finish")
        if self._trajectory.reference_ids:
            raise RuntimeError("add_reference was already called; an episode has one reference answer.")
        if not isinstance(reference, str) or not reference:
            raise ValueError(f"A reference answer must be a non-empty str, got {reference!r:.80}.")
        context = self.agent.observation_ids(messages, turn_closed=self._turn_closed)
        reply = self.agent.reply_ids(reference)
        self._trajectory.reference_ids = context + reply
        self._trajectory.reference_mask = [0] * len(context) + [1] * len(reply)

    def add_reward(self, reward: float, turn: int = -1) -> None:
        """Add ``reward`` to a turn's reward (the last turn by default)."""
        if reward and not self._trajectory.turn_rewards:
            raise ValueError("A reward needs a turn to go to; no turn has been added yet.")
        if reward:
            self._trajectory.turn_rewards[turn] += float(reward)

    def set_reward(self, reward: float, turn: int = -1) -> None:
        """Set a turn's reward (the last turn by default), replacing what it had."""
        if not self._trajectory.turn_rewards:
            raise ValueError("A reward needs a turn to go to; no turn has been added yet.")
        self._trajectory.turn_rewards[turn] = float(reward)

    def finish(
        self,
        *,
        reward: float = 0.0,
        terminated: bool = False,
        truncated: bool = False,
        error: str | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> Trajectory:
        """End the episode and return its trajectory (validated). ``reward`` is added to the last
        turn; the trajectory's ``reward`` is the sum of the turn rewards. ``info["cut_turns"]``
        lists the turns whose generation hit its token limit."""
        if self._expect == "finished":
            raise RuntimeError("finish() was already called; start a new TrajectoryBuilder per episode.")
        self.add_reward(reward)
        trajectory = self._trajectory
        trajectory.reward = float(sum(trajectory.turn_rewards))
        trajectory.terminated = terminated
        trajectory.truncated = truncated
        trajectory.error = error
        trajectory.info = {"cut_turns": list(self._cut_turns), **(info or {})}
        trajectory.validate()
        self._expect = "finished"
        return trajectory

    def _append_context(self, ids: list[int]) -> None:
        """Append prompt or observation ids: not trained on, no log-prob, no policy version."""
        trajectory = self._trajectory
        trajectory.token_ids.extend(ids)
        trajectory.loss_mask.extend([0] * len(ids))
        trajectory.logprobs.extend([0.0] * len(ids))
        trajectory.versions.extend([-1] * len(ids))

    def _check_order(self, step: str) -> None:
        if self._expect == step:
            return
        hints = {
            "start": "call start(messages) first",
            "turn": "add a turn (the policy's generation) next",
            "observation": "add an observation next (add_observation([]) if the env sent nothing)",
            "finish": "the final observation was added; call finish()",
            "finished": "the episode is finished; start a new TrajectoryBuilder",
        }
        raise RuntimeError(f"Cannot {step} here: {hints[self._expect]}.")


def reference_trajectory(
    agent: ChatAgent, messages: Sequence[Message], reference: str, *, env_id: str = "", group_id: str = ""
) -> Trajectory:
    """A trajectory in which nothing was generated: the prompt for ``messages``, then ``reference``
    teacher-forced as the policy's reply (``reference_ids``, every one of its tokens scored).

    Supervised fine-tuning on reference answers trains on these (a ``Trainer`` with
    ``algorithm="jepo"``: in a group of one a trajectory's advantage is 0 and its reference weight
    1, so the update is the reference's token-mean negative log-likelihood, nothing else), and a
    reference's likelihood straight after the prompt, without a chain of thought, is read from them.

    >>> from agentrl.testing import build_tiny_tokenizer
    >>> agent = ChatAgent(build_tiny_tokenizer())
    >>> t = reference_trajectory(agent, [Message("user", "2 + 3?")], "5")
    >>> t.num_generated, t.reference_mask == [1] * len(agent.reply_ids("5"))
    (0, True)
    """
    prompt = agent.prompt_ids(messages)
    reply = agent.reply_ids(reference)
    trajectory = Trajectory(
        token_ids=prompt,
        loss_mask=[0] * len(prompt),
        logprobs=[0.0] * len(prompt),
        versions=[-1] * len(prompt),
        prompt_length=len(prompt),
        reference_ids=reply,
        reference_mask=[1] * len(reply),
        messages=agent.conversation(messages),
        env_id=env_id,
        group_id=group_id,
        terminated=True,
    )
    trajectory.validate()
    return trajectory


def observation_key(messages: Sequence[Message]) -> str:
    """A short digest of an observation's messages: equal observations, equal keys (GiGPO's
    default anchor state)."""
    text = json.dumps([[m.role, m.content, m.name] for m in messages], ensure_ascii=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _snapshot(messages: Sequence[Message]) -> list[tuple[Any, ...]]:
    """Everything of ``messages`` that renders, copied: equal snapshots render alike, whatever is
    done to the messages afterwards. (A deep copy of the messages would do, at ten times the cost.)"""
    return [
        (m.role, m.content, m.tool_call_id, m.name, copy.deepcopy(m.tool_calls) if m.tool_calls else None)
        for m in messages
    ]


# --- cuts: training samples from part of a trajectory ---------------------------------------------


def first_turns(trajectory: Trajectory, turns: int) -> Trajectory:
    """``trajectory`` cut after its first ``turns`` turns (the observation after the last kept turn
    dropped): a training sample of part of an episode, e.g. for ``samples_fn``.

    The returned trajectory keeps those turns' rewards; ``reward`` is their sum.
    """
    if not 1 <= turns <= len(trajectory.turn_ends):
        raise ValueError(f"cannot keep {turns} turns of a trajectory with {len(trajectory.turn_ends)}.")
    end = trajectory.turn_ends[turns - 1] + 1
    rewards = list(trajectory.turn_rewards[:turns])
    return dataclasses.replace(
        trajectory,
        token_ids=trajectory.token_ids[:end],
        loss_mask=trajectory.loss_mask[:end],
        logprobs=trajectory.logprobs[:end],
        versions=trajectory.versions[:end],
        turn_ends=trajectory.turn_ends[:turns],
        turn_rewards=rewards,
        turn_states=trajectory.turn_states[:turns],
        reward=sum(rewards),
        turns=turns,
    )


def one_turn(trajectory: Trajectory, turn: int) -> Trajectory:
    """``trajectory`` as a sample of turn ``turn`` (0-based) alone: everything before that turn's
    generated tokens becomes prompt (loss mask 0, no log-probs, version -1), and the sequence ends
    after it. The sample has one turn, with that turn's reward.

    WaltzRL trains the feedback agent on one round per episode this way: the earlier rounds are
    what it read, not what it is trained to write.
    """
    if not 0 <= turn < len(trajectory.turn_ends):
        raise ValueError(f"cannot keep turn {turn} of a trajectory with {len(trajectory.turn_ends)} turns.")
    end = trajectory.turn_ends[turn] + 1
    start, floor = end - 1, trajectory.turn_ends[turn - 1] + 1 if turn else 0
    while start > floor and trajectory.loss_mask[start - 1] == 1:
        start -= 1
    reward = trajectory.turn_rewards[turn]
    return dataclasses.replace(
        trajectory,
        token_ids=trajectory.token_ids[:end],
        loss_mask=[0] * start + trajectory.loss_mask[start:end],
        logprobs=[0.0] * start + trajectory.logprobs[start:end],
        versions=[-1] * start + trajectory.versions[start:end],
        prompt_length=start,
        turn_ends=[end - 1],
        turn_rewards=[reward],
        turn_states=trajectory.turn_states[turn : turn + 1],
        reward=reward,
        turns=1,
    )
