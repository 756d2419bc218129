"""The CPU LoRA path of one decode step, four ways side by side, at SmolLM2-135M's shapes.

    python benchmarks/lora_ops.py            # 4 adapters, 64 tokens, about 1 minute
    python benchmarks/lora_ops.py --quick    # smoke test
    python benchmarks/lora_ops.py --slots 2 --tokens 32 --threads 2

What a vLLM engine with ``max_loras`` adapters adds to each forward pass on the CPU: for each of the
model's layers, its four LoRA linear layers (q/k/v as three slices, o, gate/up as two slices, down)
each call the punica wrapper's ``add_lora_linear`` (a shrink, then an expand, per slice). Timed on
vLLM's own ``PunicaWrapperCPU`` with its mapping set as the engine sets it (``update_metadata``
each step, as the running batch changes), on the same tokens, weights and adapter mix:

- **stock**: vLLM's wrapper methods and its torch ``bgmv_*`` ops (one gathered weight matrix per
  token; these read index -1, "no adapter", as the last slot: see ``agentrl/policies/vllm_worker.py``);
- **grouped ops**: vLLM's wrapper methods and agentrl's grouped ops (one matmul per adapter present,
  per call: each call sorts out the batch's adapters again);
- **grouped wrapper**: the tokens grouped by adapter once per mapping, one gather, a matmul per
  adapter and slice, one scatter (what the engine runs where the batch's adapters span more than
  ``DENSE_MAX_COLUMNS`` columns);
- **dense wrapper**: what the engine runs otherwise: two matmuls a slice against every adapter
  spanned at once, the columns of the adapters a token does not use masked to zero.

Beside them, the base model's own matmuls of those layers on the same tokens (``base matmuls``), so
that the LoRA path reads as a share of the step. The four ways must give the same output (checked;
the mix has no base-model tokens, where stock is wrong). Torch is pinned to ``--threads`` 1 (the
engine's worker on one core); the ways are interleaved round by round, and the table gives the
median over ``--rounds``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

HIDDEN, INTERMEDIATE, KV = 576, 1536, 192  # SmolLM2-135M: 9 heads of 64, 3 key/value heads
MODULES = {"qkv": (HIDDEN, (HIDDEN, KV, KV)), "o": (HIDDEN, (HIDDEN,)), "gate_up": (HIDDEN, (INTERMEDIATE,) * 2),
           "down": (INTERMEDIATE, (HIDDEN,))}  # fmt: skip
"""Per LoRA linear layer: its input width and its output slices."""


def make_layers(layers: int, slots: int, rank: int, generator: torch.Generator) -> list[dict[str, Any]]:
    """Per model layer and LoRA module: the stacked adapters (as vLLM holds them) and the base weight."""
    made = []
    for _ in range(layers):
        layer = {}
        for name, (width, outputs) in MODULES.items():
            a = tuple(0.02 * torch.randn(slots, 1, rank, width, generator=generator) for _ in outputs)
            b = tuple(0.02 * torch.randn(slots, 1, out, rank, generator=generator) for out in outputs)
            base = 0.02 * torch.randn(sum(outputs), width, generator=generator)
            layer[name] = (width, outputs, a, b, base)
        made.append(layer)
    return made


def lora_pass(wrapper: Any, layers: list[dict[str, Any]], inputs: dict[int, torch.Tensor]) -> list[torch.Tensor]:
    """One forward pass's LoRA work: add_lora_linear on every module of every layer."""
    outputs = []
    for layer in layers:
        for width, slices, a, b, _ in layer.values():
            y = torch.zeros(inputs[width].shape[0], sum(slices))
            wrapper.add_lora_linear(y, inputs[width], a, b, 1.0, slices)
            outputs.append(y)
    return outputs


def base_pass(layers: list[dict[str, Any]], inputs: dict[int, torch.Tensor]) -> None:
    """The same modules' base matmuls on the same tokens."""
    for layer in layers:
        for width, _, _, _, base in layer.values():
            inputs[width] @ base.t()


def ways() -> dict[str, Callable[[], None]]:
    """Each way as a function that puts its methods and ops in place on vLLM's CPU wrapper."""
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    from agentrl.policies import vllm_worker

    if (
        vllm_worker.LORA_OPS != "agentrl's grouped ops"
        or "PunicaWrapperCPU.add_lora_linear" not in vllm_worker.REPLACED
    ):
        raise SystemExit(f"agentrl's CPU LoRA path is not in place on this vLLM ({vllm_worker.LORA_OPS}).")
    wrapper = punica_cpu.PunicaWrapperCPU
    methods = ("update_metadata", "add_shrink", "add_expand", "add_lora_linear")
    dense_methods = {name: getattr(wrapper, name) for name in methods}
    stock_methods = {name: vllm_worker.REPLACED[f"PunicaWrapperCPU.{name}"] for name in methods}
    grouped_methods = {**dense_methods, "add_lora_linear": stock_methods["add_lora_linear"]}
    ops = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")

    def use(method_set: dict[str, Any], op_set: dict[str, Any]) -> None:
        for name, method in method_set.items():
            setattr(wrapper, name, method)
        for name, op in op_set.items():
            setattr(lora_ops, name, op)
            setattr(punica_cpu, name, op)

    stock_ops = {name: vllm_worker.REPLACED[name] for name in ops}
    grouped_ops = {name: getattr(vllm_worker, name) for name in ops}
    return {
        "stock": lambda: use(stock_methods, stock_ops),
        "grouped ops": lambda: use(stock_methods, grouped_ops),
        "grouped wrapper": lambda: use(grouped_methods, grouped_ops),
        "dense wrapper": lambda: use(dense_methods, grouped_ops),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 layers, 3 rounds")
    parser.add_argument("--layers", type=int, default=30, help="model layers (SmolLM2-135M: 30)")
    parser.add_argument("--slots", type=int, default=4, help="adapters in the batch (max_loras)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens in the decode batch")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.rounds = 2, 3
    torch.set_num_threads(args.threads)
    from vllm.lora.layers.utils import LoRAMapping
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    setters = ways()
    generator = torch.Generator().manual_seed(0)
    layers = make_layers(args.layers, args.slots, args.rank, generator)
    inputs = {width: torch.randn(args.tokens, width, generator=generator) for width in (HIDDEN, INTERMEDIATE)}
    lora_ids = list(range(1, args.slots + 1))
    # Each step a new mix of the adapters over the batch, as requests finish and start.
    mappings = [
        LoRAMapping(tuple(t), tuple(t))
        for t in (torch.randint(1, args.slots + 1, (args.tokens,), generator=generator).tolist() for _ in range(4))
    ]

    wrapper = PunicaWrapperCPU(max_num_batched_tokens=max(args.tokens, 256), max_batches=256, device="cpu")
    timings: dict[str, list[float]] = {name: [] for name in [*setters, "base matmuls"]}
    results: dict[str, list[torch.Tensor]] = {}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        mapping = mappings[round_ % len(mappings)]
        for name, put_in_place in setters.items():
            put_in_place()
            started = time.perf_counter()
            wrapper.update_metadata(mapping, lora_ids, args.slots + 1, 49152)
            outputs = lora_pass(wrapper, layers, inputs)
            if round_:
                timings[name].append(time.perf_counter() - started)
            results[name] = outputs
        started = time.perf_counter()
        base_pass(layers, inputs)
        if round_:
            timings["base matmuls"].append(time.perf_counter() - started)
        for name in setters:
            for got, want in zip(results[name], results["stock"]):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    setters["dense wrapper"]()  # leave what the engine runs in place

    base = statistics.median(timings["base matmuls"])
    print(
        f"\nCPU LoRA path of one decode step: {args.layers} layers x 4 LoRA modules (7 slices), {args.tokens} tokens "
        f"over {args.slots} adapters, rank {args.rank}, fp32, {args.threads} torch thread(s); median of {args.rounds}"
    )
    print(f"{'way':<18}{'ms a step':>10}{'vs stock':>10}{'vs base matmuls':>17}")
    stock = statistics.median(timings["stock"])
    for name, seconds in timings.items():
        median = statistics.median(seconds)
        print(f"{name:<18}{1000 * median:>10.2f}{stock / median:>9.2f}x{median / base:>16.2f}x")
    print("outputs: the four ways agree (rtol 1e-4)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
