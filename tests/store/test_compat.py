"""Expand-then-contract: code at revision N runs against a schema at N+1 when the migration
to N+1 is marked ``backward_compatible`` (only expands), and refuses it, clearly, otherwise.

The newer release is simulated for real: a copy of the shipped migrations plus the next
revision, which adds a column, applied by pointing Alembic at the copy; then this code
(which has never heard of that revision) opens the store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from autospec import store
from autospec.store import db, migrate
from autospec.store.errors import UnknownRevision

NEXT = '''"""a newer release's migration (test)"""
import sqlalchemy as sa
from alembic import op

revision = {rev!r}
down_revision = {down!r}
branch_labels = None
depends_on = None
backward_compatible = {compatible}


def upgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.add_column(sa.Column("note", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.drop_column("note")
'''


NEWER = f"{int(migrate.head_revision()) + 1:04d}"  # the next release's revision


def _newer_release(tmp_path: Path, *, compatible: bool) -> Path:
    scripts = tmp_path / "newer-migrations"
    shutil.copytree(migrate.script_location(), scripts,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / f"{NEWER}_newer.py").write_text(
        NEXT.format(rev=NEWER, down=migrate.head_revision(), compatible=compatible))
    return scripts


def _upgrade_with_newer_release(url: str, scripts: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setattr(migrate, "script_location", lambda: str(scripts))
        engine = db.make_engine(url)
        migrate.upgrade(engine)  # what the newer release's `autospec db upgrade` does
        assert migrate.current_revision(engine) == NEWER
        engine.dispose()


def test_the_migrations_declare_whether_they_only_expand() -> None:
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(migrate.alembic_config())
    for script in scripts.walk_revisions():
        assert isinstance(getattr(script.module, "backward_compatible", None), bool), \
            f"migration {script.revision} must declare backward_compatible = True/False"
    head = migrate.head_revision()
    assert migrate.is_backward_compatible(scripts.get_revision(head))  # a table only
    oldest, script = head, scripts.get_revision(head)  # back over the expand-only ones
    while (migrate.is_backward_compatible(script) and script.down_revision
           and oldest != migrate.FIRST_COMPAT_READER):
        oldest, script = script.down_revision, scripts.get_revision(script.down_revision)
    assert migrate.min_reader(head) == oldest


def test_min_reader_is_never_older_than_the_first_code_that_reads_it(db_url: str) -> None:
    """Code at 0006 required its own revision exactly: 0007 (expand-only) is readable by code
    at 0007 and later, not 0006; a record code walking back past 0007 made reads as 0007, so
    code at 0006 is refused."""
    assert migrate.min_reader("0007") == "0007" == migrate.FIRST_COMPAT_READER
    assert int(migrate.min_reader(migrate.head_revision())) >= 7
    engine = db.make_engine(db_url)
    migrate.upgrade(engine)
    head = migrate.head_revision()
    with engine.begin() as conn:
        conn.execute(text("UPDATE autospec_schema SET min_reader = '0006'"))
    assert migrate.recorded_compat(engine) == (head, "0007")
    with pytest.raises(UnknownRevision, match="code at revision '0007' or later"):
        migrate.check_schema(engine, head="0006")
    engine.dispose()


def test_db_current_without_a_schema_names_no_reader(tmp_path: Path) -> None:
    import sqlite3

    sqlite3.connect(tmp_path / "empty.db").close()
    for name, state in (("missing.db", "missing"), ("empty.db", "empty")):
        result = CliRunner().invoke(_app(), ["db", "current", "--url",
                                             f"sqlite:///{tmp_path / name}"])
        assert result.exit_code == 1 and f"state     {state}" in result.stdout
        assert "None" not in result.stdout and "readable  —" in result.stdout


def test_the_database_records_its_min_reader(db_url: str) -> None:
    engine = db.make_engine(db_url)
    migrate.upgrade(engine)
    head = migrate.head_revision()
    assert migrate.recorded_compat(engine) == (head, migrate.min_reader(head))
    migrate.downgrade(engine, "0006")  # before the table: nothing recorded, nothing read
    assert migrate.recorded_compat(engine) is None
    migrate.upgrade(engine)
    assert migrate.recorded_compat(engine) == (head, migrate.min_reader(head))
    engine.dispose()


def test_previous_code_runs_against_a_backward_compatible_next_schema(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head = migrate.head_revision()
    _upgrade_with_newer_release(db_url, _newer_release(tmp_path, compatible=True), monkeypatch)
    engine = migrate.open_store(db_url)  # this code accepts the next release's schema
    assert migrate.check_schema(engine) == NEWER
    assert migrate.schema_state(engine) == ("ahead-compatible", NEWER)
    assert migrate.recorded_compat(engine) == (NEWER, migrate.min_reader(head))
    with store.session_scope(engine) as session:  # and really works against it
        store.record_event(session, kind="note", actor="old-code", reason="still here")
        assert store.list_speculators(session)[0].version == "builtin-ngram"
    with pytest.raises(UnknownRevision):
        migrate.upgrade(engine)  # this code never migrates a schema it does not know
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM leases")).scalar() == 0
    result = CliRunner().invoke(_app(), ["db", "current", "--url", db_url, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["state"] == "ahead-compatible"
    engine.dispose()


def test_previous_code_refuses_a_contracting_next_schema(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _upgrade_with_newer_release(sqlite_url, _newer_release(tmp_path, compatible=False),
                                monkeypatch)
    with pytest.raises(UnknownRevision,
                       match=rf"'{NEWER}', which this autospec does not know.*code at "
                             rf"revision '{NEWER}' or later.*Upgrade autospec"):
        migrate.open_store(sqlite_url)
    result = CliRunner().invoke(_app(), ["db", "current", "--url", sqlite_url, "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["state"] == "unknown"


def test_check_schema_as_the_previous_code_would(sqlite_url: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The database at head (0007, marked backward-compatible) read by code whose head is
    0006: accepted; with 0007 marked contracting instead: refused."""
    engine = db.make_engine(sqlite_url)
    migrate.upgrade(engine)
    head = migrate.head_revision()
    previous = migrate.min_reader(head)
    assert previous != head
    assert migrate.check_schema(engine, head=previous) == head
    assert migrate.schema_state(engine, head=previous) == ("ahead-compatible", head)

    monkeypatch.setattr(migrate, "is_backward_compatible", lambda script: False)
    migrate.downgrade(engine, previous)
    migrate.upgrade(engine)  # records min_reader = head now
    assert migrate.recorded_compat(engine) == (head, head)
    with pytest.raises(UnknownRevision, match=rf"code at revision '{head}' or later"):
        migrate.check_schema(engine, head=previous)
    assert migrate.check_schema(engine) == head  # the current code is fine either way
    engine.dispose()


def test_a_stale_record_is_not_trusted(sqlite_url: str) -> None:
    """A row written for another revision (e.g. the alembic command moved the schema without
    recording) says nothing about the revision the database is at: refused."""
    engine = db.make_engine(sqlite_url)
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    with pytest.raises(UnknownRevision, match="'0099'"):
        migrate.check_schema(engine)
    engine.dispose()


def _app():  # type: ignore[no-untyped-def]
    from autospec.cli import app

    return app
