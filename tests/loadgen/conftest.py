"""Fixtures for loadgen tests: the real OpenAI-compatible app (tiny target, own SQLite store)
served by uvicorn on a loopback port in a thread. No Ray."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autospec import store
from autospec.engine.target import Target, load_target
from autospec.ports import free_port
from autospec.serve.http import make_app
from tests.serve.helpers import make_server, make_tiny_model_dir


@pytest.fixture(scope="session")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Target:
    path = make_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"))
    return load_target(str(path), dtype="float32", device="cpu")


class Served:
    def __init__(self, url: str, db) -> None:  # type: ignore[no-untyped-def]
        self.url, self.db = url, db

    def rows(self) -> dict:
        with store.session_scope(self.db, readonly=True) as session:
            return store.request_counts(session)


@pytest.fixture
def served(tiny_llm: Target, sqlite_url: str, tmp_path: Path) -> Iterator[Served]:
    yield from serve(tiny_llm, sqlite_url)


def serve(tiny_llm: Target, sqlite_url: str, **config) -> Iterator[Served]:  # type: ignore[no-untyped-def]
    """The app on a loopback port until the generator is closed (``config``: ServeConfig's)."""
    import uvicorn

    db = store.open_store(sqlite_url, upgrade=True)
    server = make_server(tiny_llm, db, poll_interval_s=0.1, **config)
    port = free_port()
    config = uvicorn.Config(make_app(server, replica="id=loopback; host=test"), host="127.0.0.1",
                            port=port, log_level="warning")
    http = uvicorn.Server(config)
    thread = threading.Thread(target=http.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not http.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield Served(f"http://127.0.0.1:{port}", db)
    http.should_exit = True
    thread.join(timeout=10)
    server.close()
    db.dispose()
