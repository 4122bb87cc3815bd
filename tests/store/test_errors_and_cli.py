"""Bad inputs name the problem; `autospec db` prints errors without a traceback."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from typer.testing import CliRunner

from autospec.durations import parse_duration
from autospec.store import db, migrate
from autospec.store.cli import db_app
from autospec.store.errors import BadDatabaseURL, DatabaseUnreachable, UnknownRevision

runner = CliRunner()


@pytest.mark.parametrize("url", ["not a url", "postgresql://user@host:notaport/db", ""])
def test_malformed_url(url: str) -> None:
    with pytest.raises(BadDatabaseURL, match=r"malformed database URL|cannot use"):
        db.make_engine(url)


def test_unknown_driver() -> None:
    with pytest.raises(BadDatabaseURL, match="unknown database driver"):
        db.make_engine("postgresql+nodriver://x/y")


@pytest.mark.parametrize("url", ["mysql://x@y/z", "nosuchdb+nodriver://x/y"])
def test_a_backend_other_than_sqlite_or_postgresql_is_named(url: str) -> None:
    with pytest.raises(BadDatabaseURL, match=r"autospec stores in SQLite .* or PostgreSQL"):
        db.make_engine(url)


def test_unreachable_server_is_named() -> None:
    engine = db.make_engine("postgresql://someone:secret@127.0.0.1:1/autospec",
                            connect_timeout_s=2)
    with pytest.raises(DatabaseUnreachable, match=r"127\.0\.0\.1:1/autospec") as info:
        db.ping(engine)
    assert "secret" not in str(info.value)
    with pytest.raises(DatabaseUnreachable):
        migrate.upgrade(engine)


def test_unopenable_sqlite_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(DatabaseUnreachable, match=r"dir\.db"):
        migrate.open_store(f"sqlite:///{tmp_path / 'dir.db'}")


def test_open_store_upgrades_or_refuses(sqlite_url: str, tmp_path) -> None:
    from autospec.store.errors import SchemaNotInitialized

    with pytest.raises(SchemaNotInitialized, match="autospec db upgrade"):
        migrate.open_store(sqlite_url)
    typo = tmp_path / "no" / "such" / "store.db"  # checked, never created by a read
    with pytest.raises(SchemaNotInitialized, match=f"database file {typo} does not exist"):
        migrate.open_store(f"sqlite:///{typo}")
    assert not (tmp_path / "no").exists()
    engine = migrate.open_store(sqlite_url, upgrade=True)
    assert migrate.check_schema(engine) == migrate.head_revision()


def test_default_url_comes_from_settings(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    engine = db.make_engine()
    assert engine.url.database == str(tmp_path / "autospec-data" / "autospec.db")
    from autospec.settings import get_settings

    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", f"sqlite:///{tmp_path / 'other.db'}")
    get_settings.cache_clear()
    assert db.make_engine().url.database == str(tmp_path / "other.db")


def test_sqlite_connections_use_wal_and_busy_timeout(sqlite_url: str) -> None:
    engine = db.make_engine(sqlite_url, busy_timeout_s=7)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 7000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_cli_upgrade_current_purge(sqlite_url: str) -> None:
    result = runner.invoke(db_app, ["current", "--url", sqlite_url, "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["state"] == "missing"  # and it is not created:
    assert not db.sqlite_file(sqlite_url).exists()
    empty = db.make_engine(sqlite_url)
    empty.connect().close()  # an empty file
    empty.dispose()
    result = runner.invoke(db_app, ["current", "--url", sqlite_url, "--json"])
    assert result.exit_code == 1 and json.loads(result.stdout)["state"] == "empty"
    result = runner.invoke(db_app, ["upgrade", "--url", sqlite_url])
    assert result.exit_code == 0, result.output
    result = runner.invoke(db_app, ["current", "--url", sqlite_url, "--json"])
    status = json.loads(result.stdout)
    assert result.exit_code == 0
    assert status["current"] == status["expected"] == migrate.head_revision()
    result = runner.invoke(db_app, ["purge", "--older-than", "30d", "--url", sqlite_url])
    assert result.exit_code == 0 and "deleted 0 requests" in result.stdout
    from autospec.actor import cli_actor
    from autospec.store import registry, session_scope

    engine = db.make_engine(sqlite_url)
    with session_scope(engine, readonly=True) as session:
        (purge,) = registry.list_events(session, kinds=["purge"])
        assert purge.actor == cli_actor()  # the actor promote and rollback record
    engine.dispose()
    result = runner.invoke(db_app, ["downgrade", "base", "--url", sqlite_url])
    assert result.exit_code == 0, result.output
    assert "at revision base (no schema)" in result.stdout and "None" not in result.stdout


def test_cli_errors_without_traceback(sqlite_url: str) -> None:
    for args, needle in [
        (["current", "--url", "not a url"], "malformed database URL"),
        (["upgrade", "--url", "postgresql://u@127.0.0.1:1/x"], "cannot connect to database"),
        (["purge", "--older-than", "30d", "--url", sqlite_url], "autospec db upgrade"),
    ]:
        result = runner.invoke(db_app, args)
        assert result.exit_code == 2, (args, result.output)
        assert needle in result.stderr
        assert "Traceback" not in result.output
        assert not isinstance(result.exception, Exception) or isinstance(
            result.exception, SystemExit)


def test_cli_reports_unknown_revision(sqlite_url: str) -> None:
    engine = db.make_engine(sqlite_url)
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = 'abc123'")
    result = runner.invoke(db_app, ["current", "--url", sqlite_url])
    assert result.exit_code == 1 and "unknown" in result.stdout
    result = runner.invoke(db_app, ["upgrade", "--url", sqlite_url])
    assert result.exit_code == 2 and "'abc123'" in result.stderr
    with pytest.raises(UnknownRevision):
        migrate.open_store(sqlite_url)


@pytest.mark.parametrize(("text", "delta"), [("30d", timedelta(days=30)),
                                             ("12h", timedelta(hours=12)),
                                             ("2w", timedelta(weeks=2))])
def test_parse_duration(text: str, delta: timedelta) -> None:
    assert parse_duration(text) == delta


def test_cli_rejects_bad_duration(sqlite_url: str) -> None:
    result = runner.invoke(db_app, ["purge", "--older-than", "soon", "--url", sqlite_url])
    assert result.exit_code == 2 and "duration" in result.output


def test_purge_dry_run_counts_and_changes_nothing(sqlite_url: str) -> None:
    from datetime import datetime, timezone

    from autospec.store import registry, request_counts, session_scope
    from autospec.store.traffic import RequestRecord, write_requests

    engine = db.make_engine(sqlite_url)
    migrate.upgrade(engine)
    old = datetime.now(timezone.utc) - timedelta(days=40)
    write_requests(engine, [RequestRecord(request_uid=f"r{i}", created_at=old if i < 3 else None,
                                          prompt_ids=[1, 2], output_ids=[3])
                            for i in range(5)])
    for args, needle in [(["--dry-run"], "would delete 3 requests older than 30d"),
                         (["--dry-run", "--text-only"], "would strip 3 requests")]:
        result = runner.invoke(db_app, ["purge", "--older-than", "30d", "--url", sqlite_url,
                                        *args])
        assert result.exit_code == 0 and needle in result.stdout, result.output
    result = runner.invoke(db_app, ["purge", "--older-than", "30d", "--url", sqlite_url,
                                    "--dry-run", "--json"])
    assert json.loads(result.stdout) == {"rows": 3, "older_than": "30d", "text_only": False,
                                         "dry_run": True}
    with session_scope(engine, readonly=True) as session:
        assert request_counts(session) == {None: 5}  # nothing deleted
        assert registry.list_events(session, kinds=["purge"]) == []  # nothing audited
    result = runner.invoke(db_app, ["purge", "--older-than", "30d", "--url", sqlite_url,
                                    "--json"])
    assert json.loads(result.stdout)["rows"] == 3
    with session_scope(engine, readonly=True) as session:
        assert request_counts(session) == {None: 2}
        (event,) = registry.list_events(session, kinds=["purge"])
        assert event.details["rows"] == 3
    engine.dispose()


@pytest.mark.parametrize("text", ["999999999d", "999999999999w", "36526d"])
def test_a_duration_past_a_century_is_a_usage_error_not_an_overflow(text: str) -> None:
    import typer

    with pytest.raises(typer.BadParameter, match="at most a century"):
        parse_duration(text, "--period")
    assert parse_duration("36525d") == timedelta(days=36525)


def test_a_sqlite_file_whose_folder_cannot_be_made_is_a_store_error(tmp_path) -> None:
    a_file = tmp_path / "afile"
    a_file.write_text("not a folder")
    url = f"sqlite:///{a_file}/autospec.db"
    with pytest.raises(BadDatabaseURL, match="cannot be created"):
        db.make_engine(url)
    result = runner.invoke(db_app, ["upgrade", "--url", url])
    assert result.exit_code == 2 and "cannot be created" in result.stderr, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_backup_where_nothing_can_be_written_is_a_store_error(sqlite_url, tmp_path) -> None:
    migrate.upgrade(db.make_engine(sqlite_url))
    a_file = tmp_path / "afile"
    a_file.write_text("not a folder")
    result = runner.invoke(db_app, ["backup", str(a_file / "bk"), "--url", sqlite_url])
    assert result.exit_code == 2 and "cannot write a backup" in result.stderr, result.output


def test_overflowing_reads_are_usage_errors(sqlite_url, monkeypatch) -> None:
    from autospec.cli import app

    migrate.upgrade(db.make_engine(sqlite_url))
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", sqlite_url)
    for args, needle in ((["status", "--period", "999999999d"], "at most a century"),
                         (["ledger", "--until", "0001-01-01T00:00"], "before the store's"),
                         (["history", "--limit", "99999999999999999999"], "--limit"),
                         (["db", "purge", "--older-than", "999999999w", "--dry-run"], "century")):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and needle in result.output, (args, result.output)


def test_a_string_longer_than_its_column_is_named_on_every_backend(engine, db_url) -> None:  # type: ignore[no-untyped-def]
    """SQLite kept a 200-character actor, PostgreSQL refused it with a traceback: now both
    name it (exit 2) before anything changes."""
    from autospec.store import registry, session_scope
    from autospec.store.errors import StoreError

    long = "a" * 200
    result = runner.invoke(db_app, ["purge", "--older-than", "300d", "--actor", long,
                                    "--url", db_url])
    assert result.exit_code == 2, result.output
    assert "is 200 characters long; the store keeps at most 128" in " ".join(
        result.stderr.split())
    assert result.exception is None or isinstance(result.exception, SystemExit)
    with session_scope(engine) as session:
        with pytest.raises(StoreError, match=r"actor .* at most 128"):
            registry.record_event(session, kind="note", actor=long)
        with pytest.raises(StoreError, match=r"target id .* at most 200"):
            registry.register_speculator(session, version="v", kind="ngram",
                                         target_id="t" * 201, artifact_uri="/x",
                                         sha256="0" * 64, verify=False)
    with session_scope(engine, readonly=True) as session:
        assert registry.list_events(session, kinds=["purge", "note", "registration"]) == []


def test_a_tilde_in_a_sqlite_url_or_the_data_dir_is_the_home_folder(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """SQLite does not expand "~": the URL reached it as written, "unable to open database
    file"."""
    from autospec.settings import get_settings

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    result = runner.invoke(db_app, ["upgrade", "--url", "sqlite:///~/store/a.db"])
    assert result.exit_code == 0, result.output
    assert (home / "store" / "a.db").is_file()
    assert runner.invoke(db_app, ["current", "--url", "sqlite:///~/store/a.db"]).exit_code == 0
    monkeypatch.setenv("AUTOSPEC_DATA_DIR", "~/data")
    get_settings.cache_clear()
    engine = migrate.open_store(upgrade=True)
    assert engine.url.database == str(home / "data" / "autospec.db")
    assert migrate.check_schema(engine) == migrate.head_revision()
    engine.dispose()
    # the folders beside it too: artifacts and spilled rows had gone to ./~/data/...
    settings = get_settings()
    assert settings.resolved_artifact_dir == home / "data" / "artifacts"
    assert settings.resolved_spill_dir == home / "data" / "spill"
    monkeypatch.setenv("AUTOSPEC_ARTIFACT_DIR", "~/elsewhere")
    get_settings.cache_clear()
    assert get_settings().resolved_artifact_dir == home / "elsewhere"
    get_settings.cache_clear()


def test_db_upgrade_and_downgrade_print_json_with_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Every command that prints a result takes --json; upgrade and downgrade printed their
    revision as a line only (a deploy script had to parse 'database at revision 0009')."""
    url = f"sqlite:///{tmp_path / 'j.db'}"
    runner = CliRunner()
    up = runner.invoke(db_app, ["upgrade", "--url", url, "--json"])
    assert up.exit_code == 0, up.output
    assert json.loads(up.stdout) == {"database": url, "revision": migrate.head_revision(),
                                     "expected": migrate.head_revision()}
    down = runner.invoke(db_app, ["downgrade", "base", "--url", url, "--json"])
    assert down.exit_code == 0, down.output
    assert json.loads(down.stdout)["revision"] is None


def test_db_restore_of_a_file_or_a_missing_path_is_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``db restore backup.tar``: it read 'cannot read backup.tar/backup.json: [Errno 20] Not
    a directory'."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    archive = tmp_path / "backup.tar"
    archive.write_bytes(b"x")
    for path, words in ((archive, f"{archive} is a file, not a backup's directory"),
                        (tmp_path / "none", f"{tmp_path / 'none'} is not an autospec backup")):
        result = runner.invoke(db_app, ["restore", str(path), "--url", url])
        assert result.exit_code == 2, result.output
        assert words in " ".join(result.output.split()) and "Errno" not in result.output
