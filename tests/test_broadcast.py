"""The weight broadcast's own parts (agentrl.policies.broadcast): buckets, and a real gloo group of
three members in threads of this process moving mixed-dtype weights exactly. The whole path, rank 0
into vLLM workers of two engines, is tested in tests/test_cluster.py."""

import socket
import threading

import torch

from agentrl.policies import broadcast
from agentrl.policies.broadcast import TensorSpec


def test_buckets_keep_order_and_one_dtype_and_the_byte_limit():
    spec = [
        TensorSpec("a", (4,), "float32"),  # 16 bytes
        TensorSpec("b", (2, 2), "float32"),  # 16
        TensorSpec("c", (8,), "float32"),  # 32: over the limit with a and b
        TensorSpec("d", (4,), "bfloat16"),  # another dtype
        TensorSpec("e", (100,), "bfloat16"),  # larger than the limit: alone
        TensorSpec("f", (1,), "bfloat16"),
    ]
    assert broadcast.buckets(spec, limit=40) == [[0, 1], [2], [3], [4], [5]]
    assert broadcast.buckets(spec) == [[0, 1, 2], [3, 4, 5]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_three_members_receive_exactly_what_member_0_sends():
    weights = [
        ("embed.weight", torch.randn(7, 5)),
        ("layers.0.norm.weight", torch.randn(5).to(torch.bfloat16)),
        ("layers.0.mlp.weight", torch.randn(3, 5).to(torch.bfloat16)),
        ("head.bias", torch.randn(7)),
    ]
    spec, port = broadcast.spec_of(weights), _free_port()
    received: dict[int, list] = {}
    errors: list[BaseException] = []

    def member(index: int) -> None:
        try:
            group = broadcast.join("127.0.0.1", port, 3, index, "cpu")
            if index == 0:
                broadcast.send(group, weights, "cpu")
            else:
                received[index] = [(n, t.clone()) for n, t in broadcast.receive(group, spec, "cpu")]
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=member, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for index in (1, 2):
        assert [n for n, _ in received[index]] == [n for n, _ in weights]
        for (_, got), (_, sent) in zip(received[index], weights):
            assert got.dtype == sent.dtype and got.shape == sent.shape and torch.equal(got, sent)
