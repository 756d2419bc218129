"""The WaltzRL evaluation table: the configurations of the paper's main comparison played on the
same held-out prompts of ``agentrl/Waltz-v0``, each measured with the env's metrics (ASR, ORR, FTR,
label accuracy and F1 with 95% intervals: :mod:`agentrl.envs.waltz.metrics`).

The configurations: (1) the conversation agent alone, (2) both agents untrained (inference-time
collaboration), (3) oracle labels turned into template feedback, (4) single-model RL (the
conversation agent trained alone on R_c with the same number of steps, trained here first if its
run directory has no model), (5) WaltzRL after stage 2 (the adapters ``agentrl train`` exported).
``agentrl waltz-table recipes/waltzrl/waltzrl.yaml`` prints it and writes it as JSON, on the built-in
held-out prompts or on public safety sets (``--prompts strongreject+overrefusal``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.envs.waltz.metrics import COLUMNS, REVISION_COLUMNS, as_json, records_of, waltz_metrics
from agentrl.envs.waltz.public_sets import PUBLIC_SETS
from agentrl.types import Trajectory

if TYPE_CHECKING:
    from agentrl.train import Progress  # torch: not at import

CONFIGURATIONS: dict[str, str] = {
    "conversation_alone": "conversation agent alone",
    "collaboration": "both agents, untrained",
    "oracle_feedback": "oracle labels, template feedback",
    "single_model_rl": "single-model RL",
    "waltzrl": "WaltzRL (after stage 2)",
}
"""The configurations of the table, in the paper's order: key -> label."""


def configuration_label(key: str) -> str:
    """A configuration's row label: :data:`CONFIGURATIONS`'s, or ``WaltzRL (<name>)`` for a compared run."""
    return CONFIGURATIONS.get(key) or f"WaltzRL ({key.partition(':')[2]})"


def single_model_config(config: Any) -> Any:
    """The single-model RL baseline of a WaltzRL ``config`` (a :class:`~agentrl.train.TrainConfig`):
    the conversation agent alone (``feedback: none``) trained on R_c for as many steps as the whole
    WaltzRL run takes, with the same engine, sampling, batch and trainer settings; its run
    directory is ``<run_dir>-single``."""
    from agentrl.train.config import PolicyConfig, StageConfig  # torch: only when training

    rollout = replace(config.rollout, env_kwargs={**config.rollout.env_kwargs, "feedback": "none"})
    conversation = config.policies.get("conversation", PolicyConfig())
    return replace(
        config,
        rollout=rollout,
        policies={
            "conversation": conversation,
            "feedback": PolicyConfig(weights=conversation.weights, trainable=False),
        },
        stages=[StageConfig(steps=sum(s.steps for s in config.run_stages()))],
        reward_fn=None,
        samples_fn=None,
        samples_args={},
        eval_episodes=0,
        run_dir=f"{config.run_dir}-single",
    )


def waltz_table(
    config: Any,
    episodes: int = 200,
    *,
    prompts: Sequence[str] = ("builtin",),
    train_baseline: bool = True,
    compare: Mapping[str, str | Path] | None = None,
    on_phase: Callable[[str], None] = lambda name: None,
    progress: Progress | None = None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Play the five configurations on the same ``episodes`` held-out prompts (``draw: cycle``) of
    each evaluation set in ``prompts`` (``builtin``, a public set, several joined by ``+``, a JSONL
    file: the env's ``prompts``; :func:`evaluation_kwargs`); return ``{set: {configuration:
    metrics}}`` (see :func:`waltz_metrics`), also written to ``<run_dir>/waltz_table.json``; every
    episode's record (answers, judge labels, verdicts), with its set and configuration, goes to
    ``<run_dir>/waltz_table_episodes.jsonl``.

    ``config`` is the WaltzRL :class:`~agentrl.train.TrainConfig`; ``<run_dir>/model`` must hold its
    exported adapters (``agentrl train`` writes them). With ``train_baseline``, the single-model RL
    baseline is trained first unless ``<run_dir>-single/model`` exists. ``compare`` adds a row per
    other WaltzRL run, ``{name: run_dir}`` (the recipe with and without its warm start, say): its
    adapters played on the same prompts, as configuration ``waltzrl:<name>``. ``progress`` (an
    :class:`agentrl.train.Progress`) follows the baseline's training, step by step.
    """
    from agentrl.build import policy_options  # torch, vllm: lazily
    from agentrl.model_paths import resolve_model
    from agentrl.policies import make_policy
    from agentrl.train import train
    from agentrl.train.serving import vllm_lora_rank

    waltz_dir = Path(config.run_dir) / "model"
    single = single_model_config(config)
    single_dir = Path(single.run_dir) / "model"
    others = {name: Path(run) / "model" for name, run in (compare or {}).items()}
    missing = [d for m in (waltz_dir, *others.values()) for d in (m / "conversation", m / "feedback") if not d.is_dir()]
    if missing:
        raise FileNotFoundError(
            f"no trained WaltzRL adapters in {waltz_dir} (missing {', '.join(str(d) for d in missing)}); "
            "train them first: agentrl train <the same config>."
        )
    if not (single_dir / "conversation").is_dir():
        if not train_baseline:
            raise FileNotFoundError(f"no single-model RL baseline in {single_dir}; train it, or pass train_baseline.")
        on_phase(f"training the single-model RL baseline ({single.stages[0].steps} steps) into {single.run_dir}")
        train(single, progress)

    rollout = config.rollout
    options = policy_options(rollout)
    adapters = {
        "conversation": waltz_dir / "conversation",
        "feedback": waltz_dir / "feedback",
        "single": single_dir / "conversation",
        **{f"{name}:{role}": model / role for name, model in others.items() for role in ("conversation", "feedback")},
    }
    if rollout.backend == "vllm":
        rank = max(_adapter_rank(d) for d in adapters.values())
        options.update(max_loras=len(adapters), max_lora_rank=vllm_lora_rank(rank))
    on_phase("starting the inference engine")
    base = make_policy(rollout.backend, resolve_model(rollout.model), options)
    trained: dict[str, Any] = {}
    try:
        for key, directory in adapters.items():
            trained[key] = load_adapter(base, f"table_{len(trained)}", directory)
        plan = {
            "conversation_alone": (base, base, "none"),
            "collaboration": (base, base, "agent"),
            "oracle_feedback": (base, base, "oracle"),
            "single_model_rl": (trained["single"], base, "none"),
            "waltzrl": (trained["conversation"], trained["feedback"], "agent"),
            **{f"waltzrl:{n}": (trained[f"{n}:conversation"], trained[f"{n}:feedback"], "agent") for n in others},
        }
        tables: dict[str, dict[str, dict[str, Any]]] = {}
        episodes_out: list[dict[str, Any]] = []
        for prompt_set in prompts:
            table = tables[prompt_set] = {}
            for name, (conversation, feedback, mode) in plan.items():
                on_phase(f"evaluating on {prompt_set}: {configuration_label(name)} ({episodes} held-out prompts)")
                env_kwargs = {**evaluation_kwargs(rollout.env_kwargs, prompt_set), "feedback": mode}
                trajectories, failed = play(config, conversation, feedback, env_kwargs, episodes)
                check_engine(trajectories, f"{configuration_label(name)} on {prompt_set}", single.run_dir)
                records = records_of(trajectories)
                episodes_out.extend({"prompts": prompt_set, "configuration": name, **record} for record in records)
                metrics = waltz_metrics(records)
                metrics["failed_episodes"] = failed
                table[name] = metrics
    finally:
        for policy in trained.values():
            policy.close()
        base.close()
    out = Path(config.run_dir) / "waltz_table.json"
    out.write_text(
        json.dumps({s: {name: as_json(m) for name, m in table.items()} for s, table in tables.items()}, indent=1)
    )
    with open(out.with_name("waltz_table_episodes.jsonl"), "w") as f:
        f.writelines(json.dumps(record) + "\n" for record in episodes_out)
    return tables


def play(
    config: Any,
    conversation: Any,
    feedback: Any,
    env_kwargs: Mapping[str, Any],
    episodes: int,
    *,
    seed: int | None = None,
) -> tuple[list[Trajectory], int]:
    """Play ``episodes`` episodes of the run's env with ``env_kwargs``, ``conversation`` and
    ``feedback`` (policies) in the two roles, one episode per seed from ``seed`` (the run's held-out
    seeds by default) at the run's evaluation temperature; return the trajectories and how many
    episodes failed."""
    from agentrl.build import build_rollout, rollout_settings, sampling_of  # torch, vllm: lazily
    from agentrl.train.config import EVAL_SEED_OFFSET

    rollout = config.rollout
    settings = rollout_settings(
        rollout,
        env_kwargs=dict(env_kwargs),
        sampling=replace(sampling_of(rollout, temperature=config.eval_temperature), seed=None),
        group_size=1,
        redundancy=0,
        seed=EVAL_SEED_OFFSET + rollout.seed if seed is None else seed,
        mapping="individual",
    )
    engine = build_rollout(settings, {"conversation": conversation, "feedback": feedback})
    try:
        trajectories = asyncio.run(_play(engine, episodes))
    finally:
        engine.close()
    return trajectories, engine.failed_episodes


def check_engine(trajectories: Sequence[Trajectory], played: str, baseline_dir: str | Path) -> None:
    """Raise :class:`~agentrl.faults.EngineLost` if an episode of ``played`` failed because the
    inference engine died: every later configuration would fail too, and a table of failures is no
    table. (Episodes that failed otherwise are counted in the table's ``failed`` column.)"""
    from agentrl.faults import EngineLost
    from agentrl.policies.supervisor import ENGINE_DEATHS
    from agentrl.rollout.stats import failure_cause

    dead = [t.error for t in trajectories if t.error is not None and failure_cause(t.error) in ENGINE_DEATHS]
    if dead:
        raise EngineLost(
            f"the inference engine died while playing {played} ({len(dead)} episodes lost: {dead[0][:160]}); "
            f"no table was written. Run the same command again: the single-model RL baseline in {baseline_dir} "
            "is kept and not trained again."
        )


def evaluation_kwargs(env_kwargs: Mapping[str, Any], prompts: str) -> dict[str, Any]:
    """The env's keyword arguments for evaluating on ``prompts``: the held-out split, every prompt
    in turn (``draw: cycle``), and the ``refusal`` judge in place of the exact one when ``prompts``
    names a public set (which has no exact values; a judge chosen in the config otherwise stays)."""
    kwargs = {**env_kwargs, "prompts": prompts, "draw": "cycle", "split": "test"}
    if kwargs.get("judge", "exact") == "exact" and any(part in PUBLIC_SETS for part in prompts.split("+")):
        kwargs["judge"] = "refusal"
    return kwargs


def load_adapter(host: Any, name: str, directory: Path) -> Any:
    """The LoRA adapter ``agentrl train`` exported to ``directory`` (peft's format), served by
    ``host`` (a vLLM or hf policy started with room for adapters) as a policy of its own."""
    from safetensors.torch import load_file  # torch: lazily

    config = json.loads((directory / "adapter_config.json").read_text())
    policy = host.adapter(name, config)
    policy.update_weights(load_file(str(directory / "adapter_model.safetensors")).items())
    return policy


def _adapter_rank(directory: Path) -> int:
    return int(json.loads((directory / "adapter_config.json").read_text())["r"])


async def _play(engine: Any, episodes: int) -> list[Trajectory]:
    return [t async for episode in engine.stream_episodes(episodes) for t in episode]


def seed_summary(
    tables: Sequence[Mapping[str, Mapping[str, Mapping[str, Any]]]],
) -> dict[str, dict[str, dict[str, Any]]]:
    """The tables of several training seeds (each a run's ``waltz_table.json``: ``{set: {configuration:
    metrics}}``) side by side: for each set, configuration and metric of :data:`SUMMARY_METRICS`,
    ``{"mean", "low", "high", "values"}`` over the seeds that have it (``low`` / ``high``: the smallest
    and largest seed's value, the spread). A metric a seed could not measure (no verdicts: NaN) is
    left out of that seed's values."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for table in tables:
        for prompt_set, rows in table.items():
            for configuration, metrics in rows.items():
                row = out.setdefault(prompt_set, {}).setdefault(configuration, {})
                for key in SUMMARY_METRICS:
                    value = (metrics.get(key) or {}).get("value")
                    if value is not None and value == value:  # not NaN
                        row.setdefault(key, {"values": []})["values"].append(float(value))
    for rows in out.values():
        for row in rows.values():
            for entry in row.values():
                values = entry["values"]
                entry.update(mean=sum(values) / len(values), low=min(values), high=max(values))
    return out


SUMMARY_METRICS = tuple(key for key, _ in (*COLUMNS, *REVISION_COLUMNS))
"""The metrics :func:`seed_summary` puts side by side: the table's columns, both parts."""


def tables_of_episodes(path: str | Path) -> dict[str, dict[str, dict[str, Any]]]:
    """The tables of a ``waltz_table_episodes.jsonl`` (every episode :func:`waltz_table` played, each
    record naming its prompt set and configuration): ``{set: {configuration: metrics}}`` as in
    ``waltz_table.json``, recomputed from the episodes, so that a metric added since the table was
    made is there too (``failed_episodes`` is not: a failed episode has no record)."""
    grouped: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                grouped.setdefault(record["prompts"], {}).setdefault(record["configuration"], []).append(record)
    return {
        prompt_set: {name: as_json(waltz_metrics(records)) for name, records in rows.items()}
        for prompt_set, rows in grouped.items()
    }
