"""The database unreachable while a run registers its candidate or records its failure
(issue 28: "the database unreachable ... while a cycle tries to register a version"). Real
SQLite files, another connection holding an exclusive write lock; the store opened with a
1 s busy timeout so outages of a few seconds outlast it. Tiny random-init target.

Before :mod:`autospec.store.retry`, an outage past the busy timeout lost the candidate, and
the run's failure record failed too with a bare ``OperationalError`` that replaced the
original error and left the run ``running`` for good."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from autospec import store
from autospec.settings import get_settings
from autospec.store import retry
from autospec.store.db import make_engine
from autospec.train import register as register_module
from autospec.train.data import WindowSpec
from autospec.train.errors import TrainingStopped
from autospec.train.run import TrainRequest, train_candidate

from .conftest import log_traffic


def _lock(path: str, hold_s: float) -> list[float]:
    """An exclusive write lock on ``path`` for ``hold_s``, taken before this returns; the
    moments it was taken and released (the second once it is)."""
    times: list[float] = []
    locked = threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, timeout=5.0, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        times.append(time.monotonic())
        locked.set()
        time.sleep(hold_s)
        conn.execute("ROLLBACK")
        conn.close()
        times.append(time.monotonic())

    threading.Thread(target=hold, daemon=True).start()
    assert locked.wait(10)
    return times


def _lock_after_saving(monkeypatch: pytest.MonkeyPatch, path: str, hold_s: float) -> list[Any]:
    """Once the artifact is written, :func:`_lock` for ``hold_s``."""
    save, taken = register_module.save_speculator, []

    def save_then_lock(*args: Any, **kwargs: Any) -> str:
        sha = save(*args, **kwargs)
        taken.append(_lock(path, hold_s))
        return sha

    monkeypatch.setattr(register_module, "save_speculator", save_then_lock)
    return taken


def _store(tmp_path: Path, traffic: Any) -> tuple[Any, str]:
    path = str(tmp_path / "locked.db")
    url = f"sqlite:///{path}"
    store.open_store(url, upgrade=True).dispose()
    engine = make_engine(url, busy_timeout_s=1.0)
    log_traffic(engine, traffic)
    return engine, path


def _request() -> TrainRequest:
    return TrainRequest(kind="suffix", epochs=1, window=WindowSpec(heldout_fraction=0.2))


def _artifacts() -> list[Path]:
    root = get_settings().resolved_artifact_dir
    return sorted(root.iterdir()) if root.exists() else []


@pytest.mark.parametrize("hold_s", [0.5, 3.0])  # within the busy timeout, and past it
def test_an_outage_at_registration_is_waited_out_and_the_candidate_registered_tiny(
        tmp_path, tiny, traffic, monkeypatch, caplog, hold_s) -> None:
    engine, path = _store(tmp_path, traffic)
    taken = _lock_after_saving(monkeypatch, path, hold_s)
    with caplog.at_level(logging.WARNING, logger="autospec.store.retry"):
        outcome = train_candidate(_request(), engine=engine, target=tiny)
    (times,) = taken
    assert len(times) == 2  # registered only once the lock was gone
    with store.session_scope(engine, readonly=True) as s:
        assert store.get_speculator(s, version=outcome.version).state == "candidate"
        assert store.get_training_run(s, run_id=outcome.run_id).status == "succeeded"
    assert _artifacts() == [outcome.artifact]  # no partial directory left
    retried = [r for r in caplog.records if "the store is out" in r.getMessage()]
    assert bool(retried) == (hold_s > 1.0)


def test_an_outage_past_the_deadline_registers_nothing_and_leaves_no_artifact_tiny(
        tmp_path, tiny, traffic, monkeypatch) -> None:
    engine, path = _store(tmp_path, traffic)
    monkeypatch.setattr(retry, "DEFAULT_DEADLINE_S", 2.0)
    taken = _lock_after_saving(monkeypatch, path, 6.0)
    with pytest.raises(OperationalError, match="locked"):
        train_candidate(_request(), engine=engine, target=tiny)
    assert _artifacts() == []  # the artifact went with the registration
    while len(taken[0]) < 2:
        time.sleep(0.1)
    with store.session_scope(engine, readonly=True) as s:
        assert [v.version for v in store.list_speculators(s)] == ["builtin-ngram"]


def test_a_failed_run_is_recorded_failed_after_an_outage_tiny(tmp_path, tiny, traffic) -> None:
    engine, path = _store(tmp_path, traffic)
    taken = []

    def stop() -> bool:  # the run stops while the store is locked for 3 s
        taken.append(_lock(path, 3.0))
        return True

    request = TrainRequest(kind="eagle3", epochs=1, overrides={"draft_vocab_size": 40},
                           window=WindowSpec(heldout_fraction=0.2))
    with pytest.raises(TrainingStopped):  # the run's own error, not the store's
        train_candidate(request, engine=engine, target=tiny, should_stop=stop)
    with store.session_scope(engine, readonly=True) as s:
        (run,) = store.list_training_runs(s)
    assert run.status == "failed" and run.error.startswith("stopped")


def test_only_an_outage_is_tried_again() -> None:
    pauses: list[float] = []
    calls = iter([OperationalError("x", {}, Exception("database is locked")), "done"])

    def flaky() -> str:
        got = next(calls)
        if isinstance(got, Exception):
            raise got
        return got

    assert retry.retrying("t", flaky, sleep=pauses.append) == "done" and pauses == [1.0]
    with pytest.raises(store.Conflict):
        retry.retrying("t", lambda: (_ for _ in ()).throw(store.Conflict("no")),
                       sleep=pauses.append)
    assert pauses == [1.0]  # a conflict is not waited on
