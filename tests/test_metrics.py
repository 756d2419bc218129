"""agentrl.metrics: the name table, the JSONL record (flushing, torn lines, resumes, non-finite
values), TensorBoard events read back with TensorBoard's own reader, and a real offline wandb run
read back from its record file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agentrl.metrics import (
    FREE_FORM_PREFIXES,
    METRICS,
    PER_POLICY,
    POLICY_KINDS,
    MetricsLogger,
    MetricsWarning,
    eval_curve,
    is_known_metric,
    metrics_table,
    policy_metric,
    read_metrics,
    split_policy_metric,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"

REQUIRED = """
rollout/reward_mean rollout/success_rate rollout/episodes rollout/failed rollout/truncated
rollout/turns_mean rollout/response_tokens_mean train/loss train/policy_loss train/value_loss train/kl
train/entropy train/clip_fraction train/grad_norm train/lr train/advantage_mean train/staleness_mean
train/staleness_max train/policy_version perf/tokens_per_s perf/train_tokens_per_s perf/time_rollout
perf/time_train perf/time_sync perf/time_step eval/success_rate eval/reward_mean eval/episodes
train/stage
""".split()


def lines_of(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# --- the name table ---------------------------------------------------------------------------


def test_table_has_the_required_names_each_with_a_one_line_meaning():
    assert set(REQUIRED) <= set(METRICS)
    for name, meaning in METRICS.items():
        assert re.fullmatch(r"(rollout|train|perf|eval|fault)/[a-z0-9_]+", name), name
        assert meaning.strip() and "\n" not in meaning, name


def test_docs_page_shows_the_generated_table():
    text = DOCS.read_text()
    block = text.split("<!-- begin metrics table -->\n")[1].split("\n<!-- end metrics table -->")[0]
    assert block == metrics_table(), "docs/metrics.md is stale: paste metrics_table() between the markers"
    for name in METRICS:
        assert f"| `{name}` |" in block
    for family in [*PER_POLICY, *FREE_FORM_PREFIXES]:
        assert f"| `{family}` |" in block


def test_known_names():
    assert is_known_metric("train/kl")
    assert is_known_metric("env/agentrl/Calculator-v0/solved")
    assert is_known_metric("env/my_env/latency_s")
    assert is_known_metric("sandbox/exec_seconds_mean")
    for typo in ("train/kll", "rollout/reward", "env/agentrl", "env//x", "kl", "Train/kl"):
        assert not is_known_metric(typo), typo


def test_per_policy_names_are_the_fixed_names_with_a_policy_id():
    for name in ("train/trader_0/loss", "rollout/trader_1/reward_mean", "eval/trader_0/success_rate"):
        assert is_known_metric(name), name
    assert is_known_metric("perf/trader_0/time_train") and is_known_metric("train/red-team.v2/stage")
    unknown = ("train/trader_0/kll", "train/trader_0/", "train//loss", "train/trader 0/loss", "train/a/b/loss")
    for name in (*unknown, "sandbox_x/trader_0/loss", "Train/trader_0/loss"):
        assert not is_known_metric(name), name
    for name in METRICS:
        assert name.split("/")[0] in POLICY_KINDS
        per_policy = policy_metric(name, "trader_1")
        assert split_policy_metric(per_policy) == ("trader_1", name) and is_known_metric(per_policy)
        assert split_policy_metric(name) is None
    assert policy_metric("train/loss", "trader_0") == "train/trader_0/loss"
    assert split_policy_metric("train/trader_0/kll") == ("trader_0", "train/kll")  # the shape only
    # An env id has slashes and a version, and env/ is no policy kind: never a policy's metric.
    assert split_policy_metric("env/agentrl/Negotiation-v0/x") is None
    assert is_known_metric("env/agentrl/Negotiation-v0/x") and is_known_metric("sandbox/trader_0/x")


def test_per_policy_names_are_refused_for_unknown_names_and_bad_ids():
    with pytest.raises(ValueError, match=r"'train/los' has no per-policy form: .* Did you mean 'train/loss'\?"):
        policy_metric("train/los", "trader_0")
    for policy in ("", "a/b", "a b"):
        with pytest.raises(ValueError, match="no '/' or whitespace"):
            policy_metric("train/loss", policy)


# --- the JSONL record -------------------------------------------------------------------------


def test_jsonl_one_flushed_line_per_call(tmp_path):
    torch = pytest.importorskip("torch")
    before = time.time()
    logger = MetricsLogger(tmp_path / "run")
    logger.log(1, {"rollout/reward_mean": 0.25, "rollout/episodes": 8, "train/kl": np.float32(0.5)})
    # Readable before close: every line is flushed as it is written.
    assert lines_of(tmp_path / "run")[0]["rollout/episodes"] == 8
    logger.log(np.int64(2), {"train/loss": torch.tensor(1.5), "train/lr": 1e-6, "rollout/failed": True})
    logger.close()
    logger.close()  # harmless
    first, second = lines_of(tmp_path / "run")
    assert set(first) == {"step", "time", "rollout/reward_mean", "rollout/episodes", "train/kl"}
    assert first["step"] == 1 and before <= first["time"] <= second["time"] <= time.time()
    assert first["rollout/reward_mean"] == 0.25 and first["train/kl"] == 0.5
    assert isinstance(first["rollout/episodes"], int)
    assert second == {"step": 2, "time": second["time"], "train/loss": 1.5, "train/lr": 1e-6, "rollout/failed": 1}
    assert read_metrics(tmp_path / "run") == [first, second]
    assert read_metrics(tmp_path / "run" / "metrics.jsonl") == [first, second]


def test_kill_9_keeps_every_logged_line(tmp_path):
    script = f"""
import os, signal
from agentrl.metrics import MetricsLogger
logger = MetricsLogger({str(tmp_path)!r})
for step in range(5):
    logger.log(step, {{"train/loss": step / 2}})
os.kill(os.getpid(), signal.SIGKILL)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert result.returncode == -9, result.stderr.decode()
    assert [e["train/loss"] for e in read_metrics(tmp_path)] == [0.0, 0.5, 1.0, 1.5, 2.0]


def test_torn_last_line_is_skipped_then_removed_before_appending(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "time": 1.0, "train/loss": 2.0}\n{"step": 1, "time": 2.0, "train/lo')
    assert read_metrics(tmp_path) == [{"step": 0, "time": 1.0, "train/loss": 2.0}]
    assert len(read_metrics(tmp_path, raw=True)) == 1
    with pytest.warns(MetricsWarning, match=r"torn line \(34 bytes"):
        logger = MetricsLogger(tmp_path)
    assert logger.resumed
    with logger:
        logger.log(1, {"train/loss": 1.0})
    assert [e["train/loss"] for e in read_metrics(tmp_path)] == [2.0, 1.0]
    assert path.read_text().count("\n") == 2  # every line whole again


def test_damaged_line_before_the_last_is_an_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "time": 1.0}\nnot json\n{"step": 1, "time": 2.0}\n')
    with pytest.raises(ValueError, match=r"line 2: not a metrics entry"):
        read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"time": 1.0}\n')
    with pytest.raises(ValueError, match=r'line 1: .*integer "step"'):
        read_metrics(tmp_path)


def test_missing_file_says_where_it_looked(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"No metrics at .*metrics\.jsonl"):
        read_metrics(tmp_path)


def test_same_step_merges_and_a_resume_replaces_the_redone_steps(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        logger.log(0, {"eval/success_rate": 0.1})
        for step in range(1, 10):
            logger.log(step, {"train/loss": float(step), "train/grad_norm": 9.0})
        logger.log(9, {"eval/success_rate": 0.3})
    # Restart from the checkpoint of step 5: steps 6.. are redone.
    with MetricsLogger(tmp_path) as logger:
        assert logger.resumed
        for step in range(6, 8):
            logger.log(step, {"train/loss": 100.0 + step})
    entries = read_metrics(tmp_path)
    assert [e["step"] for e in entries] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert entries[0]["eval/success_rate"] == 0.1
    assert [e["train/loss"] for e in entries[1:]] == [1, 2, 3, 4, 5, 106, 107]
    assert "train/grad_norm" not in entries[-1]  # the abandoned step 7's values are gone
    assert len(read_metrics(tmp_path, raw=True)) == 1 + 9 + 1 + 2

    with MetricsLogger(tmp_path / "merge") as logger:
        logger.log(3, {"train/loss": 1.0, "train/kl": 0.5})
        logger.log(3, {"eval/success_rate": 0.4, "train/kl": 0.25})
    (merged,) = read_metrics(tmp_path / "merge")
    assert merged["train/loss"] == 1.0 and merged["train/kl"] == 0.25 and merged["eval/success_rate"] == 0.4


def test_each_policy_counts_its_own_steps_and_resumes_on_its_own(tmp_path):
    # Stage 0 trains trader_0 for steps 1-4, stage 1 trader_1 for its steps 1-3: trader_1's step 1
    # after trader_0's step 4 is no resume.
    with MetricsLogger(tmp_path) as logger:
        logger.log(0, {"eval/trader_0/success_rate": 0.1, "eval/trader_1/success_rate": 0.2})
        for step in range(1, 5):
            logger.log(step, {"train/trader_0/loss": float(step), "train/stage": 0})
        for step in range(1, 4):
            logger.log(step, {"train/trader_1/loss": 10.0 + step})
    entries = read_metrics(tmp_path)
    assert [e["step"] for e in entries] == [0, 1, 2, 3, 4]
    assert [e.get("train/trader_0/loss") for e in entries] == [None, 1, 2, 3, 4]
    assert [e.get("train/trader_1/loss") for e in entries] == [None, 11, 12, 13, None]
    assert entries[0]["eval/trader_1/success_rate"] == 0.2

    # trader_1 resumed from its step 2 checkpoint: only its step 3 is dropped, then redone.
    with MetricsLogger(tmp_path) as logger:
        logger.log(2, {"train/trader_1/loss": 20.0})
    entries = read_metrics(tmp_path)
    assert [e.get("train/trader_1/loss") for e in entries] == [None, 11, 20, None, None]
    assert [e.get("train/trader_0/loss") for e in entries] == [None, 1, 2, 3, 4]
    assert [e.get("train/stage") for e in entries] == [None, 0, 0, 0, 0]

    # The whole run resumed from step 2 (names without a policy): their later values go, and a step
    # left with nothing at all goes with them.
    with MetricsLogger(tmp_path) as logger:
        logger.log(2, {"train/stage": 1})
        logger.log(2, {"train/trader_0/loss": 30.0})
    entries = read_metrics(tmp_path)
    assert [e["step"] for e in entries] == [0, 1, 2]
    assert [e.get("train/stage") for e in entries] == [None, 0, 1]
    assert [e.get("train/trader_0/loss") for e in entries] == [None, 1, 30]


def test_each_family_of_env_names_counts_its_own_steps(tmp_path):
    # A metrics_fn's report of two policies: env/<env id>/<policy>/<family>/<name>, each family on its
    # policy's step counter. The conversation's step 1 after feedback's step 3 is no resume; the
    # feedback's step 2 after that is one, for its family only.
    feedback, conversation = "env/agentrl/Waltz-v0/feedback/labels", "env/agentrl/Waltz-v0/conversation/answers"
    with MetricsLogger(tmp_path) as logger:
        for step in range(1, 4):
            logger.log(step, {f"{feedback}/accuracy": step / 10})
        logger.log(1, {f"{conversation}/unsafe": 0.5})
    entries = read_metrics(tmp_path)
    assert [e.get(f"{feedback}/accuracy") for e in entries] == [0.1, 0.2, 0.3]
    assert [e.get(f"{conversation}/unsafe") for e in entries] == [0.5, None, None]
    with MetricsLogger(tmp_path) as logger:
        logger.log(2, {f"{feedback}/accuracy": 0.9})
    entries = read_metrics(tmp_path)
    assert [e.get(f"{feedback}/accuracy") for e in entries] == [0.1, 0.9]
    assert entries[0][f"{conversation}/unsafe"] == 0.5


def test_non_finite_values_are_null_and_warned_once_per_name(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        with pytest.warns(MetricsWarning) as record:
            logger.log(0, {"train/loss": float("nan"), "train/kl": 0.1})
            logger.log(1, {"train/loss": float("nan")})
            logger.log(2, {"train/grad_norm": np.float64("inf")})
        messages = [str(w.message) for w in record]  # once per name, not per value
        assert len(messages) == 2
        assert messages[0].startswith("Metric 'train/loss' is nan at step 0; written as null in metrics.jsonl")
        assert messages[1].startswith("Metric 'train/grad_norm' is inf at step 2; written as null")
        assert record[0].filename == __file__  # points at the caller's line
    assert "NaN" not in (tmp_path / "metrics.jsonl").read_text()
    entries = read_metrics(tmp_path)
    assert entries[0]["train/loss"] is None and entries[0]["train/kl"] == 0.1
    assert entries[2]["train/grad_norm"] is None


def test_unknown_names_warn_once_with_a_suggestion(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # known and free-form names: no warning at all
            logger.log(0, {name: 0.0 for name in METRICS})
            logger.log(0, {"env/agentrl/Countdown-v0/solved": 1.0, "sandbox/exec_seconds_mean": 0.1})
        with pytest.warns(MetricsWarning) as record:
            logger.log(1, {"train/kll": 0.5, "myloss": 2.0})
            logger.log(2, {"train/kll": 0.5, "myloss": 2.0})
        first, second = (str(w.message) for w in record)  # once per name, not per call
        assert first.startswith("Unknown metric name 'train/kll' (logged anyway). Did you mean 'train/kl'?")
        assert second.startswith("Unknown metric name 'myloss' (logged anyway). The fixed names")
        assert "env/<env id>/" in second and "<kind>/<policy id>/<name>" in second
    assert read_metrics(tmp_path)[-1]["train/kll"] == 0.5  # logged anyway


def test_per_policy_names_warn_only_on_typos_and_suggest_within_the_policy(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            logger.log(0, {policy_metric(name, "trader_0"): 0.0 for name in METRICS})
            logger.log(0, {"env/agentrl/Negotiation-v0/deals": 1.0, "train/stage": 1})
        with pytest.warns(MetricsWarning) as record:
            logger.log(1, {"train/trader_0/kll": 0.5, "eval/trader_1/sucess_rate": 1.0, "rollout/reward/mean": 0})
        messages = [str(w.message) for w in record]
        assert messages[0].startswith(
            "Unknown metric name 'train/trader_0/kll' (logged anyway). Did you mean 'train/trader_0/kl'?"
        )
        assert "Did you mean 'eval/trader_1/success_rate'?" in messages[1]
        assert "Did you mean 'rollout/reward_mean'?" in messages[2]  # the nearer of the two readings


def test_bad_input_is_refused_with_the_reason(tmp_path):
    logger = MetricsLogger(tmp_path)
    with pytest.raises(TypeError, match="step must be an integer"):
        logger.log(1.5, {"train/loss": 1.0})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="step must be >= 0"):
        logger.log(-1, {"train/loss": 1.0})
    with pytest.raises(TypeError, match=r"'train/loss' must be a number .* got str 'high'"):
        logger.log(0, {"train/loss": "high"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="other than"):
        logger.log(0, {"step": 3.0})
    logger.close()
    with pytest.raises(RuntimeError, match="closed"):
        logger.log(0, {"train/loss": 1.0})
    assert (tmp_path / "metrics.jsonl").read_text() == ""  # nothing half-written


# --- TensorBoard ------------------------------------------------------------------------------


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]
    }


def test_tensorboard_events_read_back(tmp_path):
    pytest.importorskip("torch")
    with MetricsLogger(tmp_path, tensorboard=True, config={"lr": 1e-6}) as logger:
        with pytest.warns(MetricsWarning, match="nan at step 1"):
            for step in range(3):
                logger.log(step, {"rollout/reward_mean": step / 4, "train/loss": float("nan") if step == 1 else 1.0})
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    scalars = tensorboard_scalars(tmp_path / "tensorboard")
    assert scalars["rollout/reward_mean"] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert scalars["train/loss"] == [(0, 1.0), (2, 1.0)]  # the NaN is left out, as in the JSONL


def test_tensorboard_resume_drops_the_redone_steps(tmp_path):
    pytest.importorskip("torch")
    with MetricsLogger(tmp_path, tensorboard=True) as logger:
        for step in range(6):
            logger.log(step, {"train/kl": float(step)})
    time.sleep(1.1)  # event files are named by the second they were opened in
    with MetricsLogger(tmp_path, tensorboard=True) as logger:
        for step in range(3, 5):
            logger.log(step, {"train/kl": 10.0 + step})
    expected = [(e["step"], e["train/kl"]) for e in read_metrics(tmp_path)]
    assert expected == [(0, 0), (1, 1), (2, 2), (3, 13), (4, 14)]
    assert tensorboard_scalars(tmp_path / "tensorboard")["train/kl"] == expected


# --- wandb, offline ---------------------------------------------------------------------------


def wandb_records(path: Path) -> list[Any]:
    """Every record of a ``.wandb`` file (LevelDB's log format: 32 KiB blocks of chunks, each
    with a 7-byte header: CRC, length, and whether it is a whole record or a piece of one)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a wandb record file"
    block, header = 32768, 7
    records, pending, pos = [], b"", 7
    while pos + header <= len(data):
        left = block - pos % block
        if left < header:  # the rest of a block too small for a header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        chunk = data[pos + header : pos + header + length]
        pos += header + length
        if kind in (1, 2):  # a whole record, or its first piece
            pending = chunk
        elif kind in (3, 4):
            pending += chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def test_wandb_offline_runs_hold_the_metrics(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))
    # Several runs in one process: wandb's finish() alone often returned before a later run's
    # records reached the disk. "online" in the environment must not matter: the logger always runs
    # wandb offline (with no network here, an online attempt would fail).
    for index, env_mode in enumerate(("offline", "online", "offline", "online")):
        monkeypatch.setenv("WANDB_MODE", env_mode)
        run_dir = tmp_path / f"calc-{index}"
        with MetricsLogger(run_dir, wandb=True, wandb_project="agentrl-test", config={"lr": 1e-6}) as logger:
            with pytest.warns(MetricsWarning, match="nan at step 1"):
                for step in range(3):
                    logger.log(
                        step, {"rollout/reward_mean": step / 4, "train/loss": float("nan") if step == 1 else 1.0}
                    )
        (run_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
        records = wandb_records(run_file)
        history = {}
        for record in records:
            if record.WhichOneof("record_type") == "history":
                items = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item
                }
                history[items["_step"]] = {k: v for k, v in items.items() if not k.startswith("_")}
        assert history == {
            0: {"rollout/reward_mean": 0.0, "train/loss": 1.0},
            1: {"rollout/reward_mean": 0.25},
            2: {"rollout/reward_mean": 0.5, "train/loss": 1.0},
        }, (index, env_mode)
        (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        assert run.project == "agentrl-test" and run.display_name == f"calc-{index}"
        config = {item.key: json.loads(item.value_json) for item in run.config.update}
        assert config["lr"] == 1e-6
    assert not list((tmp_path / "elsewhere").rglob("*.wandb"))  # WANDB_DIR does not move the run


def test_wandb_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now raises ImportError
    with pytest.raises(ImportError, match=r"needs the wandb package .*pip install wandb"):
        MetricsLogger(tmp_path, wandb=True)
    assert not (tmp_path / "metrics.jsonl").exists()  # a sink that cannot start leaves nothing behind


def test_eval_curve_counts_training_minutes_only(tmp_path):
    # evaluations at steps 0, 4 and 8 taking 30 s each; 2 minutes of training between them
    lines = [
        {"step": 0, "time": 1000.0, "eval/success_rate": 0.25, "eval/seconds": 30.0},
        {"step": 2, "time": 1060.0, "train/loss": 0.1},
        {"step": 4, "time": 1150.0, "eval/success_rate": 0.5, "eval/seconds": 30.0},
        {"step": 8, "time": 1300.0, "eval/success_rate": 0.75, "eval/seconds": 30.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert eval_curve(tmp_path) == [
        {"step": 0.0, "success": 0.25, "minutes": 0.0},
        {"step": 4.0, "success": 0.5, "minutes": 2.0},
        {"step": 8.0, "success": 0.75, "minutes": 4.0},
    ]
    (tmp_path / "metrics.jsonl").write_text(json.dumps(lines[1]) + "\n")
    assert eval_curve(tmp_path) == []
