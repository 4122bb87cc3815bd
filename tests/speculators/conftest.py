"""Fixtures for speculator tests: tiny random-init Llama targets (CPU, no tokenizer)."""

from __future__ import annotations

import pytest
import torch

from autospec.engine.target import Target, tiny_target


@pytest.fixture(scope="session")
def tiny() -> Target:
    """A 4-layer, 64-token, 32-wide random-init Llama target."""
    return tiny_target(vocab_size=64, hidden_size=32, num_layers=4, seed=0)


@pytest.fixture(scope="session")
def other_tiny() -> Target:
    """A different tiny target (another id and revision)."""
    return tiny_target(vocab_size=64, hidden_size=32, num_layers=4, seed=1)


@pytest.fixture(scope="session")
def sequence() -> torch.Tensor:
    """A fixed 40-token sequence over the tiny vocabulary (EOS = 63 left out)."""
    gen = torch.Generator().manual_seed(1234)
    return torch.randint(0, 63, (40,), generator=gen)
