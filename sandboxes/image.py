"""Build the default sandbox image offline: debootstrap a minimal Debian, then ``docker import`` it.

No registry is involved (none can be reached from CI machines here): the packages come from the
Debian mirror, a package registry, and the image is made on the local engine::

    agentrl sandbox build-image                       # agentrl/sandbox-python:0, skipped if present
    agentrl sandbox build-image --force --tag my/sandbox:1

The image is Debian bookworm ``--variant=minbase`` plus ``python3`` (about 150 MB); nothing of
agentrl is inside it (the exec server is sent at container start). The downloaded ``.deb`` files are
kept in ``~/.cache/agentrl/debootstrap`` so a rebuild does not fetch them again. debootstrap needs
root; it takes one to three minutes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentrl.sandboxes.base import SandboxError
from agentrl.sandboxes.docker import DEFAULT_IMAGE, PATH, docker_client

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3",)
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "agentrl" / "debootstrap"
TRIM = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "var/cache/apt",
    "var/lib/apt/lists",
    "var/log",
)
"""Parts of the root file system a sandbox never needs (emptied, not removed)."""
IMAGE_LABEL = "org.agentrl.sandbox-image"


@dataclass(frozen=True)
class BuildResult:
    """What :func:`build_image` did.

    Attributes:
        tag: The image's tag.
        built: False when the image was already present and not rebuilt.
        image_id: The image's id.
        size_mb: The image's size in MB.
        seconds: Wall time of the build (0 when skipped).
    """

    tag: str
    built: bool
    image_id: str
    size_mb: float
    seconds: float


def split_tag(tag: str) -> tuple[str, str]:
    """``"repo/name:tag"`` -> ``("repo/name", "tag")`` (``latest`` when no tag; a registry port's
    colon is not a tag).

    >>> split_tag("localhost:5000/sandbox")
    ('localhost:5000/sandbox', 'latest')
    """
    name, sep, version = tag.rpartition(":")
    if not sep or "/" in version:
        return tag, "latest"
    return name, version


def image_present(tag: str) -> bool:
    """Whether ``tag`` is on the local Docker Engine (SandboxError when the engine does not answer)."""
    import docker

    try:
        docker_client().images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def _run(argv: list[str], log: Callable[[str], None], what: str) -> None:
    """Run ``argv``, passing its output to ``log`` line by line; SandboxError with its tail on failure."""
    tail: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            tail = [*tail[-19:], line]
            log(line)
    if proc.returncode != 0:
        raise SandboxError(f"{what} failed with exit code {proc.returncode}:\n" + "\n".join(tail))


def build_image(
    tag: str = DEFAULT_IMAGE,
    *,
    force: bool = False,
    suite: str = SUITE,
    mirror: str = MIRROR,
    packages: tuple[str, ...] = PACKAGES,
    log: Callable[[str], None] = print,
) -> BuildResult:
    """Build the sandbox image ``tag`` from Debian packages (see the module doc); skip if present.

    Args:
        tag: The image's tag.
        force: Rebuild even when ``tag`` is present.
        suite: The Debian suite to bootstrap.
        mirror: The Debian mirror (a package registry).
        packages: Packages added to minbase; ``python3`` is required by the exec server.
        log: Receives progress lines.

    Raises:
        SandboxError: the engine does not answer, debootstrap is missing or fails, not root, or the
            import fails; the message says which and what to do.
    """
    client = docker_client()
    if not force and image_present(tag):
        image = client.images.get(tag)
        return BuildResult(tag, False, image.id, image.attrs.get("Size", 0) / 1e6, 0.0)
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise SandboxError("building the sandbox image needs debootstrap (Debian: apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise SandboxError("debootstrap needs root: run `sudo agentrl sandbox build-image` (or the CI install script)")
    start = time.monotonic()
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="agentrl-image-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    rootfs = work / "rootfs"
    try:
        log(f"debootstrap {suite} (minbase + {', '.join(packages)}) from {mirror} into {rootfs}")
        _run(
            [
                debootstrap,
                "--variant=minbase",
                f"--include={','.join(packages)}",
                f"--cache-dir={CACHE_DIR}",
                suite,
                str(rootfs),
                mirror,
            ],
            log,
            "debootstrap",
        )
        for part in TRIM:
            target = rootfs / part
            if target.is_dir():
                for entry in target.iterdir():
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
        (rootfs / "work").mkdir(exist_ok=True)
        tarball = work / "rootfs.tar"
        log(f"packing {rootfs} into {tarball}")
        _run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tarball), "."], log, "tar")
        repository, version = split_tag(tag)
        log(f"docker import -> {repository}:{version}")
        client.api.import_image_from_file(
            str(tarball),
            repository=repository,
            tag=version,
            changes=[
                f"ENV PATH={PATH}",
                "ENV LANG=C.UTF-8",
                "WORKDIR /work",
                'CMD ["python3"]',
                f"LABEL {IMAGE_LABEL}={suite}-minbase+{'+'.join(packages)}",
            ],
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    image = client.images.get(tag)
    seconds = time.monotonic() - start
    return BuildResult(tag, True, image.id, image.attrs.get("Size", 0) / 1e6, seconds)
