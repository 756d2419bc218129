"""Shared fixtures: the tiny offline tokenizer and a tiny model built from it (no downloads)."""

from __future__ import annotations

import pytest

from agentrl.testing import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The tiny ChatML tokenizer of :mod:`agentrl.testing`; treat it as read-only (tests that
    change it build their own)."""
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random tiny Llama chat model (head size 64, fp32) saved with its tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
