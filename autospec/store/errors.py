"""Errors raised by the store. Every one names the problem in words an operator can act on.

The CLI prints ``str(error)`` without a traceback and exits non-zero; library callers catch
:class:`StoreError` (or a subclass) and never see a bare SQLAlchemy/DBAPI exception for the
conditions below.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error the store raises on purpose."""


class BadDatabaseURL(StoreError):
    """The database URL cannot be parsed or names a driver that is not installed."""


class DatabaseUnreachable(StoreError):
    """The database server (or SQLite file) cannot be opened."""


class SchemaError(StoreError):
    """The database schema is not the one this code expects."""


class SchemaNotInitialized(SchemaError):
    """The database has no migration revision: run ``autospec db upgrade``."""


class SchemaOutdated(SchemaError):
    """The database is at an older known revision: run ``autospec db upgrade``."""


class UnknownRevision(SchemaError):
    """The database is at a migration revision this code does not know."""


class NotFound(StoreError):
    """A speculator version, run, deployment or lease named by the caller does not exist."""


class Conflict(StoreError):
    """The request conflicts with the stored state (duplicate version, lease held, ...)."""


class ArtifactError(StoreError):
    """A speculator artifact is missing, malformed, or does not match its SHA-256."""
