"""A database that fails under an operator command (SQLite locked by another writer, a
PostgreSQL connection lost) is one line on stderr and exit 2, as the CLI promises, not a
Python traceback and exit 1; the line is the driver's message, without the SQL or a
password."""

from __future__ import annotations

import sqlite3

from sqlalchemy.exc import OperationalError
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from autospec.controller.lease import LeaseLost
from tests.store.test_registry import register

runner = CliRunner()


def _line(output: str) -> str:
    return " ".join(output.split())


def test_a_locked_sqlite_store_is_one_line_and_exit_2(db, sqlite_url, tmp_path,
                                                      monkeypatch) -> None:
    with store.session_scope(db) as s:
        register(s, tmp_path, "v1")
        store.set_live(s, version="v1", actor="t", reason="x")
    real = store.migrate.make_engine  # type: ignore[attr-defined]
    monkeypatch.setattr("autospec.store.migrate.make_engine",
                        lambda url: real(url, busy_timeout_s=0.2))  # not 30 s of waiting
    lock = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        result = runner.invoke(app, ["rollback", "--database-url", sqlite_url])
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert result.exit_code == 2, result.output
    assert (f"database {sqlite_url} failed (OperationalError): database is locked"
            in _line(result.output))
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_lost_connection_names_the_driver_message_without_the_password(
        db, sqlite_url, monkeypatch) -> None:
    def lost(*a, **k):  # type: ignore[no-untyped-def]
        raise OperationalError("SELECT secret_sql", {}, Exception(
            "connection to postgresql://autospec:hunter2@db/a lost\nDETAIL: more"))

    monkeypatch.setattr("autospec.controller.operations.list_history", lost)
    result = runner.invoke(app, ["history", "--database-url", sqlite_url])
    assert result.exit_code == 2, result.output
    text = _line(result.output)
    assert "connection to postgresql://autospec:***@db/a lost" in text, text
    assert "hunter2" not in text and "secret_sql" not in text and "DETAIL" not in text


def test_a_lost_lease_is_one_line_and_exit_2(db, sqlite_url, monkeypatch) -> None:
    def lost(*a, **k):  # type: ignore[no-untyped-def]
        raise LeaseLost("fenced out by holder h2")

    monkeypatch.setattr("autospec.controller.operations.list_history", lost)
    result = runner.invoke(app, ["history", "--database-url", sqlite_url])
    assert result.exit_code == 2, result.output
    assert "the controller lost its lease: fenced out by holder h2" in _line(result.output)
