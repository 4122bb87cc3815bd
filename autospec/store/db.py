"""Engines and sessions: one place that turns a database URL into a working connection.

- :func:`make_engine` parses the URL (a malformed one or a missing driver raises
  :class:`~autospec.store.errors.BadDatabaseURL`), expands a ``~`` in a SQLite file's path
  (:func:`sqlite_file`; SQLite itself does not), creates the SQLite file's directory, and for
  SQLite sets WAL mode, a busy timeout, ``synchronous=NORMAL`` and foreign keys on every
  connection, so serve replicas, the controller and the CLI share one file.
- On SQLite, transactions of :func:`session_scope` (and of :func:`writer_engine`, which the
  traffic writer and migrations use) start with ``BEGIN IMMEDIATE``: the write lock is taken
  up front and waited for under the busy timeout, so a read-then-write transaction can never
  fail with "database is locked". ``session_scope(engine, readonly=True)`` and plain
  ``engine.connect()`` use a deferred ``BEGIN``, which WAL never blocks.
- :func:`ping` opens a connection and raises
  :class:`~autospec.store.errors.DatabaseUnreachable` naming the database when it cannot.
- Every engine :func:`make_engine` builds tags the SQLAlchemy errors it raises with the
  database they came from (its URL, password hidden, a ``?password=`` too);
  :func:`database_failure` turns such an error into the one line a command prints (the
  CLI's root group, :mod:`autospec.cli_errors`).
- ``open_store`` (make_engine + ping + schema check or upgrade, what processes call at
  start-up) lives in :mod:`autospec.store.migrate`, which imports this module.

This module knows nothing of the tables; see :mod:`autospec.store.models`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

from autospec.store.errors import BadDatabaseURL, DatabaseUnreachable

log = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_S = 30.0
_BEGIN_OPTION = "autospec_sqlite_begin"
# scheme://user:PASSWORD@ in any text (greedy to the last '@' of the word: a password may
# hold '@' or '/'); what redact() masks where SQLAlchemy's own parser cannot be used
_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*):[^\s]*@")
# a query parameter (?key=value or &key=value) or a libpq keyword (key=value after a space
# or at the start: "host=db password=x"; a value may be quoted, 'a b') in any text, and the
# names whose value is a secret: libpq's password and sslpassword (passfile, sslkey and
# sslcert are paths, shown)
_PARAMETER = re.compile(r"(?P<head>(?:(?<=[?&\s])|^)(?P<key>[^=&?#\s'\"]+)=)"
                        r"(?P<value>'(?:[^'\\]|\\.)*'?|[^&\s'\"]*)")
_SECRET_KEY = re.compile(r"password|passwd|pwd|secret|(?<![a-z])token(?![a-z])", re.IGNORECASE)


def parse_url(url: str | URL) -> URL:
    """Parse a SQLAlchemy URL or raise :class:`BadDatabaseURL` saying what is wrong."""
    if isinstance(url, URL):
        return url
    if url.partition("://")[2].partition("/")[0].count("@") > 1:  # the host would be a guess
        raise BadDatabaseURL(f"malformed database URL {redact(url)!r}: more than one '@' before "
                             "the host; write an '@' in the user or password as %40")
    try:
        return make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise BadDatabaseURL(
            f"malformed database URL {redact(url)!r}: {redact(str(exc))}") from None


def redact(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` in it, and the value
    of every query parameter or libpq keyword naming a secret (``?password=``,
    ``&sslpassword=``, ``host=db password=x``; any name holding password, passwd, pwd,
    secret or token, percent-encoded or not), shown as ``***``: for a URL SQLAlchemy cannot
    parse, and for messages that quote one."""
    return _PARAMETER.sub(_mask_parameter, _CREDENTIALS.sub(r"\g<head>:***@", text))


def _mask_parameter(match: re.Match[str]) -> str:
    if _SECRET_KEY.search(unquote_plus(match["key"])) and match["value"]:
        return match["head"] + "***"
    return match[0]


def describe(url: str | URL) -> str:
    """The URL with its password hidden, the one after ``user:`` and one given as a query
    parameter alike (:func:`redact`), for messages and logs (a malformed one too)."""
    try:
        return redact(parse_url(url).render_as_string(hide_password=True))
    except BadDatabaseURL:
        return repr(redact(str(url)))


def make_engine(
    url: str | URL | None = None,
    *,
    busy_timeout_s: float = SQLITE_BUSY_TIMEOUT_S,
    connect_timeout_s: float = 10.0,
    echo: bool = False,
) -> Engine:
    """An Engine for ``url`` (default: ``AUTOSPEC_DATABASE_URL``). Does not connect."""
    if url is None:
        from autospec.settings import get_settings

        url = get_settings().resolved_database_url
    parsed = parse_url(url)
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise BadDatabaseURL(f"cannot use database URL {describe(parsed)!r}: autospec stores "
                             "in SQLite (sqlite:///path/to/file.db) or PostgreSQL "
                             "(postgresql://user@host:5432/db), not " + backend)
    kwargs: dict[str, Any] = {"echo": echo}
    if backend == "sqlite":
        path = sqlite_file(parsed)
        if path is not None and str(path) != parsed.database:  # "~" expanded: SQLite won't
            parsed = parsed.set(database=str(path))
        _ensure_sqlite_dir(parsed)
        kwargs["connect_args"] = {"timeout": busy_timeout_s, "check_same_thread": False}
    elif backend == "postgresql":
        kwargs["connect_args"] = {"connect_timeout": max(1, int(connect_timeout_s))}
        kwargs["pool_pre_ping"] = True
        if parsed.drivername == "postgresql":  # plain postgresql:// would pick psycopg2
            parsed = parsed.set(drivername="postgresql+psycopg")
    try:
        engine = create_engine(parsed, **kwargs)
    except NoSuchModuleError as exc:
        raise BadDatabaseURL(f"unknown database driver in {describe(parsed)!r}: {exc}") from None
    except (ArgumentError, ImportError, TypeError) as exc:
        raise BadDatabaseURL(f"cannot use database URL {describe(parsed)!r}: {exc}") from None
    if backend == "sqlite":
        _install_sqlite_hooks(engine, busy_timeout_s)
    _name_failures(engine)
    return engine


def _ensure_sqlite_dir(url: URL) -> None:
    path = sqlite_file(url)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file where a folder should be, no permission, /proc
        raise BadDatabaseURL(f"cannot use SQLite file {path}: its folder {path.parent} "
                             f"cannot be created ({exc.strerror or exc})") from None


def sqlite_file(url: str | URL | None) -> Path | None:
    """The file of a SQLite ``url`` (default: ``AUTOSPEC_DATABASE_URL``'s); None for another
    backend, an in-memory database or a ``file:`` URI."""
    if url is None:
        from autospec.settings import get_settings

        url = get_settings().resolved_database_url
    parsed = parse_url(url)
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:" \
            or database.startswith("file:"):
        return None
    return Path(database).expanduser()


def _install_sqlite_hooks(engine: Engine, busy_timeout_s: float) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (see module docstring)
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get(_BEGIN_OPTION, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")


def writer_engine(engine: Engine) -> Engine:
    """``engine`` with write transactions (BEGIN IMMEDIATE on SQLite; a no-op elsewhere)."""
    return engine.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"})


def reader_engine(engine: Engine) -> Engine:
    """``engine`` with read transactions (deferred BEGIN on SQLite; a no-op elsewhere)."""
    return engine.execution_options(**{_BEGIN_OPTION: "DEFERRED"})


@contextmanager
def session_scope(engine: Engine, *, readonly: bool = False) -> Iterator[Session]:
    """A session that commits on success and rolls back on error.

    Objects stay usable after the block (``expire_on_commit=False``). Use ``readonly=True``
    for pure reads on SQLite so readers never queue for the write lock.
    """
    bind = reader_engine(engine) if readonly else writer_engine(engine)
    session = Session(bind=bind, expire_on_commit=False)
    try:
        yield session
        if not readonly:
            session.commit()  # readonly: close() below ends the transaction, objects stay loaded
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def ping(engine: Engine) -> None:
    """Open one connection, or raise :class:`DatabaseUnreachable` naming the database (one
    line: the driver's message with its line breaks as spaces; psycopg adds an "Is the server
    running" hint on a second line)."""
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except (DBAPIError, SQLAlchemyError, OSError) as exc:
        reason = " ".join(str(getattr(exc, "orig", None) or exc).split())
        raise DatabaseUnreachable(
            f"cannot connect to database {describe(engine.url)}: {redact(reason)}"
        ) from None


#: what the database or its driver raised (locked, read-only, full, its connection lost) or
#: a connection pool timeout: an outage to report in one line (:func:`database_failure`),
#: unlike SQLAlchemy's own misuse errors, which are bugs
DATABASE_ERRORS: tuple[type[SQLAlchemyError], ...] = (DBAPIError, PoolTimeout)

#: the attribute :func:`_name_failures` sets on an engine's SQLAlchemy errors
_DATABASE_ATTR = "autospec_database"


def _name_failures(engine: Engine) -> None:
    """Tag each SQLAlchemy error ``engine`` raises with its database (for
    :func:`database_failure`: a "database is locked" or "attempt to write a readonly
    database" names no file). The error itself is raised unchanged."""
    where = describe(engine.url)

    @event.listens_for(engine, "handle_error")
    def _on_error(context: Any) -> None:
        if context.sqlalchemy_exception is not None:
            setattr(context.sqlalchemy_exception, _DATABASE_ATTR, where)


def database_failure(exc: SQLAlchemyError) -> str:
    """The one line a command prints for a database error: the database (when an engine of
    :func:`make_engine` raised it), the driver's error class and the first line of its
    message; not the SQL statement, and no password of a URL the message quotes."""
    reason = getattr(exc, "orig", None) or exc
    first = (str(reason).strip().splitlines() or [""])[0]
    where = getattr(exc, _DATABASE_ATTR, None)
    database = f"database {where}" if where else "the database"
    return (f"{database} failed ({type(reason).__name__}): {redact(first)}; nothing more "
            "was done (run it again once the database answers)")
