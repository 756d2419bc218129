"""Checkpoints of a training run, safe against ``kill -9`` at any moment.

A checkpoint is a folder ``RUN_DIR/checkpoints/step-000012/`` holding ``trainer.pt`` (model,
optimizer, scheduler, RNG states, step: :meth:`Trainer.state_dict`) and ``controller.json`` (what
the controller needs to go on without losing or repeating a batch: which groups were trained on,
the next group number) plus ``buffer.jsonl`` (complete groups that were waiting for the trainer).
It is written under a temporary name and renamed into place, so a folder with the final name is
always whole; older checkpoints beyond ``keep`` are removed after the new one is in place.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from agentrl.types import Trajectory, read_jsonl, write_jsonl

_PREFIX = "step-"


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    trainer_state: dict[str, Any],
    controller_state: dict[str, Any],
    buffered: list[Trajectory] = (),  # type: ignore[assignment]
    *,
    keep: int = 2,
) -> Path:
    """Write a checkpoint for ``step`` atomically; returns its folder."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_PREFIX}{step:06d}"
    partial = root / f".partial-{final.name}-{os.getpid()}"
    for left in root.glob(".partial-*"):  # writes cut short (a kill, a full disk): never whole, never read
        shutil.rmtree(left, ignore_errors=True)
    partial.mkdir()
    with open(partial / "trainer.pt", "wb") as handle:  # through a file object, a full disk raises OSError ENOSPC
        torch.save(trainer_state, handle)  # (given a path, torch raises a RuntimeError that names no cause)
    (partial / "controller.json").write_text(json.dumps(controller_state, indent=1))
    write_jsonl(partial / "buffer.jsonl", list(buffered))
    _fsync_tree(partial)
    if final.exists():  # the same step saved again after a resume: replace it whole
        shutil.rmtree(final)
    os.replace(partial, final)
    _fsync_dir(root)
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Whole checkpoints of a run, oldest first (partial writes are ignored)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX))


def checkpoint_step(path: str | Path) -> int:
    """The step a checkpoint folder of :func:`list_checkpoints` was saved at."""
    return int(Path(path).name.removeprefix(_PREFIX))


def load_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any], list[Trajectory]]:
    """``(trainer_state, controller_state, buffered trajectories)`` from a checkpoint folder."""
    path = Path(path)
    missing = [name for name in ("trainer.pt", "controller.json", "buffer.jsonl") if not (path / name).exists()]
    if missing:
        raise FileNotFoundError(f"Checkpoint {path} lacks {', '.join(missing)}; it is not a checkpoint agentrl wrote.")
    trainer_state = torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)
    controller_state = json.loads((path / "controller.json").read_text())
    return trainer_state, controller_state, list(read_jsonl(path / "buffer.jsonl"))


def _fsync_tree(folder: Path) -> None:
    for file in folder.iterdir():
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
