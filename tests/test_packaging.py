"""What a wheel of agentrl holds: ``pyproject.toml`` lists its packages by hand (several top-level
folders install under the one import name), so a new subpackage missing from the list would import
in the editable install the tests use and be absent from a wheel (``agentrl.train`` and
``agentrl.cli`` were). And what a clone holds: a data file the tests read must not be one that git
ignores (the refusal gold file was, and CI's clean checkout had none)."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_for_the_wheel():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for name, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *relative.parts]))
    listed = set(setuptools["packages"])
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - found == set(), "these listed packages have no folder with an __init__.py"


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_no_data_file_under_tests_is_ignored_by_git():
    # caches (__pycache__, .pytest_cache, .hypothesis) are meant to be ignored
    data = [p for p in (ROOT / "tests").rglob("*")
            if p.is_file() and not any(part.startswith((".", "__")) for part in p.relative_to(ROOT).parts)]  # fmt: skip
    names = "\n".join(str(p.relative_to(ROOT)) for p in data)
    ignored = subprocess.run(["git", "check-ignore", "--stdin"], cwd=ROOT, input=names, capture_output=True, text=True)
    assert ignored.stdout.split() == [], "git ignores these: add an exception to .gitignore and commit them"
