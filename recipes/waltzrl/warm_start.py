"""The WaltzRL recipe's supervised warm start of the feedback agent (``agentrl waltz-warm-start``).

Trained by RL alone, the 135M feedback agent does not learn to label: its verdicts swing between
asking for a revision of everything and agreeing with everything, and with stage 2's label term off
it settles on agreeing (docs/waltzrl.md, "When the feedback agent collapses"). The warm start gives
it the verdict format and a first idea of the labels before RL, from the exact judge:

1. the untrained model plays ``episodes`` training prompts in both roles (its first answers are
   what the feedback agent will be shown);
2. each first answer gets the verdict the exact judge gives it, written as the feedback agent
   should write it (:func:`teacher_verdict`): the two labels, and feedback that says what to do:
   for an over-refusal, the public fact the user asked for, quoted; for a leak, not to reveal the
   protected data;
3. the feedback adapter is trained on those verdicts, the prompt it read (its role, the
   organisation, the answer) as context (:meth:`~agentrl.trainers.trainer.Trainer.supervised_step`,
   the run's trainer settings), for ``epochs`` passes;
4. the adapter is saved in peft's format, and the feedback agent's label accuracy and F1 on held-out
   prompts are measured before and after.

The RL run starts from it with ``policies.feedback.init_from=<the adapter's directory>``; without
that line it starts from the base model as before, so the warm start is a switch.

The warm start needs the exact judge's values (the built-in prompts, or a JSONL set with
``protected`` and ``required`` values): it is the exact judge the agent imitates.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentrl.agents.trajectory import one_turn
from agentrl.agents.waltz import FEEDBACK_PREFIX
from agentrl.envs.waltz.metrics import as_json, records_of, verdict_pair, waltz_metrics
from agentrl.envs.waltz.public_sets import prompt_pool
from agentrl.envs.waltz.tasks import Labels, Prompt, exact_labels
from agentrl.recipes.waltzrl.evaluate import evaluation_kwargs, load_adapter, play
from agentrl.types import Trajectory

WARM_START_SEED = 500_000
"""The first env seed of the warm start's training episodes (apart from the run's own seeds)."""


def teacher_verdict(prompt: Prompt, labels: Labels) -> str:
    """The verdict the feedback agent is taught for an answer to ``prompt`` that the exact judge
    labelled ``labels``, as the JSON object it writes (its prefill, ``{"unsafe":``, included).

    >>> from agentrl.envs.waltz.tasks import Prompt, Labels
    >>> p = Prompt("When do you open?", "benign", required=("9am to 5pm",))
    >>> teacher_verdict(p, Labels(unsafe=False, overrefuse=True))
    '{"unsafe": false, "overrefuse": true, "feedback": "Give the public fact the user asked for: 9am to 5pm."}'
    >>> teacher_verdict(p, Labels(unsafe=False, overrefuse=False))
    '{"unsafe": false, "overrefuse": false, "feedback": ""}'
    """
    advice = []
    if labels.unsafe:
        advice.append("Do not reveal the protected data; say you cannot share it.")
    if labels.overrefuse:
        advice.append(f"Give the public fact the user asked for: {prompt.required[0]}.")
    verdict = {"unsafe": labels.unsafe, "overrefuse": labels.overrefuse, "feedback": " ".join(advice)}
    return json.dumps(verdict)


def demonstration(trajectory: Trajectory, verdict: str, tokenizer: Any, end_ids: Sequence[int]) -> Trajectory:
    """The feedback agent's first turn of ``trajectory`` with its reply replaced by ``verdict``
    (which starts with the prefill, already in the prompt): the tokens it read are context, the
    verdict's tokens and ``end_ids`` (the end of the turn) are the ones trained."""
    if not verdict.startswith(FEEDBACK_PREFIX):
        raise ValueError(f"a verdict starts with the prefill {FEEDBACK_PREFIX!r}, got {verdict[:20]!r}.")
    sample = one_turn(trajectory, 0)
    context = sample.token_ids[: sample.prompt_length]
    reply = list(tokenizer.encode(verdict[len(FEEDBACK_PREFIX) :], add_special_tokens=False)) + list(end_ids)
    n = len(context) + len(reply)
    return replace(
        sample,
        token_ids=context + reply,
        loss_mask=[0] * len(context) + [1] * len(reply),
        logprobs=[0.0] * n,
        versions=[-1] * n,
        turn_ends=[n - 1],
        turn_rewards=[0.0],
        reward=0.0,
    )


def demonstrations(
    trajectories: Sequence[Trajectory], prompts: Mapping[str, Prompt], tokenizer: Any, end_ids: Sequence[int]
) -> tuple[list[Trajectory], dict[str, int]]:
    """Each played episode's feedback turn with the exact judge's verdict of its first answer as the
    reply; and how many demonstrations each verdict has (``ok``, ``unsafe``, ``overrefuse``, ``both``)."""
    out, counts = [], {"ok": 0, "unsafe": 0, "overrefuse": 0, "both": 0}
    for trajectory in trajectories:
        record = trajectory.info.get("waltz")
        if trajectory.agent_id != "feedback" or not trajectory.turn_ends or record is None:
            continue
        prompt = prompts[record["prompt"]]
        labels = exact_labels(prompt, record["answers"][0]["text"])
        counts[verdict_pair({"valid": True, **labels._asdict()})] += 1
        out.append(demonstration(trajectory, teacher_verdict(prompt, labels), tokenizer, end_ids))
    return out, counts


def warm_start(
    config: Any,
    *,
    episodes: int = 160,
    epochs: int = 2,
    batch_size: int = 32,
    eval_episodes: int = 128,
    out: str | Path | None = None,
    on_phase: Callable[[str], None] = lambda name: None,
) -> dict[str, Any]:
    """Train the feedback adapter of the WaltzRL run ``config`` (a :class:`~agentrl.train.TrainConfig`)
    on the exact judge's verdicts of ``episodes`` first answers of the untrained model, ``epochs``
    passes in batches of ``batch_size``; save it to ``out`` (``<run_dir>-warm-start/feedback`` by
    default) and return what it did: the demonstrations' verdicts, the loss per step and the
    feedback agent's held-out label accuracy and F1 before and after (``eval_episodes`` prompts,
    0: not measured), also written to ``<out>/warm_start.json``."""
    import torch
    from transformers import AutoTokenizer

    from agentrl.build import build_trainer, policy_options
    from agentrl.model_paths import resolve_model
    from agentrl.policies import make_policy
    from agentrl.train.serving import export, vllm_lora_rank

    if episodes < 1 or epochs < 1 or batch_size < 1 or eval_episodes < 0:
        raise ValueError(
            f"need episodes, epochs and batch_size >= 1 and eval_episodes >= 0; got {episodes}, {epochs}, "
            f"{batch_size} and {eval_episodes}."
        )
    rollout = config.rollout
    env_kwargs = {**rollout.env_kwargs, "feedback": "agent", "judge": "exact", "draw": "random"}
    prompts = {p.text: p for p in prompt_pool(env_kwargs.get("prompts", "builtin"), "train", "exact")}
    out = Path(out) if out is not None else Path(f"{config.run_dir}-warm-start") / "feedback"
    settings = config.trainer_settings("feedback")
    if settings.lora_rank < 1:
        raise ValueError("the warm start trains the feedback agent's LoRA adapter: set trainer.lora_rank >= 1.")
    torch.manual_seed(settings.seed)
    model_path = resolve_model(rollout.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    end_ids = [tokenizer.eos_token_id]
    options = policy_options(rollout)
    if rollout.backend == "vllm":
        options.update(max_loras=1, max_lora_rank=vllm_lora_rank(settings.lora_rank))
    on_phase("starting the inference engine")
    base = make_policy(rollout.backend, model_path, options)
    report: dict[str, Any] = {"episodes": episodes, "epochs": epochs, "batch_size": batch_size}
    try:
        on_phase(f"playing {episodes} training prompts with the untrained model in both roles")
        played, failed = play(config, base, base, {**env_kwargs, "split": "train"}, episodes, seed=WARM_START_SEED)
        samples, counts = demonstrations(played, prompts, tokenizer, end_ids)
        report.update(demonstrations=len(samples), verdicts=counts, failed_episodes=failed)
        if not samples:
            raise RuntimeError(f"none of the {episodes} warm-start episodes reached the feedback agent.")
        held_out = {**evaluation_kwargs(env_kwargs, "builtin"), "feedback": "agent", "judge": "exact"}
        if eval_episodes:
            on_phase(f"the untrained feedback agent on {eval_episodes} held-out prompts")
            report["before"] = _label_metrics(play(config, base, base, held_out, eval_episodes)[0])
        torch.set_num_threads(os.cpu_count() or 1)  # the engine is idle while the adapter trains
        trainer = build_trainer(model_path, settings, tokenizer, device=config.device, dtype=rollout.dtype)
        order = random.Random(settings.seed)
        losses = []
        for epoch in range(epochs):
            on_phase(f"supervised pass {epoch + 1} of {epochs} over {len(samples)} verdicts")
            order.shuffle(samples)
            for start in range(0, len(samples), batch_size):
                losses.append(trainer.supervised_step(samples[start : start + batch_size])["train/nll"])
        report["nll"] = losses
        export(trainer, config.policies["feedback"], model_path, tokenizer, out)
        if eval_episodes:
            on_phase(f"the warm-started feedback agent on {eval_episodes} held-out prompts")
            adapter = load_adapter(base, "warm_feedback", out)
            try:
                report["after"] = _label_metrics(play(config, base, adapter, held_out, eval_episodes)[0])
            finally:
                adapter.close()
    finally:
        base.close()
    report["adapter"] = str(out)
    (out / "warm_start.json").write_text(json.dumps(report, indent=1))
    return report


def _label_metrics(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    metrics = as_json(waltz_metrics(records_of(trajectories)))
    return {k: metrics[k] for k in ("label_accuracy", "label_f1", "ftr_harmful", "ftr_benign", "asr", "orr")}
