"""Fixtures for controller tests: a tiny random-init target, its traffic, a store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from autospec import store
from autospec.engine.target import Target, tiny_target

from .helpers import greedy_traffic


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and the test machine is shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny() -> Target:
    """A 2-layer, 64-token, 32-wide random-init Llama target (no tokenizer)."""
    return tiny_target(vocab_size=64, hidden_size=32, num_layers=2, seed=0)


@pytest.fixture(scope="session")
def traffic(tiny: Target) -> list[tuple[list[int], list[int]]]:
    return greedy_traffic(tiny)


@pytest.fixture
def db(sqlite_url: str):  # type: ignore[no-untyped-def]
    engine = store.open_store(sqlite_url, upgrade=True)
    yield engine
    engine.dispose()
