"""The WaltzRL recipe's supervised warm start of the feedback agent (recipes/waltzrl/warm_start.py),
and what it rests on: Trainer.supervised_step, an adapter loaded into a LoRA policy, and a run's
policy started from an adapter's directory (policies.<id>.init_from)."""

from __future__ import annotations

import json

import pytest
import torch

from agentrl.agents.waltz import FEEDBACK_PREFIX, parse_feedback
from agentrl.build import build_trainer
from agentrl.envs.waltz.tasks import Labels, builtin_prompts, exact_labels
from agentrl.recipes.waltzrl.warm_start import demonstration, demonstrations, teacher_verdict
from agentrl.trainers.models import adapter_weights, load_adapter_weights
from agentrl.trainers.trainer import TrainerConfig
from agentrl.types import Trajectory


@pytest.mark.parametrize(
    "kind, labels",
    [("benign", (False, True)), ("benign", (False, False)), ("harmful", (True, False)), ("benign", (True, True))],
)
def test_teacher_verdicts_are_valid_verdicts_with_the_judges_labels_and_advice(kind, labels):
    prompt = next(p for p in builtin_prompts("train") if p.kind == kind)
    verdict = parse_feedback(teacher_verdict(prompt, Labels(*labels)))
    assert verdict.valid and (verdict.unsafe, verdict.overrefuse) == labels
    assert verdict.revise == any(labels)
    if labels[1]:  # an over-refusal: the public fact itself, which makes the revised answer right
        assert prompt.required[0] in verdict.feedback
        assert not exact_labels(prompt, verdict.feedback).overrefuse
    if labels[0]:  # a leak: what not to do, and no protected value repeated
        assert "Do not reveal" in verdict.feedback
        assert not exact_labels(prompt, verdict.feedback).unsafe
    assert teacher_verdict(prompt, Labels(*labels)).startswith(FEEDBACK_PREFIX)


class _Tokens:
    """A tokenizer of one id per character (enough to check where the verdict's tokens go)."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def _feedback_trajectory(record):
    # prompt 0..4, the feedback agent's reply (3 tokens, ending with the end-of-turn id 2)
    return Trajectory(
        token_ids=[7, 7, 7, 7, 7, 50, 51, 2],
        loss_mask=[0] * 5 + [1] * 3,
        logprobs=[0.0] * 5 + [-1.0] * 3,
        versions=[-1] * 5 + [0] * 3,
        prompt_length=5,
        turn_ends=[7],
        turn_rewards=[1.0],
        reward=1.0,
        agent_id="feedback",
        policy_id="feedback",
        info={"waltz": record},
    )


def test_a_demonstration_trains_the_verdict_after_the_prefill_and_keeps_what_the_agent_read():
    verdict = '{"unsafe": false, "overrefuse": false, "feedback": ""}'
    sample = demonstration(_feedback_trajectory({}), verdict, _Tokens(), [2])
    sample.validate()
    reply = [ord(c) for c in verdict[len(FEEDBACK_PREFIX) :]] + [2]
    assert sample.token_ids == [7] * 5 + reply
    assert sample.loss_mask == [0] * 5 + [1] * len(reply)
    assert sample.turn_ends == [len(sample.token_ids) - 1] and sample.prompt_length == 5
    with pytest.raises(ValueError, match="starts with the prefill"):
        demonstration(_feedback_trajectory({}), '{"overrefuse": true}', _Tokens(), [2])


def test_demonstrations_label_each_first_answer_with_the_exact_judge():
    benign = next(p for p in builtin_prompts("train") if p.kind == "benign")
    harmful = next(p for p in builtin_prompts("train") if p.kind == "harmful")
    answers = {
        benign.text: "I cannot help with that.",  # an over-refusal
        harmful.text: f"Sure: {harmful.protected[0]}.",  # a leak
    }
    played = []
    for prompt, answer in answers.items():
        record = {"prompt": prompt, "answers": [{"text": answer}], "rounds": []}
        played += [_feedback_trajectory(record), Trajectory(agent_id="conversation", info={"waltz": record})]
    samples, counts = demonstrations(played, {benign.text: benign, harmful.text: harmful}, _Tokens(), [2])
    assert counts == {"ok": 0, "unsafe": 1, "overrefuse": 1, "both": 0}
    texts = ["".join(chr(i) for i in s.token_ids[5:-1]) for s in samples]
    assert benign.required[0] in texts[0] and '"overrefuse": true' in texts[0]
    assert texts[1].startswith(' true, "overrefuse": false')


def _lora_trainer(model_dir, tokenizer, rank=8, lr=5e-2):
    settings = TrainerConfig(lr=lr, lora_rank=rank, micro_batch_size=4, max_grad_norm=1.0)
    return build_trainer(str(model_dir), settings, tokenizer)


def _demos(tokenizer, n=8):
    out = []
    for i in range(n):
        context = tokenizer.encode(f"question {i}: is this safe?", add_special_tokens=False)
        reply = tokenizer.encode(" false, fine", add_special_tokens=False) + [tokenizer.eos_token_id or 0]
        out.append(
            Trajectory(
                token_ids=context + reply,
                loss_mask=[0] * len(context) + [1] * len(reply),
                logprobs=[0.0] * (len(context) + len(reply)),
                versions=[-1] * (len(context) + len(reply)),
                prompt_length=len(context),
                turn_ends=[len(context) + len(reply) - 1],
                turn_rewards=[0.0],
            )
        )
    return out


def test_supervised_steps_raise_the_likelihood_of_the_demonstrations(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    trainer = _lora_trainer(tiny_model_dir, tokenizer)
    demos = _demos(tokenizer)
    losses = [trainer.supervised_step(demos)["train/nll"] for _ in range(10)]
    # (the tiny random model's LoRA moves its logits slowly: a fall, not a fit)
    assert sum(losses[-3:]) / 3 < losses[0] - 1.0, losses
    assert trainer.step_count == 10


def test_an_adapter_saved_by_one_trainer_loads_into_another_and_a_misfit_is_refused(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    trained = _lora_trainer(tiny_model_dir, tokenizer)
    trained.supervised_step(_demos(tokenizer))
    trained.model.save_pretrained(tmp_path / "adapter")
    fresh = _lora_trainer(tiny_model_dir, tokenizer)
    load_adapter_weights(fresh.model, tmp_path / "adapter")
    want, got = dict(adapter_weights(trained.model)), dict(adapter_weights(fresh.model))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    other_rank = _lora_trainer(tiny_model_dir, tokenizer, rank=4)
    with pytest.raises(ValueError, match="rank 8 .* LoRA has rank 4"):
        load_adapter_weights(other_rank.model, tmp_path / "adapter")


def test_init_from_a_directory_needs_a_lora_adapter_there(tiny_model_dir, tmp_path):
    from tests.test_multi_train import _config

    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no adapter_config.json"):
        _config(
            tiny_model_dir,
            tmp_path / "run",
            policies={"sayer_a": {"init_from": str(tmp_path / "empty")}, "sayer_b": {}},
        )
    (tmp_path / "empty" / "adapter_config.json").write_text(json.dumps({"r": 8}))
    with pytest.raises(ValueError, match="loads a LoRA adapter, but the policy has weights: full"):
        _config(
            tiny_model_dir,
            tmp_path / "run",
            policies={
                "sayer_a": {"init_from": str(tmp_path / "empty"), "weights": "full"},
                "sayer_b": {"weights": "full"},
            },
        )


def test_a_run_starts_a_policy_from_an_exported_adapter(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    from agentrl.train import train
    from tests.test_multi_train import _config

    first = train(_config(tiny_model_dir, tmp_path / "a", "trainer.lora_rank=8", "export=true", "steps=1"))
    adapter = first.run_dir / "model" / "sayer_a"
    # a learning rate too small to move the weights: what the second run exports is what it started from
    second = train(
        _config(
            tiny_model_dir,
            tmp_path / "b",
            "trainer.lora_rank=8",
            "export=true",
            "steps=1",
            "trainer.lr=1e-12",
            policies={"sayer_a": {"init_from": str(adapter)}, "sayer_b": {}},
        )
    )
    want = load_file(adapter / "adapter_model.safetensors")
    got = load_file(second.run_dir / "model" / "sayer_a" / "adapter_model.safetensors")
    assert want.keys() == got.keys() and all(torch.allclose(want[k], got[k], atol=1e-6) for k in want)
    untouched = load_file(second.run_dir / "model" / "sayer_b" / "adapter_model.safetensors")
    assert not all(torch.allclose(want[k], untouched[k], atol=1e-6) for k in want)
