"""Two Ray nodes on loopback, for the tests that need a real multi-node cluster (tests/test_ray.py,
tests/test_cluster.py).

Each node is a ``ray start --block`` of its own, in a temp dir of its own, so the cluster never takes
over another Ray user's default address; it is stopped by signalling the processes started here
(``ray stop`` would stop every Ray cluster on the machine).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import ray
from ray._raylet import AuthenticationTokenLoader

# Ray turns 127.0.0.1 into the machine's network address (so that other hosts could join); any
# other loopback address is kept, which keeps the whole cluster on the loopback interface.
LOOPBACK = "127.0.0.2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def start_node(args: list[str], log: Path, env: dict[str, str], object_store_bytes: int, cpus: int) -> subprocess.Popen:
    # --block keeps `ray start` in the foreground: signalling its process group ends this node and
    # nothing else. Fixed default ports (e.g. the dashboard agent's 52365) would collide between two
    # nodes on one machine, so every listening port is a fresh one. `ray start` is this Python's own.
    command = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--block", f"--node-ip-address={LOOPBACK}",
        f"--num-cpus={cpus}", f"--object-store-memory={object_store_bytes}", "--disable-usage-stats",
        f"--dashboard-agent-listen-port={free_port()}", *args,
    ]  # fmt: skip
    return subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(condition, what: str, processes: list[subprocess.Popen], logs: list[Path], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        exited = [" ".join(p.args[3:6]) for p in processes if p.poll() is not None]
        if exited or time.monotonic() > deadline:
            tails = "\n".join(f"--- {log}\n{log.read_text()[-2000:]}" for log in logs if log.exists())
            why = f"{exited} exited" if exited else f"not within {timeout} s"
            raise RuntimeError(f"Waiting for {what}: {why}.\n{tails}")
        time.sleep(0.25)


def stop_nodes(processes: list[subprocess.Popen], grace: float = 5.0) -> None:
    running = [p for p in processes if p.poll() is None]
    for process in running:
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in running:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:  # a slow graceful stop; these nodes hold nothing worth waiting for
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@contextlib.contextmanager
def two_node_cluster(object_store_bytes: int, cpus: int = 2) -> Iterator[tuple[str, dict[str, str]]]:
    """A head node and a second node (with resource ``node_b``), ``cpus`` logical CPUs each, on
    loopback, this process connected as driver; yields the address and the node ids by ``head`` / ``b``."""
    ray.shutdown()
    # Both nodes and this driver authenticate with one token of this cluster, given to each in its
    # environment: `ray start --head` does not make one (on a fresh machine ~/.ray has none), and
    # the tests write nothing to the home directory. A driver reads the mode once per process, so
    # its config is reloaded as Ray itself does.
    saved = {name: os.environ.get(name) for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = uuid.uuid4().hex
    AuthenticationTokenLoader.instance().reset_cache()
    ray._raylet.Config.initialize("")
    env = {**os.environ}
    temp_dir = Path(tempfile.mkdtemp(prefix="ray2n-", dir="/tmp"))  # short: Ray's socket paths must fit
    logs = [temp_dir / "head.log", temp_dir / "node_b.log"]
    port = free_port()
    address = f"{LOOPBACK}:{port}"
    processes = []
    try:
        head_args = ["--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp_dir}"]
        processes.append(start_node(head_args, logs[0], env, object_store_bytes, cpus))

        def gcs_up() -> bool:
            try:
                socket.create_connection((LOOPBACK, port), timeout=1).close()
                return True
            except OSError:
                return False

        wait_for(gcs_up, "the head's GCS to listen", processes, logs)
        node_b_args = [f"--address={address}", '--resources={"node_b": 1}', f"--temp-dir={temp_dir}"]
        processes.append(start_node(node_b_args, logs[1], env, object_store_bytes, cpus))
        # `ray start --block` says so once its node has registered.
        wait_for(lambda: all("block forever" in log.read_text() for log in logs), "both nodes", processes, logs)
        ray.init(address=address, _node_ip_address=LOOPBACK)
        wait_for(lambda: len([n for n in ray.nodes() if n["Alive"]]) == 2, "two live nodes", processes, logs)
        nodes = {("b" if "node_b" in n["Resources"] else "head"): n["NodeID"] for n in ray.nodes() if n["Alive"]}
        yield address, nodes
    finally:
        ray.shutdown()
        stop_nodes(processes)
        shutil.rmtree(temp_dir, ignore_errors=True)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        AuthenticationTokenLoader.instance().reset_cache()
        ray._raylet.Config.initialize("")
