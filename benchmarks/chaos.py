"""Chaos: one training run under every fault at once, and the proof that nothing was lost or faked.

    python benchmarks/chaos.py                      # the tiny model built here, 40 steps, about 7 minutes
    python benchmarks/chaos.py --steps 60 --keep /tmp/chaos-run

Needs root (the run directory is a small tmpfs it fills for a moment), a local ``dockerd`` started
as ``scripts/install.sh`` starts it (it is killed and started again) and Ray. Nothing else on the
machine should use Docker or Ray meanwhile.

The run: ``agentrl train examples/quickstart.yaml`` on a tiny model built here, with vLLM in a Ray
policy actor and a Ray env worker (``rollout.ray_address=local``), playing ``chaos/CodeSandbox-v0``
(``benchmarks/chaos_env.py``: the code env, sandboxes in Docker, whose steps raise or hang at 5%)
on an ``agentrl serve`` env server (``rollout.env_url``), synchronous (``max_staleness: 0``), a
checkpoint after every step. While it trains, this script fires (``FAULTS``), the first once the
run has 2 steps and each next one 3 steps after the one before is over: SIGKILL of the vLLM engine
core, ``dockerd`` killed and started again, the env server killed and started again, SIGKILL of the
Ray policy actor and of the env worker, SIGKILL of the training process itself (then resumed),
SIGKILL of it again while it writes a checkpoint (then resumed), and the run directory's disk full
for 20 s (resumed when that stopped it).

Printed at the end, and checked (exit 1 if a check fails): the faults injected by kind, how each
training command ended (no stop that no fault was fired to cause); what the run counted
(``fault/...``: failed tries by kind, episodes retried, groups replaced, engines and workers
replaced); samples trained that came from a failed episode (0: every trained record of
``samples/`` has no error); steps lost or repeated across the resumes (0: the ledger
``batches.jsonl`` holds each step, its last record winning, and no group twice); the engine's
log-prob gap to the trainer at the last step and at every weights probe (<= 1e-4 at staleness 0);
every checkpoint loads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from agentrl.metrics import read_metrics
from agentrl.testing import build_tiny_model, kill_dockerd, start_dockerd
from agentrl.trainers.checkpoint import list_checkpoints, load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
ENV_ID = "chaos/CodeSandbox-v0"

FAULTS = (
    "engine core SIGKILL",
    "dockerd killed and restarted",
    "env server killed and restarted",
    "Ray policy actor SIGKILL",
    "Ray env worker SIGKILL",
    "training process SIGKILL",
    "training process SIGKILL during a checkpoint write",
    "run directory's disk full for 20 s",
)
"""Fired in this order, the first once 2 steps are recorded, each next one ``SPACING`` steps after the
one before was over (so that each meets a run that recovered from the last)."""
SPACING = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes_matching(text: str) -> list[psutil.Process]:
    """Live processes whose command line contains ``text``, oldest first."""
    found = []
    for process in psutil.process_iter(["cmdline", "create_time"]):
        try:
            if text in " ".join(process.info["cmdline"] or []) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return sorted(found, key=lambda p: p.info["create_time"])


def kill(processes: list[psutil.Process]) -> int:
    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass
    return len(processes)


@dataclass
class EnvServer:
    """``agentrl serve chaos/CodeSandbox-v0`` on a port, killed and started again on it."""

    port: int
    env_log: Path
    process: subprocess.Popen | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]),
            "CHAOS_ENV_LOG": str(self.env_log),
        }
        command = [sys.executable, "-m", "agentrl.cli", "serve", ENV_ID, "--import", "chaos_env",
                   "--port", str(self.port), "--step-timeout", "10", "--log-level", "warning"]  # fmt: skip
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("agentrl serve did not listen within 60 s")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


@dataclass
class Chaos:
    """The run and its faults."""

    run_dir: Path
    disk: Path
    server: EnvServer
    command: list[str]
    log: Path
    fired: list[tuple[int, str, float]] = field(default_factory=list)
    """(steps recorded when fired, fault, seconds it took to fire)."""
    segments: list[tuple[int, str]] = field(default_factory=list)
    """Each training command: its exit code and why it ended (``finished``, the fault that ended it,
    or the message of a stop no fault was fired to cause)."""
    stop_messages: list[str] = field(default_factory=list)
    """Every ``Training stopped ...`` message the commands printed."""
    unplanned: list[str] = field(default_factory=list)
    """Stops no fault was meant to cause: faults the run did not survive."""
    process: subprocess.Popen | None = None
    """The training command running now."""

    def stop(self) -> None:
        """Kill the training command if it still runs (this script failed or was interrupted)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def steps(self) -> int:
        batches = self.run_dir / "batches.jsonl"
        try:
            return len(batches.read_text().splitlines())
        except OSError:
            return 0

    def run(self, steps: int) -> None:
        pending = list(FAULTS)
        resume = False
        while True:
            command = [*self.command, f"resume={str(resume).lower()}"]
            with self.log.open("a") as out:
                out.write(f"\n=== {' '.join(command)}\n")
                out.flush()
                process = subprocess.Popen(
                    command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
                self.process = process
                ended_by = self.watch(process, pending)
            output = self.log.read_text(errors="replace").split("\n=== ")[-1]
            stops = [line.strip() for line in output.splitlines() if "Training stopped" in line]
            self.stop_messages += stops
            if process.returncode == 0 and self.steps() >= steps:
                self.segments.append((0, "finished"))
                return
            if ended_by is None:
                self.unplanned.append(stops[-1] if stops else f"exit {process.returncode} without a message")
            self.segments.append((process.returncode, ended_by or self.unplanned[-1]))
            if len(self.segments) > 8:
                raise RuntimeError(f"more than 8 training commands; see {self.log}")
            resume = True

    def watch(self, process: subprocess.Popen, pending: list[str]) -> str | None:
        """Fire the faults due while ``process`` trains; the fault that ended it, if one did."""
        due = max(self.fired[-1][0] + SPACING, self.steps() + 1) if self.fired else 2
        while process.poll() is None:
            steps = self.steps()
            if pending and steps >= due:
                fault = pending.pop(0)
                started = time.monotonic()
                ended = self.fire(fault, process)
                self.fired.append((steps, fault, time.monotonic() - started))
                print(f"after step {steps}: {fault} ({time.monotonic() - started:.1f} s)", flush=True)
                due = self.steps() + SPACING  # counted from when the fault is over (a restart takes a while)
                if ended:
                    process.wait(timeout=120)
                    return fault
            time.sleep(0.1)
        return None

    def fire(self, fault: str, process: subprocess.Popen) -> bool:
        """Inject ``fault``; whether it ended the training process."""
        if fault == "engine core SIGKILL":
            if not kill(processes_matching("EngineCore")):
                raise RuntimeError("no vLLM engine core process found")
        elif fault == "dockerd killed and restarted":
            kill_dockerd()
            time.sleep(5)
            start_dockerd()
        elif fault == "env server killed and restarted":
            self.server.kill()
            time.sleep(3)
            self.server.start()
        elif fault == "Ray policy actor SIGKILL":
            if not kill(processes_matching("ray::PolicyActor")[:1]):
                raise RuntimeError("no Ray policy actor process found")
        elif fault == "Ray env worker SIGKILL":
            if not kill(processes_matching("ray::EnvWorker")[:1]):
                raise RuntimeError("no Ray env worker process found")
        elif fault == "training process SIGKILL":
            os.killpg(process.pid, signal.SIGKILL)
            return True
        elif fault == "training process SIGKILL during a checkpoint write":
            root = self.run_dir / "checkpoints"
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and process.poll() is None:
                if any(p.name.startswith(".partial-") for p in root.iterdir()):
                    os.killpg(process.pid, signal.SIGKILL)
                    return True
                time.sleep(0.0005)
            raise RuntimeError("no checkpoint write was caught within 600 s")
        elif fault == "run directory's disk full for 20 s":
            filler = self.disk / "filler"
            free = shutil.disk_usage(self.disk).free
            subprocess.run(["fallocate", "-l", str(max(free - (1 << 20), 0)), str(filler)], check=True)
            with filler.open("ab", buffering=0) as handle:  # the last MiB page by page: nothing left at all
                try:
                    while True:
                        handle.write(b"\0" * 4096)
                except OSError:
                    pass
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and process.poll() is None:
                time.sleep(0.2)
            filler.unlink()
            return process.poll() is not None
        return False


def leftovers() -> int:
    """Kill what a SIGKILLed driver may leave behind: its local Ray cluster and vLLM engine cores; how many."""
    names = ("gcs_server", "raylet", "ray::", "ray/dashboard", "VLLM::")
    return kill([p for text in names for p in processes_matching(text)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--keep", type=Path, default=None, help="Copy the run directory and the logs here.")
    parser.add_argument("--fault-rate", type=float, default=0.05, help="Share of env steps that raise or hang.")
    args = parser.parse_args()
    if args.steps < 2 + SPACING * len(FAULTS) + 2:
        parser.error(f"--steps must be at least {2 + SPACING * len(FAULTS) + 2} so that every fault fires")
    if os.geteuid() != 0:
        parser.error("the chaos run mounts a tmpfs (its disk-full fault): run it as root")

    work = Path(tempfile.mkdtemp(prefix="agentrl-chaos-"))
    disk = work / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(disk)], check=True)
    model = build_tiny_model(work / "model")
    env_log = work / "env_faults.log"
    os.environ["CHAOS_ENV_FAULT_RATE"] = str(args.fault_rate)
    server = EnvServer(free_port(), env_log)
    run_dir = disk / "run"
    command = [sys.executable, "-m", "agentrl.cli", "train", "examples/quickstart.yaml",
               f"rollout.env_id={ENV_ID}", f"rollout.env_url=http://127.0.0.1:{server.port}",
               "rollout.ray_address=local", f"rollout.model={model}", "rollout.backend=vllm",
               "rollout.group_size=4", "rollout.max_tokens=16", "rollout.max_turns=2", "rollout.max_length=2048",
               "rollout.concurrency=8", "rollout.turn_timeout=60", "rollout.episode_timeout=180",
               "trainer.trainable_layers=1", "trainer.micro_batch_size=4", "max_staleness=0",
               "curriculum.selection=uniform", f"steps={args.steps}", "groups_per_step=2", "eval_episodes=0",
               "checkpoint_every=1", "samples_per_step=2", "probe_every=2", "stall_timeout=600", "export=false",
               f"run_dir={run_dir}"]  # fmt: skip
    chaos = Chaos(run_dir, disk, server, command, work / "train.out")
    started = time.monotonic()
    try:
        start_dockerd()
        server.start()
        chaos.run(args.steps)
        wall = time.monotonic() - started
        report(chaos, env_log, wall)
    finally:
        chaos.stop()
        server.kill()
        left = leftovers()
        if left:
            print(f"killed {left} processes the run left behind (Ray, vLLM)")
        if args.keep is not None:
            shutil.copytree(run_dir, args.keep / "run", dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.pt"))
            for name in ("train.out", "env_faults.log"):
                if (work / name).exists():
                    shutil.copy(work / name, args.keep / name)
        for _ in range(10):  # a process killed just now may still hold a file there for a moment
            if subprocess.run(["umount", str(disk)], capture_output=True).returncode == 0:
                break
            time.sleep(1)
        else:
            subprocess.run(["umount", "--lazy", str(disk)], check=False)
        shutil.rmtree(work, ignore_errors=True)


def report(chaos: Chaos, env_log: Path, wall: float) -> None:
    run_dir = chaos.run_dir
    rows = [m for m in read_metrics(run_dir) if "train/loss" in m]
    last = rows[-1]
    env_faults = Counter(env_log.read_text().split()) if env_log.exists() else Counter()
    print(f"\nchaos run: {len(rows)} steps, {len(chaos.segments)} training commands, {wall / 60:.1f} min wall")
    print("\nfaults injected")
    for at, fault, seconds in chaos.fired:
        print(f"  after step {at:>2}: {fault} ({seconds:.1f} s)")
    print(f"  env steps that raised: {env_faults['raise']}, that hung 30 s: {env_faults['hang']}")
    print("\ntraining commands (exit code: how it ended)")
    for code, why in chaos.segments:
        print(f"  {code:>3}: {why[:400]}")
    for message in chaos.stop_messages:
        print(f"  printed: {message[:400]}")

    print("\nwhat the run counted (fault/..., over the whole run)")
    counted = {k.removeprefix("fault/"): v for k, v in last.items() if k.startswith("fault/")}
    for name, value in sorted(counted.items()):
        print(f"  {name:<24} {value:g}")

    # Checks: nothing trained from a failed episode, no batch lost or repeated, the engine on the trainer's weights.
    records = [json.loads(line) for path in sorted((run_dir / "samples").glob("train-*.jsonl"))
               for line in path.read_text().splitlines()]  # fmt: skip
    from_failed = sum(1 for r in records if r.get("error") is not None)
    # The ledger: a step re-done after a resume is recorded again and its last record wins.
    ledger = {b["step"]: b["groups"] for b in map(json.loads, (run_dir / "batches.jsonl").read_text().splitlines())}
    redone = sum(1 for _ in (run_dir / "batches.jsonl").read_text().splitlines()) - len(ledger)
    lost_or_repeated = len(set(range(1, len(rows) + 1)) ^ set(ledger))
    groups = [g for step in sorted(ledger) for g in ledger[step]]
    repeated_groups = len(groups) - len(set(groups))
    gap = last.get("train/engine_logprob_gap")
    probes = [m["fault/adapter_probe_gap"] for m in rows if "fault/adapter_probe_gap" in m]
    checkpoints = list_checkpoints(run_dir)
    loadable = 0
    for path in checkpoints:
        load_checkpoint(path)
        loadable += 1
    checks = [
        ("stops no fault was fired to cause", len(chaos.unplanned), not chaos.unplanned),
        ("faults fired", f"{len(chaos.fired)}/{len(FAULTS)}", len(chaos.fired) == len(FAULTS)),
        ("samples trained from a failed episode", from_failed, from_failed == 0 and len(records) > 0),
        ("steps lost or repeated across resumes", lost_or_repeated, lost_or_repeated == 0),
        ("groups trained twice", repeated_groups, repeated_groups == 0),
        ("engine log-prob gap at the last step", gap, gap is not None and gap <= 1e-4),
        ("largest weights-probe gap", max(probes, default=None), bool(probes) and max(probes) <= 1e-4),
        ("checkpoints that load", f"{loadable}/{len(checkpoints)}", loadable == len(checkpoints) > 0),
        ("training records checked", len(records), len(records) == 8 * len(rows)),
    ]
    survived = len(chaos.fired) - len(chaos.unplanned)
    print(
        f"\nfaults survived: {survived} of {len(chaos.fired)} (the run finished; every command a fault ended was resumed)"
    )
    print("\nchecks")
    for name, value, ok in checks:
        print(f"  {name:<40} {value!s:>12}  {'ok' if ok else 'FAILED'}")
    print(f"\nsteps re-done after a resume (trained again from the last checkpoint): {redone}")
    if not all(ok for *_, ok in checks):
        sys.exit(1)


if __name__ == "__main__":
    main()
