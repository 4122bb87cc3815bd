"""Alembic migration scripts of the autospec store, installed as the ``autospec.migrations``
package; found through :func:`autospec.shipped.shipped_dir` (see autospec.store.migrate)."""
