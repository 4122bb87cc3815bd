"""A store that fails in the middle of a cycle (found by an operator trial, 2026-12-07: the
SQLite file's disk filled while the cycle evaluated) is one line in the controller's log,
not a traceback: the cycle caught the database error only in its catch-all and logged it
with its traceback, and under ``controller run`` the error the failed cycle's own record
raised went on into APScheduler, which logged two more tracebacks (the job, then the
listener publishing the next run time). A database error is now the cycle's reason, the
scheduler's jobs log it in one line and run again on their schedule, and the next cycle,
once the store answers, closes the one left unfinished, saying why (it had been recorded as
of a controller that "died or lost its lease", by that very controller). Real SQLite file
(locked by another connection, as a full disk or a lost server refuses every statement), tiny
target."""

from __future__ import annotations

import logging
import sqlite3

import pytest
from apscheduler.schedulers.background import BackgroundScheduler

from autospec import store
from autospec.controller import records, scheduler
from autospec.controller.cycle import Controller
from autospec.store.models import utcnow

from .helpers import fast_policy, log_traffic


class _Lock:
    """Another connection holding the SQLite file exclusively: every statement of the
    controller's engine fails with ``database is locked`` until :meth:`release`."""

    def __init__(self, sqlite_url: str) -> None:
        self.path = sqlite_url.removeprefix("sqlite:///")
        self.conn: sqlite3.Connection | None = None

    def take(self) -> None:
        self.conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None)
        self.conn.execute("BEGIN EXCLUSIVE")

    def release(self) -> None:
        if self.conn is not None:
            self.conn.execute("ROLLBACK")
            self.conn.close()
            self.conn = None


def _no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    logged = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not logged, [f"{r.name}: {r.getMessage()}" for r in logged]


def test_a_store_failing_mid_cycle_is_one_line_and_the_next_cycle_recovers_tiny(
        sqlite_url: str, tiny, traffic, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    store.open_store(sqlite_url, upgrade=True).dispose()
    engine = store.make_engine(sqlite_url, busy_timeout_s=0.2)
    lock = _Lock(sqlite_url)
    try:
        log_traffic(engine, traffic)
        controller = Controller(engine, fast_policy(), tiny, hooks={"registered": lock.take})
        sched = BackgroundScheduler(timezone="UTC")
        scheduler.build_scheduler(controller, scheduler=sched)
        jobs = {job.id: job for job in sched.get_jobs()}
        caplog.set_level(logging.INFO)
        # the candidate is registered, then the store fails: the evaluation's reads, the
        # failed cycle's own record and the lease's release all meet the locked file
        assert jobs["cycle"].func() is None
        assert jobs["watch"].func() is None
        scheduler.publish_from(sched, controller, after=utcnow())  # the listener's call
        _no_traceback(caplog)
        lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert any("job cycle: database" in line and "database is locked" in line
                   for line in lines), lines
        assert any(line.startswith("job watch: database") for line in lines), lines
        lock.release()

        controller.hooks.clear()
        result = controller.run_cycle(trigger="schedule")
        assert result.outcome == "promoted", result.reasons
        with store.session_scope(engine, readonly=True) as session:
            cycles = records.cycles(session, deployment="default")
        assert [c.outcome for c in cycles] == ["promoted", "interrupted"]
        # closed by the controller whose end record the store refused: it did not die
        assert cycles[1].end is not None and cycles[1].actor == controller.holder
        assert ("did not finish (its end could not be recorded: the store failed under this "
                "controller)") in cycles[1].end["reasons"][0]
        _no_traceback(caplog)
    finally:
        lock.release()
        engine.dispose()


def test_a_database_error_in_the_cycle_is_its_recorded_reason_tiny(
        db, tiny, traffic, monkeypatch, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy.exc import OperationalError

    def full(*a, **k):  # type: ignore[no-untyped-def]
        raise OperationalError("INSERT INTO evaluations ...", {},
                               sqlite3.OperationalError("database or disk is full"))

    log_traffic(db, traffic)
    monkeypatch.setattr("autospec.evaluate.run._record", full)
    caplog.set_level(logging.INFO)
    result = Controller(db, fast_policy(), tiny).run_cycle(trigger="once")
    assert result.outcome == "failed"
    assert "failed (OperationalError): database or disk is full" in result.reasons[-1]
    assert "INSERT" not in result.reasons[-1]
    _no_traceback(caplog)
    with store.session_scope(db, readonly=True) as session:
        (cycle,) = records.cycles(session, deployment="default")
    assert cycle.outcome == "failed" and cycle.end is not None
    assert "database or disk is full" in cycle.end["reasons"][-1]
