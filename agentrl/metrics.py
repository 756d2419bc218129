"""Training metrics: one fixed table of names, and a logger that writes them to JSONL, TensorBoard
and wandb (offline).

::

    with MetricsLogger("runs/calc", tensorboard=True) as logger:
        logger.log(step, {"rollout/reward_mean": 0.4, "train/kl": 0.01})
    read_metrics("runs/calc")   # [{"step": ..., "time": ..., "rollout/reward_mean": 0.4, ...}, ...]

``RUN_DIR/metrics.jsonl`` is always written and is the run's record: one JSON object per
:meth:`MetricsLogger.log` call, ``{"step": int, "time": unix seconds, name: value, ...}``, flushed
line by line, so killing the process loses at most the line being written. TensorBoard events go to
``RUN_DIR/tensorboard`` and wandb's offline run to ``RUN_DIR/wandb`` (``wandb sync`` uploads it
later; nothing here touches the network).

Names: every name in :data:`METRICS` has a fixed meaning (``docs/metrics.md`` is generated from that
table). A multi-policy run logs each policy's metrics as ``<kind>/<policy id>/<name>``, where
``<kind>/<name>`` is a fixed name (:data:`PER_POLICY`; :func:`policy_metric` builds such a name,
:func:`split_policy_metric` takes one apart). Free-form names are welcome under ``env/<env id>/...``
and ``sandbox/...``; any other name is logged anyway but warned about once, since it is most likely
a typo.

Resuming: a logger opened on a run directory that already has a ``metrics.jsonl`` appends to it. A
run resumed from an earlier checkpoint logs steps again; :func:`read_metrics` then keeps what the
resumed run logged (see there), and TensorBoard is told to drop the abandoned steps the same way.
"""

from __future__ import annotations

import difflib
import json
import math
import operator
import re
import threading
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

METRICS_FILE = "metrics.jsonl"
"""The file name of the JSONL record inside a run directory."""
TENSORBOARD_DIR = "tensorboard"
"""The sub-directory of a run directory that holds TensorBoard event files."""

METRICS: Mapping[str, str] = {
    # Rollouts: the episodes that made this step's batch.
    "rollout/episodes": "episodes played (failed ones included)",
    "rollout/failed": "episodes that ended with an error (env raised or hung, engine failed); never trained on",
    "rollout/truncated": "episodes cut by the turn limit, the context length or the env",
    "rollout/success_rate": 'share of non-failed episodes whose final `info["success"]` was true',
    "rollout/reward_mean": "mean episode return over non-failed episodes",
    "rollout/turns_mean": "mean policy turns per episode",
    "rollout/response_tokens_mean": "mean generated tokens per episode, all turns (observation tokens not counted)",
    # The optimizer step.
    "train/loss": "the total loss the optimizer stepped on (policy, value, KL and entropy terms as weighted)",
    "train/policy_loss": "the policy-gradient (clipped surrogate) part of the loss",
    "train/value_loss": "the critic's loss (PPO with a value head only)",
    "train/kl": "mean per-token KL estimate of the policy from the reference policy, on generated tokens",
    "train/entropy": "mean per-token entropy of the policy on generated tokens (of the rows computed: see train/computed_fraction; so are the clip fraction, approx KL, importance-weight and log-prob-gap figures)",
    "train/clip_fraction": "share of generated tokens whose probability ratio was clipped",
    "train/approx_kl": "k3 estimate of KL(behaviour policy || updated policy) on generated tokens: how far the update moved",
    "train/engine_logprob_gap": (
        "mean |trainer log-prob - engine log-prob| over the generated tokens sampled by the weights being trained, in "
        "the loss's forward pass: about 0 (one epoch, one mini-batch); more means the trainer scores another "
        "distribution than the engine sampled from (temperature, dtype, weights out of sync). Absent from a step "
        "whose tokens are all stale"
    ),
    "train/policy_lag_logprob_gap": (
        "the same gap over the tokens sampled by an older policy version (max_staleness > 0): how far the policy "
        "moved since they were sampled (the engine mismatch, about 1e-6, included). Absent from an on-policy step"
    ),
    "train/stale_token_fraction": "share of the trained generated tokens sampled by an older policy version",
    "train/corrected": "1 when this step's loss applied an off-policy correction (trainer.correction), else 0",
    "train/is_weight_mean": "mean importance weight exp(trainer - engine log-prob) after truncation, on corrected steps",
    "train/is_capped_fraction": "share of tokens whose importance weight exceeded trainer.is_cap (clamped: tis; dropped: decoupled)",
    "train/grad_norm": "global gradient norm before clipping",
    "train/lr": "learning rate used by this step",
    "train/advantage_mean": "mean advantage over generated tokens (near 0 for group-normalised estimators)",
    "train/reward_mean": "mean episode reward of the trajectories this step trained on",
    "train/tail_long_round": "tail batching: 1 when this batch came from a long round (groups aborted earlier, played at full length), else 0",
    "train/tail_aborted_groups": "tail batching: groups this batch's short round aborted unfinished and queued for a long round",
    "train/filtered_groups": "curriculum.selection filter: groups played and dropped for equal rewards before this step",
    "train/pcl_value_loss": "curriculum.selection pcl: the value model's squared error on this batch's group success rates, before its update",
    "train/pcl_predicted_mean": "curriculum.selection pcl: mean predicted success of the groups this step trained on, when they were chosen",
    "train/pcl_success_mean": "curriculum.selection pcl: their mean observed success rate (the value model's targets)",
    "train/reference_loss": "jepo: the supervised term, weighted negative log-likelihood per reference-answer token",
    "train/reference_nll": "jepo: negative log-likelihood per token of the reference answers after this step's trajectories, before the update",
    "train/jensen_bound": "jepo: the groups' Jensen lower bound on log p(reference | prompt), per reference token, before the update",
    "train/unscored_trajectories": "jepo: trajectories of this step without a reference answer (cut off before the env gave it); not trained on",
    "train/effective_group_fraction": "share of this step's groups whose rewards are not all equal (the others give GRPO no signal)",
    "train/computed_fraction": "share of this step's trajectories the trainer ran forward and backward: a row whose advantages are all 0 (a GRPO group of equal rewards) adds nothing to a loss that is the policy-gradient term alone, so it is skipped (not with an entropy bonus, KL term, critic or JEPO term, nor in data-parallel runs); its tokens still count in the loss's normalisers, so the update is the same",
    "train/trajectories": "trajectories this step trained on",
    "train/generated_tokens": "generated (loss-masked) tokens this step trained on",
    "train/behaviour_version_min": "oldest policy version that sampled a trained token (-1 when unknown)",
    "train/staleness_mean": "mean policy-version lag of the trained tokens (trainer version minus the version that sampled them)",
    "train/staleness_max": "largest policy-version lag of any trained token",
    "train/policy_version": "the policy version after this step's update",
    "train/stale_groups": "groups the staleness bound has dropped since the run (or its resumed session) started",
    "train/stage": "index of the training stage the run is in, from 0 (multi-policy runs)",
    # Throughput and where the time went.
    "perf/tokens_per_s": "generated tokens per second of the whole step (rollout, training and weight sync)",
    "perf/rollout_tokens_per_s": "generated tokens per second of rollout wall time",
    "perf/train_tokens_per_s": "tokens (prompt and response) of the trained batch per second of training time (rows skipped for having no gradient included)",
    "perf/time_rollout": "seconds spent collecting this step's rollouts",
    "perf/time_train": "seconds spent in forward, backward and optimizer step",
    "perf/time_sync": "seconds spent publishing the new weights to the inference engine",
    "perf/time_select": "curriculum: seconds spent choosing prompts since the last step (PCL: env resets, value model scoring and update)",
    "perf/time_step": "wall seconds of the whole step (less than the sum of the phases when they overlap)",
    # Faults the run survived (single-policy runs; see agentrl.policies.supervisor).
    "fault/engine_restarts": "inference engines started so far in this run (across resumes) to replace one that died",
    "fault/engine_seconds_lost": (
        "seconds so far from an engine's death being noticed to its replacement serving the last weights "
        "(generation waited that long; the episodes the death cut short are in rollout/failed)"
    ),
    "fault/adapter_probe_gap": (
        "probe_every: right after this step's weight sync, the mean absolute difference between the engine's and "
        "the trainer's log-probs of a few tokens the engine sampled: about 0 when the engine serves the adapter (or full weights) the trainer "
        "sent; past probe_tolerance the run stops"
    ),
    "fault/env_error": "episode tries so far (retried ones included) that failed because the env raised in a reset or a step: the env itself, its env server, sandbox or Docker engine",
    "fault/env_timeout": "episode tries so far that failed because an env reset or step ran past turn_timeout (or the episode past episode_timeout during one)",
    "fault/engine_error": "episode tries so far that failed because a generation raised: the engine died or refused the request",
    "fault/engine_timeout": "episode tries so far that failed because a generation ran past turn_timeout (max_tokens bounds what the policy may write: a hung or swamped engine)",
    "fault/worker_died": "rollout.ray_address: episodes so far lost with the Ray env worker playing them",
    "fault/episodes_retried": "episode tries so far played again in a fresh env, same seeds, after a fault (rollout.episode_retries per episode); only the last try is ever trained on",
    "fault/groups_replaced": "groups so far left short of group_size good episodes after every retry: never trained on, each replaced by a new group",
    "fault/env_workers_replaced": "rollout.ray_address: Ray env workers that died and were replaced so far, resumes included (their unstarted groups replayed, the rest counted failed)",
    # Several engines behind the router (cluster.engines; see agentrl.policies.router).
    "fault/engines_lost": "cluster: inference engines that died so far (their episodes went on on the others)",
    "fault/replayed_requests": "cluster: generation requests sent again to another engine because theirs died",
    "perf/engine_share_min": "cluster: the least busy engine's share of the generation requests answered so far (1/engines when even)",
    "perf/engine_share_max": "cluster: the busiest engine's share of the generation requests answered so far",
    # Evaluation on the held-out split (before training, every few steps, after training).
    "eval/success_rate": 'share of held-out episodes whose final `info["success"]` was true',
    "eval/reward_mean": "mean episode return on the held-out split",
    "eval/seconds": "wall time of this evaluation (time a training step did not use)",
    "eval/episodes": "held-out episodes played",
    "eval/failed": "held-out episodes that ended with an error",
    "eval/reference_nll": (
        "envs with reference answers (info['reference']): negative log-likelihood per token of the held-out "
        "references after the policy's own episode, under the trainer's weights"
    ),
    "eval/vs_base_success_rate": (
        "multi-agent runs (`eval_against_base`): success rate of a trained policy's agents on the held-out split, "
        "with the base model in every other seat"
    ),
    "eval/vs_base_reward_mean": "the same run's mean return of that policy's agents",
}
"""Every fixed metric name with its one-line meaning."""

FREE_FORM_PREFIXES: Mapping[str, str] = {
    "env/<env id>/...": "anything an env reports about itself, e.g. `env/agentrl/Calculator-v0/success_rate`",
    "sandbox/...": "anything the sandbox layer reports, e.g. `sandbox/exec_seconds_mean`",
}
"""Name families with no fixed members, and what goes in them."""

POLICY_KINDS: tuple[str, ...] = ("rollout", "train", "perf", "eval", "fault")
"""The kinds of fixed name that a multi-policy run logs once per policy."""

PER_POLICY: Mapping[str, str] = {
    "<kind>/<policy id>/<name>": (
        "one policy's value of the fixed name `<kind>/<name>` in a multi-policy run, where kind is "
        f"{', '.join(POLICY_KINDS[:-1])} or {POLICY_KINDS[-1]}, e.g. `train/trader_0/loss`, "
        "`eval/trader_1/success_rate`; each policy counts its own steps"
    ),
}
"""The per-policy family: every fixed name of :data:`POLICY_KINDS`, once per policy."""

_FREE_FORM = re.compile(r"^(env/\S+/[^/\s]+|sandbox/\S+)$")
# kind / policy id / rest of the fixed name. A policy id is any name without "/" or whitespace; the
# kinds leave env/<env id>/... out, whatever the env id looks like.
_PER_POLICY = re.compile(rf"^({'|'.join(POLICY_KINDS)})/([^/\s]+)/([^/\s]+)$")
_PER_POLICY_METRICS = [name for name in METRICS if name.split("/")[0] in POLICY_KINDS]
_RESERVED = ("step", "time")


class MetricsWarning(UserWarning):
    """An unknown metric name or a non-finite value (filter this category to silence them)."""


def is_known_metric(name: str) -> bool:
    """Whether ``name`` is in :data:`METRICS`, is a policy's value of one of them, or is in one of the
    free-form families.

    >>> is_known_metric("train/kl"), is_known_metric("env/agentrl/Calculator-v0/solved")
    (True, True)
    >>> is_known_metric("train/trader_0/kl"), is_known_metric("train/trader_0/kll"), is_known_metric("train/kll")
    (True, False, False)
    """
    if name in METRICS or _FREE_FORM.match(name) is not None:
        return True
    split = split_policy_metric(name)
    return split is not None and split[1] in METRICS


def policy_metric(name: str, policy: str) -> str:
    """The name under which a multi-policy run logs ``policy``'s value of the fixed ``name``.

    >>> policy_metric("train/loss", "trader_0")
    'train/trader_0/loss'

    Raises:
        ValueError: ``name`` is not a fixed name of :data:`POLICY_KINDS`, or ``policy`` is empty or
            holds a ``/`` or whitespace.
    """
    kind, _, rest = name.partition("/")
    if name not in METRICS or kind not in POLICY_KINDS:
        raise ValueError(
            f"{name!r} has no per-policy form: expected a name of agentrl.metrics.METRICS whose kind is one of "
            f"{POLICY_KINDS}.{_did_you_mean(name, _PER_POLICY_METRICS)}"
        )
    if not re.fullmatch(r"[^/\s]+", policy):
        raise ValueError(f"Policy ids in metric names must be non-empty with no '/' or whitespace, got {policy!r}.")
    return f"{kind}/{policy}/{rest}"


def split_policy_metric(name: str) -> tuple[str, str] | None:
    """``(policy id, fixed name)`` of a per-policy metric name, or None for any other name.

    It reads the shape only: the fixed name that comes back may be unknown (a typo).

    >>> split_policy_metric("rollout/trader_1/reward_mean")
    ('trader_1', 'rollout/reward_mean')
    >>> split_policy_metric("rollout/reward_mean"), split_policy_metric("env/agentrl/Negotiation-v0/x")
    (None, None)
    """
    match = _PER_POLICY.match(name)
    if match is None:
        return None
    kind, policy, rest = match.groups()
    return policy, f"{kind}/{rest}"


def metrics_table() -> str:
    """The Markdown table of :data:`METRICS`, :data:`PER_POLICY` and :data:`FREE_FORM_PREFIXES` in
    ``docs/metrics.md``."""
    rows = ["| name | meaning |", "|---|---|"]
    rows += [f"| `{name}` | {meaning} |" for name, meaning in METRICS.items()]
    rows += [f"| `{family}` | {meaning} (per policy) |" for family, meaning in PER_POLICY.items()]
    rows += [f"| `{family}` | {meaning} (free-form) |" for family, meaning in FREE_FORM_PREFIXES.items()]
    return "\n".join(rows)


class MetricsLogger:
    """Writes metrics of a run to ``RUN_DIR/metrics.jsonl`` and, if asked, TensorBoard and wandb.

    Args:
        run_dir: The run directory (created if missing). An existing ``metrics.jsonl`` is appended
            to, for a resumed run.
        tensorboard: Also write TensorBoard event files to ``RUN_DIR/tensorboard`` (needs torch).
        wandb: Also log to a wandb run in offline mode under ``RUN_DIR/wandb``; upload it later
            with ``wandb sync``.
        wandb_project: The wandb project the offline run belongs to.
        config: The run's settings, recorded as the wandb config and as TensorBoard text.

    >>> with MetricsLogger(run_dir) as logger:  # doctest: +SKIP
    ...     logger.log(1, {"rollout/reward_mean": 0.25, "train/loss": 1.7})
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = False,
        wandb: bool = False,
        wandb_project: str = "agentrl",
        config: dict[str, Any] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        """The JSONL file this logger appends to."""
        self.resumed = _repair_torn_tail(self.path)
        """Whether the run directory already held logged metrics (a resumed run)."""
        self._config = config
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._closed = False
        self._tensorboard_wanted = tensorboard
        self._tensorboard: Any = None  # made at the first log(), when the resume step is known
        if tensorboard:
            _import_summary_writer()  # fail now, not at the first log()
        self._wandb_run: Any = _start_wandb(self.run_dir, wandb_project, config) if wandb else None
        # Opened last, so a sink that fails to start leaves no open file behind. log() flushes
        # after every line: a killed process loses at most the line it was writing.
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record ``metrics`` at training step ``step``: one JSONL line, and one point per name in
        TensorBoard and wandb.

        Values may be Python numbers, numpy scalars or 0-d tensors. A NaN or infinity is written as
        ``null`` (and left out of TensorBoard and wandb), with a warning the first time per name.
        Several calls with the same step are merged by :func:`read_metrics`.
        """
        step = _check_step(step)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"MetricsLogger for {self.run_dir} is closed; make a new one to log more.")
            values: dict[str, float | int | None] = {}
            for name, value in metrics.items():  # a loop, not a comprehension: warnings' stacklevel
                values[name] = self._value(step, name, value)
            entry = {"step": step, "time": time.time(), **values}
            self._file.write(json.dumps(entry, allow_nan=False) + "\n")
            self._file.flush()
            finite = {name: value for name, value in values.items() if value is not None}
            if self._tensorboard_wanted:
                self._write_tensorboard(step, finite)
            if self._wandb_run is not None and finite:
                self._wandb_run.log(finite, step=step)

    def close(self) -> None:
        """Flush and close every sink; closing twice is harmless."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._file.close()
            if self._tensorboard is not None:
                self._tensorboard.close()
            if self._wandb_run is not None:
                _finish_wandb(self._wandb_run)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _value(self, step: int, name: str, value: Any) -> float | int | None:
        if not isinstance(name, str) or name in _RESERVED:
            raise ValueError(
                f"Metric names must be strings other than {_RESERVED} (those keys hold the step "
                f"and the wall time), got {name!r}."
            )
        if not is_known_metric(name):
            self._warn_once(name, _unknown_name_message(name))
        number = _as_number(name, value)
        if isinstance(number, float) and not math.isfinite(number):
            self._warn_once(
                f"nonfinite:{name}",
                f"Metric {name!r} is {number} at step {step}; written as null in {self.path.name} and "
                f"left out of TensorBoard and wandb (later non-finite values of it are not warned about).",
            )
            return None
        return number

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, MetricsWarning, stacklevel=4)

    def _write_tensorboard(self, step: int, values: Mapping[str, float | int]) -> None:
        if self._tensorboard is None:
            summary_writer = _import_summary_writer()
            # A resumed run restarts from its checkpoint's step: purge_step makes TensorBoard drop
            # what the earlier run logged from that step on, as read_metrics does.
            self._tensorboard = summary_writer(
                str(self.run_dir / TENSORBOARD_DIR), purge_step=step if self.resumed else None
            )
            if self._config is not None:
                text = json.dumps(self._config, indent=2, sort_keys=True, default=str)
                self._tensorboard.add_text("config", f"```\n{text}\n```", global_step=step)
        for name, value in values.items():
            self._tensorboard.add_scalar(name, value, global_step=step)
        self._tensorboard.flush()


def eval_curve(run_dir: str | Path) -> list[dict[str, float]]:
    """Held-out success against training time: one ``{"step", "success", "minutes"}`` per
    evaluation, ``minutes`` the wall time from the end of the first evaluation with the later
    evaluations' own time (``eval/seconds``) taken out, so runs that evaluate at different steps
    compare by the training they did."""
    evals = [e for e in read_metrics(run_dir, raw=True) if "eval/success_rate" in e]
    if not evals:
        return []
    curve, spent = [], 0.0
    for index, entry in enumerate(evals):
        if index:
            spent += entry.get("eval/seconds") or 0.0
        minutes = (entry["time"] - evals[0]["time"] - spent) / 60
        curve.append({"step": float(entry["step"]), "success": entry["eval/success_rate"], "minutes": minutes})
    return curve


def read_metrics(run_dir: str | Path, *, raw: bool = False) -> list[dict[str, Any]]:
    """The entries of a run's ``metrics.jsonl``, one dict per step in step order.

    Entries with the same step are merged (a later value of a name wins), so a step's training and
    evaluation metrics may be logged separately. A step lower than the one logged before it marks a
    resumed run: what the earlier run logged from that step on is dropped, so every step shows the
    values of the run that the final checkpoints descend from. In a multi-policy run each policy
    counts its own steps, so this is judged per policy: a line's ``<kind>/<policy id>/<name>``
    values are compared with that policy's earlier lines and only that policy's later values are
    dropped; each family of ``env/...`` names (``env/<env id>/<policy>/labels/...``) is judged so
    too, and the other names without a policy form one more such stream. A torn last line (the writer was
    killed mid-line) is skipped. ``null`` values read as ``None``.

    Args:
        run_dir: The run directory, or the path of the JSONL file itself.
        raw: Return every line as written, in file order, without merging.

    Raises:
        FileNotFoundError: There is no metrics file.
        ValueError: A line other than a torn last one is not a metrics entry.
    """
    path = Path(run_dir)
    if not path.is_file():
        path = path / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"No metrics at {path}: expected the {METRICS_FILE} that agentrl.metrics.MetricsLogger "
            f"writes into a run directory. Check the run directory's path."
        )
    data = path.read_bytes()
    lines = data.split(b"\n")
    entries: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            if not isinstance(entry, dict) or not isinstance(entry.get("step"), int):
                raise ValueError(f'expected an object with an integer "step", got {line[:80]!r}')
        except ValueError as e:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            if number == len(lines):  # no newline after it: the writer died mid-line
                break
            raise ValueError(
                f"{path}, line {number}: not a metrics entry ({e}). MetricsLogger writes whole lines, "
                f"so the file was edited or damaged; fix or delete that line."
            ) from None
        entries.append(entry)
    return entries if raw else _merge_steps(entries)


def _merge_steps(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged: dict[int, dict[str, Any]] = {}
    previous: dict[str | None, int] = {}  # the last step of each stream: a policy id, an env family, None for the rest
    for entry in entries:
        step = entry["step"]
        for stream in {_stream(name) for name in entry if name not in _RESERVED} or {None}:
            if step < previous.get(stream, step):  # a resumed run replaces the steps it redoes
                for stale in [s for s in merged if s >= step]:
                    kept = {k: v for k, v in merged[stale].items() if k in _RESERVED or _stream(k) != stream}
                    if kept.keys() <= set(_RESERVED):
                        del merged[stale]
                    else:
                        merged[stale] = kept
            previous[stream] = step
        merged.setdefault(step, {}).update(entry)
    return [merged[step] for step in sorted(merged)]


def _stream(name: str) -> str | None:
    """The step counter a logged name follows: its policy's; for ``env/...`` its family's (the name
    without its last part: a ``metrics_fn``'s names carry the policy there in a run of several);
    None for the other names of the whole run."""
    split = split_policy_metric(name)
    if split is not None:
        return split[0]
    return name.rpartition("/")[0] if name.startswith("env/") else None


def _repair_torn_tail(path: Path) -> bool:
    """Cut a torn last line left by a killed writer, so appended lines start on a line of their
    own; return whether any whole entries remain (the run is being resumed)."""
    if not path.exists() or path.stat().st_size == 0:
        return False
    with path.open("r+b") as f:
        data = f.read()
        if not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            f.truncate(keep)
            warnings.warn(
                f"{path} ended with a torn line ({len(data) - keep} bytes, from a run that was "
                f"killed mid-write); removed it before appending.",
                MetricsWarning,
                stacklevel=3,
            )
            data = data[:keep]
    return bool(data.strip())


def _check_step(step: Any) -> int:
    try:
        step = operator.index(step)
    except TypeError:
        raise TypeError(f"step must be an integer (the training step), got {step!r}.") from None
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}.")
    return step


def _as_number(name: str, value: Any) -> float | int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    try:
        return float(value)  # numpy scalars and 0-d tensors too
    except (TypeError, ValueError):
        raise TypeError(
            f"Metric {name!r} must be a number (int, float, numpy scalar or 0-d tensor), got "
            f"{type(value).__name__} {value!r:.80}."
        ) from None


def _unknown_name_message(name: str) -> str:
    # The nearest fixed name, or the nearest of this policy's names when the name has a policy's
    # shape ("train/trader_0/kll" -> "train/trader_0/kl"); whichever is closer.
    candidates = [(name, fixed, fixed) for fixed in METRICS]
    split = split_policy_metric(name)
    if split is not None:
        policy, base = split
        candidates += [(base, fixed, policy_metric(fixed, policy)) for fixed in _PER_POLICY_METRICS]
    ratio, suggestion = max((difflib.SequenceMatcher(None, a, b).ratio(), s) for a, b, s in candidates)
    hint = f" Did you mean {suggestion!r}?" if ratio >= 0.8 else ""
    return (
        f"Unknown metric name {name!r} (logged anyway).{hint} The fixed names are in "
        f"agentrl.metrics.METRICS, a policy's values of them are <kind>/<policy id>/<name>; free-form "
        f"names go under env/<env id>/... or sandbox/...."
    )


def _did_you_mean(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.8)
    return f" Did you mean {close[0]!r}?" if close else ""


def _import_summary_writer() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ImportError(
            f"MetricsLogger(tensorboard=True) writes through torch.utils.tensorboard, which failed to "
            f"import ({e}). Install torch and tensorboard, or pass tensorboard=False."
        ) from e
    return SummaryWriter


def _start_wandb(run_dir: Path, project: str, config: dict[str, Any] | None) -> Any:
    try:
        import wandb
    except ImportError as e:
        raise ImportError(
            f"MetricsLogger(wandb=True) needs the wandb package ({e}). Install it with "
            f"`pip install wandb`, or pass wandb=False; metrics.jsonl is written either way."
        ) from e
    settings = wandb.Settings(
        mode="offline",  # never the network: `wandb sync RUN_DIR/wandb/offline-run-*` uploads later
        console="off",  # leave stdout and stderr alone (progress bars, the CLI's own output)
        silent=True,
        x_disable_stats=True,  # no system-metrics sampler process
        x_disable_machine_info=True,
        x_save_requirements=False,
    )
    # Each logger session is its own offline run, named after the run directory: a resumed run
    # shows up as a second wandb run, and metrics.jsonl stays the record that merges them.
    return wandb.init(
        mode="offline",
        reinit="create_new",  # never log into, or finish, a wandb run the user has open
        project=project,
        dir=str(run_dir),
        name=run_dir.resolve().name,
        config=config,
        settings=settings,
    )


def _finish_wandb(run: Any) -> None:
    import wandb

    run.finish()
    # finish() can return before wandb's service process has written the run's records to disk
    # (seen with wandb 0.31: a second run in one process left a header-only .wandb file). Stopping
    # the service flushes them; skipped when the user has a wandb run of their own still open.
    if wandb.run is None:
        wandb.teardown()
