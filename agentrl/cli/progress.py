"""Progress on screen: rich bars on a terminal, flushed lines when stdout is a file, a pipe or CI
(:class:`LineProgress`, which ``agentrl rollout`` uses too)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from agentrl.cli.common import (
    err_console,
)


def progress_bars() -> Any:
    """Rich progress bars on stderr: description, bar, count, status, elapsed time."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
    )
    return Progress(*columns, console=err_console, transient=False)


def train_progress() -> TrainProgress | LineProgress:
    """Progress bars on a terminal; plain lines when stdout is not one (a file, a pipe, CI)."""
    return TrainProgress() if sys.stdout.isatty() else LineProgress()


class TrainProgress:
    """Progress bars for ``agentrl train``: one per phase (engine start, evaluations, training)."""

    def __init__(self) -> None:
        self.progress = progress_bars()
        self.task: Any = None

    def __enter__(self) -> TrainProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def hooks(self) -> Any:
        from agentrl.train import Progress  # see train_command

        def on_phase(name: str, total: int) -> None:
            if self.task is not None:  # the phase before ended: its bar full, its clock stopped
                done = self.progress.tasks[self.task].completed
                self.progress.update(self.task, total=done or 1, completed=done or 1, status="done")
                self.progress.stop_task(self.task)
            self.task = self.progress.add_task(name, total=total or None, status="")

        def on_advance(info: dict[str, Any]) -> None:
            status = ""
            if "rollout/reward_mean" in info:
                status = f"reward {info['rollout/reward_mean']:.3f}  success {info['rollout/success_rate']:.0%}"
            self.progress.update(self.task, advance=1, status=status)

        def on_resumed(done: int) -> None:
            self.progress.update(self.task, completed=done)

        return Progress(on_phase=on_phase, on_advance=on_advance, on_resumed=on_resumed)


class LineProgress:
    """``agentrl train``'s progress as lines on stdout, each flushed: one when a phase starts and
    when it ends, one per training step (reward, success, seconds per step, time left) and one per
    evaluation (held-out success). For a log file, a pipe or CI, where bars would show nothing
    until the end."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out: TextIO | None = out or sys.stdout
        self.started = time.monotonic()
        self.phase: str | None = None
        self.phase_started = self.started
        self.total = self.done = 0
        self.done_before = 0  # steps before this stretch of training: an earlier command's, or before an evaluation
        self.stepped = 0  # the last training step this command printed
        self.training_started = self.started  # training's first start (evaluations may come between its steps)

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self._end_phase()

    def line(self, text: str) -> None:
        if self.out is None:
            return
        try:
            print(f"[{clock(time.monotonic() - self.started)}] {text}", file=self.out, flush=True)
        except BrokenPipeError:  # the reader went away (`| head`): the run goes on without its lines
            if self.out is sys.stdout:  # and Python's own flush at exit must not fail either
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)
            self.out = None

    def _end_phase(self) -> None:
        interrupted = self.phase == "training" and self.done < self.total  # by an evaluation: training goes on
        if self.phase is not None and not interrupted:
            started = self.training_started if self.phase == "training" else self.phase_started
            self.line(f"{self.phase}: done in {clock(time.monotonic() - started)}")
        self.phase = None

    def hooks(self) -> Any:
        from agentrl.train import Progress  # see train_command

        def on_phase(name: str, total: int) -> None:
            self._end_phase()
            self.phase, self.total, self.done, self.phase_started = name, total, 0, time.monotonic()
            self.done_before = 0
            if name == "training" and self.stepped:  # going on after an evaluation: the next step's line says so
                return
            self.training_started = self.phase_started
            unit = "steps" if name == "training" else "episodes"
            self.line(f"{name}" + (f" ({total} {unit})" if total else ""))

        def on_advance(info: dict[str, Any]) -> None:
            self.done += 1
            if "rollout/reward_mean" not in info:  # an evaluation's episode: the phase's end says it
                return
            per_step = (time.monotonic() - self.phase_started) / (self.done - self.done_before)
            left = f"  eta {clock(per_step * (self.total - self.done))}" if self.total else ""
            self.stepped = self.done
            self.line(
                f"step {self.done}/{self.total or '?'}  reward {info['rollout/reward_mean']:.3f}  "
                f"success {info['rollout/success_rate']:.0%}  {per_step:.1f} s/step{left}"
            )

        def on_result(metrics: dict[str, Any]) -> None:
            rates = {  # eval/success_rate, eval/<policy>/success_rate, eval/<policy>/vs_base_success_rate
                k.removeprefix("eval/").removesuffix("success_rate").rstrip("/_").replace("vs_base", "vs base"): v
                for k, v in metrics.items()
                if k.endswith("success_rate")
            }
            rates = {who.replace("/", " "): v for who, v in rates.items()}
            self.line("held-out " + "  ".join(f"{f'{p} ' if p else ''}success {v:.1%}" for p, v in rates.items()))

        def on_resumed(done: int) -> None:
            self.done = self.done_before = done
            if done != self.stepped:  # steps of an earlier command (not this one's, before an evaluation)
                self.line(f"resumed after step {done}")

        return Progress(on_phase=on_phase, on_advance=on_advance, on_result=on_result, on_resumed=on_resumed)


def clock(seconds: float) -> str:
    """``h:mm:ss``, as the progress bars show elapsed time."""
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"
