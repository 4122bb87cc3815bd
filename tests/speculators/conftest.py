"""Fixtures for speculator tests: tiny random-init Llama targets (CPU, no tokenizer)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def sequence() -> torch.Tensor:
    """A fixed 40-token sequence over the tiny vocabulary (EOS = 63 left out)."""
    gen = torch.Generator().manual_seed(1234)
    return torch.randint(0, 63, (40,), generator=gen)
