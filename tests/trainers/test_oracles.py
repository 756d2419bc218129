"""The test oracles of :mod:`agentrl.testing` against hand-computed values: the trainer's fast
log-probs and entropies (tests/trainers/test_trainer.py) and the engines' recorded log-probs
(tests/test_policies.py) are checked against these, so an oracle must be right on its own."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.testing import token_entropy, token_logprobs

torch.set_num_threads(1)


def close(actual: torch.Tensor, expected: list, atol: float = 1e-5) -> bool:
    return torch.allclose(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol)


# Logits at position 0 are [0, 0] (p = 1/2, 1/2); at position 1 [ln 3, 0] (p = 3/4, 1/4); the
# last position predicts nothing, so its huge logits must never be read.
LOGITS = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [100.0, -100.0]]])
IDS = torch.tensor([[1, 1, 0]])


def test_token_logprobs_reads_the_logits_one_position_earlier():
    # Token 1 at position 1: log 1/2 = -0.6931472. Token 0 at position 2: log 3/4 = -0.2876821.
    assert close(token_logprobs(LOGITS, IDS), [[0.0, -0.6931472, -0.2876821]])


def test_token_logprobs_divides_by_the_temperature():
    # T = 2: position 1 logits become [ln sqrt 3, 0]; p(0) = sqrt 3 / (sqrt 3 + 1) = 0.6339746,
    # log = -0.4557464. Position 0 stays uniform.
    assert close(token_logprobs(LOGITS, IDS, temperature=2.0), [[0.0, -0.6931472, -0.4557464]])
    with pytest.raises(ValueError, match="temperature must be positive"):
        token_logprobs(LOGITS, IDS, temperature=0.0)


def test_token_logprobs_matches_log_softmax_and_carries_gradients():
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 11, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 11, (3, 7))
    expected = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    result = token_logprobs(logits, ids)
    assert result.shape == (3, 7) and result.dtype == torch.float64  # never narrower than the logits
    assert token_logprobs(logits.detach().bfloat16(), ids).dtype == torch.float32  # upcast
    assert torch.allclose(result[:, 1:].double(), expected, atol=1e-6)
    assert result[:, 0].abs().sum() == 0
    result.sum().backward()
    assert logits.grad is not None and logits.grad[:, -1].abs().sum() == 0  # the last logits unused
    with pytest.raises(ValueError, match=r"input_ids must be \[B, T\]"):
        token_logprobs(logits, ids[:, :-1])


def test_token_entropy_is_aligned_like_the_logprobs():
    # Position 1: uniform over 2 -> ln 2 = 0.6931472. Position 2: -(3/4 ln 3/4 + 1/4 ln 1/4) = 0.5623351.
    assert close(token_entropy(LOGITS), [[0.0, 0.6931472, 0.5623351]])
    # T = 2 at position 2: p = [0.6339746, 0.3660254], H = 0.6568064. Position 1 stays uniform.
    assert close(token_entropy(LOGITS, temperature=2.0), [[0.0, 0.6931472, 0.6568064]])
    with pytest.raises(ValueError, match=r"\[B, T, V\]"):
        token_entropy(LOGITS[0])
