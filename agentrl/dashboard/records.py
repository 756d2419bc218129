"""What a training run writes for the dashboard's trajectory viewer: ``RUN_DIR/samples/``.

After each training step the controller writes the first ``samples_per_step`` groups it trained
on to ``samples/train-000012.jsonl`` (``train.POLICY-000012.jsonl`` for each policy of a
multi-policy run, whose policies count their own steps), and after each evaluation the first ``samples_per_eval``
held-out episodes to ``samples/eval-000012.jsonl`` (the held-out seeds are the same at every
evaluation, so the same prompts line up across steps). One JSON object per line: a trajectory's
fields (:meth:`agentrl.Trajectory.to_dict`) plus

- ``step`` and ``kind`` (``train``, ``train.POLICY`` or ``eval``);
- ``token_texts``: each token id decoded on its own, so the page needs no tokenizer;
- ``advantages``: the advantage of each token as the trainer computed it (0 where the loss mask is
  0; empty for evaluation episodes, which are not trained on);
- ``failure_cause``: :func:`~agentrl.rollout.failure_cause` of ``error``, or ``None``.

:func:`read_trajectories` reads these files and the JSONL of ``agentrl rollout --out`` alike.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agentrl.rollout.stats import failure_cause
from agentrl.types import Trajectory

SAMPLES_DIR = "samples"


def sample_records(
    trajectories: Sequence[Trajectory],
    step: int,
    kind: str,
    tokenizer: Any = None,
    advantages: Sequence[Sequence[float]] | None = None,
) -> list[dict[str, Any]]:
    """The records of ``trajectories`` (see the module docstring); ``advantages[i]`` is trajectory
    ``i``'s per-token advantages, ``tokenizer`` decodes ``token_texts`` (left empty without one)."""
    records = []
    for i, trajectory in enumerate(trajectories):
        record = trajectory.to_dict()
        record["step"], record["kind"] = step, kind
        record["token_texts"] = token_texts(tokenizer, trajectory.token_ids) if tokenizer is not None else []
        record["advantages"] = [round(float(a), 5) for a in advantages[i]] if advantages is not None else []
        record["failure_cause"] = failure_cause(trajectory.error) if trajectory.error is not None else None
        records.append(record)
    return records


def write_samples(run_dir: str | Path, records: Iterable[dict[str, Any]], step: int, kind: str) -> Path:
    """Write ``records`` to ``RUN_DIR/samples/KIND-STEP.jsonl`` (replacing an older file of that step)."""
    if not KIND.fullmatch(kind):
        raise ValueError(f"A sample kind is train, eval or train.POLICY, got {kind!r}.")
    folder = Path(run_dir) / SAMPLES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}-{step:06d}.jsonl"
    partial = path.with_suffix(".jsonl.partial")
    with partial.open("w") as f:
        for record in records:
            # ASCII: an env may hand back lone surrogates, which UTF-8 cannot write.
            f.write(json.dumps(finite(record), ensure_ascii=True, default=str) + "\n")
    partial.replace(path)  # a reader never sees half a file
    return path


def token_texts(tokenizer: Any, token_ids: Sequence[int]) -> list[str]:
    """Each token decoded on its own (a character split across tokens shows as U+FFFD)."""
    return list(tokenizer.batch_decode([[i] for i in token_ids], skip_special_tokens=False))


KIND = re.compile(r"(train|eval)(\.[A-Za-z0-9_.+-]{1,128})?")
"""A sample file's kind: ``train`` or ``eval``, or ``train.POLICY`` in a multi-policy run (other
characters of a policy id are written as ``_``, see :func:`sample_kind`)."""


def sample_kind(kind: str, policy_id: str | None = None) -> str:
    """``kind``, or ``kind.POLICY`` with the policy id made fit for a file name."""
    if policy_id is None:
        return kind
    return f"{kind}.{re.sub(r'[^A-Za-z0-9_.+-]', '_', policy_id)[:128]}"


def sample_files(run_dir: str | Path) -> list[tuple[str, int, Path]]:
    """``(kind, step, path)`` of every sample file of a run, in step order."""
    folder = Path(run_dir) / SAMPLES_DIR
    found = []
    for path in folder.glob("*-*.jsonl") if folder.is_dir() else ():
        kind, _, number = path.stem.rpartition("-")
        if KIND.fullmatch(kind) and number.isdigit():
            found.append((kind, int(number), path))
    return sorted(found, key=lambda f: (f[1], f[0]))


def read_trajectories(path: str | Path, limit: int = 1000) -> list[dict[str, Any]]:
    """The first ``limit`` records of a samples file or of ``agentrl rollout --out``'s JSONL."""
    records = []
    with Path(path).open(errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                records.append(finite(json.loads(line)))
            except ValueError:  # a line being written (a live rollout --out): read next time
                continue
            if len(records) >= limit:
                break
    return records


def finite(value: Any) -> Any:
    """``value`` with NaN and infinities as ``None``: JSON has no word for them, and a browser's
    ``JSON.parse`` refuses the page that has one (a loss can be NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
