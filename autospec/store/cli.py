"""``autospec db``: migrate, inspect and purge the database.

Commands: ``upgrade``, ``downgrade``, ``current`` (database revision vs the one this code
expects; ``--json``), ``purge --older-than 30d``, ``backup PATH`` and ``restore PATH`` (the
store's rows and the artifacts, portable between SQLite and PostgreSQL;
:mod:`autospec.store.backup`). Every command takes ``--database-url`` (or ``--url``; default
``AUTOSPEC_DATABASE_URL``). Only ``upgrade`` and ``restore`` create a SQLite file that does
not exist; ``current`` reports it missing, the others refuse it (a mistyped path stays a
mistake). A :class:`~autospec.store.errors.StoreError` is printed as one line on stderr,
without a traceback, and the command exits with status 2; so is a database
that fails under a command (read-only, locked, its connection lost: the database and the
driver's message, :mod:`autospec.cli_errors`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from autospec.actor import cli_actor
from autospec.cli_options import DatabaseUrl
from autospec.durations import parse_duration
from autospec.store.errors import StoreError

if TYPE_CHECKING:
    from sqlalchemy import Engine

db_app = typer.Typer(help="Create, migrate, inspect and purge the autospec database.",
                     no_args_is_help=True)
out = Console()
err = Console(stderr=True)

T = TypeVar("T")
@contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except StoreError as exc:
        err.print(Text.assemble(("error:", "bold red"), " ", str(exc)), soft_wrap=True)
        raise typer.Exit(2) from None


def _run(fn: Callable[[], T]) -> T:
    with _errors():
        return fn()


AsJson = Annotated[bool, typer.Option("--json", help="print JSON")]


def _migrated(url: str | None, revision: str | None, as_json: bool) -> None:
    """The revision a migration left the database at: a line, or JSON (``revision`` null:
    no schema)."""
    from autospec.store import db, migrate

    expected = migrate.head_revision()
    if as_json:
        out.print_json(json.dumps({"database": db.describe(db.make_engine(url).url),
                                   "revision": revision, "expected": expected}))
    else:
        out.print(Text(f"database at revision {revision or 'base (no schema)'} (code "
                       f"expects {expected})"))


@db_app.command()
def upgrade(url: DatabaseUrl = None,
            revision: Annotated[str, typer.Option(help="target revision")] = "head",
            as_json: AsJson = False) -> None:
    """Create or migrate the schema (a fresh database is created this way)."""
    from autospec.store import db, migrate

    def go() -> str | None:
        engine = db.make_engine(url)
        migrate.upgrade(engine, revision)
        return migrate.current_revision(engine)

    _migrated(url, _run(go), as_json)


@db_app.command()
def downgrade(revision: Annotated[str, typer.Argument(help="target revision, or 'base' for empty")],
              url: DatabaseUrl = None, as_json: AsJson = False) -> None:
    """Migrate the schema down to REVISION."""
    from autospec.store import db, migrate

    def go() -> str | None:
        migrate.check_exists(url)  # a mistyped path stays a mistake
        engine = db.make_engine(url)
        migrate.downgrade(engine, revision)
        return migrate.current_revision(engine)

    _migrated(url, _run(go), as_json)


def current_status(url: str | None) -> dict[str, Any]:
    from autospec.store import db, migrate

    missing = db.sqlite_file(url)
    if missing is not None and not missing.exists():  # read only: nothing is created
        return {"url": f"sqlite:///{missing}", "current": None,
                "expected": migrate.head_revision(), "state": "missing", "min_reader": None}
    engine = db.make_engine(url)
    state, current = migrate.schema_state(engine)
    compat = migrate.recorded_compat(engine)
    return {"url": db.describe(engine.url), "current": current,
            "expected": migrate.head_revision(), "state": state,
            "min_reader": compat[1] if compat is not None and compat[0] == current else None}


def _readable_by(status: dict[str, Any]) -> str:
    """Which code can run against the database, or "—" when it has no schema to read."""
    oldest = status["min_reader"] or status["current"]
    return "—" if oldest is None else f"by code at {oldest} or later"


@db_app.command()
def current(url: DatabaseUrl = None,
            as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """Say which revision the database is at and which this code expects.

    States: current, empty, missing (no such SQLite file; none is created), outdated (run
    `autospec db upgrade`), ahead-compatible (newer, but this code can run against it),
    unknown. Exit 0 when this code can run against it (current, ahead-compatible), 1 when
    it cannot (missing, empty, outdated, unknown), 2 when the database cannot be read.
    """
    status = _run(lambda: current_status(url))
    if as_json:
        out.print_json(json.dumps(status))
    else:
        out.print(Text(f"database  {status['url']}\nat        {status['current'] or '—'}\n"
                       f"expected  {status['expected']}\nstate     {status['state']}\n"
                       f"readable  {_readable_by(status)}"))
    if status["state"] not in ("current", "ahead-compatible"):
        raise typer.Exit(1)


@db_app.command()
def purge(
    older_than: Annotated[str, typer.Option("--older-than", help="age, e.g. 30d, 12h, 2w")],
    text_only: Annotated[bool, typer.Option(
        "--text-only", help="keep the rows' statistics, drop only the client's text: prompt, "
        "output, token ids and the sampling entries an opt-out drops (stop strings, seed, "
        "user)")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="count what would go, change nothing (a read: no write lock, no "
        "audit event)")] = False,
    url: DatabaseUrl = None,
    actor: Annotated[str | None, typer.Option(
        help="who purges (audit log; default: cli:<your user name>, as promote)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Delete requests older than --older-than (retention), and the synthetic sequences
    resampled from them. --dry-run first to see how many would go."""
    age = parse_duration(older_than, "--older-than")
    count = _run(lambda: _purge(url, age, text_only=text_only, dry_run=dry_run,
                                reason=f"older than {older_than}", actor=actor or cli_actor()))
    if as_json:
        out.print_json(json.dumps({"rows": count, "older_than": older_than,
                                   "text_only": text_only, "dry_run": dry_run}))
        return
    verb, done = ("strip", "stripped") if text_only else ("delete", "deleted")
    if dry_run:
        out.print(Text(f"would {verb} {count} requests older than {older_than} (dry run: "
                       "nothing changed)"))
    else:
        out.print(Text(f"{done} {count} requests older than {older_than}"))


def _purge(url: str | None, age: timedelta, *, text_only: bool, dry_run: bool, reason: str,
           actor: str) -> int:
    """Purge (or, ``dry_run``, count what a purge would touch: a read, no write lock)."""
    from autospec.store import db, migrate, queries, registry

    registry.check_actor(actor)  # before anything is read or changed
    engine = migrate.open_store(url)
    if dry_run:
        with db.session_scope(engine, readonly=True) as session:
            return queries.count_purgeable(session, older_than=age, text_only=text_only)
    with db.session_scope(engine) as session:
        count = queries.purge_requests(session, older_than=age, text_only=text_only)
        registry.record_event(session, kind="purge", actor=actor, reason=reason,
                              details={"rows": count, "text_only": text_only})
    return count


def _on_engine(url: str | None, fn: Callable[[Engine], T], *, create: bool = False) -> T:
    """``fn`` on an engine for ``url`` (disposed after); a store error is one line, exit 2.
    A SQLite file that does not exist is refused unless ``create``."""
    from autospec.store import db, migrate

    with _errors():
        if not create:
            migrate.check_exists(url)  # a mistyped path stays a mistake
        engine = db.make_engine(url)
        try:
            return fn(engine)
        finally:
            engine.dispose()


def _progress(quiet: bool) -> Callable[[str, int], None] | None:
    if quiet:
        return None
    return lambda what, count: err.print(Text(f"  {what}: {count}"))


@db_app.command()
def backup(
    path: Annotated[Path, typer.Argument(help="a new directory to write the backup to")],
    url: DatabaseUrl = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Back up every table and the registered versions' artifacts to PATH (a new directory).

    Portable: rows as JSON Lines, read in one transaction; no pg_dump needed. Restore with
    `autospec db restore PATH`, into SQLite or PostgreSQL.
    """
    from autospec.store import backup as backups

    done = _on_engine(url, lambda engine: backups.backup(
        engine, path, progress=_progress(as_json)).as_dict())
    if as_json:
        out.print_json(json.dumps(done))
        return
    out.print(Text(f"backed up {done['rows']} rows of {len(done['tables'])} tables and "
                   f"{len(done['artifacts'])} artifacts from {done['database']} (revision "
                   f"{done['revision']}) to {done['path']}"))
    if done["missing_artifacts"]:
        out.print(Text(f"without an artifact (pruned or missing): "
                       f"{', '.join(done['missing_artifacts'])}"))


@db_app.command()
def restore(
    path: Annotated[Path, typer.Argument(help="a directory written by `autospec db backup`")],
    url: DatabaseUrl = None,
    force: Annotated[bool, typer.Option(
        "--force", help="replace a store that is not empty (and artifacts that differ)")] = False,
    actor: Annotated[str | None, typer.Option(
        help="who restores (audit log; default: cli:<your user name>, as promote)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Restore a backup into the database (created if empty) and the artifact directory.

    Refuses a store that holds anything unless --force, a backup of another schema
    revision than this autospec's, and a backup whose table files do not hold the rows
    backup.json counts, before writing anything; a restore that fails leaves the store and
    its artifacts as they were. Stop the replicas and the controller first.
    """
    from autospec.store import backup as backups

    who = actor or cli_actor()
    done = _on_engine(url, lambda engine: backups.restore(
        engine, path, force=force, actor=who, progress=_progress(as_json)).as_dict(),
        create=True)
    if as_json:
        out.print_json(json.dumps(done))
        return
    replaced = (f" (replacing {sum(done['replaced'].values())} rows)"
                if done["replaced"] else "")
    out.print(Text(f"restored {done['rows']} rows of {len(done['tables'])} tables and "
                   f"{len(done['artifacts'])} artifacts into {done['database']}{replaced}"))
    if done["missing_artifacts"]:
        out.print(Text(f"without an artifact (pruned or missing): "
                       f"{', '.join(done['missing_artifacts'])}"))
