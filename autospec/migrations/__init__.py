"""Alembic migration scripts of the autospec store (package data; see autospec.store.migrate)."""
