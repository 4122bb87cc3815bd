"""How ``autospec db backup`` writes rows (:mod:`autospec.store.backup`): the tables, parents
first, and each row as one JSON object: ``LargeBinary`` columns (token ids) as base64,
timestamps as ISO 8601, JSON as JSON, the rest as is; and back, each value checked against
its column's type (an integer of 64 bits, a number, a string, true or false)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, LargeBinary, MetaData, Table

from autospec.store.errors import StoreError
from autospec.store.models import metadata

FORMAT = 1
INDEX = "backup.json"


def tables() -> list[Table]:
    """The autospec tables, parents before children (the order rows are restored in);
    ``autospec_schema`` is schema bookkeeping the restoring store writes itself."""
    return [t for t in metadata.sorted_tables if t.name != "autospec_schema"]


def _kind(column: Any) -> str:
    kind = column.type
    if isinstance(kind, LargeBinary):
        return "bytes"
    if isinstance(kind, DateTime) or isinstance(getattr(kind, "impl", None), DateTime):
        return "datetime"
    if isinstance(kind, JSON):
        return "plain"
    try:
        python = kind.python_type
    except NotImplementedError:
        return "plain"
    return {bool: "bool", int: "int", float: "float", str: "str"}.get(python, "plain")


_INT64 = 1 << 63
#: what a value of each checked kind must be in a backup's row (None aside), and its words
_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool) and -_INT64 <= v < _INT64,
            "an integer of 64 bits"),
    "float": (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
}


def encoder(table: Table) -> Callable[[Any], dict[str, Any]]:
    """A database row of ``table`` → the JSON object a backup holds."""
    kinds = {c.name: _kind(c) for c in table.columns}

    def encode(row: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in row._mapping.items():
            if value is not None and kinds[name] == "bytes":
                value = base64.b64encode(value).decode("ascii")
            elif value is not None and kinds[name] == "datetime":
                value = value.isoformat()
            out[name] = value
        return out

    return encode


def decoder(table: Table) -> Callable[[Any], dict[str, Any]]:
    """A backup's JSON object → the row of ``table`` to insert; a ``ValueError`` or
    :class:`StoreError` for one this autospec cannot read."""
    kinds = {c.name: _kind(c) for c in table.columns}

    def decode(row: Any) -> dict[str, Any]:
        if not isinstance(row, dict):
            raise ValueError(f"expected a JSON object, found {type(row).__name__}")
        unknown = set(row) - set(kinds)
        if unknown:
            raise StoreError(f"backup of table {table.name} has columns this autospec does "
                             f"not know: {', '.join(sorted(unknown))}")
        out: dict[str, Any] = {}
        for name, value in row.items():
            if value is not None and kinds[name] == "bytes":
                value = base64.b64decode(value)
            elif value is not None and kinds[name] == "datetime":
                value = datetime.fromisoformat(value)
            elif value is not None and kinds[name] in _TYPES \
                    and not _TYPES[kinds[name]][0](value):
                raise ValueError(f"column {name} holds {repr(value)[:40]}, not "
                                 f"{_TYPES[kinds[name]][1]}")
            out[name] = value
        return out

    return decode


def writable(table: Table) -> Table:
    """``table`` with JSON columns storing Python None as SQL NULL (as the ORM writes it)."""
    copy = table.to_metadata(MetaData())
    for column in copy.columns:
        if isinstance(column.type, JSON):
            column.type = JSON(none_as_null=True)
    return copy


def order(table: Table) -> list[Any]:
    """The columns a backup orders ``table``'s rows by: its primary key."""
    return list(table.primary_key.columns) or list(table.columns)
