"""``autospec promote`` and ``rollback`` move the pointer only if it still names the version
they read: a controller's promotion committed in between (simulated here in the command's
own transaction, where a PostgreSQL commit would land) is left as it is, and the command
exits 2 naming the move instead of reporting the wrong version as the one it replaced."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from autospec.controller import operations
from tests.store.test_registry import register

runner = CliRunner()


@pytest.fixture
def moved(engine, db_url, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """A on the pointer (after builtin-ngram), a passing evaluation of V against A; the
    controller's move of A to B is what ``moved()`` does in the command's transaction."""
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", db_url)
    with store.session_scope(engine) as s:
        for v in ("A", "B", "V"):
            register(s, tmp_path, v)
        store.set_live(s, version="builtin-ngram", actor="t", reason="start")
        store.set_live(s, version="A", actor="t", reason="x")
        store.record_evaluation(s, candidate="V", incumbent="A", decision="promote",
                                tau_candidate=3.0, tau_incumbent=2.0, num_requests=50)

    def controller_promotes(session) -> None:  # type: ignore[no-untyped-def]
        store.set_live(session, version="B", actor="controller", reason="cycle promoted B",
                       expect="A")
    return controller_promotes


def _line(output: str) -> str:
    return " ".join(output.split())


def _live(engine) -> str:  # type: ignore[no-untyped-def]
    with store.session_scope(engine, readonly=True) as s:
        return store.get_live(s).version  # type: ignore[union-attr]


def _after(moved, real):  # type: ignore[no-untyped-def]
    """``real``, called once the controller's move (``moved``) has landed in its session."""
    def racing(session, **kw):  # type: ignore[no-untyped-def]
        moved(session)
        return real(session, **kw)
    return racing


def test_a_promotion_after_a_controllers_move_is_not_made(engine, moved, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(operations, "ensure_pointer", _after(moved, operations.ensure_pointer))
    result = runner.invoke(app, ["promote", "V"])
    assert result.exit_code == 2, result.output
    assert "moved from A to B while promoting V" in _line(result.output)
    assert "run it again" in _line(result.output) and "Traceback" not in result.output
    assert _live(engine) == "A"  # the command's transaction rolled back, B's move with it


def test_a_rollback_after_a_controllers_move_is_not_made(engine, moved, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(store, "rollback", _after(moved, store.rollback))
    result = runner.invoke(app, ["rollback"])
    assert result.exit_code == 2, result.output
    assert "moved from A to B while rolling it back" in _line(result.output)
    assert _live(engine) == "A"
