"""Fixtures for the agent-layer tests: the tiny offline tokenizer, built once per session."""

from __future__ import annotations

import pytest

from agentrl.testing import build_tiny_tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The tiny ChatML tokenizer of :mod:`agentrl.testing`; treat it as read-only (tests that
    change it build their own)."""
    return build_tiny_tokenizer()
