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
