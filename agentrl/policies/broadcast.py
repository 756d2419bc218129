"""Weights broadcast from trainer rank 0 to the inference engines' workers over a process group.

With ``cluster.weight_sync: broadcast`` the new weights do not pass through Ray's object store:
rank 0 and every engine's vLLM worker form one ``torch.distributed`` process group of their own
(NCCL on GPUs, gloo on the CPU; rank 0 is member 0, engine *i* member *i + 1*), and rank 0
broadcasts the tensors straight from its memory into theirs. Both sides build the group with
:func:`join` and walk the same :func:`buckets` of the same :class:`TensorSpec` list, so one
broadcast moves a bucket of tensors of one dtype flattened into one buffer (few, large
collectives instead of one per tensor).

The group lives outside ``torch.distributed``'s default group (the trainer ranks' own, and vLLM's
in its worker): it is built directly on a ``TCPStore`` that member 0 hosts, so neither side's
other collectives see it. The engine side is :class:`~agentrl.policies.vllm_worker.WeightSync`;
the trainer side and the choice of members are :class:`agentrl.policies.weight_sync.BroadcastWeights`.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch

BUCKET_BYTES = 256 * 2**20
"""The most bytes one broadcast moves (a bucket); a tensor larger than this goes alone."""

JOIN_TIMEOUT = datetime.timedelta(minutes=2)
"""How long member 0 waits for the others to join (one that died before it could: the join fails then)."""

TIMEOUT = datetime.timedelta(minutes=5)
"""How long a member waits for the others in a broadcast."""


class TensorSpec(NamedTuple):
    """What a receiver allocates for one tensor of the broadcast."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    """``torch.float32``'s name without ``torch.``: ``float32``."""


def spec_of(named_tensors: Sequence[tuple[str, torch.Tensor]]) -> list[TensorSpec]:
    return [TensorSpec(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in named_tensors]


def buckets(spec: Sequence[TensorSpec], limit: int = BUCKET_BYTES) -> list[list[int]]:
    """Indices into ``spec``, in order, grouped into runs of one dtype of at most ``limit`` bytes."""
    groups: list[list[int]] = []
    size, dtype = 0, None
    for i, tensor in enumerate(spec):
        nbytes = _numel(tensor.shape) * getattr(torch, tensor.dtype).itemsize
        if not groups or tensor.dtype != dtype or size + nbytes > limit:
            groups.append([])
            size, dtype = 0, tensor.dtype
        groups[-1].append(i)
        size += nbytes
    return groups


def join(host: str, port: int, world: int, member: int, device: str, timeout: datetime.timedelta = TIMEOUT) -> Any:
    """This process's handle on the broadcast group: member 0 (rank 0) hosts its store at ``host:port``."""
    store = torch.distributed.TCPStore(host, port, world, is_master=member == 0, timeout=JOIN_TIMEOUT)
    store = torch.distributed.PrefixStore("agentrl-weights", store)
    if device == "cuda":
        options = torch.distributed.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return torch.distributed.ProcessGroupNCCL(store, member, world, options)
    return torch.distributed.ProcessGroupGloo(store, member, world, timeout)


def send(group: Any, named_tensors: Sequence[tuple[str, torch.Tensor]], device: str) -> None:
    """Member 0: broadcast ``named_tensors`` (on ``device``), bucket by bucket."""
    tensors = [t for _, t in named_tensors]
    for bucket in buckets(spec_of(named_tensors)):
        flat = torch.cat([tensors[i].detach().reshape(-1).to(device) for i in bucket])
        group.broadcast(flat, 0).wait()


def receive(group: Any, spec: Sequence[TensorSpec], device: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Any other member: the tensors member 0 sends, as they arrive, a bucket at a time."""
    for bucket in buckets(spec):
        dtype = getattr(torch, spec[bucket[0]].dtype)
        sizes = [_numel(spec[i].shape) for i in bucket]
        flat = torch.empty(sum(sizes), dtype=dtype, device=device)
        group.broadcast(flat, 0).wait()
        for i, part in zip(bucket, flat.split(sizes)):
            yield spec[i].name, part.view(spec[i].shape)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
