"""Fixtures for serving tests: the tiny target with a tokenizer, a store, a server, a client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from autospec import store
from autospec.engine.target import Target, load_target
from autospec.serve.http import make_app
from autospec.serve.server import LLMServer

from .helpers import make_server, make_tiny_model_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_llm(tiny_model_dir: Path) -> Target:
    """The tiny target loaded like any model directory (float32, CPU)."""
    return load_target(str(tiny_model_dir), dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def tiny_llm_4_layers(tmp_path_factory: pytest.TempPathFactory) -> Target:
    """The tiny target with 4 layers, for eagle3 heads on vLLM: their default feature layers
    on it, (1, 2, 3), are strictly increasing ids up to its depth, the only ones vLLM reads
    as autospec does; a 2-layer target's default ones, (1, 1, 1), are not, and vLLM serving
    and export refuse them."""
    directory = make_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama-4"), layers=4)
    return load_target(str(directory), dtype="float32", device="cpu")


@pytest.fixture
def db(sqlite_url: str):  # type: ignore[no-untyped-def]
    engine = store.open_store(sqlite_url, upgrade=True)
    yield engine
    engine.dispose()


@pytest.fixture
def poll_interval_s() -> float:
    """How often the server's watcher reads the live pointer; a module whose tests swap by
    hand (``versions.poll_once()``) overrides it with a long one, or the watcher could
    swap first — the race behind a CI failure of test_versions.py."""
    return 0.1


@pytest.fixture
def server(tiny_llm: Target, db, poll_interval_s: float) -> Iterator[LLMServer]:  # type: ignore[no-untyped-def]
    srv = make_server(tiny_llm, db, poll_interval_s=poll_interval_s)
    yield srv
    srv.close()


@pytest.fixture
def client(server: LLMServer) -> Iterator[TestClient]:
    with TestClient(make_app(server), raise_server_exceptions=False) as c:
        yield c
