"""Only ``autospec db upgrade`` migrates a store other processes use (issue 31, item 4).

``export``, ``import``, ``synth`` and ``pretrain`` may create a brand-new SQLite file
(``train``, which needs logged traffic, does not); on a PostgreSQL database, or an existing
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


def test_create_makes_a_new_sqlite_file_but_never_migrates_an_old_one(tmp_path: Path) -> None:
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    migrate.open_store(fresh, upgrade="create").dispose()
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
