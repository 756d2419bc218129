"""Policy mapping: which policy plays which agent, ``agent_id -> policy_id``, with MARLlib's presets.

- ``all``: every agent shares one policy, :data:`SHARED_POLICY_ID` (``"default"``: the same name
  single-agent runs use, so a one-policy trainer config works unchanged whether one agent or
  several play);
- ``group``: one policy per team, named by the team prefix (:func:`group_of`);
- ``individual``: one policy per agent, named by the agent id;
- or any callable ``agent_id -> policy_id``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

from agentrl.suggest import did_you_mean

MappingPreset = Literal["all", "group", "individual"]
PRESETS: tuple[str, ...] = ("all", "group", "individual")
SHARED_POLICY_ID = "default"
"""The policy id of the ``all`` preset."""


def group_of(agent_id: str) -> str:
    """The team prefix of ``agent_id``: the id without its trailing number, underscore kept.

    Only digits right after the *last* underscore at the very end are dropped, so ``red_tank_3``
    is in team ``red_tank_``. MARLlib's code instead cuts at the *first* underscore (``red_``); the
    two agree on the usual ``<team>_<number>`` ids. An id without a trailing ``_<number>`` is a
    team of its own.

    >>> group_of("adversary_0"), group_of("red_tank_12"), group_of("judge")
    ('adversary_', 'red_tank_', 'judge')
    """
    return re.sub(r"(?<=_)\d+$", "", agent_id)


def policy_mapping(mapping: MappingPreset | str | Callable[[str], str]) -> Callable[[str], str]:
    """The ``agent_id -> policy_id`` function for a MARLlib preset, or ``mapping`` itself if callable.

    >>> [policy_mapping("group")(a) for a in ("adversary_0", "adversary_1", "agent_0")]
    ['adversary_', 'adversary_', 'agent_']
    >>> policy_mapping("all")("agent_0"), policy_mapping("individual")("agent_0")
    ('default', 'agent_0')
    """
    if callable(mapping):
        return mapping
    if mapping == "all":
        return _shared
    if mapping == "group":
        return group_of
    if mapping == "individual":
        return _individual
    hint = did_you_mean(str(mapping), PRESETS, n=1, cutoff=0.5)
    raise ValueError(
        f"Unknown policy mapping {mapping!r}; expected one of {PRESETS} or a callable agent_id -> policy_id. "
        f"{hint}".rstrip()
    )


def _shared(agent_id: str) -> str:
    return SHARED_POLICY_ID


def _individual(agent_id: str) -> str:
    return agent_id
