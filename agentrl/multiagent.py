"""Several agents in one episode: the multi-agent env contract, and where each of its parts lives.

A multi-agent env is a PettingZoo env, :class:`pettingzoo.ParallelEnv` (every live agent acts at
once) or :class:`pettingzoo.AECEnv` (agents take turns), that speaks the single-agent message
contract per agent: an observation is the list of *new* messages for that agent since it last
acted (a :class:`MessageList`), and an action is the reply text or an assistant
:class:`~agentrl.types.Message`. Spaces are :class:`~agentrl.env.MessagesSpace` and
:class:`~agentrl.env.ReplySpace`, one object per agent. PettingZoo's own ``api_test`` and
``parallel_api_test`` check such an env.

The parts, importable from here as before:

- which policy plays which agent: :func:`policy_mapping` with MARLlib's ``all`` / ``group`` /
  ``individual`` presets (:mod:`agentrl.mapping`);
- ids: :func:`register_multiagent`, :func:`make_multiagent`, :func:`multiagent_ids`
  (:mod:`agentrl.registry`, beside the single-agent registry);
- playing: :func:`run_multiagent_episode` and :class:`MultiAgentRollout`
  (:mod:`agentrl.rollout.multiagent`).

::

    env = make_multiagent("agentrl/Negotiation-v0")              # a ParallelEnv
    aec = make_multiagent("agentrl/Negotiation-v0", api="aec")   # the same game as an AECEnv
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from gymnasium.utils import seeding

from agentrl.env import MessagesSpace, ReplySpace
from agentrl.mapping import PRESETS, SHARED_POLICY_ID, MappingPreset, group_of, policy_mapping
from agentrl.registry import (
    MultiAgentEnv,
    MultiAgentSpec,
    make_multiagent,
    multiagent_ids,
    multiagent_spec,
    register_multiagent,
)
from agentrl.rollout.multiagent import MultiAgentRollout, run_multiagent_episode
from agentrl.types import Message

__all__ = [
    "PRESETS",
    "SHARED_POLICY_ID",
    "MappingPreset",
    "MessageList",
    "MessageSpaces",
    "MultiAgentEnv",
    "MultiAgentRollout",
    "MultiAgentSpec",
    "group_of",
    "make_multiagent",
    "multiagent_ids",
    "multiagent_spec",
    "policy_mapping",
    "register_multiagent",
    "run_multiagent_episode",
]


class MessageList(list[Message]):
    """A multi-agent env's observation for one agent: a plain list of new messages.

    The one addition to ``list`` is ``dtype = None``, equal to ``MessagesSpace().dtype``:
    PettingZoo's ``api_test`` compares each observation's ``dtype`` with its space's, a check
    written for numpy observations, and a bare list has no ``dtype`` to compare.
    """

    dtype: None = None


class MessageSpaces:
    """What every PettingZoo env in messages repeats, as a mixin (listed before ``AECEnv`` or
    ``ParallelEnv``): one :class:`~agentrl.env.MessagesSpace` and one
    :class:`~agentrl.env.ReplySpace` per agent, made once (PettingZoo wants the same object on
    every call), and ``np_random``, seeded by :meth:`_seed` as gymnasium seeds a single env (each
    agent's action space with ``seed + i``)."""

    _observation_spaces: dict[str, MessagesSpace]
    _action_spaces: dict[str, ReplySpace]
    _np_random: np.random.Generator | None

    def _make_spaces(self, agents: Sequence[str], action_spaces: Mapping[str, ReplySpace] | None = None) -> None:
        """The spaces of ``agents`` (``action_spaces``: ones of your own, e.g. with a reply prefix)."""
        self._observation_spaces = {a: MessagesSpace() for a in agents}
        self._action_spaces = dict(action_spaces) if action_spaces is not None else {a: ReplySpace() for a in agents}
        self._np_random = None

    def observation_space(self, agent: str) -> MessagesSpace:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> ReplySpace:
        return self._action_spaces[agent]

    @property
    def np_random(self) -> np.random.Generator:
        if self._np_random is None:
            self._np_random, _ = seeding.np_random()
        return self._np_random

    def _seed(self, seed: int | None) -> None:
        """Seed ``np_random`` and the agents' action spaces (nothing when ``seed`` is ``None``)."""
        if seed is None:
            return
        self._np_random, _ = seeding.np_random(seed)
        for i, space in enumerate(self._action_spaces.values()):
            space.seed(seed + i)
