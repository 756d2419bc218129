"""Golden runs: what a single-policy run and a two-policy run write, pinned before the two training
loops become one (issue 33) and compared after it.

Each run's record in ``tests/golden/<name>.json`` holds its ``batches.jsonl`` (the groups each step
trained, per policy), the policy version after every step and the metric names of every record of
``metrics.jsonl``. The single-policy run is played by a :class:`~agentrl.testing.ScriptedPolicy`, so
its batches are the same on every machine and its metric values are pinned too (to float noise
between CPUs). The two-policy run samples from the tiny model on the hf backend, whose draws depend
on how requests happen to batch; its values are not pinned, its groups, versions and names are.

A deliberate change to what runs write: rewrite the records with ``python tests/test_golden_runs.py``
and say why in the commit.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import agentrl
from agentrl.config import load_config
from agentrl.env import AgentEnv, Feedback
from agentrl.metrics import read_metrics
from agentrl.testing import ScriptedPolicy
from agentrl.train import TrainConfig, train
from agentrl.types import Message

sys.path.insert(0, str(Path(__file__).parent))
import multi_env  # noqa: E402  (registers tests/SayLetters-v0)

GOLDEN = Path(__file__).parent / "golden"
ENV_ID = "tests/GoldenSayB-v0"


def volatile(name: str) -> bool:
    """Whether a metric's value is a wall-clock reading, never pinned (its name is)."""
    return name == "time" or name.startswith("perf/") or "seconds" in name


class SayB(AgentEnv):
    """Say b (one to three of them): the reward is the share of the letter b in the reply.

    tests/test_train.py has the same env; this copy is the golden runs' own, so that a change made
    there for its tests cannot move what is pinned here."""

    def __init__(self, split: str = "train"):
        super().__init__(max_turns=1)
        self.split = split  # the held-out split draws the same kind of task from other seeds

    def start(self, options: dict[str, Any] | None) -> list[Message]:
        return [Message("user", f"Say {'b' * (1 + int(self.np_random.integers(3)))}")]

    def respond(self, reply: Message) -> Feedback:
        share = reply.content.count("b") / max(len(reply.content), 1)
        return Feedback([], reward=share, terminated=True, info={"success": share >= 0.5})


if ENV_ID not in agentrl.registered_ids():
    agentrl.register(ENV_ID, entry_point=SayB)


class Script:
    """Replies that differ within a group (so every group has advantages to train on) and depend
    only on the prompt and how often it was asked before."""

    def __init__(self) -> None:
        self.asked: Counter[str] = Counter()

    def __call__(self, prompt: str) -> str:
        self.asked[prompt] += 1
        return "b" * (1 + self.asked[prompt] % 3) + "a" * (self.asked[prompt] % 2)


COMMON = [
    "rollout.backend=hf", "rollout.group_size=4", "rollout.max_tokens=8", "rollout.max_length=256",
    "trainer.lr=1e-2", "trainer.micro_batch_size=8", "groups_per_step=2", "steps=3", "max_staleness=0",
    "eval_episodes=4", "eval_every=2", "checkpoint_every=0", "export=false", "torch_threads=1",
]  # fmt: skip


def one_policy_run(model_dir: Path, run_dir: Path) -> Path:
    config = load_config(TrainConfig, None, [f"rollout.env_id={ENV_ID}", f"rollout.model={model_dir}", *COMMON,
                                             f"run_dir={run_dir}"])  # fmt: skip
    from transformers import AutoTokenizer

    policy = ScriptedPolicy(AutoTokenizer.from_pretrained(model_dir), Script())
    return train(config, policy=policy).run_dir


def two_policy_run(model_dir: Path, run_dir: Path) -> Path:
    policies = json.dumps({p: {"weights": "full"} for p in multi_env.LETTERS})
    config = load_config(
        TrainConfig,
        None,
        [f"rollout.env_id={multi_env.ENV_ID}", f"rollout.model={model_dir}", *COMMON, "rollout.max_turns=2",
         "mapping=individual", f"policies={policies}", "lockstep=true", f"run_dir={run_dir}"],
    )  # fmt: skip
    return train(config).run_dir


RUNS = {"one_policy": (one_policy_run, True), "two_policies": (two_policy_run, False)}
"""name -> (the run, whether its metric values are pinned)."""


def record(run_dir: Path, values: bool) -> dict[str, Any]:
    """What the golden file holds of a run: batches (ordered by step, then policy), versions,
    metric names per record, and with ``values`` the values of the names that are not volatile."""
    batches = [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]
    batches.sort(key=lambda b: (b["step"], b.get("policy", "")))
    metrics = read_metrics(run_dir)
    versions = [
        {k: v for k, v in m.items() if k == "step" or k.endswith("policy_version")}
        for m in metrics
        if any(k.endswith("policy_version") for k in m)
    ]
    out: dict[str, Any] = {"batches": batches, "versions": versions, "names": [sorted(m) for m in metrics]}
    if values:
        out["values"] = [{k: v for k, v in m.items() if not volatile(k)} for m in metrics]
    return out


def assert_same_values(got: list[dict[str, float]], pinned: list[dict[str, float]]) -> None:
    assert len(got) == len(pinned)
    for i, (g, p) in enumerate(zip(got, pinned)):
        for name, value in p.items():
            close = math.isclose(g[name], value, rel_tol=1e-4, abs_tol=1e-6)
            assert close, f"record {i} ({name}): {g[name]} now, {value} pinned"


@pytest.mark.parametrize("name", RUNS)
def test_a_run_writes_what_it_wrote_before_the_loops_became_one(name, tiny_model_dir, tmp_path):
    run, pinned_values = RUNS[name]
    got = record(run(tiny_model_dir, tmp_path / "run"), pinned_values)
    pinned = json.loads((GOLDEN / f"{name}.json").read_text())
    assert got["batches"] == pinned["batches"]
    assert got["versions"] == pinned["versions"]
    assert got["names"] == pinned["names"]
    if pinned_values:
        assert_same_values(got["values"], pinned["values"])


def main() -> None:
    """Rewrite the golden records (on the tiny test model, as the tests build it)."""
    import tempfile

    from agentrl.testing import build_tiny_model

    GOLDEN.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "model")
        for name, (run, values) in RUNS.items():
            path = GOLDEN / f"{name}.json"
            path.write_text(json.dumps(record(run(model, Path(tmp) / name), values), indent=1) + "\n")
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
