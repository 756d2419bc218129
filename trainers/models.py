"""The models a trainer holds: the policy (optionally with LoRA), a frozen reference, a value model.

Also the one forward pass every loss needs, :func:`generated_logprobs`: log-probs (and entropies)
of the generated tokens only. The language-model head is applied to the positions that predict a
generated token and nowhere else; in multi-turn trajectories most tokens are prompt and
observations, and the head (hidden x vocabulary) is the largest matrix of a small model, so this is
most of the trainer's speed. Nor is the batch's padding computed: rows of similar length run
together, each set only as long as its longest row (:func:`forward_plan`); in a quickstart batch
that was nearly two thirds of the tokens computed. Models whose logits are not plainly ``lm_head(hidden)`` (soft-capped
or scaled logits) take the ordinary full forward pass instead.

:func:`inference_state_dict` is what goes to the inference engine after an update: every tensor
under the transformers checkpoint's names, the tied ``lm_head.weight`` included, LoRA merged in.
A policy served as a LoRA adapter on a shared engine gets :func:`adapter_weights` instead (only the
adapter's tensors), and its adapter policy is made with :func:`adapter_config`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from agentrl.trainers.advantages import jensen_terms
from agentrl.trainers.batch import Batch, collate
from agentrl.types import Trajectory


class TokenStats(NamedTuple):
    """Per-token results of :func:`generated_logprobs`, ``[B, T]`` aligned with the token ids."""

    logprobs: torch.Tensor
    """Log-prob of each generated token given the tokens before it (0 where ``loss_mask`` is 0)."""
    entropy: torch.Tensor
    """Entropy of the policy's distribution at each generated token (0 elsewhere)."""


def load_policy_model(
    path: str | Path,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    lora_rank: int = 0,
    lora_alpha: float = 16.0,
    lora_target_modules: str | list[str] = "all-linear",
    trainable_layers: int = 0,
    gradient_checkpointing: bool = False,
) -> nn.Module:
    """A transformers causal LM to train, from a checkpoint directory.

    ``lora_rank`` > 0 trains LoRA adapters instead of the weights. ``trainable_layers`` = N > 0
    trains only the last N decoder layers and the final norm (with LoRA: puts adapters only
    there); everything below, embeddings included, is frozen, so the backward pass stops at layer
    L - N. On a CPU that is most of a step's cost: the quickstart trains SmolLM2's top layers.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype)).to(device)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    layers = _decoder_layers(model)
    if trainable_layers < 0 or trainable_layers > len(layers):
        raise ValueError(
            f"trainable_layers must be between 0 (all) and the model's {len(layers)} layers, got {trainable_layers}."
        )
    top = list(range(len(layers) - trainable_layers, len(layers))) if trainable_layers else None
    if lora_rank > 0:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=lora_rank,
            lora_alpha=lora_alpha,
            target_modules=lora_target_modules,
            lora_dropout=0.0,
            layers_to_transform=top,
        )
        model = get_peft_model(model, config)
    elif top is not None:
        model.requires_grad_(False)
        for index in top:
            layers[index].requires_grad_(True)
        norm = getattr(getattr(model, model.base_model_prefix), "norm", None)
        if norm is not None:
            norm.requires_grad_(True)
    model.train()
    return model


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of decoder layers (the ModuleList as long as ``num_hidden_layers``)."""
    count = getattr(model.config, "num_hidden_layers", None)
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == count:
            return module
    raise ValueError(f"Cannot find the decoder layers of {type(model).__name__} (no ModuleList of {count} layers).")


def load_reference_model(path: str | Path, *, dtype: str = "float32", device: str = "cpu") -> nn.Module:
    """A frozen copy of the starting policy, for the KL term."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype)).to(device)
    model.eval()
    model.requires_grad_(False)
    return model


class ValueModel(nn.Module):
    """PPO's critic: the policy's backbone (its own copy) and a scalar head.

    ``values[:, t]`` estimates the return from the state in which token ``t`` is about to be
    generated, so it is read from the hidden state at ``t - 1``; position 0 holds 0.
    """

    def __init__(self, path: str | Path, *, dtype: str = "float32", device: str = "cpu"):
        super().__init__()
        from transformers import AutoModel

        self.backbone = AutoModel.from_pretrained(str(path), dtype=getattr(torch, dtype))
        self.head = nn.Linear(self.backbone.config.hidden_size, 1, dtype=getattr(torch, dtype))
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.to(device)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        values = self.head(hidden).squeeze(-1).float()
        return torch.nn.functional.pad(values[:, :-1], (1, 0))


def generated_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    entropy_grad: bool = False,
    group_index: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> TokenStats:
    """Log-probs and entropies of the generated tokens (``loss_mask`` 1) under logits / ``temperature``
    (the rollouts' sampling temperature), computed in fp32.

    With ``group_index``, rows of one group that begin with the same tokens (GRPO samples of one
    prompt) share one forward pass over that prefix: its keys and values are computed once,
    repeated for the group's rows, and the rows go on from there. The gradient flows through the
    shared pass; the results equal the plain pass to rounding. Either way, rows run in length
    buckets without the batch's padding (:func:`forward_plan`). The entropy is differentiable only
    with ``entropy_grad`` (an entropy bonus needs it; a metric does not, and its graph over the
    vocabulary would cost memory).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}.")
    base = _unwrap(model)
    logprobs = torch.zeros(loss_mask.shape, dtype=torch.float32, device=loss_mask.device)
    entropy = torch.zeros_like(logprobs)
    if not _plain_head(base):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
        every_row = torch.arange(len(input_ids))
        end = input_ids.shape[1]
        _fill(logprobs, entropy, logits, input_ids, loss_mask, every_row, 0, end, entropy_grad, temperature)
        return TokenStats(logprobs, entropy)
    backbone, head = getattr(base, base.base_model_prefix), base.get_output_embeddings()
    for rows, prefix, buckets in forward_plan(input_ids, attention_mask, loss_mask, group_index):
        shared = None
        if prefix > 0:
            shared = backbone(input_ids=input_ids[rows[:1], :prefix], use_cache=True).past_key_values
        for bucket, end in buckets:
            cache = None
            if shared is not None:
                cache = copy.copy(shared)  # the layers replace their tensors as they grow: copies are enough
                cache.layers = [copy.copy(layer) for layer in shared.layers]
                cache.batch_repeat_interleave(len(bucket))
            hidden = backbone(
                input_ids=input_ids[bucket, prefix:end],
                attention_mask=attention_mask[bucket, :end],
                past_key_values=cache,
                use_cache=cache is not None,
            ).last_hidden_state
            _fill(logprobs, entropy, hidden, input_ids, loss_mask, bucket, prefix, end, entropy_grad, temperature, head)
    return TokenStats(logprobs, entropy)


def reference_logliks(
    model: nn.Module, batch: Batch, micro_batch_size: int, *, temperature: float = 1.0
) -> torch.Tensor:
    """``[B]``: each row's log-likelihood of its reference answer, the sum of the log-probs of the
    tokens where ``batch.reference_mask`` is 1 (0 for a row without one), micro-batch by
    micro-batch. Run it under ``torch.no_grad()`` unless its gradient is wanted."""
    if batch.reference_mask is None:
        return torch.zeros(len(batch), device=batch.input_ids.device)
    parts = [
        generated_logprobs(
            model,
            micro.input_ids,
            micro.attention_mask,
            micro.reference_mask,
            group_index=micro.group_index,
            temperature=temperature,
        ).logprobs.sum(-1)
        for micro in batch.split(micro_batch_size)
    ]
    return torch.cat(parts)


class ReferenceScores(NamedTuple):
    """How likely a model finds reference answers (:func:`score_references`)."""

    nll: float
    """Negative log-likelihood per reference token, over every scored trajectory: ``-E log pi(y*|x,z)``
    per token, the single-sample Jensen bound (a trajectory with no generated tokens: ``-log pi(y*|x)``)."""
    bound_nll: float
    """The same per token from each group's multi-sample bound ``-log mean_i pi(y*|x,z_i)`` (equal to
    ``nll`` when every group holds one trajectory)."""
    trajectories: int
    """How many trajectories had a reference to score."""


def score_references(
    model: nn.Module,
    trajectories: Sequence[Trajectory],
    pad_token_id: int,
    *,
    micro_batch_size: int = 8,
    temperature: float = 1.0,
) -> ReferenceScores | None:
    """The likelihood ``model`` gives the reference answers of ``trajectories``
    (``Trajectory.reference_ids``), each after its own episode; None when none has one. Failed
    episodes are left out. Groups (``group_id``) of several episodes of one prompt also give the
    multi-sample bound."""
    scored = [t for t in trajectories if t.reference_ids and not t.error]
    if not scored:
        return None
    device = next(model.parameters()).device
    batch = collate(scored, pad_token_id).to(device)
    assert batch.reference_mask is not None  # every row has a reference
    with torch.no_grad():
        logliks = reference_logliks(model, batch, micro_batch_size, temperature=temperature)
    tokens = batch.reference_mask.sum(-1)
    bound = jensen_terms(logliks, batch.group_index, bound="multi").bound
    first = torch.zeros(len(batch), dtype=torch.bool, device=device)  # one row per group for its bound
    first[[int((batch.group_index == g).nonzero()[0]) for g in torch.unique(batch.group_index)]] = True
    return ReferenceScores(
        nll=float(-logliks.sum() / tokens.sum()),
        bound_nll=float(-bound[first].sum() / tokens[first].sum()),
        trajectories=len(scored),
    )


def _fill(
    logprobs: torch.Tensor,
    entropy: torch.Tensor,
    states: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    rows: torch.Tensor,
    start: int,
    end: int,
    entropy_grad: bool,
    temperature: float,
    head: nn.Module | None = None,
) -> None:
    """Write the log-probs of ``rows``' generated tokens from ``states`` (hidden states, or logits when
    ``head`` is None) of positions ``start`` to ``end`` - 1 of the sequence; position t - 1 predicts t.
    ``rows`` must be in increasing order (the results are scattered in row-major order)."""
    targets = loss_mask[rows, start + 1 : end].bool()
    chosen_states = states[:, : targets.shape[1]][targets]
    logits = (head(chosen_states) if head is not None else chosen_states).float()
    if temperature != 1.0:
        logits = logits / temperature
    log_dist = torch.log_softmax(logits, dim=-1)
    chosen = log_dist.gather(-1, input_ids[rows, start + 1 : end][targets].unsqueeze(-1)).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        spread = -(log_dist.exp() * log_dist).sum(-1)
    where = torch.zeros_like(loss_mask, dtype=torch.bool)
    where[rows, start + 1 : end] = targets
    # In place on a zeros tensor that needs no gradient: the graph of ``chosen`` is kept.
    logprobs.masked_scatter_(where, chosen)
    entropy.masked_scatter_(where, spread)


def _shared_prefixes(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, group_index: torch.Tensor | None
) -> list[tuple[torch.Tensor, int]]:
    """Row sets and the length of the prefix they share, up to the token before their first generated one."""
    everything = torch.arange(len(input_ids), device=input_ids.device)
    if group_index is None:
        return [(everything, 0)]
    out = []
    for group in torch.unique(group_index):
        rows = everything[group_index == group]
        first = loss_mask[rows].argmax(dim=1).min().item()  # the earliest first generated token
        prefix = max(int(first) - 1, 0)  # the token before it must run with the row, to predict it
        if len(rows) > 1 and prefix > 0:
            same = (input_ids[rows, :prefix] == input_ids[rows[:1], :prefix]).all(dim=0)
            prefix = int(same.float().argmin().item()) if not bool(same.all()) else prefix
        out.append((rows, prefix if len(rows) > 1 else 0))
    return out


class PrefixSet(NamedTuple):
    """Rows that share their first ``prefix`` tokens, and the forward passes that run them on from there."""

    rows: torch.Tensor
    """The rows, in increasing order."""
    prefix: int
    """How many tokens they share: computed once, from the first row (0: nothing shared)."""
    buckets: list[tuple[torch.Tensor, int]]
    """One forward pass each, from ``prefix`` to ``end`` (the longest row's length): ``(rows, end)``."""


def forward_plan(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor, group_index: torch.Tensor | None
) -> list[PrefixSet]:
    """How :func:`generated_logprobs` runs a right-padded batch: the rows grouped by shared prefix
    (with ``group_index``), then each set cut into length buckets (:func:`_length_buckets`), each
    bucket computed up to its own longest row only, not the batch's."""
    lengths = attention_mask.sum(dim=1)
    plan = []
    for rows, prefix in _shared_prefixes(input_ids, loss_mask, group_index):
        buckets = [(bucket, int(lengths[bucket].max())) for bucket in _length_buckets(rows, lengths[rows] - prefix)]
        plan.append(PrefixSet(rows, prefix, buckets))
    return plan


def computed_tokens(plan: Sequence[PrefixSet]) -> int:
    """How many token positions the forward passes of ``plan`` compute (padding included)."""
    return sum(s.prefix + sum(len(b) * (end - s.prefix) for b, end in s.buckets) for s in plan)


BUCKET_COST = 16
"""What one more forward pass costs, in tokens' worth of compute: :func:`_length_buckets` pads a row
to a longer one's length rather than run it alone when that pads fewer tokens than this."""


def _length_buckets(rows: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
    """``rows`` split into sets to run as one forward pass each, every set padded to its longest row,
    so that the tokens computed plus :data:`BUCKET_COST` per set are fewest: the rows sorted by
    ``lengths`` and cut where it pays (an exact partition over the sorted order, O(n^2) for n rows).
    Each set keeps its rows in increasing order."""
    order = torch.argsort(lengths, stable=True).tolist()
    sizes = [int(lengths[i]) for i in order]
    n = len(order)
    best = [0.0] + [float("inf")] * n  # best[j]: the cost of the j shortest rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):  # the last set holds sorted rows i..j-1, padded to sizes[j - 1]
            cost = best[i] + (j - i) * sizes[j - 1] + BUCKET_COST
            if cost < best[j]:
                best[j], cut[j] = cost, i
    buckets, j = [], n
    while j > 0:
        buckets.append(rows[sorted(order[cut[j] : j])])
        j = cut[j]
    return buckets[::-1]


def inference_state_dict(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor the inference engine needs, under the transformers checkpoint's names.

    With LoRA the adapters are merged into new tensors (the trainable model is left untouched). Tied weights appear under both names (vLLM needs ``lm_head.weight``).
    """
    try:
        from peft import PeftModel
    except ImportError:  # peft is optional at run time
        PeftModel = ()  # type: ignore[assignment,misc]
    if isinstance(model, PeftModel):
        # Merged out of place: merging into the weights and unmerging again would leave rounding
        # errors in the frozen base weights at every sync.
        state = {_base_name(n): t.detach() for n, t in model.state_dict().items() if "lora_" not in n}
        for name, module in model.named_modules():
            if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
                key = _base_name(f"{name}.base_layer.weight")
                delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
                state[key] = (module.base_layer.weight + delta).detach()
        yield from state.items()
        return
    yield from ((name, tensor.detach()) for name, tensor in model.state_dict().items())


def adapter_config(model: nn.Module) -> dict[str, Any]:
    """The LoRA config of a peft ``model`` as a JSON-able dict: what ``adapter_config.json`` holds.

    This is what an adapter policy is made with (``host.adapter(policy_id, adapter_config(model))``).
    ``target_modules`` is the list of module names peft actually wrapped (an ``"all-linear"``
    request resolved), because inference engines match adapters by module name and reject a
    pattern they do not know.
    """
    config = _lora_config(model)
    return {key: _json_value(value) for key, value in config.to_dict().items()}


def adapter_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The LoRA tensors of a peft ``model`` (its active adapter), detached and on the CPU.

    Names are peft's saved-adapter names (``base_model.model....lora_A.weight``, without the
    adapter's name), the ones in ``adapter_model.safetensors``: an adapter policy's
    ``update_weights`` takes exactly these. Only the adapter travels, not the frozen base.
    """
    from peft import get_peft_model_state_dict

    _lora_config(model)  # the clear error for a model without LoRA
    adapter = model.active_adapter  # type: ignore[attr-defined]
    for name, tensor in get_peft_model_state_dict(model, adapter_name=adapter).items():
        yield name, tensor.detach().to("cpu")


def load_adapter_weights(model: nn.Module, directory: str | Path) -> None:
    """Load the LoRA adapter saved in ``directory`` (peft's format: ``adapter_config.json`` and
    ``adapter_model.safetensors``) into the active adapter of the peft ``model``.

    Raises ``ValueError`` when the saved adapter does not fit: another rank or other target modules
    than the model's, or tensors the model lacks (an adapter of another base model)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    directory = Path(directory)
    mine = adapter_config(model)
    saved = json.loads((directory / "adapter_config.json").read_text())
    shape, wanted = (
        (saved.get("r"), sorted(saved.get("target_modules") or [])),
        (mine["r"], sorted(mine["target_modules"])),
    )
    if shape != wanted:
        raise ValueError(
            f"the adapter in {directory} has rank {shape[0]} on {shape[1]}, the policy's LoRA has rank {wanted[0]} "
            f"on {wanted[1]}: set trainer.lora_rank (and the targets) as the adapter was trained, or train it again."
        )
    result = set_peft_model_state_dict(model, load_file(str(directory / "adapter_model.safetensors")))
    lora_missing = [name for name in result.missing_keys if "lora_" in name]
    if result.unexpected_keys or lora_missing:
        raise ValueError(
            f"the adapter in {directory} does not fit the policy's model: {len(result.unexpected_keys)} tensors it "
            f"does not have (e.g. {result.unexpected_keys[:1]}), {len(lora_missing)} of its LoRA tensors missing "
            f"(e.g. {lora_missing[:1]}). Was it trained on another base model?"
        )


def _lora_config(model: nn.Module) -> Any:
    """The active LoRA config of a peft model; ValueError for anything else."""
    configs = getattr(model, "peft_config", None)
    adapter = getattr(model, "active_adapter", None)
    if not hasattr(model, "get_base_model") or not isinstance(configs, dict) or adapter not in configs:
        raise ValueError(
            f"Expected a peft LoRA model, got a {type(model).__name__} without LoRA adapters; "
            "load it with load_policy_model(..., lora_rank=R) with R > 0."
        )
    config = configs[adapter]
    kind = str(getattr(config.peft_type, "value", config.peft_type))
    if kind != "LORA":
        raise ValueError(f"Expected a LoRA adapter, got a peft {kind} adapter; only LoRA adapters can be served.")
    return config


def _json_value(value: Any) -> Any:
    """``value`` in JSON's types: sets become sorted lists and enums their values, as peft's own
    ``save_pretrained`` writes them."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    return value


def pad_token_id(tokenizer: Any) -> int:
    """The id batches are padded with: the tokenizer's pad token, else its end-of-sequence token."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("The tokenizer has neither a pad token nor an end-of-sequence token to pad batches with.")
    return int(pad)


def save_pretrained(model: nn.Module, tokenizer: Any, out: str | Path) -> Path:
    """Export a plain transformers checkpoint (LoRA merged) that transformers and vLLM load."""
    out = Path(out)
    base = _unwrap(model)
    state = dict(inference_state_dict(model))
    # save_pretrained drops a tied head from the file; loaders re-tie it from the config.
    base.save_pretrained(out, state_dict=state, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def save_weights(weights: Iterable[tuple[str, torch.Tensor]], model_path: str, tokenizer: Any, out: str | Path) -> Path:
    """Export the named ``weights`` of the model at ``model_path`` as a transformers checkpoint, with
    no model built (a cluster run's weights, which rank 0 published)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    out = Path(out)
    skeleton.save_pretrained(out, state_dict=dict(weights), safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def _unwrap(model: nn.Module) -> nn.Module:
    """The transformers model inside a peft (or DDP-like ``.module``) wrapper."""
    if hasattr(model, "get_base_model"):
        return model.get_base_model()
    return getattr(model, "module", model)


def _plain_head(base: nn.Module) -> bool:
    config = getattr(base, "config", None)
    if config is None or not hasattr(base, "base_model_prefix") or base.get_output_embeddings() is None:
        return False
    if not hasattr(base, base.base_model_prefix):
        return False
    # Logits that are transformed after the head cannot come from the head alone.
    return not any(getattr(config, name, None) for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"))


def _base_name(name: str) -> str:
    name = name.removeprefix("base_model.model.")
    return name.replace(".base_layer.", ".")
