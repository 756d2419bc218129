"""Env servers in containers: ``agentrl serve --docker ENV_ID`` runs ``agentrl serve`` in a Docker
container, reached over a Unix socket in a host folder mounted into it, so the container needs no
network at all (``network_mode="none"``; the engine here runs with ``--bridge=none``).

Which Python runs inside:

- ``image=None`` (the default): the sandbox image (``agentrl/sandbox-python:0``, Debian with
  ``python3``) running *this* install: the interpreter's prefix, every folder on ``sys.path``
  and the source tree of an editable install are mounted read-only at their own paths, so the
  env code inside is exactly the code here. The host and the image must share the C library
  (both Debian bookworm here);
- ``image="my/envs:1"``: a user's image holding Python, agentrl and the env package;
  ``python`` is run from its ``PATH``.

Either way the container is a sandbox container in all but its command: read-only root, no
network, no capabilities, memory and process limits, ``/tmp`` a tmpfs, and the sandbox labels
(``agentrl.sandbox=1`` with this process as owner), so ``agentrl sandbox cleanup`` (and the first
sandbox a later run starts) removes it if this process dies without removing it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import httpx

from agentrl.sandboxes.docker import DEFAULT_IMAGE, LABEL, OWNER_LABEL, PATH, docker_client, owner_label

SERVER_LABEL = "agentrl.env-server"
"""Env-server containers carry this label too (its value: the env ids they serve)."""
SOCKET_NAME = "server.sock"


def host_mounts() -> list[str]:
    """The folders that make this install importable inside a container, outermost first."""
    source_tree = Path(__file__).resolve().parents[2]  # an editable install's checkout (else site-packages)
    paths = {Path(sys.base_prefix), Path(sys.prefix), source_tree}
    paths.update(Path(p) for p in sys.path if p and Path(p).is_dir())
    paths = {p.resolve() for p in paths if str(p.resolve()) not in ("/", "/usr", "/usr/lib", "/tmp")}
    # A folder inside another mounted one comes with it.
    kept = [p for p in sorted(paths) if not any(q != p and q in p.parents for q in paths)]
    return [str(p) for p in kept]


class DockerEnvServer:
    """An env server in a container (see the module docstring); :attr:`url` is its Unix socket.

    >>> with DockerEnvServer(["agentrl/Calculator-v0"]) as url:  # doctest: +SKIP
    ...     env = RemoteEnv(url, "agentrl/Calculator-v0")
    """

    def __init__(
        self,
        env_ids: Sequence[str],
        *,
        image: str | None = None,
        socket_dir: str | Path | None = None,
        serve_args: Sequence[str] = (),
        tokens: Collection[str] = (),
        memory_mb: int = 4096,
        pids: int = 512,
    ):
        self.env_ids = list(env_ids)
        self.image = image or DEFAULT_IMAGE
        self.own_python = image is None
        self.socket_dir = Path(socket_dir) if socket_dir else Path(tempfile.mkdtemp(prefix="agentrl-serve-"))
        self.socket_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        others = [p.name for p in self.socket_dir.iterdir() if p.name != SOCKET_NAME]
        if others:  # the folder is mounted read-write into the container: it must hold nothing else
            raise ValueError(
                f"{self.socket_dir} is mounted into the container and must be a folder of its own; it holds "
                f"{sorted(others)[:5]}. Pass --uds NEW_FOLDER/{SOCKET_NAME}."
            )
        self.serve_args = list(serve_args)
        self.tokens = list(tokens)
        self.memory_mb = memory_mb
        self.pids = pids
        self.container: Any = None

    @property
    def socket_path(self) -> Path:
        return self.socket_dir / SOCKET_NAME

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def start(self, timeout: float = 120.0) -> str:
        """Create and start the container; the URL once the server inside answers ``/healthz``."""
        import docker

        if self.socket_path.exists():
            self.socket_path.unlink()
        python = sys.executable if self.own_python else "python"
        command = [
            python,
            "-m",
            "agentrl.cli",
            "serve",
            *self.env_ids,
            "--uds",
            str(self.socket_path),
            *self.serve_args,
        ]
        volumes = {str(self.socket_dir): {"bind": str(self.socket_dir), "mode": "rw"}}
        if self.own_python:
            volumes.update({path: {"bind": path, "mode": "ro"} for path in host_mounts()})
        environment = {"HOME": "/tmp", "PATH": PATH, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
                       "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}  # fmt: skip
        if self.tokens:  # every token, in a read-only file of its own
            self._token_dir = tempfile.TemporaryDirectory(prefix="agentrl-serve-tokens-")
            token_file = Path(self._token_dir.name) / "tokens"
            token_file.write_text("\n".join(self.tokens) + "\n")
            token_file.chmod(0o600)
            volumes[self._token_dir.name] = {"bind": "/run/agentrl-tokens", "mode": "ro"}
            command += ["--token-file", "/run/agentrl-tokens/tokens"]
        client = docker_client()
        try:
            self.container = client.containers.run(
                self.image,
                command=command,
                detach=True,
                user="0:0",  # to read this install where it lies (root's home); no capabilities, see cap_drop
                environment=environment,
                volumes=volumes,
                network_mode="none",
                mem_limit=f"{self.memory_mb}m",
                memswap_limit=f"{self.memory_mb}m",
                pids_limit=self.pids,
                read_only=True,
                tmpfs={"/tmp": "size=512m,mode=1777"},
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                labels={LABEL: "1", OWNER_LABEL: owner_label(), SERVER_LABEL: ",".join(self.env_ids)},
                hostname="agentrl-env-server",
                log_config={"type": "json-file", "config": {"max-size": "10m"}},
            )
        except docker.errors.ImageNotFound as exc:
            raise RuntimeError(
                f"The image {self.image!r} is not on this Docker Engine; build the default one offline with "
                "`agentrl sandbox build-image`, or pass an image that is present (docker images)."
            ) from exc
        self._wait_ready(timeout)
        return self.url

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        headers = {"authorization": f"Bearer {self.tokens[0]}"} if self.tokens else {}
        while time.monotonic() < deadline:
            self.container.reload()
            if self.container.status in ("exited", "dead"):
                logs = self.container.logs(tail=30).decode(errors="replace")
                self.stop()
                raise RuntimeError(f"The env server container exited before it served:\n{logs}")
            if self.socket_path.exists():
                try:
                    transport = httpx.HTTPTransport(uds=str(self.socket_path))
                    with httpx.Client(transport=transport, base_url="http://agentrl-env-server", headers=headers) as c:
                        if c.get("/healthz", timeout=2).status_code == 200:
                            return
                except httpx.TransportError:
                    pass
            time.sleep(0.2)
        logs = self.container.logs(tail=30).decode(errors="replace")
        self.stop()
        raise RuntimeError(f"The env server container did not answer within {timeout:g} s:\n{logs}")

    def logs(self, tail: int = 50) -> str:
        return "" if self.container is None else self.container.logs(tail=tail).decode(errors="replace")

    def wait(self) -> int:
        """Block until the container exits; its exit code."""
        return int(self.container.wait().get("StatusCode", 1))

    def stop(self) -> None:
        """Remove the container (the server inside stops with it) and the socket."""
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except Exception:  # already gone
                pass
            self.container = None
        if self.socket_path.exists():
            os.unlink(self.socket_path)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
