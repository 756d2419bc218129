"""How often the WaltzRL conversation agent's revision follows a feedback text, by what the feedback says.

    python benchmarks/waltz_revisions.py              # 34 minutes on 1 thread beside a training run
    python benchmarks/waltz_revisions.py --quick      # smoke test

WaltzRL pays the feedback agent for a verdict whose revision fixes the answer (the dynamic
improvement reward, DIR). Whether a right verdict can earn it at all depends on the conversation
agent using the feedback. This plays the untrained default model (SmolLM2-135M-Instruct) as the
conversation agent on training prompts of ``agentrl/Waltz-v0`` at the recipe's temperature (0.7),
keeps the first answers the exact judge calls flawed (a benign prompt's answer without the public
fact; a harmful prompt's answer that leaks), hands each answer the same feedback in several
wordings, through the env's own request to answer again (``feedback_notice``), and prints how many
revisions the exact judge calls fine, with a 95% Wilson interval. All wordings see the same flawed
answers.

The wordings are feedback a verdict can carry: the oracle baseline's template (no fact), the warm
start's teacher feedback (``recipes/waltzrl/warm_start.py``), the fact given as the answer, and for
leaks the template and the teacher's advice.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.agents.waltz import CONVERSATION_PROMPT, feedback_notice, oracle_feedback
from agentrl.envs.waltz.metrics import wilson
from agentrl.envs.waltz.tasks import Labels, Prompt, builtin_prompts, exact_labels
from agentrl.model_paths import resolve_model
from agentrl.recipes.waltzrl.warm_start import teacher_verdict


def teacher(labels: Labels) -> Callable[[Prompt], str]:
    """The warm start's feedback text for an answer with these labels."""
    return lambda prompt: json.loads(teacher_verdict(prompt, labels))["feedback"]


OVERREFUSAL_FEEDBACK: dict[str, Callable[[Prompt], str]] = {
    "oracle template": lambda prompt: oracle_feedback(False, True),
    "teacher": teacher(Labels(unsafe=False, overrefuse=True)),
    "the answer is": lambda prompt: f"The answer is {prompt.required[0]}. Tell the user.",
}
LEAK_FEEDBACK: dict[str, Callable[[Prompt], str]] = {
    "oracle template": lambda prompt: oracle_feedback(True, False),
    "teacher": teacher(Labels(unsafe=True, overrefuse=False)),
}


def conversation(prompt: Prompt) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": f"{CONVERSATION_PROMPT}\n\n{prompt.context}"},
        {"role": "user", "content": prompt.text},
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--benign", type=int, default=64, help="benign training prompts answered first")
    parser.add_argument("--harmful", type=int, default=128, help="harmful training prompts answered first")
    parser.add_argument("--keep", type=int, default=32, help="flawed first answers revised per kind")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-tokens", type=int, default=64, help="the recipe's rollout.max_tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="4 prompts of each kind, 2 kept, 24 tokens")
    args = parser.parse_args(argv)
    if args.quick:
        args.benign, args.harmful, args.keep, args.max_tokens = 4, 4, 2, 24
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    path = resolve_model("default")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def generate(chats: list[list[dict[str, str]]], batch: int = 32) -> list[str]:
        texts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
        replies = []
        for i in range(0, len(texts), batch):
            inputs = tokenizer(texts[i : i + batch], return_tensors="pt", padding=True)
            with torch.no_grad():
                out = model.generate(
                    **inputs,
                    do_sample=True,
                    temperature=args.temperature,
                    max_new_tokens=args.max_tokens,
                    pad_token_id=tokenizer.eos_token_id,
                )
            width = inputs.input_ids.shape[1]
            replies += [tokenizer.decode(row[width:], skip_special_tokens=True) for row in out]
        return replies

    prompts = list(builtin_prompts("train"))
    random.Random(args.seed).shuffle(prompts)
    benign = [p for p in prompts if p.kind == "benign"][: args.benign]
    harmful = [p for p in prompts if p.kind == "harmful"][: args.harmful]
    start = time.perf_counter()
    first = generate([conversation(p) for p in benign + harmful])
    answered = list(zip(benign + harmful, first, strict=True))
    refused = [(p, a) for p, a in answered if p.kind == "benign" and exact_labels(p, a).overrefuse]
    leaked = [(p, a) for p, a in answered if p.kind == "harmful" and exact_labels(p, a).unsafe]
    print(
        f"first answers ({time.perf_counter() - start:.0f} s): {len(refused)} of {len(benign)} benign lack the fact, "
        f"{len(leaked)} of {len(harmful)} harmful leak; revising {min(len(refused), args.keep)} and "
        f"{min(len(leaked), args.keep)}"
    )
    refused, leaked = refused[: args.keep], leaked[: args.keep]

    def revise(flawed: list[tuple[Prompt, str]], feedback: Callable[[Prompt], str]) -> int:
        chats = [
            [
                *conversation(p),
                {"role": "assistant", "content": a},
                {"role": "user", "content": feedback_notice(feedback(p))},
            ]
            for p, a in flawed
        ]
        return sum(exact_labels(p, r).ok for (p, _), r in zip(flawed, generate(chats), strict=True))

    print(f"\n{'flaw':<13} {'feedback':<26} {'revisions fine':>15}  95% interval")
    rows = [("over-refusal", name, refused, feedback) for name, feedback in OVERREFUSAL_FEEDBACK.items()]
    rows += [("leak", name, leaked, feedback) for name, feedback in LEAK_FEEDBACK.items()]
    for flaw, name, flawed, feedback in rows:
        if not flawed:
            continue
        fixed = revise(flawed, feedback)
        low, high = wilson(fixed, len(flawed))
        print(f"{flaw:<13} {name:<26} {fixed:>5}/{len(flawed):<3} {fixed / len(flawed):>5.0%}  [{low:.0%}, {high:.0%}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
