"""The scripts in examples/ run as they stand, with the tiny model and a tiny budget."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_the_grpo_script_runs_its_loop_and_moves_the_weights(tiny_model_dir):
    script = EXAMPLES / "grpo_tool_arithmetic.py"
    assert "python examples/grpo_tool_arithmetic.py" in "\n".join(script.read_text().splitlines()[:5])
    # The random tiny model never solves ToolArithmetic, so every GRPO advantage is 0 and the loss
    # has no gradient; the entropy bonus gives it one, so that the update has to reach the weights.
    tiny = ["--model", str(tiny_model_dir), "--backend", "hf", "--steps", "2", "--groups", "1", "--group-size", "2",
            "--eval-episodes", "2", "--trainable-layers", "1", "--entropy-coef", "0.01"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(script), *tiny],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"^held-out success before training: \d\.\d{3} \(2 episodes\)$", out, re.MULTILINE), out
    assert re.search(r"^held-out success after training: \d\.\d{3} \(2 episodes\)$", out, re.MULTILINE), out
    assert [int(v) for v in re.findall(r"^step \d/2 .* policy version (\d+) ", out, re.MULTILINE)] == [1, 2], out
    final = re.search(r"^policy version (\d+); trained weights moved (\S+) \(relative L2\)$", out, re.MULTILINE)
    assert final, out
    assert int(final[1]) == 2  # each step's weights reached the inference engine
    assert 0 < float(final[2]) < 0.1  # the trainer changed the top layer, by a small step
