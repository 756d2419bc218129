"""One "did you mean" rule for every unknown name: env ids, config fields, tools, estimators, metrics.

>>> did_you_mean("agentrl/Calculater-v0", ["agentrl/Calculator-v0", "agentrl/Countdown-v0"])
"Did you mean 'agentrl/Calculator-v0'?"
>>> did_you_mean("zzz", ["a", "b"])
''
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

MAX_NAME_LENGTH = 100
"""Names longer than this are garbage (a model's runaway tool name), not typos: no comparison."""


NEAR_BEST = 0.05
"""Only names scoring within this of the best match are suggested: ids share long prefixes
(``agentrl/``), and a typo has one clear fix more often than three."""


def close_matches(name: object, choices: Iterable[str], *, n: int = 3, cutoff: float = 0.6) -> list[str]:
    """Up to ``n`` of ``choices`` close to ``name`` (difflib's similarity at least ``cutoff`` and
    near the best match's); falls back to a case-insensitive comparison, so ``"calculator"`` still
    finds ``"agentrl/Calculator-v0"``."""
    if not isinstance(name, str) or len(name) > MAX_NAME_LENGTH:
        return []
    choices = [c for c in choices if isinstance(c, str)]
    close = _ranked(name, {c: c for c in choices}, n, cutoff)
    if close:
        return close
    return _ranked(name.lower(), {c.lower(): c for c in choices}, n, cutoff - 0.1)


def _ranked(name: str, choices: dict[str, str], n: int, cutoff: float) -> list[str]:
    scored = []
    for key, choice in choices.items():
        matcher = difflib.SequenceMatcher(None, name, key)
        if matcher.real_quick_ratio() >= cutoff and matcher.quick_ratio() >= cutoff:
            score = matcher.ratio()
            if score >= cutoff:
                scored.append((score, choice))
    scored.sort(key=lambda item: (-item[0], item[1]))
    best = scored[0][0] if scored else 0.0
    return [choice for score, choice in scored[:n] if score >= best - NEAR_BEST]


def did_you_mean(name: object, choices: Iterable[str], *, n: int = 3, cutoff: float = 0.6) -> str:
    """``"Did you mean 'a' or 'b'?"`` for the names close to ``name``, or ``""`` when none is."""
    close = close_matches(name, choices, n=n, cutoff=cutoff)
    return "Did you mean " + " or ".join(repr(c) for c in close) + "?" if close else ""
