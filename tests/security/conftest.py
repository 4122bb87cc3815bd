"""Fixtures for the security checks: a tiny random-init target and its greedy traffic."""

from __future__ import annotations

import pytest

from autospec.engine.target import Target
from tests.controller.helpers import greedy_traffic
from tests.tiny import tiny_target


@pytest.fixture(scope="session")
def tiny() -> Target:
    """A 2-layer, 64-token, 32-wide random-init Llama target (no tokenizer)."""
    return tiny_target(vocab_size=64, hidden_size=32, num_layers=2, seed=0)


@pytest.fixture(scope="session")
def traffic(tiny: Target) -> list[tuple[list[int], list[int]]]:
    return greedy_traffic(tiny)
