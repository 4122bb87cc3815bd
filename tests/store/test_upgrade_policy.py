"""Only ``autospec db upgrade`` migrates a store other processes use (issue 31, item 4).

``import``, ``synth`` and ``pretrain`` may create the data directory's SQLite store on a
fresh machine, never a file a URL names that does not exist (a mistyped path stays a
mistake; ``train`` and ``export`` create none); on a PostgreSQL database, or an existing
SQLite store at an older revision, they refuse naming ``autospec db upgrade`` and leave the
revision as it was. ``serve``/``demo`` upgrade their own SQLite file. One rule decides it
all: :func:`autospec.store.migrate.may_migrate`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autospec.store import db, migrate
from autospec.store.errors import SchemaNotInitialized, SchemaOutdated

OLD = "0005"
PG = "postgresql+psycopg://root@127.0.0.1/x"


@pytest.mark.parametrize(("url", "mode", "current", "empty", "expected"), [
    ("sqlite:////tmp/a.db", "never", None, True, False),
    ("sqlite:////tmp/a.db", "create", None, True, True),
    ("sqlite:////tmp/a.db", "create", OLD, False, False),
    ("sqlite:////tmp/a.db", "create", None, False, False),  # tables, but not ours
    ("sqlite:////tmp/a.db", "embedded", OLD, False, True),
    ("sqlite:////tmp/a.db", "always", OLD, False, True),
    (PG, "create", None, True, False),
    (PG, "embedded", None, True, False),
    (PG, "embedded", OLD, False, False),
    (PG, "always", OLD, False, True),
    (PG, True, OLD, False, True),
    (PG, False, None, True, False),
])
def test_the_one_rule(url, mode, current, empty, expected) -> None:  # type: ignore[no-untyped-def]
    assert migrate.may_migrate(url, mode, current=current, empty=empty) is expected


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown upgrade mode"):
        migrate.may_migrate("sqlite://", "sometimes", current=None, empty=True)  # type: ignore[arg-type]


def _at(url: str, revision: str | None) -> None:
    engine = db.make_engine(url)
    if revision is not None:
        migrate.upgrade(engine, revision)
    engine.dispose()


def _revision(url: str) -> str | None:
    engine = db.make_engine(url)
    try:
        return migrate.current_revision(engine)
    finally:
        engine.dispose()


def test_create_makes_the_data_directorys_store_but_never_migrates_an_old_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autospec.settings import get_settings

    typo = tmp_path / "fresh.db"  # named by a URL: it had been created
    with pytest.raises(SchemaNotInitialized, match=f"database file {typo} does not exist"):
        migrate.open_store(f"sqlite:///{typo}", upgrade="create")
    assert not typo.exists()
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", f"sqlite:///{typo}")  # named all the same
    get_settings.cache_clear()
    with pytest.raises(SchemaNotInitialized):
        migrate.open_store(None, upgrade="create")
    assert not typo.exists()
    monkeypatch.delenv("AUTOSPEC_DATABASE_URL")
    get_settings.cache_clear()
    migrate.open_store(None, upgrade="create").dispose()  # the data directory's, first use
    fresh = get_settings().resolved_database_url
    assert _revision(fresh) == migrate.head_revision()

    old = f"sqlite:///{tmp_path / 'old.db'}"
    _at(old, OLD)
    with pytest.raises(SchemaOutdated, match="autospec db upgrade"):
        migrate.open_store(old, upgrade="create")
    assert _revision(old) == OLD
    with pytest.raises(SchemaOutdated, match="autospec db upgrade"):
        migrate.open_store(old)  # default: never
    assert _revision(old) == OLD
    migrate.open_store(old, upgrade="embedded").dispose()  # serve/demo's own SQLite file
    assert _revision(old) == migrate.head_revision()


@pytest.mark.postgres
@pytest.mark.parametrize("mode", ["never", "create", "embedded"])
def test_postgres_is_never_migrated_by_opening_it(postgres_url: str, mode: str) -> None:
    with pytest.raises(SchemaNotInitialized, match="autospec db upgrade"):
        migrate.open_store(postgres_url, upgrade=mode)  # type: ignore[arg-type]
    assert _revision(postgres_url) is None
    _at(postgres_url, OLD)
    with pytest.raises(SchemaOutdated, match="autospec db upgrade"):
        migrate.open_store(postgres_url, upgrade=mode)  # type: ignore[arg-type]
    assert _revision(postgres_url) == OLD


def _commands(tmp_path: Path) -> dict[str, list[str]]:
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    return {
        "train": ["train", "--kind", "suffix"],
        "export": ["export", "builtin-ngram", "--out", str(tmp_path / "out")],
        "import": ["import", str(head)],
        "synth": ["synth", "--count", "2"],
        "pretrain": ["pretrain", "--per-domain", "0"],
    }


@pytest.mark.postgres
@pytest.mark.parametrize("command", ["train", "export", "import", "synth", "pretrain"])
def test_commands_refuse_an_older_postgres_schema_and_leave_it(
        postgres_url: str, tmp_path: Path, command: str) -> None:
    from autospec.cli import app

    _at(postgres_url, OLD)
    args = [*_commands(tmp_path)[command], "--url", postgres_url]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0, result.output
    assert "autospec db upgrade" in result.output and f"'{OLD}'" in result.output
    assert "Traceback" not in result.output
    assert _revision(postgres_url) == OLD


@pytest.mark.parametrize("command", ["train", "export", "import", "synth", "pretrain"])
def test_commands_refuse_an_older_sqlite_store_and_leave_it(
        tmp_path: Path, command: str) -> None:
    from autospec.cli import app

    url = f"sqlite:///{tmp_path / 'old.db'}"
    _at(url, OLD)
    result = CliRunner().invoke(app, [*_commands(tmp_path)[command], "--url", url])
    assert result.exit_code != 0, result.output
    assert "autospec db upgrade" in result.output and "Traceback" not in result.output
    assert _revision(url) == OLD


def test_serve_prepares_its_sqlite_store_but_only_checks_postgres(
        tmp_path: Path, db_url: str) -> None:
    from autospec.serve.cli import _prepare_database

    _at(db_url, OLD)
    if db_url.startswith("sqlite"):
        _prepare_database(db_url)
        assert _revision(db_url) == migrate.head_revision()
    else:
        with pytest.raises(SchemaOutdated, match="autospec db upgrade"):
            _prepare_database(db_url)
        assert _revision(db_url) == OLD


@pytest.mark.parametrize("command", ["import", "synth", "pretrain"])
def test_a_fresh_machines_first_write_creates_the_data_directorys_store(
        tmp_path: Path, command: str, caplog: pytest.LogCaptureFixture) -> None:
    """No URL given: the data directory's store is made (and said), then the command goes
    on (here to a target that does not load)."""
    from autospec.cli import app
    from autospec.settings import get_settings

    path = Path(get_settings().resolved_database_url.removeprefix("sqlite:///"))
    args = [*_commands(tmp_path)[command], "--target", str(tmp_path / "no-model")]
    with caplog.at_level("WARNING", logger="autospec.store.migrate"):
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "no-model' is neither" in result.output, result.output
    assert _revision(f"sqlite:///{path}") == migrate.head_revision()
    assert f"creating the store {path} (a new SQLite file)" in caplog.text
