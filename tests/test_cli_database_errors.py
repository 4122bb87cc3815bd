"""Every command that opens the store says in one line which database failed and exits 2:
a PostgreSQL server that does not answer, a SQLite file that is not a database, a store
that is read-only under a command that writes. No traceback, no SQL, no password.

Before, ``serve`` printed a traceback (exit 1), ``train`` and ``pretrain`` exited 1, the
PostgreSQL error took two lines (psycopg's hint) and ``evaluate`` wrapped it at 80
columns; a read-only store under ``db upgrade``, ``downgrade``, ``purge`` or ``restore``
was a traceback, and under the operator commands a line naming no database.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from autospec.ports import free_port
from tests.store.test_registry import register

runner = CliRunner()
UNREACHABLE = "postgresql+psycopg://u:secret@127.0.0.1:1/x"

#: every command that opens the store (the arguments it needs; {tmp}: the test's folder,
#: {backup}: a backup of an empty store, {head}: a directory with a config.json)
OPENING = {
    "status": ["status"], "promote": ["promote", "v1"], "rollback": ["rollback"],
    "history": ["history"], "versions": ["versions"], "versions prune": ["versions", "prune"],
    "ledger": ["ledger"], "controller once": ["controller", "once"],
    "controller watch": ["controller", "watch"], "controller run": ["controller", "run"],
    "evaluate": ["evaluate", "v1", "--no-speed"], "train": ["train", "--kind", "suffix"],
    "synth": ["synth"], "pretrain": ["pretrain", "--per-domain", "0"],
    "export": ["export", "builtin-ngram", "--out", "{tmp}/exported"],
    "import": ["import", "{head}"], "serve": ["serve", "--port", "{port}"],
    "db upgrade": ["db", "upgrade"], "db downgrade": ["db", "downgrade", "base"],
    "db current": ["db", "current"], "db purge": ["db", "purge", "--older-than", "1d"],
    "db backup": ["db", "backup", "{tmp}/backup"], "db restore": ["db", "restore", "{backup}"],
}
#: commands that write to a store they can read (a read-only store fails under them)
WRITING = {
    "promote --force": ["promote", "v1", "--force", "--reason", "test"],
    "controller once": OPENING["controller once"], "db upgrade": OPENING["db upgrade"],
    "db downgrade": OPENING["db downgrade"], "db purge": OPENING["db purge"],
    "db restore --force": ["db", "restore", "{backup}", "--force"],
}


@pytest.fixture
def places(tmp_path: Path, sqlite_url: str) -> dict[str, str]:
    """What the commands' arguments name: a backup, a head directory, a free port."""
    backup = tmp_path / "a-backup"
    done = runner.invoke(app, ["db", "upgrade", "--url", sqlite_url])
    assert done.exit_code == 0, done.output
    done = runner.invoke(app, ["db", "backup", str(backup), "--url", sqlite_url])
    assert done.exit_code == 0, done.output
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text("{}")
    return {"tmp": str(tmp_path), "backup": str(backup), "head": str(head),
            "port": str(free_port())}


def _one_line(args: list[str], places: dict[str, str], url: str, names: str) -> str:
    result = runner.invoke(app, [a.format(**places) for a in args] + ["--database-url", url])
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    error = [i for i, line in enumerate(lines) if line.startswith("error:")]
    assert error and lines[error[0]:] == lines[-1:], result.stderr  # (progress lines before)
    assert names in lines[-1], lines[-1]
    assert "secret" not in result.output and "Traceback" not in result.output
    return lines[-1]


@pytest.mark.parametrize("command", list(OPENING))
def test_an_unreachable_postgresql_is_one_line_naming_it(command: str, places) -> None:  # type: ignore[no-untyped-def]
    line = _one_line(OPENING[command], places, UNREACHABLE,
                     "postgresql+psycopg://u:***@127.0.0.1:1/x")
    assert "Connection refused" in line


@pytest.mark.parametrize("command", list(OPENING))
def test_a_file_that_is_no_database_is_one_line_naming_it(command: str, places,  # type: ignore[no-untyped-def]
                                                          tmp_path: Path) -> None:
    garbage = tmp_path / "notes.db"
    garbage.write_text("not a database\n" * 200)
    line = _one_line(OPENING[command], places, f"sqlite:///{garbage}", str(garbage))
    assert "file is not a database" in line


@pytest.mark.parametrize("command", list(WRITING))
def test_a_read_only_store_under_a_write_is_one_line_naming_it(command: str, places,  # type: ignore[no-untyped-def]
                                                               sqlite_url: str,
                                                               tmp_path: Path) -> None:
    engine = store.open_store(sqlite_url)
    with store.session_scope(engine) as s:
        register(s, tmp_path, "v1")
    engine.dispose()
    path = sqlite_url.removeprefix("sqlite:///")
    line = _one_line(WRITING[command], places, f"sqlite:///file:{path}?mode=ro&uri=true", path)
    assert "failed (OperationalError): attempt to write a readonly database" in line


def test_only_what_the_database_said_is_mapped_not_sqlalchemy_misuse() -> None:
    """A database's or driver's error is the one line; SQLAlchemy's own misuse errors
    (a bug of ours) keep their traceback rather than blame the database."""
    from sqlalchemy.exc import InvalidRequestError, OperationalError
    from sqlalchemy.exc import TimeoutError as PoolTimeout
    from sqlalchemy.orm.exc import DetachedInstanceError

    from autospec.cli_errors import database_message

    assert "failed (OSError)" in database_message(OperationalError("SELECT", {}, OSError("x")))
    assert database_message(PoolTimeout("pool exhausted")) is not None
    assert database_message(InvalidRequestError("misuse")) is None
    assert database_message(DetachedInstanceError("detached")) is None
    assert database_message(ValueError("other")) is None


#: commands that never create a store a URL names: all but db upgrade and restore (which
#: make one), serve (its own SQLite file) and db current (says "missing", exit 0)
NOT_CREATING = [c for c in OPENING if c not in ("db upgrade", "db restore", "serve",
                                                 "db current")]


@pytest.mark.parametrize("command", NOT_CREATING)
def test_a_missing_sqlite_file_is_one_line_and_is_not_created(command: str, places,  # type: ignore[no-untyped-def]
                                                              tmp_path: Path) -> None:
    """A mistyped path stays a mistake: export, import, synth, pretrain and db backup had
    created an empty store there (and went on in it), db downgrade too (exit 0)."""
    typo = tmp_path / "typo.db"
    line = _one_line(OPENING[command], places, f"sqlite:///{typo}", str(typo))
    assert f"database file {typo} does not exist" in line
    assert not typo.exists()


@pytest.mark.parametrize("command", list(OPENING))
def test_url_names_the_store_on_every_command_that_opens_it(command: str, places,  # type: ignore[no-untyped-def]
                                                            tmp_path: Path) -> None:
    """``--url`` is ``--database-url`` everywhere; status, promote, rollback, history,
    versions, ledger, evaluate, controller and serve had said "No such option"."""
    garbage = tmp_path / "notes.db"
    garbage.write_text("not a database\n" * 200)
    result = runner.invoke(app, [a.format(**places) for a in OPENING[command]]
                           + ["--url", f"sqlite:///{garbage}"])
    assert result.exit_code == 2, result.output
    assert str(garbage) in result.stderr and "file is not a database" in result.stderr


def test_every_database_url_option_has_the_alias_and_the_one_help() -> None:
    """Every --database-url has the --url alias, bench's too; outside ``bench`` (whose
    --database-url means what each bench does with it) it is the store, its help the same
    words."""
    import typer.main

    from autospec.settings import DATABASE_URL_HELP

    def walk(cmd, path):  # type: ignore[no-untyped-def]
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, [*path, name])
        yield path, cmd

    seen, benches = [], []
    for path, cmd in walk(typer.main.get_command(app), []):
        for param in getattr(cmd, "params", []):
            if "--database-url" not in param.opts:
                continue
            assert param.opts == ["--database-url", "--url"], path  # bench's too
            if path[:1] == ["bench"]:
                benches.append(" ".join(path))
                continue
            seen.append(" ".join(path))
            assert param.help == DATABASE_URL_HELP, path
    assert {c.removesuffix(" --force") for c in OPENING} <= set(seen)
    assert {"bench store", "bench serve"} <= set(benches)
