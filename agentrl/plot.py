"""Training curves of a run, drawn from ``RUN_DIR/metrics.jsonl`` into one PNG.

::

    agentrl plot runs/calc                 # writes runs/calc/curves.png and prints its path
    plot_run("runs/calc", out=Path("calc.png"))

One panel per family of metrics the run logged (reward, success rate, loss, KL, entropy, clip
fraction, staleness, tokens/s, seconds per phase, then each family of ``env/...`` names a
``metrics_fn`` reported), three panels to a row. Rollout metrics are
lines; evaluation metrics (``eval/…``, typically logged before training, every few steps and at the
last step) are drawn as labelled markers on the same panels, so "before" and "after" read off the
picture. A ``null`` value (a NaN that was logged) leaves a gap in its line.

A multi-policy run's ``<kind>/<policy id>/<name>`` metrics are drawn beside the plain ones: one line
(or set of markers) per policy, labelled with the policy id (``trader_0 reward_mean``). Each policy
counts its own steps, and the x axis is the step, so the policies' lines share the axis.

Drawing uses matplotlib's object API on an Agg canvas: no display and no change to pyplot's global
backend, so it works on headless machines and inside other programs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from agentrl.metrics import METRICS_FILE, policy_metric, read_metrics, split_policy_metric

PLOT_FILE = "curves.png"
"""The default file name of the picture, inside the run directory."""
PANEL_WIDTH_IN = 4.8
"""Width of one panel, in inches."""
PANEL_HEIGHT_IN = 3.2
"""Height of one panel, in inches."""
DPI = 100
"""Pixels per inch of the picture: a panel is 480 x 320 pixels."""
MAX_COLUMNS = 3
"""Panels per row."""


@dataclass(frozen=True)
class Panel:
    """One panel of the picture: the metrics drawn as lines, and those drawn as markers."""

    title: str
    lines: tuple[str, ...]
    markers: tuple[str, ...] = ()
    env_suffix: str | None = None
    """Also draw every ``env/<env id>/<env_suffix>`` the run logged, one line per env."""
    ylim: tuple[float, float] | None = None
    """Fixed y range (rates), so a flat curve is not stretched to fill the panel."""
    per_policy: bool = True
    """Also draw each policy's value of the lines and markers (fixed names only)."""


PANELS: tuple[Panel, ...] = (
    Panel("reward", ("rollout/reward_mean",), markers=("eval/reward_mean",)),
    Panel(
        "success rate",
        ("rollout/success_rate",),
        markers=("eval/success_rate",),
        env_suffix="success_rate",
        ylim=(-0.05, 1.05),
    ),
    Panel("loss", ("train/loss", "train/policy_loss", "train/value_loss")),
    Panel("KL to reference", ("train/kl",)),
    Panel("entropy", ("train/entropy",)),
    Panel("clip fraction", ("train/clip_fraction",)),
    Panel("staleness (policy versions)", ("train/staleness_mean", "train/staleness_max")),
    Panel("tokens/s", ("perf/tokens_per_s", "perf/rollout_tokens_per_s", "perf/train_tokens_per_s")),
    Panel("seconds per phase", ("perf/time_rollout", "perf/time_train", "perf/time_sync", "perf/time_step")),
)
"""The panels, in reading order; a panel none of whose metrics the run logged is left out."""


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw the training curves of the run in ``run_dir`` and return the path of the picture.

    Args:
        run_dir: A run directory holding the ``metrics.jsonl`` of :class:`~agentrl.metrics.MetricsLogger`.
        out: Where to write the picture (default ``RUN_DIR/curves.png``); its suffix picks the format
            (png, svg, pdf).

    Raises:
        ValueError: ``run_dir`` has no ``metrics.jsonl``, it is empty, or it holds none of the
            metrics the panels draw.
    """
    run_dir = Path(run_dir)
    try:
        entries = read_metrics(run_dir / METRICS_FILE)
    except FileNotFoundError:
        raise ValueError(
            f"No {METRICS_FILE} in {run_dir}: expected a run directory written by "
            f"agentrl.metrics.MetricsLogger (a training run's output directory)."
        ) from None
    if not entries:
        raise ValueError(f"{run_dir / METRICS_FILE} is empty: the run has not logged any metrics yet.")
    panels = [(panel, series) for panel in (*PANELS, *env_panels(entries)) if (series := _panel_series(panel, entries))]
    if not panels:
        names = sorted({name for entry in entries for name in entry} - {"step", "time"})
        raise ValueError(
            f"{run_dir / METRICS_FILE} holds none of the metrics agentrl plot draws; it has {names}. "
            f"The drawn names are listed in agentrl.plot.PANELS."
        )

    columns = min(MAX_COLUMNS, len(panels))
    rows = math.ceil(len(panels) / columns)
    # A fixed size (no bbox_inches="tight") so the picture's pixels are known in advance.
    figure = Figure(figsize=(PANEL_WIDTH_IN * columns, PANEL_HEIGHT_IN * rows), dpi=DPI, layout="constrained")
    steps = [entry["step"] for entry in entries]
    figure.suptitle(f"{run_dir.resolve().name}: steps {min(steps)} to {max(steps)}")
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, (panel, series) in zip(axes, panels):
        _draw_panel(ax, panel, series)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)

    path = Path(out) if out is not None else run_dir / PLOT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI)
    return path


@dataclass
class _Series:
    name: str
    """The logged metric."""
    label: str
    """Its legend entry."""
    steps: list[int]
    values: list[float]
    as_markers: bool


def env_panels(entries: list[dict[str, Any]]) -> list[Panel]:
    """A panel per family of the ``env/...`` names the run logged (a ``metrics_fn``'s report:
    ``env/agentrl/Waltz-v0/feedback/labels/...``), each name a line labelled with its last part,
    on a 0-1 axis when every value is a share. ``.../success_rate`` is the success panel's."""
    families: dict[str, list[str]] = {}
    for entry in entries:
        for name in entry:
            if name.startswith("env/") and not name.endswith("/success_rate"):
                family = name.rpartition("/")[0]
                if name not in families.setdefault(family, []):
                    families[family].append(name)
    panels = []
    for family, names in families.items():
        values = [entry[n] for entry in entries for n in names if entry.get(n) is not None]
        shares = all(0.0 <= v <= 1.0 for v in values)
        panels.append(
            Panel(family.removeprefix("env/"), tuple(names), ylim=(-0.05, 1.05) if shares else None, per_policy=False)
        )
    return panels


def _panel_series(panel: Panel, entries: list[dict[str, Any]]) -> list[_Series]:
    # (logged name, label, as markers): the plain names, each policy's value of them, then the envs'.
    policies = list(
        dict.fromkeys(split[0] for entry in entries for name in entry if (split := split_policy_metric(name)))
    )
    if not panel.per_policy:
        names = [(name, name.rpartition("/")[2], False) for name in panel.lines]
        return _series(names, entries)
    names = [(name, name, False) for name in panel.lines]
    names += [(policy_metric(name, p), _policy_label(name, p), False) for name in panel.lines for p in policies]
    if panel.env_suffix is not None:
        pattern = re.compile(rf"^env/\S+/{re.escape(panel.env_suffix)}$")
        env_names = sorted({name for entry in entries for name in entry if pattern.match(name)})
        names += [(name, name, False) for name in env_names]
    names += [(name, name, True) for name in panel.markers]
    names += [(policy_metric(name, p), _policy_label(name, p), True) for name in panel.markers for p in policies]
    return _series(names, entries)


def _series(names: list[tuple[str, str, bool]], entries: list[dict[str, Any]]) -> list[_Series]:
    series = []
    for name, label, as_markers in names:
        points = [(entry["step"], entry[name]) for entry in entries if name in entry]
        if not any(value is not None for _, value in points):
            continue
        values = [math.nan if value is None else float(value) for _, value in points]  # null: a gap
        series.append(_Series(name, label, [step for step, _ in points], values, as_markers))
    return series


def _policy_label(name: str, policy: str) -> str:
    """``trader_0 reward_mean`` for a policy's line; evaluations keep their kind, since the reward
    and success panels draw ``rollout/...`` and ``eval/...`` of one name (``trader_0 eval/reward_mean``)."""
    kind, _, rest = name.partition("/")
    return f"{policy} {name if kind == 'eval' else rest}"


def _draw_panel(ax: Axes, panel: Panel, series: list[_Series]) -> None:
    ax.set_title(panel.title)
    if panel.ylim is not None:
        ax.set_ylim(*panel.ylim)
    ax.set_xlabel("step")
    ax.grid(True, alpha=0.3)
    for s in series:
        if s.as_markers:
            ax.margins(y=0.15)  # room for the value labels above the markers
            ax.plot(s.steps, s.values, linestyle="none", marker="D", markersize=7, label=s.label, zorder=3)
            for step, value in zip(s.steps, s.values):
                if math.isfinite(value):
                    ax.annotate(
                        f"{value:.3g}",
                        (step, value),
                        textcoords="offset points",
                        xytext=(0, 7),
                        ha="center",
                        fontsize=8,
                    )
        else:
            # A short run would show as nearly invisible segments without point markers.
            marker = "." if len(s.steps) <= 20 else None
            ax.plot(s.steps, s.values, marker=marker, linewidth=1.5, label=s.label)
    ax.legend(fontsize=7, loc="best")
