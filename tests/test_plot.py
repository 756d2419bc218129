"""agentrl.plot and ``agentrl plot``: the picture's size and content, its errors, the CLI's exit codes."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.metrics import MetricsLogger, read_metrics
from agentrl.plot import DPI, PANEL_HEIGHT_IN, PANEL_WIDTH_IN, PANELS, _panel_series, env_panels, plot_run

runner = CliRunner()
PANEL_PX = (round(PANEL_HEIGHT_IN * DPI), round(PANEL_WIDTH_IN * DPI))  # rows, columns of pixels


def write_run(run_dir: Path, steps: int = 12) -> Path:
    """A run with every plotted family, evaluations at the first and last steps, and a NaN."""
    with MetricsLogger(run_dir) as logger, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the NaN's warning is tested in test_metrics
        logger.log(0, {"eval/success_rate": 0.1, "eval/reward_mean": 0.2, "eval/episodes": 16})
        for step in range(1, steps + 1):
            x = step / steps
            logger.log(
                step,
                {
                    "rollout/reward_mean": x,
                    "rollout/success_rate": 0.8 * x,
                    "env/agentrl/Calculator-v0/success_rate": 0.9 * x,
                    "train/loss": math.nan if step == 5 else 1 - x,
                    "train/policy_loss": -x,
                    "train/kl": 0.01 * step,
                    "train/entropy": 2 - x,
                    "train/clip_fraction": 0.1 * x,
                    "train/staleness_mean": 0.5,
                    "train/staleness_max": 1,
                    "perf/tokens_per_s": 100 + step,
                    "perf/train_tokens_per_s": 300,
                    "perf/time_rollout": 3.0,
                    "perf/time_train": 1.0,
                    "perf/time_sync": 0.1,
                    "perf/time_step": 4.2,
                },
            )
        logger.log(steps, {"eval/success_rate": 0.6, "eval/reward_mean": 0.7, "eval/episodes": 16})
    return run_dir


def assert_drawn(path: Path, panels: tuple[int, int]) -> None:
    """The picture is panels[0] x panels[1] panels in size and has coloured curves on it."""
    image = imread(path)
    rows, columns = panels
    assert image.shape[:2] == (rows * PANEL_PX[0], columns * PANEL_PX[1])
    rgb = image[..., :3]
    not_white = (rgb < 0.95).any(axis=-1).mean()
    coloured = (rgb.max(axis=-1) - rgb.min(axis=-1) > 0.3).mean()  # lines and markers, not black text
    assert 0.02 < not_white < 0.5, not_white
    assert coloured > 0.002, coloured


def test_every_family_gets_a_panel(tmp_path):
    run_dir = write_run(tmp_path / "run")
    path = plot_run(run_dir)
    assert path == run_dir / "curves.png"
    assert_drawn(path, (math.ceil(len(PANELS) / 3), 3))


def test_a_run_with_only_evaluations_draws_them_as_markers(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        logger.log(0, {"eval/success_rate": 0.2, "eval/reward_mean": 0.1})
        logger.log(10, {"eval/success_rate": 0.5, "eval/reward_mean": 0.4})
    assert_drawn(plot_run(tmp_path), (1, 2))  # reward and success rate only


def test_a_multi_policy_run_draws_one_line_per_policy(tmp_path):
    # Stage 0 trains trader_0 for its steps 1-6, stage 1 trader_1 for its steps 1-4; each is
    # evaluated at its step 0 and its last step. trader_1 logs no rollout success rate.
    with MetricsLogger(tmp_path) as logger:
        for policy, steps in (("trader_0", 6), ("trader_1", 4)):
            logger.log(0, {f"eval/{policy}/reward_mean": 0.1, f"eval/{policy}/success_rate": 0.2})
            for step in range(1, steps + 1):
                metrics = {f"rollout/{policy}/reward_mean": step / steps, f"train/{policy}/loss": 1 - step / steps}
                if policy == "trader_0":
                    metrics["rollout/trader_0/success_rate"] = step / 10
                logger.log(step, {**metrics, "train/stage": int(policy == "trader_1")})
            logger.log(steps, {f"eval/{policy}/reward_mean": 0.5, f"eval/{policy}/success_rate": 0.6})
        logger.log(7, {"rollout/reward_mean": 0.3})  # a plain name too, drawn beside them
    entries = read_metrics(tmp_path)

    def found(title):
        (panel,) = [p for p in PANELS if p.title == title]
        return [(s.name, s.label, s.steps, s.values, s.as_markers) for s in _panel_series(panel, entries)]

    assert found("reward") == [
        ("rollout/reward_mean", "rollout/reward_mean", [7], [0.3], False),
        (
            "rollout/trader_0/reward_mean",
            "trader_0 reward_mean",
            [1, 2, 3, 4, 5, 6],
            [i / 6 for i in range(1, 7)],
            False,
        ),
        ("rollout/trader_1/reward_mean", "trader_1 reward_mean", [1, 2, 3, 4], [0.25, 0.5, 0.75, 1.0], False),
        ("eval/trader_0/reward_mean", "trader_0 eval/reward_mean", [0, 6], [0.1, 0.5], True),
        ("eval/trader_1/reward_mean", "trader_1 eval/reward_mean", [0, 4], [0.1, 0.5], True),
    ]
    assert [(name, label, markers) for name, label, _, _, markers in found("success rate")] == [
        ("rollout/trader_0/success_rate", "trader_0 success_rate", False),
        ("eval/trader_0/success_rate", "trader_0 eval/success_rate", True),
        ("eval/trader_1/success_rate", "trader_1 eval/success_rate", True),
    ]
    assert [label for _, label, _, _, _ in found("loss")] == ["trader_0 loss", "trader_1 loss"]
    assert found("entropy") == []
    assert_drawn(plot_run(tmp_path), (1, 3))  # reward, success rate, loss


def test_what_a_metrics_fn_reports_gets_a_panel_per_family(tmp_path):
    # WaltzRL's shape: stage 1 trains the feedback policy for its steps 1-4, stage 2 both for 1-2
    # more each (feedback 5-6, conversation 1-2); each reports under env/<env id>/<policy>/.
    prefix = "env/agentrl/Waltz-v0"
    with MetricsLogger(tmp_path) as logger:
        for step in range(1, 7):
            logger.log(step, {"train/feedback/loss": 1.0, f"{prefix}/feedback/labels/accuracy": step / 10,
                              f"{prefix}/feedback/labels/f1": step / 20, f"{prefix}/feedback/verdicts/same_steps": step})  # fmt: skip
            if step > 4:
                logger.log(step - 4, {"train/conversation/loss": 1.0, f"{prefix}/conversation/answers/unsafe": 0.5})
    entries = read_metrics(tmp_path)
    panels = {p.title: p for p in env_panels(entries)}
    assert list(panels) == [
        "agentrl/Waltz-v0/feedback/labels",
        "agentrl/Waltz-v0/feedback/verdicts",
        "agentrl/Waltz-v0/conversation/answers",
    ]
    labels = panels["agentrl/Waltz-v0/feedback/labels"]
    assert labels.ylim == (-0.05, 1.05) and panels["agentrl/Waltz-v0/feedback/verdicts"].ylim is None  # a count
    series = [(s.label, s.steps, s.values) for s in _panel_series(labels, entries)]
    assert series == [
        ("accuracy", [1, 2, 3, 4, 5, 6], pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])),
        ("f1", [1, 2, 3, 4, 5, 6], pytest.approx([0.05, 0.1, 0.15, 0.2, 0.25, 0.3])),
    ]  # the conversation's steps 1-2, logged after feedback's step 4, resumed nothing
    assert_drawn(plot_run(tmp_path), (2, 3))  # loss and the three families


def test_out_may_be_anywhere(tmp_path):
    run_dir = write_run(tmp_path / "run", steps=3)
    out = tmp_path / "new" / "dir" / "calc.png"
    assert plot_run(run_dir, out) == out
    assert_drawn(out, (3, 3))
    assert not (run_dir / "curves.png").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        (None, r"No metrics\.jsonl in .*: expected a run directory written by"),
        ("", r"metrics\.jsonl is empty: the run has not logged any metrics yet"),
        (
            '{"step": 0, "time": 1.0, "sandbox/exec_seconds_mean": 0.1}\n',
            r"holds none of the metrics .* \['sandbox/exec_seconds_mean'\]",
        ),
        ('{"step": 0, "time": 1.0, "train/loss": null}\n', r"holds none of the metrics"),
    ],
)
def test_nothing_to_draw_is_a_value_error(tmp_path, content, message):
    if content is not None:
        (tmp_path / "metrics.jsonl").write_text(content)
    with pytest.raises(ValueError, match=message):
        plot_run(tmp_path)
    assert not (tmp_path / "curves.png").exists()


def test_missing_run_directory_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="No metrics.jsonl in"):
        plot_run(tmp_path / "no-such-run")


# --- agentrl plot -----------------------------------------------------------------------------


def test_cli_prints_the_path_it_wrote(tmp_path):
    run_dir = write_run(tmp_path / ("a run with a long name " + "x" * 60))
    result = runner.invoke(app, ["plot", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(run_dir / "curves.png")  # one line, unwrapped
    assert_drawn(run_dir / "curves.png", (3, 3))

    out = tmp_path / "elsewhere.png"
    result = runner.invoke(app, ["plot", str(run_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(out)
    assert np.array_equal(imread(out).shape, imread(run_dir / "curves.png").shape)


def test_cli_usage_errors_exit_2_with_the_reason(tmp_path):
    result = runner.invoke(app, ["plot", str(tmp_path)])
    assert result.exit_code == 2
    assert "No metrics.jsonl in" in result.output and "Traceback" not in result.output

    (tmp_path / "metrics.jsonl").write_text("")
    result = runner.invoke(app, ["plot", str(tmp_path)])
    assert result.exit_code == 2
    assert "is empty" in result.output

    result = runner.invoke(app, ["plot"])
    assert result.exit_code == 2  # typer's own: the missing RUN_DIR
