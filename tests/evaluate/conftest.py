"""Fixtures of the evaluate CLI's tests on the tiny random-init target."""

import pytest

from autospec import store
from autospec.speculators.checkpoint import save_speculator
from autospec.speculators.registry import new_speculator
from tests.train.conftest import greedy_traffic, log_traffic


@pytest.fixture
def suffix_store(sqlite_url, tiny, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """A real SQLite store (``AUTOSPEC_DATABASE_URL``) with 6 greedy requests of the tiny
    target logged and a suffix version ``suffix-1`` registered."""
    engine = store.open_store(sqlite_url, upgrade=True)
    log_traffic(engine, greedy_traffic(tiny, 6, output_len=8))
    sha = save_speculator(new_speculator("suffix", tiny), tmp_path / "suffix-1")
    with store.session_scope(engine) as session:
        store.register_speculator(session, version="suffix-1", kind="suffix",
                                  target_id=tiny.info.target_id,
                                  artifact_uri=str(tmp_path / "suffix-1"), sha256=sha)
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    yield engine
    engine.dispose()
