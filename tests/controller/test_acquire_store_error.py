"""Found by the 30-minute soak (issue 28, 2026-12-04): while the SQLite file was locked, the
watch job's lease acquisition raised ``database is locked`` after the controller had taken
its process-local turn, and the turn was never given back — every later cycle and watch of
that controller answered ``busy`` for the rest of the run (no cycle, no promotion). A store
error while acquiring must leave the controller able to run once the store answers again.
Real SQLite file, tiny random-init target."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy.exc import OperationalError

from autospec import store
from autospec.controller.cycle import Controller
from autospec.controller.watch import Watcher

from .helpers import fast_policy, log_traffic


def test_a_locked_database_while_acquiring_does_not_leave_the_controller_busy_tiny(
        sqlite_url: str, tiny, traffic) -> None:  # type: ignore[no-untyped-def]
    store.open_store(sqlite_url, upgrade=True).dispose()
    engine = store.make_engine(sqlite_url, busy_timeout_s=0.2)
    try:
        log_traffic(engine, traffic)
        controller = Controller(engine, fast_policy(), tiny)
        path = sqlite_url.removeprefix("sqlite:///")
        lock = sqlite3.connect(path, timeout=5.0, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")  # as the soak's fault: another process holds the file
        try:
            with pytest.raises(OperationalError, match="locked"):
                Watcher(controller).run()
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        result = controller.run_cycle(trigger="schedule")
        assert result.outcome != "busy", result.reasons
        assert Watcher(controller).run().action != "busy"
    finally:
        engine.dispose()
