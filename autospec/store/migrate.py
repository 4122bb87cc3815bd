"""Alembic, driven from code so it works from an installed wheel as well as a checkout.

The migration scripts live in the top-level ``migrations/`` directory, installed as the
``autospec.migrations`` package (:func:`autospec.shipped.shipped_dir` finds either);
:func:`alembic_config` points Alembic there and hands it an open connection, so no
``alembic.ini`` is needed at run time (the one at the repository root is for authors running
``alembic revision --autogenerate``).

- :func:`upgrade` / :func:`downgrade` move the schema; a fresh database is created only this way.
- :func:`current_revision` reads the database; :func:`head_revision` is what the code expects.
- :func:`check_schema` raises a :class:`~autospec.store.errors.SchemaError` subclass when the
  two differ (not initialised, outdated, or a revision this code does not know).
- :func:`schema_drift` lists differences between the models and the migrated database.
- :func:`open_store` = make_engine + ping + schema check (or upgrade): what processes call
  at start-up (here, not in :mod:`~autospec.store.db`, so the two do not import each other).
  Whether it may create or migrate the schema is decided in one place, :func:`may_migrate`:
  only ``autospec db upgrade`` migrates a PostgreSQL database or an existing SQLite store
  other processes use; ``serve``/``demo`` upgrade their own SQLite file; ``train``, ``export``,
  ``import``, ``synth``, ``pretrain`` only create a brand-new SQLite file.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import URL, Connection, Engine, inspect

from autospec.shipped import shipped_dir
from autospec.store.db import describe, make_engine, parse_url, ping, writer_engine
from autospec.store.errors import SchemaNotInitialized, SchemaOutdated, StoreError, UnknownRevision
from autospec.store.models import metadata

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
    log.info("database %s now at %s", describe(engine.url), current_revision(engine))


def _unknown_message(engine: Engine, current: str) -> str:
    return (
        f"database {describe(engine.url)} is at migration revision {current!r}, which this "
        f"autospec does not know (it expects {head_revision()!r}); was it migrated by a newer "
        f"autospec? Upgrade autospec, or point AUTOSPEC_DATABASE_URL at the right database."
    )


def check_schema(engine: Engine) -> str:
    """Return the database revision if it is the one the code expects; raise otherwise."""
    current = current_revision(engine)
    head = head_revision()
    if current == head:
        return current
    where = describe(engine.url)
    if current is None:
        raise SchemaNotInitialized(
            f"database {where} has no autospec schema; run `autospec db upgrade`"
        )
    if current not in known_revisions():
        raise UnknownRevision(_unknown_message(engine, current))
    raise SchemaOutdated(
        f"database {where} is at revision {current!r}, the code expects {head!r}; "
        f"run `autospec db upgrade`"
    )


def schema_drift(engine: Engine) -> list[Any]:
    """Differences between the models and the (migrated) database; empty means no drift."""
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(ctx, metadata))


UpgradeMode = Literal["never", "create", "embedded", "always"]
"""Who may migrate what, when a process opens the store (:func:`may_migrate`):

- ``never`` — check only (replicas on PostgreSQL, the controller, ``db purge``, ...);
- ``create`` — create the schema in an *empty SQLite* database (a new file), never migrate an
  existing one (``train``, ``export``, ``import``, ``synth``, ``pretrain``: a fresh machine's
  first command works; a store other processes use is never changed under them);
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


def open_store(url: str | URL | None = None, *,
               upgrade: UpgradeMode | bool = "never") -> Engine:
    """Engine for ``url``, checked: reachable and at a revision this code can run against.

    ``upgrade`` (see :data:`UpgradeMode` and :func:`may_migrate`) says whether the schema may be
    created or migrated to head first; ``True`` means ``always``, ``False`` ``never``. When it
    may not, a schema mismatch raises a :class:`~autospec.store.errors.SchemaError` telling the
    operator to run ``autospec db upgrade``.
    """
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
