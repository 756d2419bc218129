"""check_multiagent_env passes on every registered multi-agent env, in every form it can be made in,
and fails with a message saying what was expected on each kind of breach."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from gymnasium.spaces import Discrete
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import parallel_to_aec

import agentrl
from agentrl import EnvCheckError, Message, MessagesSpace, ReplySpace, check_multiagent_env
from agentrl.multiagent import MessageList

FORMS = [
    (env_id, api)
    for env_id in agentrl.multiagent_ids("agentrl")
    for api in (None, "aec")
    if api is None or isinstance(agentrl.make_multiagent(env_id), ParallelEnv)
]


def test_every_builtin_multiagent_env_is_checked():
    ids = {env_id for env_id, _ in FORMS}
    assert {"agentrl/Negotiation-v0", "agentrl/Waltz-v0"} <= ids
    assert ("agentrl/Negotiation-v0", "aec") in FORMS


@pytest.mark.parametrize(("env_id", "api"), FORMS)
def test_every_registered_multiagent_env_passes(env_id, api):
    for split in ("train", "test"):
        check_multiagent_env(functools.partial(agentrl.make_multiagent, env_id, api=api, split=split), seed=3)
        check_multiagent_env(agentrl.make_multiagent(env_id, api=api, split=split))  # no factory: no seed test


class Echo(ParallelEnv):
    """Two agents each say something for three rounds and hear the other's words: a well-behaved env."""

    metadata: dict[str, Any] = {"name": "echo_v0", "is_parallelizable": True}
    rounds = 3
    render_mode = None

    def __init__(self):
        self.possible_agents = ["a_0", "a_1"]
        self.agents: list[str] = []
        self._observation_spaces = {a: MessagesSpace() for a in self.possible_agents}
        self._action_spaces = {a: ReplySpace() for a in self.possible_agents}
        self.round = 0

    def observation_space(self, agent):
        return self._observation_spaces[agent]

    def action_space(self, agent):
        return self._action_spaces[agent]

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.round = 0
        self.topic = "nothing" if seed is None else f"topic {seed}"
        return {a: self.observe_text(f"Talk about {self.topic}.") for a in self.agents}, {a: {} for a in self.agents}

    def observe_text(self, text: str) -> Any:
        return MessageList([Message("user", text)])

    def info(self) -> dict[str, Any]:
        return {"round": self.round}

    def step(self, actions):
        self.round += 1
        over = self.round >= self.rounds
        a, b = self.possible_agents
        observations = {a: self.observe_text(str(actions[b])), b: self.observe_text(str(actions[a]))}
        rewards = {agent: 0.0 for agent in self.agents}
        flags = {agent: over for agent in self.agents}
        infos = {agent: self.info() for agent in self.agents}
        if over:
            self.agents = []
        return observations, rewards, flags, {agent: False for agent in flags}, infos


class ObservesText(Echo):
    def observe_text(self, text):
        return text


class ObservesPlainLists(Echo):
    def observe_text(self, text):
        return [Message("user", text)]


class DiscreteActions(Echo):
    def __init__(self):
        super().__init__()
        self._action_spaces = {a: Discrete(3) for a in self.possible_agents}


class SetInInfo(Echo):
    def info(self):
        return {"seen": {1, 2}}


class NeverEnds(Echo):
    rounds = 10**9


class Unseeded(Echo):
    resets = 0

    def reset(self, seed=None, options=None):
        Unseeded.resets += 1
        return super().reset(seed=Unseeded.resets, options=options)


class NewSpaceEachCall(Echo):
    def action_space(self, agent):
        return ReplySpace()


class NanReward(Echo):
    def step(self, actions):
        observations, rewards, *rest = super().step(actions)
        return (observations, {agent: float("nan") for agent in rewards}, *rest)


def as_aec(cls: type[Echo]) -> Any:
    return lambda: parallel_to_aec(cls())


def test_a_well_behaved_test_env_passes_in_both_forms():
    check_multiagent_env(Echo)
    check_multiagent_env(as_aec(Echo))


BREACHES = {
    "text observation": (ObservesText, r"ObservesText\.reset\(seed=0\) to give 'a_0' a list of agentrl\.Message"),
    "text observation as AEC": (
        as_aec(ObservesText),
        r"to give 'a_0' a list of agentrl\.Message.*PettingZoo's api_test",
    ),
    "plain-list observation as AEC": (
        as_aec(ObservesPlainLists),
        r"ObservesPlainLists \(as an AECEnv\) raised AttributeError: .*dtype.* inside PettingZoo's api_test.*MessageList",
    ),
    "discrete actions": (DiscreteActions, r"action_space\('a_0'\) to be an agentrl\.ReplySpace.*got Discrete\(3\)"),
    "set in info": (SetInInfo, r"an info that json\.dumps can write.*got \{'seen': \{1, 2\}\}.*TypeError"),
    "never ends": (NeverEnds, r"to end within 50 steps.*got agents \['a_0', 'a_1'\] still live after 50 steps"),
    "never ends as AEC": (as_aec(NeverEnds), r"to end within 100 turns"),
    "unseeded reset": (Unseeded, r"reset\(seed=0\) to give the same first observations twice"),
    "new space each call": (
        NewSpaceEachCall,
        r"NewSpaceEachCall failed PettingZoo's parallel_api_test: action_space should return the exact same",
    ),
    "nan reward": (NanReward, r"to give 'a_0' a finite float reward; got nan"),
}


@pytest.mark.parametrize("case", BREACHES)
def test_each_breach_fails_with_a_clear_message(case):
    factory, message = BREACHES[case]
    with pytest.raises(EnvCheckError, match=message) as caught:
        check_multiagent_env(factory)
    assert str(caught.value).startswith(("Expected", type(factory().unwrapped).__name__)), caught.value


def test_an_instance_is_checked_without_the_seed_test():
    check_multiagent_env(Echo())
    with pytest.raises(EnvCheckError, match="to end within 5 steps"):
        check_multiagent_env(NeverEnds(), cycles=5)


def test_a_single_agent_env_is_pointed_to_check_env():
    with pytest.raises(EnvCheckError, match=r"pettingzoo\.ParallelEnv or pettingzoo\.AECEnv.*agentrl\.check_env"):
        check_multiagent_env(agentrl.make("agentrl/Calculator-v0"))


def test_pettingzoo_recommendations_for_numpy_envs_are_silenced(recwarn):
    check_multiagent_env(Echo)
    check_multiagent_env(lambda: agentrl.make_multiagent("agentrl/Waltz-v0"))
    assert [str(w.message) for w in recwarn] == []


def test_aec_envs_are_aec():
    assert isinstance(as_aec(Echo)(), AECEnv)
