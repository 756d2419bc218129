"""Process-global random streams kept per env: for packages whose games draw from ``random`` and
``numpy.random`` (TextArena, GEM), so that envs played side by side in one process do not share one
stream and a seed replays an episode."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

_LOCK = threading.Lock()  # one for every env here: they all swap the same two global streams


class OwnRandom:
    """One env's state of ``random`` and ``numpy.random``, swapped in around its calls to the package."""

    def __init__(self, seed: int = 0):
        self.state = _seeded(seed)

    def seed(self, seed: int) -> None:
        self.state = _seeded(seed)

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Run package code with this env's streams (under the one lock: a call holds it throughout)."""
        with _LOCK:
            saved = random.getstate(), np.random.get_state()
            random.setstate(self.state[0])
            np.random.set_state(self.state[1])
            try:
                yield
            finally:
                self.state = random.getstate(), np.random.get_state()
                random.setstate(saved[0])
                np.random.set_state(saved[1])


def _seeded(seed: int) -> tuple[Any, Any]:
    return random.Random(seed).getstate(), np.random.RandomState(seed % 2**32).get_state()
