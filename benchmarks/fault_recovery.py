"""Fault recovery: what an inference engine's death costs a run, and what being ready for it costs.

    python benchmarks/fault_recovery.py                  # the default model (SmolLM2-135M-Instruct), vLLM
    python benchmarks/fault_recovery.py --model /path/to/ckpt --episodes 16

One :class:`~agentrl.policies.supervisor.EngineSupervisor` over a ``vllm`` engine, with trained weights
pushed to it (the model's own, with one layer scaled, so that they differ from the checkpoint on
disk). Then ``--episodes`` single-turn ``agentrl/Countdown-v0`` episodes start, and once they are
generating, the engine core process is killed with SIGKILL. Printed:

- the cold start of an engine, and the recovery: from the kill to the first generation of the new
  engine (its start plus loading the last weights), and the supervisor's own ``seconds_lost``;
- the episodes the death cut short (failed, with their cause) and those that finished;
- whether the new engine serves the pushed weights: greedy log-probs of a fixed prompt before the
  kill and after the restart (equal to 1e-4), and those of the checkpoint on disk (not equal);
- the price of being ready: a weight update through the supervisor (which keeps a host copy of the
  weights for a new engine, copying again only the tensors a step changed) against one straight to
  an engine, alternated ``--rounds`` times, each after the top ``--trainable-layers`` layers changed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import time

import psutil


def engine_cores() -> list[psutil.Process]:
    """This process's vLLM engine core processes."""
    children = psutil.Process(os.getpid()).children(recursive=True)
    return [p for p in children if "EngineCore" in " ".join(p.cmdline()) or p.name().startswith("VLLM::Engine")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trainable-layers", type=int, default=8, help="layers a step changes (the quickstart's)")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "CRITICAL")  # the death this causes is logged as an ERROR

    import torch
    from transformers import AutoModelForCausalLM

    import agentrl
    from agentrl.agents import ChatAgent
    from agentrl.model_paths import resolve_model
    from agentrl.policies import Sampling
    from agentrl.policies.supervisor import EngineSupervisor
    from agentrl.policies.vllm import VLLMPolicy
    from agentrl.rollout import EpisodeLimits, RolloutSettings, SingleAgentRollout

    torch.set_num_threads(1)
    path = resolve_model(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        model.model.layers[-1].mlp.down_proj.weight.mul_(1.05)  # trained weights: not the checkpoint's
    weights = list(model.state_dict().items())

    def start() -> VLLMPolicy:
        return VLLMPolicy(path, max_model_len=2048, seed=0)

    started = time.perf_counter()
    policy = EngineSupervisor(start, max_restarts=1)
    cold_start = time.perf_counter() - started
    policy.update_weights(weights)
    greedy = Sampling(max_tokens=16, temperature=0.0)
    text = policy.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three prime numbers."}], add_generation_prompt=True, tokenize=False
    )
    probe = policy.tokenizer.encode(text, add_special_tokens=False)
    before = asyncio.run(policy.generate(probe, greedy))

    env_id = "agentrl/Countdown-v0"
    agent = ChatAgent.from_env(policy.tokenizer, agentrl.make(env_id))
    engine = SingleAgentRollout(
        lambda: agentrl.make(env_id),
        agent,
        policy,
        RolloutSettings(
            env_id=env_id,
            sampling=Sampling(max_tokens=args.max_tokens, seed=0),
            limits=EpisodeLimits(max_turns=1, max_length=2048),
            concurrency=args.episodes,
        ),
    )

    async def play_and_kill() -> tuple[list, float, float]:
        playing = asyncio.create_task(engine.collect(args.episodes))
        await asyncio.sleep(1.0)  # every episode is generating by now
        killed = time.perf_counter()
        for core in engine_cores():
            os.kill(core.pid, signal.SIGKILL)
        trajectories = await playing
        after = await policy.generate(probe, greedy)  # waits for the new engine
        return trajectories, killed, time.perf_counter() - killed, after

    trajectories, _, recovery, after = asyncio.run(play_and_kill())
    failed = [t for t in trajectories if t.error is not None]
    causes = sorted({t.error.split(":")[0] for t in failed})
    gap = max(abs(a - b) for a, b in zip(before.logprobs, after.logprobs))
    same_tokens = before.token_ids == after.token_ids

    disk = start()
    on_disk = asyncio.run(disk.generate(probe, greedy))
    disk_gap = max(abs(a - b) for a, b in zip(before.logprobs, on_disk.logprobs))

    plain, supervised = [], []
    trained = list(model.model.layers[-args.trainable_layers :].parameters())
    for _ in range(args.rounds):  # the two ways of pushing, alternated, each after a "step"
        with torch.no_grad():
            for parameter in trained:  # an optimizer step changes the top layers in place
                parameter.mul_(1.0)
        t = time.perf_counter()
        disk.update_weights(model.state_dict().items())
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        policy.update_weights(model.state_dict().items())
        supervised.append(time.perf_counter() - t)
    disk.close()
    policy.close()

    print(f"model {path}, {args.episodes} episodes of {env_id}, up to {args.max_tokens} tokens each")
    print(f"engine cold start                         {cold_start:6.1f} s")
    print(
        f"kill -> first generation of the new engine {recovery:6.1f} s (supervisor: {policy.seconds_lost:.1f} s lost)"
    )
    print(
        f"episodes cut short by the death           {len(failed):4d} of {len(trajectories)} ({', '.join(causes) or '-'})"
    )
    print(f"new engine = pushed weights               greedy tokens equal: {same_tokens}, max log-prob gap {gap:.2e}")
    print(f"checkpoint on disk instead                max log-prob gap {disk_gap:.2e} (the pushed weights differ)")
    print(
        f"weight update, straight / supervised      {statistics.median(plain):.2f} / {statistics.median(supervised):.2f} s "
        f"(median of {args.rounds}; the supervised one copies the {args.trainable_layers} changed layers to host memory)"
    )


if __name__ == "__main__":
    main()
