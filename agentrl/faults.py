"""A run that a fault ends says so in one message: what died, after which step, and what to run to resume.

``agentrl train`` turns an exception that ends a run (anything but a usage error, which the command
line reports on its own) into :class:`RunFailed`, whose message is :func:`failure_message`; the
command exits with code 1 and the full traceback goes to ``RUN_DIR/train.log``
(:func:`write_traceback`), not to the screen, as do vLLM's own log records of the run
(:func:`vllm_logs_to`).

>>> what_died(ConnectionError("refused"))
'a connection failed (ConnectionError: refused)'
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import logging.config
import os
import sys
import tempfile
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path

from agentrl.metrics import read_metrics

RUN_LOG = "train.log"
"""The file in a run directory that gets the traceback of the fault that ended the run."""


class RunFailed(RuntimeError):
    """A training run ended by a fault; the message says what died, when, and how to resume.

    An episode does not count this as its own failure (as it counts any other exception): it is
    raised through the rollout to the run, which ends.
    """


class TrainerLost(RunFailed):
    """A trainer rank died; the run stops (the other ranks are killed) and resumes from its
    checkpoint (:class:`~agentrl.trainers.ranks.TrainerGroup`)."""


class EngineLost(RunFailed):
    """The inference engine died once more than ``max_engine_restarts`` allows, or could not be
    started again (:class:`~agentrl.policies.supervisor.EngineSupervisor`)."""


class EpisodesFailing(RunFailed):
    """``max_failed_in_a_row`` episodes failed one after another: what they run on (the env, its
    sandbox or server, an engine) is broken, not one episode, and the run stops instead of turning
    every group it starts into another failure."""


class RunStalled(RunFailed):
    """No group finished for ``stall_timeout`` seconds while groups were being played: something the
    episodes wait on hangs, and the run stops instead of waiting for ever."""


class WeightsMismatch(RunFailed):
    """The engine's log-probs of its own sample, right after a weight sync, differ from the trainer's
    by more than ``probe_tolerance``: it serves other weights than the trainer sent (an update that
    never arrived, a restart that loaded old ones), and training on its samples would be off-policy
    without anyone knowing."""


def error_chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the exceptions it was raised from or during, innermost last."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def what_died(error: BaseException) -> str:
    """The part whose failure ``error`` reports, in words, with the error's type and first line."""
    if isinstance(error, RunFailed):  # written for a person already
        return str(error)
    kinds = [f"{type(e).__module__}.{type(e).__name__}" for e in error_chain(error)]
    if any(kind.startswith("vllm.") for kind in kinds):
        part = "the inference engine (vLLM) died"
    elif any(kind.startswith("ray.") for kind in kinds):
        part = "a Ray actor or node died"
    elif any(kind.startswith("docker.") for kind in kinds):
        part = "the Docker engine failed"
    elif any(isinstance(e, ConnectionError) for e in error_chain(error)):
        part = "a connection failed"
    elif any(isinstance(e, MemoryError) for e in error_chain(error)):
        part = "the process ran out of memory"
    elif any(isinstance(e, OSError) and e.errno == errno.ENOSPC for e in error_chain(error)):
        part = "a disk is full (free space on it, then resume)"
    else:
        part = "the run failed"
    first_line = (str(error).strip().splitlines() or [""])[0]
    return f"{part} ({type(error).__name__}{': ' + first_line if first_line else ''})"


def failure_message(
    error: BaseException, run_dir: str | Path, resume_command: str, *, traceback_written: bool = True
) -> str:
    """One paragraph for the person who started the run: what died, the last step finished and the
    last one saved, where the traceback is (``traceback_written``: in the run's log, else above),
    and the command that resumes from the checkpoint."""
    from agentrl.trainers.checkpoint import checkpoint_step, list_checkpoints  # torch: not for `agentrl --help`

    run_dir = Path(run_dir)
    steps = [int(m["step"]) for m in _metrics(run_dir) if any(name.startswith("train/") for name in m)]
    checkpoints = list_checkpoints(run_dir) if run_dir.exists() else []
    # A step is checkpointed before its metrics are logged: a fault in between leaves only the checkpoint.
    done = max(steps + [checkpoint_step(c) for c in checkpoints], default=0)
    saved = (
        f"the last checkpoint is {checkpoints[-1]}, which a rerun resumes from: {resume_command}"
        if checkpoints
        else f"no checkpoint was written yet (checkpoint_every saves one), so a rerun starts over: {resume_command}"
    )
    where = (
        f"in {run_dir / RUN_LOG}" if traceback_written else f"above (it could not be written to {run_dir / RUN_LOG})"
    )
    return f"Training stopped after step {done}: {what_died(error)}. {saved[0].upper()}{saved[1:]}. The traceback is {where}."


def write_traceback(error: BaseException, run_dir: str | Path) -> Path | None:
    """Append ``error``'s traceback, with the time, to ``RUN_DIR/train.log``; return the file's path,
    or None when it cannot be written (a full disk): the traceback then goes to stderr."""
    path = Path(run_dir) / RUN_LOG
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    text = f"--- {stamp}: the run ended with this error\n" + "".join(traceback.format_exception(error))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as e:  # the error may be the full disk itself: the traceback must not be lost with it
        sys.stderr.write(f"{text}(not written to {path}: {e})\n")
        return None
    return path


@contextlib.contextmanager
def vllm_logs_to(run_dir: str | Path) -> Iterator[Path]:
    """For the time of a run, vLLM's log records (warnings and up, from this process and from the
    engine processes it starts: an engine that dies logs its traceback) go to ``RUN_DIR/train.log``
    instead of the screen, where the progress bars and a fault's one message are.

    vLLM configures its logging from a file named by ``VLLM_LOGGING_CONFIG_PATH``, in every process
    and again at each engine start; this writes such a file for the run (unless the environment
    already names one, or sets ``VLLM_LOGGING_LEVEL``, which asks for vLLM's log on the screen). It
    must be entered before vLLM is imported.
    """
    path = Path(run_dir) / RUN_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    if "VLLM_LOGGING_CONFIG_PATH" in os.environ or "VLLM_LOGGING_LEVEL" in os.environ:
        yield path
        return
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
        "handlers": {
            "run_log": {"class": "logging.FileHandler", "filename": str(path.resolve()), "formatter": "plain"}
        },
        "loggers": {"vllm": {"handlers": ["run_log"], "level": "WARNING", "propagate": False}},
    }
    handle, config_path = tempfile.mkstemp(prefix="agentrl-vllm-logging-", suffix=".json")
    with os.fdopen(handle, "w") as file:
        json.dump(config, file)
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = config_path
    # This process's vLLM records too, from vLLM's first import on (some are logged while vLLM is
    # still importing, before it reads the file).
    vllm_logger = logging.getLogger("vllm")
    before = (list(vllm_logger.handlers), vllm_logger.propagate, vllm_logger.level)
    logging.config.dictConfig(config)
    try:
        yield path
    finally:
        os.environ.pop("VLLM_LOGGING_CONFIG_PATH", None)
        os.unlink(config_path)
        for handler in vllm_logger.handlers:
            if handler not in before[0]:
                handler.close()
        vllm_logger.handlers, vllm_logger.propagate = before[0], before[1]
        vllm_logger.setLevel(before[2])


@contextlib.contextmanager
def native_stderr_to(path: str | Path) -> Iterator[None]:
    """For the time of a run, what is written to the process's file descriptor 2 below Python goes
    to ``path`` (appended): the engine processes the run starts inherit it, so their warnings
    (Triton, deprecated torch names), progress bars and an engine's dying traceback land there, as
    do notices of C++ libraries (torch's NUMA binding). Python's ``sys.stderr`` (progress, the run's
    own warnings, a fault's one message) stays where it was. Nothing changes where ``sys.stderr``
    is not descriptor 2 (a test capturing it).
    """
    try:
        real = sys.stderr is sys.__stderr__ and sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        real = False
    if not real:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    screen = os.fdopen(saved, "w", buffering=1, encoding=sys.stderr.encoding, errors="backslashreplace")
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 2)
    os.close(log)
    sys.stderr = screen
    try:
        yield
    finally:
        screen.flush()
        os.dup2(saved, 2)
        sys.stderr = sys.__stderr__
        screen.close()


def resume_command(arguments: Sequence[str], resume: bool) -> str:
    """The ``agentrl train`` command that resumes a run started with ``arguments`` (its config and
    overrides): the same, with ``resume=true`` added where the run had resume off."""
    words = ["agentrl", "train", *arguments]
    if not resume:
        words.append("resume=true")
    return " ".join(words)


def _metrics(run_dir: Path) -> list[dict[str, float]]:
    try:
        return read_metrics(run_dir)
    except (FileNotFoundError, ValueError):  # no step logged yet, or a line cut by the fault
        return []
