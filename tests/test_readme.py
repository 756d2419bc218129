"""The README's examples run as they stand."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_custom_env_example_runs():
    blocks = python_blocks()
    assert blocks, "README lost its custom-env example"
    # A fresh interpreter, so the example needs nothing this test process set up.
    subprocess.run([sys.executable, "-c", blocks[0]], check=True, timeout=120)


def test_first_screen_names_the_test_command_ci_runs():
    first_screen = "\n".join(README.read_text().splitlines()[:20])
    assert "python -m pytest -q" in first_screen
    ci = (README.parent / ".ci" / "run").read_text()
    assert "python -m pytest -q" in ci
