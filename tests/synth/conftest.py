"""Fixtures for synthetic-data tests: the tiny target's greedy traffic in a SQLite store."""

from __future__ import annotations

import pytest

from autospec import store
from tests.train.conftest import greedy_traffic, log_traffic


@pytest.fixture(scope="session")
def traffic(tiny) -> list[tuple[list[int], list[int]]]:  # type: ignore[no-untyped-def]
    return greedy_traffic(tiny, 40, output_len=12)


@pytest.fixture
def db_with_traffic(sqlite_url: str, traffic):  # type: ignore[no-untyped-def]
    engine = store.open_store(sqlite_url, upgrade=True)
    log_traffic(engine, traffic)
    yield engine
    engine.dispose()
