"""Train / test splits for procedurally generated envs.

Every task has a canonical key (for example ``"countdown:3,7,25,50->311"``). A stable hash of the
key, not the seed, decides the task's split, so the two splits are disjoint by construction however
many seeds are drawn: a task generated for the wrong split is thrown away and drawn again from the
same generator, which keeps episodes deterministic under a seed. ``hashlib`` is used rather than
``hash()`` because Python salts string hashes per process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Literal, TypeVar

import numpy as np

Split = Literal["train", "test"]
SPLITS: tuple[str, ...] = ("train", "test")
TEST_FRACTION = 0.2
"""About this share of all tasks belongs to the test split."""

_MAX_DRAWS = 10_000
T = TypeVar("T")


def check_split(split: str) -> Split:
    """Return ``split`` if it is a known split name, else raise a ``ValueError`` saying which are."""
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}; expected one of {SPLITS}.")
    return split  # type: ignore[return-value]


def split_of(key: str) -> Split:
    """The split a task with canonical key ``key`` belongs to."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return "test" if int.from_bytes(digest, "big") / 2**64 < TEST_FRACTION else "train"


def draw(rng: np.random.Generator, generate: Callable[[np.random.Generator], tuple[str, T]], split: Split) -> T:
    """Call ``generate(rng) -> (key, task)`` until a task of ``split`` comes out; return that task."""
    for _ in range(_MAX_DRAWS):
        key, task = generate(rng)
        if split_of(key) == split:
            return task
    raise RuntimeError(
        f"No {split!r} task in {_MAX_DRAWS} draws; the generator's task space is too small for a "
        f"{TEST_FRACTION:.0%} test split."
    )
