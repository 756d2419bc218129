"""JEPO (Tang et al. 2025): the Jensen terms against values computed by hand and against autograd,
the reference answer a rollout records and the batch carries, the supervised term, SFT as its
special case, and a training run on agentrl/Explain-v0 whose reference likelihood goes up."""

from __future__ import annotations

import json
import math

import pytest
import torch

import agentrl
from agentrl import Message, Trajectory
from agentrl.agents import ChatAgent, TrajectoryBuilder, reference_trajectory
from agentrl.config import load_config
from agentrl.envs.explain import ANSWER_REQUEST, ExplainEnv
from agentrl.testing import ScriptedPolicy
from agentrl.train import TrainConfig, train
from agentrl.trainers.advantages import estimate_advantages, jensen_terms, scored_jensen_terms
from agentrl.trainers.batch import collate
from agentrl.trainers.losses import reference_loss
from agentrl.trainers.models import load_policy_model, score_references
from agentrl.trainers.trainer import Trainer, TrainerConfig

# --- the Jensen terms ---------------------------------------------------------------------------


def test_the_single_sample_bound_is_the_mean_with_leave_one_out_baselines():
    logliks = torch.tensor([-1.0, -2.0, -6.0, -4.0])
    terms = jensen_terms(logliks, torch.tensor([0, 0, 0, 1]), bound="single")
    # group 0: mean -3; each minus the mean of the other two: -1 - (-4), -2 - (-3.5), -6 - (-1.5)
    assert terms.bound.tolist() == [-3.0, -3.0, -3.0, -4.0]
    assert terms.advantages.tolist() == [3.0, 1.5, -4.5, 0.0]  # a group of one has no baseline
    assert terms.weights.tolist() == [1.0, 1.0, 1.0, 1.0]


def test_the_multi_sample_bound_is_the_log_mean_likelihood_with_its_leave_one_out_baseline():
    # likelihoods 1 and 3 (group 0), 2, 2, 8 (group 1)
    logliks = torch.tensor([1.0, 3.0, 2.0, 2.0, 8.0]).log()
    terms = jensen_terms(logliks, torch.tensor([0, 0, 1, 1, 1]), bound="multi")
    # group 0: J = log 2; without sample 0: log 3, without sample 1: log 1 = 0; advantages 2 (J - that)
    assert terms.bound[:2].tolist() == pytest.approx([math.log(2)] * 2)
    assert terms.advantages[:2].tolist() == pytest.approx([2 * math.log(2 / 3), 2 * math.log(2)])
    assert terms.weights[:2].tolist() == pytest.approx([2 * 1 / 4, 2 * 3 / 4])
    # group 1: J = log 4; without a 2: log 5, without the 8: log 2
    assert terms.bound[2].item() == pytest.approx(math.log(4))
    assert terms.advantages[2:].tolist() == pytest.approx([3 * math.log(4 / 5)] * 2 + [3 * math.log(2)])
    assert terms.weights[2:].tolist() == pytest.approx([3 * 2 / 12, 3 * 2 / 12, 3 * 8 / 12])


def test_the_multi_sample_weights_are_k_times_the_bounds_gradient():
    logliks = torch.tensor([-3.0, -1.0, -2.5, -7.0], requires_grad=True)
    bound = torch.logsumexp(logliks, 0) - math.log(4)
    (gradient,) = torch.autograd.grad(bound, logliks)
    terms = jensen_terms(logliks.detach(), torch.zeros(4, dtype=torch.long), bound="multi")
    assert torch.allclose(terms.weights, 4 * gradient)
    assert terms.bound[0].item() == pytest.approx(bound.item())


def test_the_multi_sample_baseline_does_not_depend_on_the_sample_it_scores():
    group = torch.zeros(3, dtype=torch.long)
    base = jensen_terms(torch.tensor([-1.0, -2.0, -3.0]), group, bound="multi")
    moved = jensen_terms(torch.tensor([-5.0, -2.0, -3.0]), group, bound="multi")
    # advantage_0 = K * (J - b_0), and b_0 is computed without sample 0
    assert (base.advantages[0] / 3 - base.bound[0]).item() == pytest.approx(
        (moved.advantages[0] / 3 - moved.bound[0]).item()
    )


def test_an_unknown_bound_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="single.*multi"):
        jensen_terms(torch.zeros(2), torch.zeros(2, dtype=torch.long), bound="mult")  # type: ignore[arg-type]


def test_the_supervised_term_is_the_weighted_reference_nll_per_token():
    logprobs = torch.tensor([[0.0, -1.0, -2.0, 0.0], [0.0, 0.0, -3.0, -5.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
    # (0.5 * 3 + 1.5 * 8) / 4 tokens
    assert reference_loss(logprobs, mask, torch.tensor([0.5, 1.5])).item() == pytest.approx(13.5 / 4)
    assert reference_loss(logprobs, mask, torch.tensor([0.5, 1.5]), num_tokens=8).item() == pytest.approx(13.5 / 8)


# --- references in trajectories and batches ------------------------------------------------------


def scored(group: str, reference: list[int]) -> Trajectory:
    """Prompt [1], two generated tokens, then a reference of which the first id is template."""
    return Trajectory(
        token_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -1.0, -1.0], versions=[-1, 0, 0],
        prompt_length=1, turn_ends=[2], turn_rewards=[0.0], group_id=group,
        reference_ids=reference, reference_mask=[0] + [1] * (len(reference) - 1) if reference else [],
    )  # fmt: skip


def test_the_batch_puts_each_reference_after_its_trajectory_with_no_loss_on_it():
    batch = collate([scored("g", [9, 10, 11]), scored("g", [9, 12])], pad_token_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 9, 10, 11], [1, 2, 3, 9, 12, 0]]
    assert batch.loss_mask.tolist() == [[0, 1, 1, 0, 0, 0]] * 2
    assert batch.reference_mask.tolist() == [[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 0]]
    assert batch.attention_mask.tolist() == [[1] * 6, [1] * 5 + [0]]
    assert batch.lengths.tolist() == [6, 5] and batch.num_reference_tokens == 3
    assert collate([scored("g", [])], pad_token_id=0).reference_mask is None


def test_a_trajectory_with_a_mismatched_reference_mask_is_refused():
    bad = scored("g", [9, 10])
    bad.reference_mask = [1]
    with pytest.raises(ValueError, match="reference_mask"):
        bad.validate()


def test_a_trajectory_cut_off_before_its_reference_is_left_out_of_its_group():
    batch = collate([scored("g", [9, 10]), scored("g", [9, 11]), scored("g", [])], pad_token_id=0)
    batch.rewards = torch.tensor([-1.0, -3.0, 0.0])  # what the trainer puts there: log pi(reference | ...)
    terms = scored_jensen_terms(batch, bound="single")
    assert terms.advantages.tolist() == [2.0, -2.0, 0.0] and terms.weights.tolist() == [1.0, 1.0, 0.0]
    advantages = estimate_advantages("jepo", batch, bound="single").advantages
    assert advantages[2].abs().sum() == 0 and advantages[0, 1:3].tolist() == [2.0, 2.0]


def test_jepo_refuses_a_batch_without_references_and_says_which_env_to_use():
    batch = collate([scored("g", []), scored("g", [])], pad_token_id=0)
    with pytest.raises(ValueError, match="info\\['reference'\\]"):
        estimate_advantages("jepo", batch)


def test_the_builder_records_the_request_and_the_reference_as_the_next_reply(tiny_tokenizer):
    agent = ChatAgent(tiny_tokenizer)
    builder = TrajectoryBuilder(agent)
    builder.start([Message("user", "7 - 3?")])
    generated = agent.encode("seven minus three") + agent.end_of_turn_ids
    builder.add_turn(generated, [-1.0] * len(generated), 0)
    request = [Message("user", ANSWER_REQUEST)]
    builder.add_final_observation(request)
    builder.add_reference(request, "It is 4.")
    t = builder.finish(terminated=True)
    reply = agent.reply_ids("It is 4.")
    assert t.reference_ids == agent.observation_ids(request) + reply
    assert t.reference_mask == [0] * len(agent.observation_ids(request)) + [1] * len(reply)
    # Teacher-forcing the reference gives exactly the tokens of the conversation in which the policy said it.
    full = agent.encode(
        agent.render([*agent.conversation([Message("user", "7 - 3?")]), Message("assistant", "seven minus three"),
                      *request, Message("assistant", "It is 4.")])
    )  # fmt: skip
    assert full[: len(t.token_ids) + len(t.reference_ids)] == t.token_ids + t.reference_ids


def test_an_explain_episode_ends_with_its_reference_recorded(tiny_tokenizer):
    from agentrl.rollout.episode import EpisodeLimits, run_episode

    env = ExplainEnv()
    agent = ChatAgent(tiny_tokenizer)
    policy = ScriptedPolicy(tiny_tokenizer, lambda prompt: "3 times 12 is 36")
    import asyncio

    from agentrl.policies.base import Sampling

    t = asyncio.run(run_episode(env, agent, policy, Sampling(max_tokens=16), EpisodeLimits(), seed=3))
    assert t.error is None and t.terminated and t.reward == 0.0
    assert t.info["reference"] == env.reference
    answer = [i for i, m in zip(t.reference_ids, t.reference_mask, strict=True) if m]
    assert agent.completion_text(answer) == env.reference
    assert ANSWER_REQUEST in tiny_tokenizer.decode(t.reference_ids)


# --- the trainer ----------------------------------------------------------------------------------


def test_sft_is_jepo_on_reference_only_trajectories(tiny_model_dir, tiny_tokenizer):
    agent = ChatAgent(tiny_tokenizer)
    examples = [reference_trajectory(agent, [Message("user", f"q{i}")], f"answer {i} in full", group_id=str(i))
                for i in range(3)]  # fmt: skip
    torch.manual_seed(0)
    model = load_policy_model(tiny_model_dir)
    trainer = Trainer(
        model, TrainerConfig(algorithm="jepo", lr=0.0, micro_batch_size=2, max_grad_norm=0.0), pad_token_id=0
    )
    trainer.step(examples)
    jepo_grads = [p.grad.clone() for p in model.parameters()]
    # By hand: the token-mean negative log-likelihood of the three references after their prompts.
    model.zero_grad()
    nll, count = torch.zeros(()), 0
    for t in examples:
        ids = torch.tensor([t.token_ids + t.reference_ids])
        logits = model(input_ids=ids).logits[0, :-1].float()
        chosen = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        nll = nll - chosen[len(t.token_ids) - 1 :].sum()
        count += len(t.reference_ids)
    (nll / count).backward()
    for mine, theirs in zip(jepo_grads, (p.grad for p in model.parameters()), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-6)


def test_score_references_gives_the_per_token_nll_and_the_groups_bound(tiny_model_dir):
    model = load_policy_model(tiny_model_dir)
    trajectories = [scored("a", [9, 10, 11]), scored("a", [9, 12, 13]), scored("b", [9, 14, 15])]
    result = score_references(model, trajectories, pad_token_id=0)
    batch = collate(trajectories, 0)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids).logits.float()
    chosen = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    logliks = (chosen * batch.reference_mask[:, 1:]).sum(-1)
    assert result.nll == pytest.approx(float(-logliks.sum() / 6), rel=1e-5)
    bound_a = torch.logsumexp(logliks[:2], 0) - math.log(2)
    assert result.bound_nll == pytest.approx(float(-(bound_a + logliks[2]) / 4), rel=1e-5)
    assert result.bound_nll <= result.nll + 1e-6 and result.trajectories == 3


def test_jepo_training_on_explain_raises_the_reference_likelihood(tiny_model_dir, tiny_tokenizer, tmp_path):
    policy = ScriptedPolicy(tiny_tokenizer, lambda prompt: "I add the numbers.")
    config = load_config(TrainConfig, None, [
        "rollout.env_id=agentrl/Explain-v0", f"rollout.model={tiny_model_dir}", "rollout.backend=hf",
        "rollout.group_size=2", "rollout.max_tokens=8", "rollout.temperature=1.0", "trainer.algorithm=jepo",
        "trainer.lr=3e-3", "trainer.micro_batch_size=4", "groups_per_step=2", "steps=4", "eval_episodes=4",
        "checkpoint_every=0", "export=false", "torch_threads=1", f"run_dir={tmp_path / 'run'}",
    ])  # fmt: skip
    result = train(config, policy=policy)
    assert result.steps == 4
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/reference_nll" in r]
    assert len(steps) == 4 and all("train/jensen_bound" in r and "train/reference_loss" in r for r in steps)
    assert all(r["train/jensen_bound"] >= -r["train/reference_nll"] - 1e-6 for r in steps)  # multi >= single
    # The held-out references (other prompts) became more likely after the policy's own replies.
    assert result.eval_after["eval/reference_nll"] < result.eval_before["eval/reference_nll"] - 0.5
    assert agentrl.make("agentrl/Explain-v0").spec.id == "agentrl/Explain-v0"
