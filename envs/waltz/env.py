"""``agentrl/Waltz-v0``: a conversation agent and a feedback agent take turns on one user prompt
(WaltzRL's protocol; Zhang et al., "The Alignment Waltz", arXiv 2510.08240).

An episode, with ``max_rounds`` = T (the paper's T_max = 1):

1. ``conversation`` reads its role (:data:`~agentrl.agents.waltz.CONVERSATION_PROMPT`), the
   organisation's context and the user's prompt, and answers: c_0.
2. ``feedback`` reads its role, the same context, the prompt and the latest answer, and replies with
   a JSON verdict (:func:`~agentrl.agents.waltz.parse_feedback`): labels ``unsafe`` and
   ``overrefuse``, a ``reasoning`` and a ``feedback`` text. The episode stops when both labels are
   false, when the reply is not a valid verdict, or once T verdicts were given and answered.
3. Otherwise ``conversation`` reads only the feedback text and answers again (c_1), and so on.

A judge (:mod:`agentrl.envs.waltz.judges`: ``exact`` for the built-in prompts, ``llm``, or
``module:function``) labels every answer. The env's rewards are WaltzRL's: ``R_c`` per answer and
``R_f`` per verdict (:mod:`agentrl.envs.waltz.rewards`, weights ``alpha``, ``lam``, ``gamma``). The
final step's ``info["waltz"]`` of both agents holds the whole record (the prompt's kind and family,
the judge's labels of each answer, each verdict, why the episode stopped), from which a
``reward_fn`` can score it again with other weights and the evaluation computes attack success,
over-refusal and the feedback trigger rate.

``feedback="agent"`` plays the protocol; ``"oracle"`` replaces the feedback agent by a template
feedback made from the judge's labels (the paper's oracle baseline), and ``"none"`` lets the
conversation agent answer alone (one answer, T = 0); in both the feedback agent never acts.

>>> from agentrl.multiagent import make_multiagent
>>> env = make_multiagent("agentrl/Waltz-v0", split="test")
>>> env.reset(seed=0)
>>> env.agent_selection
'conversation'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pettingzoo import AECEnv

from agentrl.agents.waltz import (
    CONVERSATION_PROMPT,
    FEEDBACK_PREFIX,
    FEEDBACK_PROMPT,
    Feedback,
    feedback_notice,
    oracle_feedback,
    parse_feedback,
    review_request,
    revision_notice,
)
from agentrl.env import ReplySpace
from agentrl.envs._split import Split, check_split
from agentrl.envs.waltz.judges import Judge, make_judge
from agentrl.envs.waltz.public_sets import prompt_pool
from agentrl.envs.waltz.rewards import ALPHA, GAMMA, LAMBDA, episode_rewards
from agentrl.envs.waltz.tasks import Prompt
from agentrl.multiagent import MessageList, MessageSpaces
from agentrl.types import Message

AGENTS: tuple[str, str] = ("conversation", "feedback")
FeedbackMode = Literal["agent", "oracle", "none"]
FEEDBACK_MODES: tuple[str, ...] = ("agent", "oracle", "none")


class WaltzEnv(MessageSpaces, AECEnv[str, MessageList, "str | Message | None"]):
    """WaltzRL's two-agent protocol on one prompt per episode (see the module docstring)."""

    metadata: dict[str, Any] = {"name": "waltz_v0", "render_modes": ["ansi"], "is_parallelizable": False}

    def __init__(
        self,
        split: Split = "train",
        max_rounds: int = 1,
        prompts: str | Sequence[str] = "builtin",
        kinds: str = "all",
        draw: str = "random",
        judge: str = "exact",
        judge_options: Mapping[str, Any] | None = None,
        feedback: FeedbackMode = "agent",
        conversation_prompt: str = CONVERSATION_PROMPT,
        feedback_prompt: str = FEEDBACK_PROMPT,
        alpha: float = ALPHA,
        lam: float = LAMBDA,
        gamma: float = GAMMA,
        render_mode: str | None = None,
    ):
        """
        Args:
            split: ``train`` or ``test`` (the built-in prompts are split by template).
            max_rounds: T, the most feedback rounds (0: the conversation agent answers once).
            prompts: ``builtin``, a public set (``strongreject``, ``harmbench``, ``advbench``,
                ``donotanswer``, ``overrefusal``: :mod:`~agentrl.envs.waltz.public_sets`), or a JSONL
                file of ``{"prompt": ..., "kind": "harmful" | "benign"}`` (used as given for either
                split; :func:`~agentrl.envs.waltz.tasks.load_prompts`), or several of them (a list,
                or joined by ``+``; :func:`~agentrl.envs.waltz.public_sets.prompt_pool`). The exact
                judge needs each prompt's ``protected`` or ``required`` values; public sets have
                none: judge them with ``refusal`` or ``llm``.
            kinds: ``all``, ``harmful`` or ``benign``: which prompts episodes draw.
            draw: ``random`` (a prompt drawn by the seed) or ``cycle`` (seed ``s`` plays prompt
                ``s mod n`` of a fixed shuffle, so consecutive seeds play distinct prompts: an
                evaluation covers the split without repeats).
            judge: ``exact``, ``refusal``, ``llm`` or ``module:function`` (:func:`~agentrl.envs.waltz.judges.make_judge`).
            judge_options: the judge's options (``llm``: backend, model, ...).
            feedback: ``agent``, ``oracle`` (template feedback from the judge's labels) or ``none``.
            conversation_prompt / feedback_prompt: the roles' system prompts.
            alpha / lam / gamma: the weights of the feedback reward's improvement, label and format terms.
        """
        if max_rounds < 0:
            raise ValueError(f"max_rounds must be >= 0 (0: no feedback), got {max_rounds}.")
        if feedback not in FEEDBACK_MODES:
            raise ValueError(f"feedback must be one of {FEEDBACK_MODES}, got {feedback!r}.")
        if kinds not in ("all", "harmful", "benign"):
            raise ValueError(f"kinds must be 'all', 'harmful' or 'benign', got {kinds!r}.")
        if draw not in ("random", "cycle"):
            raise ValueError(f"draw must be 'random' or 'cycle', got {draw!r}.")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}.")
        self.split = check_split(split)
        self.max_rounds = 0 if feedback == "none" else max_rounds
        self.feedback_mode: FeedbackMode = feedback
        pool = prompt_pool(prompts, self.split, judge)
        self.prompts = tuple(p for p in pool if kinds in ("all", p.kind))
        if not self.prompts:
            raise ValueError(f"no {kinds} prompts in {prompts!r}.")
        self.draw = draw
        self._order = np.random.default_rng(0).permutation(len(self.prompts))  # the fixed shuffle of `cycle`
        self.judge: Judge = make_judge(judge, judge_options)
        self.roles = {"conversation": conversation_prompt, "feedback": feedback_prompt}
        self.weights = {"alpha": alpha, "lam": lam, "gamma": gamma}
        self.render_mode = render_mode
        self.possible_agents = list(AGENTS)
        self.agents: list[str] = []
        self._make_spaces(AGENTS, {"conversation": ReplySpace(), "feedback": ReplySpace(reply_prefix=FEEDBACK_PREFIX)})
        self.prompt: Prompt | None = None
        self.record: dict[str, Any] = {}
        self._pending: dict[str, list[Message]] = {}
        self.rewards: dict[str, float] = {}
        self._cumulative_rewards: dict[str, float] = {}
        self.terminations: dict[str, bool] = {}
        self.truncations: dict[str, bool] = {}
        self.infos: dict[str, dict[str, Any]] = {}
        self.agent_selection = "conversation"

    # --- PettingZoo ---------------------------------------------------------------------------------

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self._seed(seed)
        if self.draw == "cycle" and seed is not None:
            index = int(self._order[seed % len(self.prompts)])
        else:
            index = int(self.np_random.integers(len(self.prompts)))
        self.prompt = prompt = self.prompts[index]
        self.agents = list(AGENTS) if self.feedback_mode == "agent" and self.max_rounds > 0 else ["conversation"]
        self.record = {
            "kind": prompt.kind,
            "family": prompt.family,
            "template": prompt.template,
            "prompt": prompt.text,
            "answers": [],
            "rounds": [],
            "stopped": "",
        }
        self._pending = {
            "conversation": [self._system("conversation"), Message("user", prompt.text)],
            "feedback": [],
        }
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = "conversation"

    def observe(self, agent: str) -> MessageList:
        """The messages ``agent`` has not seen yet (what came since its last turn)."""
        return MessageList(self._pending.get(agent, []))

    def step(self, action: str | Message | None) -> None:
        agent = self.agent_selection
        if self.terminations.get(agent) or self.truncations.get(agent):
            self._was_dead_step(action)
            return
        if self.prompt is None:
            raise RuntimeError("WaltzEnv.step was called outside an episode; call reset() first.")
        if action is None:
            raise ValueError(f"WaltzEnv.step needs {agent}'s reply (text or an assistant Message), got None.")
        text = action.content if isinstance(action, Message) else str(action)
        self._cumulative_rewards[agent] = 0.0
        self.rewards = {a: 0.0 for a in self.agents}
        self._pending[agent] = []
        if agent == "conversation":
            self._answer(text)
        else:
            self._verdict(parse_feedback(text))
        self._accumulate_rewards()

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self.prompt is None:
            return None
        lines = [f"[{self.prompt.kind}/{self.prompt.family}] user: {self.prompt.text}"]
        for t, answer in enumerate(self.record["answers"]):
            lines.append(f"c_{t}: {answer['text']}  judge: {answer['unsafe']=}, {answer['overrefuse']=}")
            if t < len(self.record["rounds"]):
                lines.append(f"f_{t}: {self.record['rounds'][t]}")
        lines.append(f"stopped: {self.record['stopped']}")
        return "\n".join(lines)

    def close(self) -> None:
        pass  # the judge is shared by every env of the run (make_judge); close_judges() frees it

    # --- the protocol ---------------------------------------------------------------------------------

    def _answer(self, text: str) -> None:
        """The conversation agent answered: judge it, pay it and the feedback that led to it, and
        hand over to the feedback (or end)."""
        assert self.prompt is not None
        labels = self.judge.label(self.prompt, text)
        self.record["answers"].append(
            {
                "text": text,
                "unsafe": None if labels is None else labels.unsafe,
                "overrefuse": None if labels is None else labels.overrefuse,
            }
        )
        self._pay()
        t = len(self.record["answers"]) - 1
        if t >= self.max_rounds:
            return self._end("max_rounds" if self.max_rounds else "no_feedback")
        if self.feedback_mode == "oracle":
            if labels is None or labels.ok:
                return self._end("agreed" if labels is not None else "judge_failed")
            self.record["rounds"].append(
                {"valid": True, "unsafe": labels.unsafe, "overrefuse": labels.overrefuse, "revise": True}
            )
            self._pending["conversation"] = [Message("user", feedback_notice(oracle_feedback(*labels)))]
            return
        request = review_request(self.prompt.text, text) if t == 0 else revision_notice(text)
        self._pending["feedback"] = [
            *([self._system("feedback")] if t == 0 else []),
            Message("user", request),
        ]
        self.agent_selection = "feedback"

    def _verdict(self, verdict: Feedback) -> None:
        """The feedback agent replied: stop, or pass its feedback text to the conversation agent."""
        self.record["rounds"].append(
            {
                "valid": verdict.valid,
                "unsafe": verdict.unsafe if verdict.valid else None,
                "overrefuse": verdict.overrefuse if verdict.valid else None,
                "revise": verdict.revise,
                "problem": verdict.problem,
            }
        )
        if not verdict.revise:
            self._pay()
            return self._end("agreed" if verdict.valid else "invalid_feedback")
        self._pending["conversation"] = [Message("user", feedback_notice(verdict.feedback))]
        self.agent_selection = "conversation"

    def _pay(self) -> None:
        """Set this step's rewards: R_c of the newest answer, and R_f of the newest verdict once
        its outcome is known (the answer after it, or the end)."""
        answers, rounds = episode_rewards(self.record, **self.weights)
        answered = len(self.record["answers"])
        if self.record["answers"] and (not self.record["rounds"] or answered > len(self.record["rounds"])):
            self.rewards["conversation"] = answers[-1]
        if rounds and self.feedback_mode == "agent":
            self.rewards["feedback"] = rounds[-1]

    def _end(self, why: str) -> None:
        self.record["stopped"] = why
        final = self.record["answers"][-1] if self.record["answers"] else {}
        success = final.get("unsafe") is False and final.get("overrefuse") is False
        for agent in self.agents:
            self.terminations[agent] = True
            self.infos[agent] = {"waltz": self.record, "success": success}
        self.agent_selection = self.agents[0]

    def _system(self, role: str) -> Message:
        assert self.prompt is not None
        context = self.prompt.context
        return Message("system", f"{self.roles[role]}\n\n{context}" if context else self.roles[role])


def env(**kwargs: Any) -> WaltzEnv:
    """The env as an ``AECEnv`` (PettingZoo's module convention)."""
    return WaltzEnv(**kwargs)
