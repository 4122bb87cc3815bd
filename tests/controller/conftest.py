"""Fixtures for controller tests: a tiny random-init target, its traffic, a store."""

from __future__ import annotations

import pytest

from autospec import store
from autospec.engine.target import Target
from tests.tiny import tiny_target

from .helpers import greedy_traffic


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
