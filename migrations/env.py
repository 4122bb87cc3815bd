"""Alembic environment: runs on the connection autospec.store.migrate hands in, or on the
URL from ``-x url=...`` / ``AUTOSPEC_DATABASE_URL`` when run by the ``alembic`` command."""

from __future__ import annotations

from alembic import context

from autospec.store.models import metadata

config = context.config


def _configure_and_run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection)
        return
    from autospec.store.db import make_engine

    url = context.get_x_argument(as_dictionary=True).get("url")
    engine = make_engine(url)
    with engine.begin() as conn:
        _configure_and_run(conn)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported")
run_migrations_online()
