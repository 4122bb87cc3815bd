"""Alembic, driven from code so it works from an installed wheel as well as a checkout.

The migration scripts live in the top-level ``migrations/`` directory, installed as the
``autospec.migrations`` package (:func:`autospec.shipped.shipped_dir` finds either);
:func:`alembic_config` points Alembic there and hands it an open connection, so no
``alembic.ini`` is needed at run time (the one at the repository root is for authors running
``alembic revision --autogenerate``).

- :func:`upgrade` / :func:`downgrade` move the schema; a fresh database is created only this way.
- :func:`current_revision` reads the database; :func:`head_revision` is what the code expects.
- :func:`check_schema` raises a :class:`~autospec.store.errors.SchemaError` subclass when this
  code cannot run against the database (not initialised, outdated, or a revision this code
  does not know). Expand-then-contract: every migration declares ``backward_compatible``
  (it only expands the schema); each migration run records in ``autospec_schema`` the oldest
  code revision that can still run against the schema (:func:`min_reader`), and a database
  *ahead* of the code is accepted when the code's head is at least that (``ahead-compatible``,
  :func:`schema_state`), so ``autospec db upgrade`` can go first and replicas roll after.
- :func:`schema_drift` lists differences between the models and the migrated database.
- :func:`open_store` = make_engine + ping + schema check (or upgrade): what processes call
  at start-up (here, not in :mod:`~autospec.store.db`, so the two do not import each other).
  Whether it may create or migrate the schema is decided in one place, :func:`may_migrate`:
  only ``autospec db upgrade`` migrates a PostgreSQL database or an existing SQLite store
  other processes use; ``serve``/``demo`` upgrade their own SQLite file; ``import``,
  ``synth``, ``pretrain`` only create the data directory's store on a fresh machine (a SQLite
  file a URL names must exist); ``train`` (which needs logged traffic), ``export`` and the
  read-only commands never create one.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import Script, ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import URL, Connection, Engine, delete, insert, inspect, select

from autospec.settings import get_settings
from autospec.shipped import shipped_dir
from autospec.store.db import (
    describe,
    make_engine,
    parse_url,
    ping,
    sqlite_file,
    writer_engine,
)
from autospec.store.errors import SchemaNotInitialized, SchemaOutdated, StoreError, UnknownRevision
from autospec.store.models import SchemaCompat, metadata, utcnow

log = logging.getLogger(__name__)


def script_location() -> str:
    """Filesystem path of the migration scripts shipped with this autospec."""
    return str(shipped_dir("migrations"))


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic Config built in code; ``connection`` is used by ``env.py`` when given."""
    cfg = Config()
    cfg.set_main_option("script_location", script_location())
    cfg.attributes["connection"] = connection
    cfg.attributes["configure_logger"] = False
    return cfg


def head_revision() -> str:
    """The revision this code expects (the single head of the migration scripts)."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise StoreError(f"no migration scripts found in {script_location()}")
    return head


def known_revisions() -> set[str]:
    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None: never migrated). Raises if unreachable."""
    ping(engine)
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database up to ``revision`` (default: head)."""
    _run(engine, command.upgrade, revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Migrate the database down to ``revision`` (``"base"`` drops every table)."""
    _run(engine, command.downgrade, revision)


def _run(engine: Engine, fn: Any, revision: str) -> None:
    ping(engine)
    current = current_revision(engine)
    if current is not None and current not in known_revisions():
        raise UnknownRevision(_unknown_message(engine, current))
    with writer_engine(engine).begin() as conn:
        try:
            fn(alembic_config(conn), revision)
        except CommandError as exc:
            raise StoreError(f"migration to {revision!r} failed: {exc}") from None
        record_compat(conn)
    log.info("database %s now at %s", describe(engine.url), current_revision(engine))


def _unknown_message(engine: Engine, current: str, head: str | None = None,
                     compat: tuple[str, str] | None = None) -> str:
    head = head or head_revision()
    needs = ""
    if compat is not None and compat[0] == current:
        needs = (f" It records that code at revision {compat[1]!r} or later can run against "
                 f"it (a contracting migration since {head!r}).")
    return (
        f"database {describe(engine.url)} is at migration revision {current!r}, which this "
        f"autospec does not know (it expects {head!r}); was it migrated by a newer "
        f"autospec?{needs} Upgrade autospec, or point AUTOSPEC_DATABASE_URL at the right "
        f"database."
    )


# -- expand-then-contract -------------------------------------------------------------------


def is_backward_compatible(script: Script) -> bool:
    """Whether a migration only expands the schema (its module says
    ``backward_compatible = True``): code at the revision before it keeps working."""
    return getattr(script.module, "backward_compatible", False) is True


#: the first revision whose code reads ``autospec_schema``: code before it (release 0006 and
#: older) accepted only its own revision, so no ``min_reader`` is ever older than this
FIRST_COMPAT_READER = "0007"


def min_reader(revision: str, scripts: ScriptDirectory | None = None) -> str:
    """The oldest code revision that can run against a schema at ``revision``: walk back
    over the backward-compatible migrations that led to it, never past
    :data:`FIRST_COMPAT_READER`."""
    scripts = scripts or ScriptDirectory.from_config(alembic_config())
    while True:
        script = scripts.get_revision(revision)
        if (revision == FIRST_COMPAT_READER or script is None
                or not is_backward_compatible(script)):
            return revision
        down = script.down_revision
        if not isinstance(down, str):  # the first migration, or a merge: stop here
            return revision
        revision = down


def record_compat(conn: Connection) -> None:
    """Record ``(revision, min_reader)`` in ``autospec_schema`` (from 0007; before, nothing)."""
    current = MigrationContext.configure(conn).get_current_revision()
    if current is None or not inspect(conn).has_table(SchemaCompat.__tablename__):
        return
    table = SchemaCompat.__table__
    conn.execute(delete(table))
    conn.execute(insert(table).values(revision=current, min_reader=min_reader(current),
                                      updated_at=utcnow()))


def recorded_compat(engine: Engine) -> tuple[str, str] | None:
    """``(revision, min_reader)`` the database records, or None (before 0007, or none). A
    ``min_reader`` before :data:`FIRST_COMPAT_READER` (recorded by code that walked back past
    it) reads as that revision: code before it never accepted another revision's schema."""
    with engine.connect() as conn:
        if not inspect(conn).has_table(SchemaCompat.__tablename__):
            return None
        row = conn.execute(select(SchemaCompat.revision, SchemaCompat.min_reader)).first()
    if row is None:
        return None
    if row[1] in lineage(FIRST_COMPAT_READER) - {FIRST_COMPAT_READER}:
        return row[0], FIRST_COMPAT_READER
    return row[0], row[1]


def lineage(head: str) -> set[str]:
    """``head`` and every revision before it (what code at ``head`` knows)."""
    scripts = ScriptDirectory.from_config(alembic_config())
    return {s.revision for s in scripts.iterate_revisions(head, "base")}


def schema_state(engine: Engine, *, head: str | None = None) -> tuple[str, str | None]:
    """``(state, revision)``: ``current`` (at the code's head), ``empty`` (never migrated),
    ``outdated`` (an older revision: run ``autospec db upgrade``), ``ahead-compatible`` (a
    newer revision whose recorded min reader this code satisfies: it runs), ``unknown``."""
    current = current_revision(engine)
    expected = head or head_revision()
    known = lineage(head) if head else known_revisions()
    if current == expected:
        return "current", current
    if current is None:
        return "empty", None
    if current in known:
        return "outdated", current
    compat = recorded_compat(engine)
    if compat is not None and compat[0] == current and compat[1] in known:
        return "ahead-compatible", current
    return "unknown", current


def check_schema(engine: Engine, *, head: str | None = None) -> str:
    """Return the database revision if this code can run against it; raise otherwise.

    Accepted: the code's head, or a newer revision (unknown to this code) whose recorded
    ``min_reader`` this code's head satisfies (expand-then-contract: ``autospec db upgrade``
    first, then roll the replicas and the controller). ``head`` simulates older code.
    """
    state, current = schema_state(engine, head=head)
    expected = head or head_revision()
    where = describe(engine.url)
    if state == "current":
        return expected
    if state == "ahead-compatible":
        assert current is not None
        log.info("database %s is at %s, ahead of this code (%s) by backward-compatible "
                 "migrations only", where, current, expected)
        return current
    if state == "empty":
        raise SchemaNotInitialized(
            f"database {where} has no autospec schema; run `autospec db upgrade`"
        )
    assert current is not None
    if state == "unknown":
        raise UnknownRevision(_unknown_message(engine, current, expected,
                                               recorded_compat(engine)))
    raise SchemaOutdated(
        f"database {where} is at revision {current!r}, the code expects {expected!r}; "
        f"run `autospec db upgrade`"
    )


def schema_drift(engine: Engine) -> list[Any]:
    """Differences between the models and the (migrated) database; empty means no drift."""
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(ctx, metadata))


UpgradeMode = Literal["never", "create", "embedded", "always"]
"""Who may migrate what, when a process opens the store (:func:`may_migrate`):

- ``never`` — check only, a missing SQLite file refused, never created (replicas on
  PostgreSQL, the controller, ``train``, ``export``, ``db purge``, ...: a mistyped path
  stays a mistake);
- ``create`` — create the data directory's own SQLite store (no URL given: neither
  ``--database-url`` nor ``AUTOSPEC_DATABASE_URL``) when it does not exist yet, never migrate
  an existing one (``import``, ``synth``, ``pretrain``, which write what stands without
  traffic: a fresh machine's first command works; a store other processes use is never
  changed under them); a SQLite file named by a URL must exist, as in ``never``;
- ``embedded`` — create or upgrade a *SQLite* store (``serve`` and ``demo`` own their
  single-machine SQLite file; the upgrade is logged), never a server database;
- ``always`` — create or upgrade anything (``autospec db upgrade``; tests and benches on their
  own throwaway files).
"""


def may_migrate(url: str | URL, mode: UpgradeMode | bool, *, current: str | None,
                empty: bool) -> bool:
    """The one rule deciding whether opening the store at ``url`` may migrate it.

    ``current``: the database's revision (None: none); ``empty``: it has no table at all.
    A PostgreSQL (or any server) database is migrated only in mode ``always`` — i.e. by
    ``autospec db upgrade``, as the runbook says — so a newer CLI pointed at production never
    changes the schema the running replicas and controller check.
    """
    mode = _mode(mode)
    if mode == "always":
        return True
    if mode == "never" or parse_url(url).get_backend_name() != "sqlite":
        return False
    if mode == "embedded":
        return True
    return current is None and empty  # "create": a brand-new SQLite file only


def _mode(mode: UpgradeMode | bool) -> UpgradeMode:
    if mode is True:
        return "always"
    if mode is False:
        return "never"
    if mode not in ("never", "create", "embedded", "always"):
        raise ValueError(f"unknown upgrade mode {mode!r}")
    return mode


def _is_empty(engine: Engine) -> bool:
    with engine.connect() as conn:
        return not inspect(conn).get_table_names()


def missing_sqlite_file(url: str | URL | None) -> Path | None:
    """The file of a SQLite ``url`` (None: the settings') when it does not exist; None when
    it does or the store is not a SQLite file. Opening it would create it empty."""
    path = sqlite_file(url)
    return path if path is not None and not path.exists() else None


def check_exists(url: str | URL | None, mode: UpgradeMode = "never") -> None:
    """A missing SQLite file is created only where ``mode`` may (see :data:`UpgradeMode`);
    else :class:`SchemaNotInitialized`: checked, not created, a mistyped path stays a
    mistake."""
    missing = missing_sqlite_file(url)
    if missing is None or mode in ("embedded", "always"):
        return
    if mode == "create" and url is None and get_settings().database_url is None:
        log.warning("creating the store %s (a new SQLite file)", missing)
        return
    raise SchemaNotInitialized(
        f"database file {missing} does not exist; run `autospec db upgrade` to create it "
        "(or set AUTOSPEC_DATABASE_URL to an existing store)")


def open_store(url: str | URL | None = None, *,
               upgrade: UpgradeMode | bool = "never") -> Engine:
    """Engine for ``url``, checked: reachable and at a revision this code can run against.

    ``upgrade`` (see :data:`UpgradeMode` and :func:`may_migrate`) says whether the schema may be
    created or migrated to head first; ``True`` means ``always``, ``False`` ``never``. When it
    may not, a schema mismatch raises a :class:`~autospec.store.errors.SchemaError` telling the
    operator to run ``autospec db upgrade``.
    """
    check_exists(url, _mode(upgrade))
    engine = make_engine(url)
    ping(engine)
    current = current_revision(engine)
    head = head_revision()
    migratable = current is None or (current != head and current in known_revisions())
    if migratable and may_migrate(engine.url, upgrade, current=current,
                                  empty=current is None and _is_empty(engine)):
        _run(engine, command.upgrade, "head")
        if current is not None:
            log.warning("upgraded database %s from revision %s to %s", describe(engine.url),
                        current, head)
    check_schema(engine)
    return engine
