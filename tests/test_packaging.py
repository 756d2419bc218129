"""What a wheel of agentrl holds: ``pyproject.toml`` lists its packages by hand (several top-level
folders install under the one import name), so a new subpackage missing from the list would import
in the editable install the tests use and be absent from a wheel (``agentrl.train`` and
``agentrl.cli`` were)."""

from __future__ import annotations

import tomllib
from pathlib import Path

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
