"""What every command shares when its database fails: one line on stderr, exit status 2.

Each area's commands print their own errors (a refusal, bad input, a failed run), and most
print a :class:`~autospec.store.errors.StoreError` they expect (a database that cannot be
reached, a schema to upgrade). A database error can also come in the middle of any command's
work: SQLite locked past its busy timeout or read-only, a PostgreSQL connection lost. The
root group, :class:`Commands`, turns whichever of those escapes a command — an error of
the database or its driver (``DBAPIError``), a connection pool timeout, or a ``StoreError``
— into one line naming the database (its password
hidden, no SQL statement: :func:`autospec.store.db.database_failure`) and exit status 2,
never a traceback. So is an ``AUTOSPEC_*`` environment variable that does not parse
(:class:`autospec.settings.SettingsError`, raised wherever a command first reads the
settings): one line naming the variable and what is wrong.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

EXIT_ERROR = 2


def database_message(exc: BaseException) -> str | None:
    """The line for a database error (None for anything else). The store is imported only
    when something was raised: ``--help`` stays fast."""
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    from autospec.store.db import database_failure
    from autospec.store.errors import StoreError

    if isinstance(exc, DBAPIError | PoolTimeout):  # what the database or its driver said;
        return database_failure(exc)  # SQLAlchemy's own misuse errors are bugs: a traceback
    if isinstance(exc, StoreError):
        return str(exc)
    return None


def error_message(exc: BaseException) -> str | None:
    """The line for a database error or a bad ``AUTOSPEC_*`` variable (None otherwise)."""
    from autospec.settings import SettingsError

    if isinstance(exc, SettingsError):
        return str(exc)
    return database_message(exc)


class Commands(TyperGroup):
    """The ``autospec`` group: a database error or a bad ``AUTOSPEC_*`` variable out of any
    command is one line, exit 2."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:  # click's own (Exit, usage errors) are none of these
            message = error_message(exc)
            if message is None:
                raise
            from rich.console import Console
            from rich.text import Text

            Console(stderr=True).print(Text.assemble(("error:", "bold red"), " ", message),
                                       soft_wrap=True)
            raise typer.Exit(EXIT_ERROR) from None
