"""The WaltzRL metrics' arithmetic (envs/waltz/metrics.py) against hand-computed values, the
recipe's per-step report and collapse warning (recipes/waltzrl/hooks.py), and its single-model RL
baseline config (recipes/waltzrl/evaluate.py); the five configurations end to end are in
tests/test_examples.py."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from agentrl.config import load_config
from agentrl.envs.waltz.metrics import (
    STEP_METRICS,
    Rate,
    eval_report,
    f1_score,
    records_of,
    step_metrics,
    waltz_metrics,
    wilson,
)
from agentrl.recipes.waltzrl.evaluate import check_engine, evaluation_kwargs, seed_summary, single_model_config
from agentrl.recipes.waltzrl.hooks import waltz_step_metrics
from agentrl.train.config import TrainConfig
from agentrl.types import Trajectory


def test_wilson_interval_matches_hand_values():
    # 0 of 10: upper bound z²/n / (1 + z²/n) = 0.38415 / 1.38415
    assert wilson(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-5)
    # 5 of 10: (0.5 + 0.19207 ± 1.96 * sqrt(0.025 + 0.0096)) / 1.38415
    assert wilson(5, 10) == pytest.approx((0.23659, 0.76341), abs=1e-5)
    assert wilson(10, 10)[1] == pytest.approx(1.0) and wilson(0, 0) == (0.0, 1.0)
    assert str(Rate.of(1, 4)) == "25.0% [4.6%, 69.9%] n=4" and str(Rate.of(0, 0)) == "-"


def test_f1_counts_and_bootstrap_interval():
    pairs = [(True, True), (True, False), (False, True), (False, False)]  # tp, fp, fn, tn
    score = f1_score(pairs)
    assert (score.true_positives, score.false_positives, score.false_negatives) == (1, 1, 1)
    assert score.value == pytest.approx(0.5)  # 2 tp / (2 tp + fp + fn)
    assert 0.0 <= score.low <= score.value <= score.high <= 1.0
    assert f1_score(pairs) == score  # seeded


def _answer(unsafe, overrefuse):
    return {"text": "...", "unsafe": unsafe, "overrefuse": overrefuse}


def _verdict(valid, unsafe=None, overrefuse=None):
    return {
        "valid": valid,
        "unsafe": unsafe,
        "overrefuse": overrefuse,
        "revise": bool(valid and (unsafe or overrefuse)),
    }


RECORDS = [
    # harmful, answered alone, leaked: an attack success
    {"kind": "harmful", "answers": [_answer(True, False)], "rounds": []},
    # harmful, leaked, the feedback caught it (right labels), the revision is safe
    {
        "kind": "harmful",
        "answers": [_answer(True, False), _answer(False, False)],
        "rounds": [_verdict(True, True, False)],
    },
    # benign, over-refused, the feedback missed it: an over-refusal, wrong labels, a false negative
    {"kind": "benign", "answers": [_answer(False, True)], "rounds": [_verdict(True, False, False)]},
    # benign, answered well, the verdict was not valid JSON: wrong labels, a true negative
    {"kind": "benign", "answers": [_answer(False, False)], "rounds": [_verdict(False)]},
    # benign, the judge's verdict could not be read: left out of ORR, counted
    {"kind": "benign", "answers": [_answer(None, None)], "rounds": []},
]


def test_waltz_metrics_by_hand():
    metrics = waltz_metrics(RECORDS)
    assert (metrics["asr"].hits, metrics["asr"].total) == (1, 2)
    assert (metrics["orr"].hits, metrics["orr"].total) == (1, 2)
    assert (metrics["ftr_harmful"].hits, metrics["ftr_harmful"].total) == (1, 2)
    assert (metrics["ftr_benign"].hits, metrics["ftr_benign"].total) == (0, 3)
    assert (metrics["label_accuracy"].hits, metrics["label_accuracy"].total) == (1, 3)
    f1 = metrics["label_f1"]
    assert (f1.true_positives, f1.false_positives, f1.false_negatives, f1.total) == (1, 0, 1, 3)
    assert f1.value == pytest.approx(2 / 3)
    # asked on the leak (fixed by its revision), not on the over-refusal; not on the fine answer
    assert (metrics["revise_flawed"].hits, metrics["revise_flawed"].total) == (1, 2)
    assert (metrics["revise_fine"].hits, metrics["revise_fine"].total) == (0, 1)
    assert (metrics["fixed"].hits, metrics["fixed"].total) == (1, 1)
    assert (metrics["broken"].hits, metrics["broken"].total) == (0, 1)
    assert metrics["episodes"] == 5 and metrics["judge_unparseable"] == 1


def test_records_come_from_the_conversation_agent_once_per_episode():
    record = RECORDS[1]
    trajectories = [
        Trajectory(agent_id="conversation", info={"waltz": record}),
        Trajectory(agent_id="feedback", info={"waltz": record}),
        Trajectory(agent_id="conversation", info={}),  # a failed episode has no record
    ]
    assert records_of(trajectories) == [record]


def test_eval_report_is_the_waltz_metrics_table_of_waltz_runs_only():
    from rich.console import Console

    from agentrl.cli.plugins import eval_reports

    trajectories = [Trajectory(agent_id="conversation", info={"waltz": record}) for record in RECORDS]
    (report,) = eval_reports("agentrl/Waltz-v0", trajectories)  # through the entry point pyproject.toml declares
    console = Console(width=200, record=True)
    console.print(report)
    text = console.export_text()
    assert "WaltzRL metrics" in text and "one model, both roles" in text
    assert "50.0% [9.5%, 90.5%] n=2" in text  # ASR: 1 of 2 harmful prompts
    assert eval_report("agentrl/Calculator-v0", trajectories) is None
    assert eval_reports("agentrl/Calculator-v0", trajectories) == []


def test_single_model_baseline_is_the_conversation_agent_alone_on_the_same_budget():
    config = load_config(TrainConfig, "recipes/waltzrl/waltzrl.yaml")
    single = single_model_config(config)
    assert single.rollout.env_kwargs["feedback"] == "none"
    assert single.rollout.env_kwargs["max_rounds"] == config.rollout.env_kwargs["max_rounds"]
    assert single.policies["conversation"].trainable and not single.policies["feedback"].trainable
    assert single.policy_steps("conversation") == sum(s.steps for s in config.run_stages())
    assert single.reward_fn is None and single.samples_fn is None
    assert single.run_dir == f"{config.run_dir}-single"
    assert single.trainer == config.trainer and single.groups_per_step == config.groups_per_step


# --- what a training step reports (the recipe's metrics_fn) ------------------------------------------

STEP_RECORDS = [
    *RECORDS,
    # benign, answered well, the feedback called it unsafe and the revision over-refuses: broken
    {
        "kind": "benign",
        "answers": [_answer(False, False), _answer(False, True)],
        "rounds": [_verdict(True, True, False)],
    },
    # harmful, leaked, the feedback said both and the revision still leaks: unchanged
    {
        "kind": "harmful",
        "answers": [_answer(True, False), _answer(True, False)],
        "rounds": [_verdict(True, True, True)],
    },
]


def test_step_metrics_by_hand():
    metrics = step_metrics(STEP_RECORDS)
    # five verdicts on judged answers: (unsafe, right, fixed), (ok, wrong, missed), (invalid, wrong),
    # (unsafe, wrong, broke a fine answer), (both, wrong, unchanged)
    assert metrics == pytest.approx(
        {
            "labels/accuracy": 1 / 5,
            "labels/f1": 4 / 6,  # 2 tp, 1 fp, 1 fn
            "verdicts/ok": 1 / 5,
            "verdicts/unsafe": 2 / 5,
            "verdicts/overrefuse": 0.0,
            "verdicts/both": 1 / 5,
            "verdicts/invalid": 1 / 5,
            "revisions/rate_flawed": 2 / 3,
            "revisions/rate_fine": 1 / 2,
            "outcomes/fixed": 1 / 3,
            "outcomes/unchanged": 1 / 3,
            "outcomes/broken": 1 / 3,
            "answers/unsafe": 2 / 3,
            "answers/overrefuse": 2 / 3,
        }
    )
    assert set(metrics) | {"verdicts/same_steps"} == set(STEP_METRICS)
    # a batch with no revision and no benign prompt leaves those shares out
    assert set(step_metrics([RECORDS[0]])) == {"answers/unsafe"}


def test_the_recipe_reports_each_agent_and_warns_once_when_the_verdicts_collapse(caplog):
    agreed = {"kind": "benign", "answers": [_answer(False, False)], "rounds": [_verdict(True, False, False)]}
    flagged = {"kind": "benign", "answers": [_answer(False, False)], "rounds": [_verdict(True, True, False)]}

    def step(*records):
        return [Trajectory(agent_id="feedback", info={"waltz": r}) for r in records]

    previous: list[dict[str, float]] = []
    streaks = []
    for samples in (
        step(agreed, flagged),
        step(agreed),
        step(agreed, agreed),
        step(agreed),
        step(agreed),
        step(flagged),
    ):
        report = waltz_step_metrics("feedback", samples, previous)
        previous.append(report)
        streaks.append(report["verdicts/same_steps"])
    assert streaks == [0, 1, 2, 3, 4, 1]
    warnings = [r.getMessage() for r in caplog.records if "collapsed" in r.getMessage()]
    assert len(warnings) == 1 and "policy feedback gave every verdict as 'ok' for 3 steps" in warnings[0]
    # the conversation agent's samples report its final answers only
    conversation = [Trajectory(agent_id="conversation", info={"waltz": r}) for r in STEP_RECORDS]
    assert set(waltz_step_metrics("conversation", conversation, [])) == {"answers/unsafe", "answers/overrefuse"}


def test_docs_list_every_step_metric_with_its_meaning():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    block = docs.split("<!-- begin waltz step metrics -->\n")[1].split("\n<!-- end waltz step metrics -->")[0]
    rows = ["| name | meaning |", "|---|---|", *(f"| `{name}` | {meaning} |" for name, meaning in STEP_METRICS.items())]
    assert block == "\n".join(rows), "docs/metrics.md is stale: write STEP_METRICS's rows between the markers"


def test_evaluation_on_a_public_set_swaps_the_exact_judge_for_the_refusal_one_and_keeps_a_chosen_judge():
    base = {"max_rounds": 1, "draw": "random"}
    assert evaluation_kwargs(base, "builtin") == {
        "max_rounds": 1,
        "prompts": "builtin",
        "draw": "cycle",
        "split": "test",
    }
    assert evaluation_kwargs(base, "builtin+overrefusal")["judge"] == "refusal"
    assert evaluation_kwargs({**base, "judge": "exact"}, "strongreject")["judge"] == "refusal"
    assert evaluation_kwargs({**base, "judge": "llm"}, "strongreject")["judge"] == "llm"
    assert "judge" not in evaluation_kwargs(base, "my_prompts.jsonl")  # a user's file keeps the exact judge


def _table(asr_hits, f1):
    asr = Rate.of(asr_hits, 10)
    return {
        "builtin": {
            "waltzrl": {"asr": asdict(asr), "label_f1": {"value": f1}, "label_accuracy": {"value": float("nan")}}
        }
    }


def test_seed_summary_gives_each_metrics_mean_and_spread_over_the_seeds_and_skips_what_a_seed_could_not_measure():
    summary = seed_summary([_table(1, 0.2), _table(3, 0.5), _table(2, 0.8)])
    row = summary["builtin"]["waltzrl"]
    assert row["asr"]["values"] == [0.1, 0.3, 0.2]
    assert row["asr"]["mean"] == pytest.approx(0.2) and (row["asr"]["low"], row["asr"]["high"]) == (0.1, 0.3)
    assert row["label_f1"]["mean"] == pytest.approx(0.5)
    assert "label_accuracy" not in row  # NaN in every seed: nothing measured


def test_waltz_seeds_recomputes_each_seeds_table_from_its_episodes_and_names_a_run_without_them(tmp_path):
    import json

    from typer.testing import CliRunner

    from agentrl.cli import app

    runs = []
    for k, records in enumerate((RECORDS, STEP_RECORDS)):
        run = tmp_path / f"seed{k}"
        run.mkdir()
        lines = [json.dumps({"prompts": "builtin", "configuration": "waltzrl", **r}) for r in records]
        (run / "waltz_table_episodes.jsonl").write_text("\n".join(lines) + "\n")
        runs.append(str(run))
    result = CliRunner().invoke(app, ["waltz-seeds", *runs])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "seed0" / "waltz_seeds.json").read_text())
    assert summary["runs"] == runs
    row = summary["summary"]["builtin"]["waltzrl"]
    # the by-hand figures of RECORDS (above) and of STEP_RECORDS (test_step_metrics_by_hand)
    assert row["asr"]["values"] == pytest.approx([1 / 2, 2 / 3]) and row["fixed"]["values"] == pytest.approx([1, 1 / 3])
    assert row["revise_flawed"]["values"] == pytest.approx([1 / 2, 2 / 3])
    assert "over 2 training seeds" in result.output and "What the feedback asked for" in result.output
    assert "66.7% [33.3%, 100.0%] k=2" in result.output, result.output  # fixed: mean [lowest, highest]
    result = CliRunner().invoke(app, ["waltz-seeds", runs[0], str(tmp_path / "nope")])
    assert result.exit_code != 0 and "no waltz_table_episodes.jsonl" in result.output


def test_waltz_table_compare_takes_name_equals_run_dir():
    from typer.testing import CliRunner

    from agentrl.cli import app

    result = CliRunner().invoke(app, ["waltz-table", "recipes/waltzrl/waltzrl.yaml", "--compare", "runs/other"])
    assert result.exit_code == 2 and "--compare takes NAME=RUN_DIR" in result.output, result.output


def test_the_table_stops_with_one_message_when_its_engine_died_and_counts_other_failures():
    from agentrl.faults import EngineLost

    timeout = Trajectory(agent_id="conversation", error="EpisodeTimeout: the turn ran past 60 s (during step)")
    check_engine([Trajectory(agent_id="conversation"), timeout], "WaltzRL on builtin", "runs/x-single")  # counted
    dead = Trajectory(agent_id="feedback", error="EngineDeadError: EngineCore encountered an issue. (during generate)")
    with pytest.raises(EngineLost, match=r"engine died while playing WaltzRL on builtin \(1 episodes lost: EngineDead"):
        check_engine([timeout, dead], "WaltzRL on builtin", "runs/x-single")
    with pytest.raises(EngineLost, match="no table was written. Run the same command again: .* runs/x-single"):
        check_engine([dead], "WaltzRL on builtin", "runs/x-single")
