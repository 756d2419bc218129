"""End to end: the main job (``agentrl train examples/quickstart.yaml``) against TRL's GRPOTrainer on it.

    python benchmarks/e2e_vs_trl.py                       # best against best, 3 seeds, held-out after every step: hours on 2 cores
    python benchmarks/e2e_vs_trl.py --seeds 1 --steps 10  # one seed, longer
    python benchmarks/e2e_vs_trl.py --same-job            # both sides the same job: agentrl without its filter too
    python benchmarks/e2e_vs_trl.py --only trl trainer.lr=1e-5  # one side; key=value changes both sides' job
    python benchmarks/e2e_vs_trl.py --only trl --first-seed 1 --seeds 2  # TRL's seeds 1 and 2
    python benchmarks/e2e_vs_trl.py --quick               # smoke test: tiny model, hf backend, 1 step, 1 seed, the same job

Best against best (the default): agentrl runs examples/quickstart.yaml as shipped, and TRL the same
job less the quickstart's filter of groups with equal rewards (:data:`UNIFORM`), which TRL's
GRPOTrainer has no option for. With ``--same-job`` agentrl drops its filter too, and the script
checks that both sides trained the same groups step by step. Each side runs ``--seeds`` times
(``rollout.seed`` and ``trainer.seed`` 0, 1, ...: the tasks trained and evaluated, the sampler and
the trainer), evaluating held-out success every ``--eval-every`` steps (1); the summary gives the
training minutes to each of ``--targets`` (80% and 90%) per side, median and the lowest and highest
seed, and the ratio of the medians. ``key=value`` arguments override the job for both sides.

The job: SmolLM2-135M-Instruct learns
``agentrl/ToolArithmetic-v0`` (call the calculator, then submit its result; up to 3 turns, reward
from the env) with GRPO, groups of 8, 2 groups per step, lr 5e-5 (3e-5 before 2026-12-03), the top
16 decoder layers trainable (8 before 2026-12-07), temperature 0.7, 32 new tokens per turn, one
torch thread. Each side runs in its own process, one after the other, and is measured the same
way:

- **agentrl**: ``agentrl train examples/quickstart.yaml`` (rollouts on vLLM one batch ahead of the
  GRPO steps), timed from start to exit; it evaluates before and after (and every
  ``--eval-every`` steps) inside the command.
- **TRL**: a script a user would write: ``GRPOTrainer(model, args=GRPOConfig(...), train_dataset,
  processing_class, environment_factory=...)`` with TRL's own multi-turn tool loop and generation
  (transformers ``generate``, ``use_vllm=False``), timed from start to the saved model. Its saved
  models are then evaluated in another process by agentrl's evaluation.

Both evaluations are :meth:`agentrl.train.loop.Controller.evaluate`'s engine (:func:`held_out`):
the test split, ``eval_episodes`` episodes of seed ``EVAL_SEED_OFFSET + rollout.seed`` (the same
tasks every time), ``eval_temperature``, unseeded sampling, the rollout's backend. TRL's models are
loaded into one engine started on the base model, as agentrl loads its trained weights into its own.

What TRL gets that is the same as agentrl's:

- the model, its chat template and the prompts: the env's first observation for the seed of each
  group agentrl trains on (``group_env_seed(rollout.seed, group)`` for groups 0, 1, ...), in order,
  ``num_generations`` = group size, ``groups_per_step`` prompts per step; the script checks that
  TRL's prompt and tool-result tokens equal agentrl's, and (with ``--same-job``) that both trained the same groups;
- the env: TRL's tools are the env's, one env step per call (:class:`EnvTools`), so tool results,
  grading and reward are the env's own, and TRL reads a reply's calls with agentrl's reader
  (:func:`read_replies_as_agentrl`), so both score every reply alike; up to ``max_turns`` rounds of
  calls (``max_tool_calling_iterations``);
- sampling: temperature, top-p, ``max_tokens`` new tokens per turn (``generation_kwargs``), the same
  end-of-turn token;
- the loss and optimizer: GRPO advantages scaled by the group's std, PPO-clip at the same range,
  one optimizer step per batch (``num_iterations`` 1), every generated token of the step weighing
  the same (agentrl's ``token-mean`` is TRL's ``loss_type="dapo"``), no KL (``beta`` 0), no entropy
  bonus, log-probs at the sampling temperature, ``torch.optim.AdamW`` with the same lr, betas and
  weight decay, a constant lr, clipping at ``max_grad_norm``, micro-batches of the same size, fp32,
  no gradient checkpointing; the layers below the top ``trainable_layers`` (and the embeddings) are
  frozen before TRL gets the model (:func:`train_top_layers`, what agentrl's loader does).

What a TRL user has to add, and how it is done here: SmolLM2's chat template ignores tool calls,
which TRL refuses (``supports_tool_calling``), so :data:`FOLD_TOOL_CALLS` puts an assistant
message's calls into its text, as the model writes them (the only messages the template renders
differently); TRL knows no response parser for this template (``add_response_schema`` raises), so
the tokenizer gets one, agentrl's.

What differs, and cannot be made equal through TRL's API:

- **Generation and overlap.** TRL generates with transformers in the training process, on the
  trainer's one torch thread (the job's ``torch_threads: 1``; the second core idles), and steps on
  each batch right after generating it; each round of tool calls generates again from the whole
  history. agentrl generates on vLLM on the other core, one batch ahead of training
  (``max_staleness: 1``), correcting the stale tokens off-policy. ``torch_threads=2`` gives both
  sides' trainers two threads.
- **The end of an episode.** TRL's tool loop does not know that a call ended the episode: after the
  env's last tool result (the graded ``answer``, or the last turn's call) the model replies once
  more, as long as rounds are left, so an episode has up to ``max_turns + 1`` replies. Those replies
  are generated and trained on (with the episode's advantage) but never change its reward; agentrl
  stops at the end. (``max_tool_calling_iterations = max_turns - 1`` would cap the replies, but
  then the calls of the last reply never run, and a last-turn answer would score 0 where the env
  scores it.) TRL counts turns per call rather than per reply; the same here, where a reply makes
  one call.
- **Faults.** A reply whose call agentrl cannot read gets the env's error message; in TRL the call
  is made without arguments and TRL's own error text comes back. Both spend a turn. agentrl closes
  a reply cut at ``max_tokens`` with the end-of-turn token before the next observation; TRL appends
  the observation to the cut text.
- **Small print.** TRL adds 1e-4 to the group std, agentrl 1e-6; TRL's fused LM head scores every
  position of a sequence on the CPU (see benchmarks/trainer_step.py).

Printed per side: the command's wall time (and the evaluations inside it), the set-up (command less
training and evaluations: engine start, loading, saving), the training time (from the first step's
start to the last step's end, evaluations and saves left out), held-out success before and after,
the train reward by step and the generated tokens per episode. Then the comparison: the training
time each side took to reach each target, or, where one did not, each side's success after the
same training time (its last evaluation by then). Over 64 episodes a held-out figure's 95%
interval is about +-10 points, so "first evaluation at or above 90%" comes early by chance as often
as late: that is why the seeds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from agentrl.agents import ChatAgent
from agentrl.build import build_rollout, env_factory, limits_of, make_policy, sampling_of
from agentrl.config import load_config
from agentrl.env import AgentEnv
from agentrl.metrics import eval_curve, read_metrics
from agentrl.model_paths import resolve_model
from agentrl.policies import Policy
from agentrl.rollout import RolloutSettings, group_env_seed
from agentrl.testing import build_tiny_model, train_in_subprocess
from agentrl.train.config import EVAL_SEED_OFFSET, TrainConfig
from agentrl.types import Message, ToolCall

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "examples" / "quickstart.yaml"
UNIFORM = ["curriculum.selection=uniform"]
"""Both sides train every group they play. The job drops groups of equal rewards and plays others
(DAPO's dynamic sampling, ``curriculum.selection: filter``); TRL's GRPOTrainer has no such option
(its experimental replay-buffer trainer swaps such groups for earlier ones instead)."""
QUICK = ["rollout.backend=hf", "steps=1", "eval_episodes=8", "trainer.trainable_layers=1"]
"""The smoke test's job (with the tiny model): the tiny Llama has 2 layers."""
TRL_RESULT, HELD_OUT_RESULT = "trl.json", "held_out.json"
"""What the TRL side's two processes write into their run directory."""

FOLD_TOOL_CALLS = (
    "{%- set folded = namespace(messages=[]) -%}"
    "{%- for message in messages -%}"
    "{%- if message.tool_calls -%}"
    "{%- set calls = message.tool_calls | map(attribute='function') | map('tojson') | join('\\n') -%}"
    "{%- set folded.messages = folded.messages + [{'role': message.role, 'content': (message.content or '') + calls}] -%}"
    "{%- else -%}{%- set folded.messages = folded.messages + [message] -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- set messages = folded.messages -%}"
)
"""Put before a chat template that ignores tool calls: each assistant message's calls join its text
as JSON objects, as this task's replies write them. Every other message renders as before."""


# --- the TRL side: what a user writes around GRPOTrainer ------------------------------------------


class EnvTools:
    """``agentrl/ToolArithmetic-v0`` in the shape TRL's ``environment_factory`` wants: ``reset``, one
    public method per tool (TRL shows them to the model and calls them by name) and ``get_reward``.

    Each call is one step of the agentrl env (a reply holding that call), so tool results, grading,
    turn limit and reward are the env's own. ``seeds`` collects the seed of every reset."""

    def __init__(self, make_env: Callable[[], AgentEnv], seeds: list[int]):
        self.env = make_env()
        self.seeds = seeds
        self.reward = 0.0
        self.over = False

    def reset(self, seed: int, **_: Any) -> None:
        """Start the task of the dataset row's seed; the row's prompt is already its first observation."""
        self.env.reset(seed=seed)
        self.seeds.append(seed)
        self.reward, self.over = 0.0, False

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression and return the result.

        Args:
            expression: Numbers combined with + - * / // % ** and parentheses, e.g. "865 * 67".
        """
        return self._step("calculate", {"expression": expression})

    def answer(self, number: float) -> str:
        """Submit the final answer; this ends the problem.

        Args:
            number: The value of the expression, e.g. 57955.
        """
        return self._step("answer", {"number": number})

    def get_reward(self) -> float:
        """The episode's reward, summed over its steps (TRL asks once the episode's replies are done)."""
        return self.reward

    def _step(self, name: str, arguments: dict[str, Any]) -> str:
        if self.over:  # TRL lets the model go on after the env's end; nothing it does counts
            return "The episode is over."
        observation, reward, terminated, truncated, _ = self.env.step(
            Message("assistant", "", tool_calls=[ToolCall(name, arguments)])
        )
        self.reward += reward
        self.over = terminated or truncated
        return "\n".join(message.content for message in observation)


def read_replies_as_agentrl(tokenizer: Any, agent: ChatAgent) -> None:
    """Make TRL read each reply's tool calls with agentrl's reader (``agent.parse``, the env's tool
    format), in TRL's message shape.

    TRL parses a reply with ``tokenizer.parse_response`` (trl/chat_template_utils.py
    ``parse_response``), and only when the tokenizer has a ``response_template``; it has none for
    SmolLM2's chat template. A call agentrl cannot read is passed on without arguments, so TRL
    answers it with an error and the episode goes on, as the env does."""

    def parse_response(ids: Sequence[int], prefix: Any = None, tools: Any = None) -> dict[str, Any]:
        reply = agent.parse(agent.completion_text(ids))
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": {} if c.error else c.arguments}}
                for c in reply.tool_calls
            ]
        return message

    # TRL only checks that there is one; the parsing is the function above.
    tokenizer.response_template = {"start_anchor": "<|im_start|>assistant\n", "fields": {"content": {}}}
    tokenizer.parse_response = parse_response


def train_top_layers(model: Any, layers: int) -> None:
    """Freeze everything but the top ``layers`` decoder layers and the final norm (0: train all), as
    agentrl's ``load_policy_model(trainable_layers=...)`` does."""
    if layers:
        model.requires_grad_(False)
        for layer in model.model.layers[-layers:]:
            layer.requires_grad_(True)
        model.model.norm.requires_grad_(True)


def train_prompts(make_env: Callable[[], AgentEnv], agent: ChatAgent, seed: int, groups: int) -> list[dict[str, Any]]:
    """One dataset row per group agentrl plays: the env seed and the first observation as chat messages."""
    env, rows = make_env(), []
    for group in range(groups):
        env_seed = group_env_seed(seed, group)
        observation, _ = env.reset(seed=env_seed)
        rows.append({"seed": env_seed, "prompt": [m.to_dict() for m in agent.conversation(observation)]})
    return rows


class Clock(TrainerCallback):
    """Times TRL's training from ``train()`` to each step's end, without the saves; saves the model
    after the steps in ``save_at``; keeps TRL's logs."""

    def __init__(self, run_dir: Path, save_at: set[int]):
        self.run_dir, self.save_at = run_dir, save_at
        self.started = self.saving = 0.0
        self.seconds: list[float] = []
        """Training seconds at the end of each step."""
        self.logs: list[dict[str, float]] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        now = time.perf_counter()
        self.seconds.append(now - self.started - self.saving)
        if state.global_step in self.save_at:
            model.save_pretrained(self.run_dir / f"step-{state.global_step}")
            self.saving += time.perf_counter() - now

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        self.logs.append(dict(logs or {}))


def train_trl(config: TrainConfig, run_dir: Path) -> None:
    """The TRL side (its own process): train the job with GRPOTrainer, save the models to evaluate,
    and write what happened to ``run_dir/trl.json``."""
    import torch

    with warnings.catch_warnings():  # TRL's import warns about things unrelated to this job
        warnings.simplefilter("ignore")
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
        from trl import GRPOConfig, GRPOTrainer
        from trl.chat_template_utils import supports_tool_calling

    rollout, trainer = config.rollout, config.trainer_settings()
    torch.set_num_threads(config.torch_threads or torch.get_num_threads())
    path = resolve_model(rollout.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    make_env = env_factory(rollout.env_id, {**rollout.env_kwargs, "split": "train"})
    # Pinned to the model's own template: the reference the check below compares TRL's tokens with.
    agent = ChatAgent.from_env(
        tokenizer, make_env(), system_prompt=rollout.system_prompt, chat_template=tokenizer.chat_template
    )
    dataset = Dataset.from_list(train_prompts(make_env, agent, rollout.seed, config.steps * config.groups_per_step))
    if not supports_tool_calling(tokenizer):
        tokenizer.chat_template = FOLD_TOOL_CALLS + tokenizer.chat_template
    read_replies_as_agentrl(tokenizer, agent)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    train_top_layers(model, trainer.trainable_layers)

    batch = config.groups_per_step * rollout.group_size
    every = config.eval_every or config.steps
    clock = Clock(run_dir, {step for step in range(1, config.steps + 1) if step % every == 0 or step == config.steps})
    seeds: list[int] = []
    args = GRPOConfig(
        output_dir=str(run_dir / "trl"),  # nothing is saved there (save_strategy "no"); Clock saves
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        use_vllm=False,
        optim="adamw_torch",
        learning_rate=trainer.lr,
        adam_beta1=trainer.betas[0],
        adam_beta2=trainer.betas[1],
        weight_decay=trainer.weight_decay,
        lr_scheduler_type="constant",
        max_grad_norm=trainer.max_grad_norm,
        per_device_train_batch_size=trainer.micro_batch_size,
        gradient_accumulation_steps=batch // trainer.micro_batch_size,
        num_generations=rollout.group_size,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        generation_kwargs={"max_new_tokens": rollout.max_tokens},  # per turn
        max_completion_length=rollout.max_length,  # all turns and tool results of an episode: never reached here
        max_tool_calling_iterations=rollout.max_turns,
        loss_type="dapo",
        scale_rewards="group",
        beta=0.0,
        epsilon=trainer.clip_low,
        epsilon_high=trainer.clip_high,
        num_iterations=1,
        max_steps=config.steps,
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=trainer.seed,
    )
    grpo = GRPOTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        environment_factory=lambda: EnvTools(make_env, seeds),
        callbacks=[clock],
    )
    grpo.remove_callback(PrinterCallback)
    differences = token_differences(grpo, agent, make_env, dataset[0]["seed"])
    threads = torch.get_num_threads()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grpo.train()
    group_of = {row["seed"]: group for group, row in enumerate(dataset)}
    record = {
        "seconds": clock.seconds,
        "saved": sorted(clock.save_at),
        "rewards": [log["reward"] for log in clock.logs if "reward" in log],
        "tokens": [log["completions/mean_length"] for log in clock.logs if "completions/mean_length" in log],
        "groups": [sorted({group_of[s] for s in seeds[i : i + batch]}) for i in range(0, len(seeds), batch)],
        "token_differences": differences,
        "torch_threads": threads,
    }
    (run_dir / TRL_RESULT).write_text(json.dumps(record))


def token_differences(grpo: Any, agent: ChatAgent, make_env: Callable[[], AgentEnv], seed: int) -> list[str]:
    """Where TRL's tokens for the first prompt and a tool result differ from agentrl's (empty: nowhere).

    TRL's side is computed as its tool loop does (``_tokenize_prompts``, ``_get_tool_suffix_ids``)."""
    observation, _ = make_env().reset(seed=seed)
    prompt = [m.to_dict() for m in agent.conversation(observation)]
    trl_prompt = grpo.processing_class.apply_chat_template(
        conversation=[prompt],
        tools=grpo._env_tools[None] or None,
        chat_template=grpo.chat_template,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        **grpo.chat_template_kwargs,
    )["input_ids"][0]
    env = EnvTools(make_env, [])
    env.reset(seed)
    result = env.calculate("865 * 67")
    trl_result = grpo._get_tool_suffix_ids([{"role": "tool", "name": "calculate", "content": result}])
    differences = []
    if list(trl_prompt) != agent.prompt_ids(observation):
        differences.append("prompt")
    if list(trl_result) != agent.observation_ids([Message("tool", result, tool_call_id="call_0", name="calculate")]):
        differences.append("tool result")
    return differences


# --- held-out success, measured alike for both sides -----------------------------------------------


async def held_out(config: TrainConfig, policy: Policy) -> float:
    """Success rate over ``eval_episodes`` held-out episodes played by ``policy``: the engine
    :meth:`agentrl.train.loop.Controller.evaluate` builds."""
    rollout = config.rollout
    engine = build_rollout(
        RolloutSettings(
            rollout.env_id,
            env_kwargs={**rollout.env_kwargs, "split": "test"},
            env_url=rollout.env_url,
            system_prompt=rollout.system_prompt,
            sampling=replace(sampling_of(rollout, temperature=config.eval_temperature), seed=None),
            limits=limits_of(rollout),
            concurrency=rollout.concurrency,
            seed=EVAL_SEED_OFFSET + rollout.seed,
        ),
        policy,
    )
    try:
        async for _ in engine.stream(config.eval_episodes):
            pass
    finally:
        engine.close()
    return engine.stats.summary()["rollout/success_rate"]


def evaluate_trl(config: TrainConfig, run_dir: Path) -> None:
    """Held-out success of the base model and of each model TRL saved (its own process), written to
    ``run_dir/held_out.json``. One engine on the base model; each saved model's weights are loaded
    into it, as agentrl loads its trained weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.trainers import inference_state_dict

    torch.set_num_threads(config.torch_threads or torch.get_num_threads())
    saved = json.loads((run_dir / TRL_RESULT).read_text())["saved"]
    policy = make_policy(config.rollout)
    points = []
    try:
        for step in [0, *saved]:
            if step:
                model = AutoModelForCausalLM.from_pretrained(run_dir / f"step-{step}", dtype=torch.float32)
                policy.update_weights(inference_state_dict(model))
            points.append({"step": step, "success": asyncio.run(held_out(config, policy))})
    finally:
        policy.close()
    (run_dir / HELD_OUT_RESULT).write_text(json.dumps(points))


# --- running the sides and comparing them ----------------------------------------------------------


@dataclass
class Side:
    """What one side's run measured."""

    name: str
    command_s: float
    """Wall time of the training command, start to exit (the model trained and saved)."""
    eval_s: float
    """Seconds of held-out evaluation inside that command (agentrl's; TRL's models are evaluated apart)."""
    train_s: float
    """Training time: the first step's start to the last step's end, evaluations and saves left out."""
    curve: list[tuple[float, float, float]]
    """``(step, training seconds, held-out success)`` at each evaluation, before training first."""
    rewards: list[float]
    """Mean train reward of each step."""
    tokens: float
    """Generated tokens per training episode, mean over steps."""
    groups: list[list[int]]
    """The group numbers each step trained on."""


def run_agentrl(overrides: list[str], run_dir: Path) -> Side:
    """``agentrl train examples/quickstart.yaml OVERRIDES`` in its own process."""
    wall = train_in_subprocess(JOB, overrides, run_dir)
    curve = [(e["step"], e["minutes"] * 60, e["success"]) for e in eval_curve(run_dir)]
    steps = [m for m in read_metrics(run_dir) if "train/loss" in m]
    evals = [m for m in read_metrics(run_dir, raw=True) if "eval/seconds" in m]
    batches = [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]
    return Side(
        name="agentrl",
        command_s=wall,
        eval_s=sum(m["eval/seconds"] for m in evals),
        train_s=curve[-1][1],
        curve=curve,
        rewards=[m["rollout/reward_mean"] for m in steps],
        tokens=statistics.mean(m["rollout/response_tokens_mean"] for m in steps),
        groups=[sorted(b["groups"]) for b in batches],
    )


def run_trl(overrides: list[str], run_dir: Path) -> tuple[Side, dict[str, Any]]:
    """The TRL side: training in one process, then the held-out evaluations in another."""
    wall = run_child("train-trl", overrides, run_dir)
    trained = json.loads((run_dir / TRL_RESULT).read_text())
    trained["eval_process_s"] = run_child("evaluate-trl", overrides, run_dir)
    seconds = [0.0, *trained["seconds"]]
    points = json.loads((run_dir / HELD_OUT_RESULT).read_text())
    side = Side(
        name="TRL",
        command_s=wall,
        eval_s=0.0,
        train_s=seconds[-1],
        curve=[(p["step"], seconds[p["step"]], p["success"]) for p in points],
        rewards=trained["rewards"],
        tokens=statistics.mean(trained["tokens"]),
        groups=trained["groups"],
    )
    return side, trained


def run_child(role: str, overrides: list[str], run_dir: Path) -> float:
    """This script as ``--child ROLE`` in a process of its own; returns its wall time in seconds."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", role, "--run-dir", str(run_dir), *overrides]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "TRL_EXPERIMENTAL_SILENCE": "1"}
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return time.perf_counter() - started


def check_trl_can_match(config: TrainConfig) -> None:
    """Exit with what differs if the job asks for something the TRL side does not reproduce."""
    trainer = config.trainer_settings()
    expected = {
        "trainer.algorithm": (trainer.algorithm, "grpo"),
        "trainer.scale_rewards": (trainer.scale_rewards or "group", "group"),
        "trainer.loss_aggregation": (trainer.loss_aggregation, "token-mean"),
        "trainer.returns": (trainer.returns, "episode"),
        "trainer.kl_coef": (trainer.kl_coef, 0.0),
        "trainer.entropy_coef": (trainer.entropy_coef, 0.0),
        "trainer.lora_rank": (trainer.lora_rank, 0),
        "trainer.epochs": (trainer.epochs, 1),
        "trainer.mini_batches": (trainer.mini_batches, 1),
        "trainer.lr_schedule": (trainer.lr_schedule, "constant"),
        "trainer.warmup_steps": (trainer.warmup_steps, 0),
        "curriculum.selection": (config.curriculum.selection, "uniform"),
    }
    wrong = [f"{name} is {got!r}, TRL's side needs {want!r}" for name, (got, want) in expected.items() if got != want]
    env_kwargs = {**config.rollout.env_kwargs, "split": "train"}
    tools = sorted(t.name for t in env_factory(config.rollout.env_id, env_kwargs)().tools)
    if tools != ["answer", "calculate"]:
        wrong.append(f"{config.rollout.env_id}'s tools are {tools}; EnvTools is written for ToolArithmetic's")
    if wrong:
        sys.exit("The TRL side cannot run this job as agentrl does: " + "; ".join(wrong) + ".")


def reached(curve: list[tuple[float, float, float]], target: float) -> tuple[float, float] | None:
    """``(step, training seconds)`` of the first evaluation at or above ``target``, if any."""
    return next(((step, seconds) for step, seconds, success in curve if success >= target), None)


def success_by(curve: list[tuple[float, float, float]], seconds: float) -> tuple[float, float]:
    """``(step, success)`` of the last evaluation done within ``seconds`` of training."""
    step, _, success = [point for point in curve if point[1] <= seconds + 1e-9][-1]
    return step, success


def report(config: TrainConfig, sides: list[Side], trl: dict[str, Any], targets: list[float], same_job: bool) -> bool:
    """Print one seed's table and comparison; False if the two sides did not get the same prompts and
    tokens (or, with ``same_job``, did not train the same groups)."""
    rollout = config.rollout
    print(
        f"\nend to end: {rollout.env_id}, model {rollout.model}, {config.steps} training steps of "
        f"{config.groups_per_step} x {rollout.group_size} episodes; held-out success on {config.eval_episodes} test "
        f"episodes at temperature {config.eval_temperature} ({rollout.backend} backend)"
    )
    print(
        f"{'side':<8}{'command s':>10}{'evals in it':>12}{'set-up s':>9}{'training s':>11}{'s/step':>8}"
        f"{'held-out before':>16}{'after':>7}{'tokens/episode':>15}"
    )
    for side in sides:
        setup = side.command_s - side.eval_s - side.train_s
        print(
            f"{side.name:<8}{side.command_s:>10.1f}{side.eval_s:>12.1f}{setup:>9.1f}{side.train_s:>11.1f}"
            f"{side.train_s / config.steps:>8.1f}{side.curve[0][2]:>16.1%}{side.curve[-1][2]:>7.1%}{side.tokens:>15.1f}"
        )
    for side in sides:
        points = ", ".join(f"step {s:.0f} ({t / 60:.1f} min) {p:.1%}" for s, t, p in side.curve)
        rewards = " ".join(f"{r:.2f}" for r in side.rewards)
        print(f"{side.name}: held-out by training time: {points}; train reward by step: {rewards}")
    for target in targets:
        found = {side.name: reached(side.curve, target) for side in sides}
        words = [
            f"{name} {point[1] / 60:.1f} min (step {point[0]:.0f})" if point else f"{name} not reached"
            for name, point in found.items()
        ]
        print(f"training time to {target:.0%} held-out success: " + ", ".join(words))
    if len(sides) == 2 and not all(reached(side.curve, max(targets)) for side in sides):
        common = min(side.train_s for side in sides)
        after = [f"{side.name} {p:.1%} (step {s:.0f})" for side in sides for s, p in [success_by(side.curve, common)]]
        print(f"held-out success after the same {common / 60:.1f} min of training: " + ", ".join(after))
    if not trl:
        return True
    print(
        f"TRL's models were evaluated apart in {trl['eval_process_s']:.1f} s; TRL trained with "
        f"{trl['torch_threads']} torch thread(s)"
    )
    same = True
    if len(sides) == 2 and not same_job:
        print("trained groups: agentrl's job as shipped drops groups of equal rewards and plays others, TRL's cannot")
    elif len(sides) == 2:
        groups = [side.groups for side in sides]
        if groups[0] == groups[1]:
            print("trained groups: the same, step by step")
        else:
            flat = [sorted(group for step in side for group in step) for side in groups]
            same = flat[0] == flat[1]
            print(f"trained groups: {'the same, in another order' if same else 'PROBLEM: not the same'}: {groups}")
    if trl["token_differences"]:
        print(f"PROBLEM: TRL's tokens of the {' and '.join(trl['token_differences'])} differ from agentrl's")
    else:
        print("TRL's prompt and tool-result tokens: the same as agentrl's")
    return same and not trl["token_differences"]


def seed_summary(runs: list[dict[str, Any]], targets: list[float]) -> dict[str, Any]:
    """Per side, over the seeds: the training minutes to each target (None for a seed whose run did
    not reach it, which counts as slower than any that did), held-out success after training and the
    command's wall minutes; each with its median and its lowest and highest seed."""
    summary: dict[str, Any] = {}
    for name in dict.fromkeys(side["name"] for run in runs for side in run["sides"]):
        sides = [side for run in runs for side in run["sides"] if side["name"] == name]
        row: dict[str, Any] = {
            "seeds": len(sides),
            "after": spread([side["curve"][-1][2] for side in sides]),
            "command_minutes": spread([side["command_s"] / 60 for side in sides]),
        }
        for target in targets:
            minutes = [point[1] / 60 if (point := reached(side["curve"], target)) else None for side in sides]
            row[f"minutes_to_{target:g}"] = {**spread(minutes), "seeds": minutes}
        summary[name] = row
    return summary


def spread(values: list[float | None]) -> dict[str, float | None]:
    """Median, lowest and highest of ``values``; None stands for "not reached", above every number
    (a median or highest that falls on it is None)."""
    ranked = sorted(values, key=lambda v: (v is None, v or 0.0))
    if not ranked:
        return {"median": None, "low": None, "high": None}
    middle = len(ranked) // 2
    if len(ranked) % 2:
        median = ranked[middle]
    else:
        low, high = ranked[middle - 1], ranked[middle]
        median = None if low is None or high is None else (low + high) / 2
    return {"median": median, "low": ranked[0], "high": ranked[-1]}


def print_summary(summary: dict[str, Any], targets: list[float], same_job: bool) -> None:
    """The seeds side by side: training minutes to each target and success after, median [lowest,
    highest], and the ratio of the medians."""
    job = "the same job, no filter on either side" if same_job else "agentrl's job as shipped, TRL's GRPOTrainer"
    seeds = max(row["seeds"] for row in summary.values())
    print(f"\nover {seeds} seed(s) ({job}): median [lowest, highest]; - = not reached")

    def cell(values: dict[str, Any], form: str) -> str:
        median, low, high = (
            "-" if v is None else f"{v:{form}}" for v in (values["median"], values["low"], values["high"])
        )
        return f"{median} [{low}, {high}]"

    header = "".join(f"{f'training min to {t:.0%}':>28}" for t in targets)
    print(f"{'side':<8}{header}{'held-out after':>26}{'command min':>22}")
    for name, row in summary.items():
        reach = "".join(f"{cell(row[f'minutes_to_{t:g}'], '.1f'):>28}" for t in targets)
        print(f"{name:<8}{reach}{cell(row['after'], '.1%'):>26}{cell(row['command_minutes'], '.1f'):>22}")
    if {"agentrl", "TRL"} <= summary.keys():
        for t in targets:
            ours, theirs = (summary[n][f"minutes_to_{t:g}"]["median"] for n in ("agentrl", "TRL"))
            if ours and theirs:
                print(f"to {t:.0%}: TRL's median training minutes / agentrl's = {theirs / ours:.2f}x")
            else:
                print(f"to {t:.0%}: no ratio ({'agentrl' if not ours else 'TRL'}'s median seed did not reach it)")


def tiny_job_model(directory: Path) -> Path:
    """The test suite's tiny Llama speaking the job's model's chat template (SmolLM2's ignores tools
    and tool calls), so that the smoke test takes the job's path on both sides."""
    from transformers import AutoTokenizer

    build_tiny_model(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = AutoTokenizer.from_pretrained(
        resolve_model(load_config(TrainConfig, JOB).rollout.model)
    ).chat_template
    tokenizer.save_pretrained(directory)
    return directory


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="key=value changes to the job, for both sides")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the job's)")
    parser.add_argument("--eval-every", type=int, default=1, help="also evaluate every this many steps")
    parser.add_argument("--targets", type=float, nargs="+", default=[0.8, 0.9], help="held-out success to reach")
    parser.add_argument("--seeds", type=int, default=3, help="training seeds per side (rollout.seed, trainer.seed)")
    parser.add_argument(
        "--first-seed", type=int, default=0, help="the first seed; --first-seed 1 --seeds 2 runs seeds 1 and 2"
    )
    parser.add_argument(
        "--same-job", action="store_true", help="agentrl without its filter too: both sides train the same groups"
    )
    parser.add_argument("--only", choices=("agentrl", "trl"), help="run one side only")
    parser.add_argument("--quick", action="store_true", help="smoke test: tiny model, hf backend, 1 step, 1 seed")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--child", choices=("train-trl", "evaluate-trl"), help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:  # one process of the TRL side, started by run_child with the job's overrides
        role = {"train-trl": train_trl, "evaluate-trl": evaluate_trl}[args.child]
        role(load_config(TrainConfig, JOB, args.overrides), args.run_dir)
        return 0

    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # the tiny model's saving bar
    same_job, seeds = args.same_job or args.quick, 1 if args.quick else args.seeds
    runs, ok = [], True
    with tempfile.TemporaryDirectory(prefix="e2e-vs-trl-") as tmp:
        common = [f"rollout.model={tiny_job_model(Path(tmp) / 'tiny')}", *QUICK] if args.quick else []
        if args.steps is not None:
            common.append(f"steps={args.steps}")
        common.append(f"eval_every={args.eval_every}")
        for seed in range(args.first_seed, args.first_seed + seeds):
            seeded = [*common, f"rollout.seed={seed}", f"trainer.seed={seed}", *args.overrides]
            ours = [*UNIFORM, *seeded] if same_job else seeded  # as shipped: groups of equal rewards dropped
            theirs = [*UNIFORM, *seeded]
            config = load_config(TrainConfig, JOB, theirs)
            if args.only != "agentrl":
                check_trl_can_match(config)
            sides, trl = [], {}
            if args.only != "trl":
                print(f"seed {seed}, agentrl: agentrl train {JOB.relative_to(ROOT)} {' '.join(ours)}", flush=True)
                sides.append(run_agentrl(ours, Path(tmp) / f"agentrl-{seed}"))
                print(f"seed {seed}, agentrl: done in {sides[-1].command_s:.0f} s", flush=True)
            if args.only != "agentrl":
                print(f"seed {seed}, TRL: GRPOTrainer on the job, then agentrl's evaluation of its models", flush=True)
                (Path(tmp) / f"trl-{seed}").mkdir()
                side, trl = run_trl(theirs, Path(tmp) / f"trl-{seed}")
                sides.append(side)
                print(
                    f"seed {seed}, TRL: trained in {side.command_s:.0f} s, evaluated in {trl['eval_process_s']:.0f} s"
                )
            print(f"\n--- seed {seed} ---")
            ok = report(config, sides, trl, args.targets, same_job) and ok
            runs.append({"seed": seed, "sides": [asdict(side) for side in sides], "trl": trl})
    summary = seed_summary(runs, args.targets)
    print_summary(summary, args.targets, same_job)
    if args.out:
        args.out.write_text(json.dumps({"runs": runs, "summary": summary, "same_job": same_job}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
