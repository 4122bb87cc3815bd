"""Row-level steps of :func:`autospec.store.backup.restore`: every table file read and
checked before anything is written (:func:`check_tables`: a file cut short, a line that does
not parse, a speculator row restore cannot read (no version name, a parent or meta of
another type), rows missing against the counts ``backup.json`` records, or a version's row
naming another artifact than the one the backup holds, is one error naming the file), the
rows inserted (:func:`insert_tables`), the order speculator rows are inserted in,
PostgreSQL's id sequences after the insert, and what to say when the database refuses a
batch of a backup's rows (a string longer than its column, a NUL in text: SQLite stores
both, PostgreSQL refuses them) — the table, the row by its primary key and the column where
the rows show it, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Table, func, insert, select, text
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError

from autospec.names import NAME_RULE, is_name
from autospec.store.backup_format import INDEX, decoder, tables, writable
from autospec.store.errors import StoreError

_BATCH = 1000


def _lines(source: Path, table: Table) -> Iterator[dict[str, Any]]:
    file = source / "tables" / f"{table.name}.jsonl"
    if not file.is_file():
        raise StoreError(f"backup {source} has no {file.name}; nothing was restored")
    decode = decoder(table)
    with file.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            try:
                yield decode(json.loads(line))
            except (ValueError, TypeError, RecursionError) as exc:  # Recursion: nested too deep
                raise StoreError(f"{file}:{number}: {exc}; nothing was restored") from None


def _check_count(source: Path, table: Table, found: int, counts: Any) -> None:
    """A :class:`StoreError` unless ``backup.json`` (``counts``, its ``tables``) records
    ``found`` rows for ``table``."""
    expected = counts.get(table.name) if isinstance(counts, dict) else None
    file = source / "tables" / f"{table.name}.jsonl"
    if not isinstance(expected, int):
        raise StoreError(f"backup {source}: {INDEX} records no row count for table "
                         f"{table.name}; nothing was restored")
    if found != expected:
        raise StoreError(f"backup {source}: table {table.name}: {file} holds {found} rows, "
                         f"{INDEX} records {expected}; nothing was restored")


def check_tables(source: Path, counts: Any, shas: dict[str, str]) -> dict[str, str]:
    """Read and decode every row of every table file of the backup at ``source``, and check
    each table's rows against ``counts`` (``backup.json``'s ``tables``) and each version's
    SHA-256 against ``shas`` (the artifacts it lists): a :class:`StoreError` naming the
    first file that is missing, does not parse, holds another number of rows, or a version
    whose row records another artifact than the one the backup holds. Writes nothing;
    returns each registered version's ``artifact_uri``."""
    registered: dict[str, str] = {}
    for table in tables():
        found = 0
        for row in _lines(source, table):
            found += 1
            if table.name == "speculators":
                _check_speculator(source / "tables" / f"{table.name}.jsonl", found, row)
                registered[row["version"]] = row["artifact_uri"]
            if table.name == "speculators" and row.get("version") in shas \
                    and shas[row["version"]] != row.get("sha256"):
                raise StoreError(
                    f"backup {source}: the row of {row['version']!r} in {table.name}.jsonl "
                    f"records SHA-256 {str(row.get('sha256'))[:12]}…, {INDEX} lists its "
                    f"artifact with {shas[row['version']][:12]}…; nothing was restored")
        _check_count(source, table, found, counts)
    return registered


#: a speculator row's fields restore reads itself (a version's parent, its artifact...), with
#: the JSON types they must have (None: null allowed)
_SPECULATOR_FIELDS = {"version": (str,), "parent": (str, type(None)), "artifact_uri": (str,),
                      "sha256": (str,), "meta": (dict, type(None))}


def _check_speculator(file: Path, number: int, row: dict[str, Any]) -> None:
    """A :class:`StoreError` naming the line unless the speculator row has a version that
    is a version name, and its parent, artifact and meta of their types."""
    for name, types in _SPECULATOR_FIELDS.items():
        if not isinstance(row.get(name), types):
            raise StoreError(f"{file}:{number}: {name} is {row.get(name)!r}, not "
                             f"{' or '.join(_JSON[t] for t in types)}; nothing was restored")
    if not is_name(row["version"]):
        raise StoreError(f"{file}:{number}: version {row['version']!r} is not a version name "
                         f"({NAME_RULE}); nothing was restored")


_JSON = {str: "a string", dict: "an object", type(None): "null"}


def insert_tables(conn: Any, source: Path, counts: Any, uris: dict[str, str],
                  progress: Callable[[str, int], None] | None) -> dict[str, int]:
    """Insert every table's rows (speculators' ``artifact_uri`` from ``uris`` where it names
    the version); rows a table. A batch the database refuses, or a file that changed since
    :func:`check_tables`, is a :class:`StoreError` naming the table (the caller's
    transaction rolls back: the store is unchanged)."""
    done: dict[str, int] = {}
    for table in tables():
        count = 0
        for batch in _batches(source, table, uris):
            try:
                conn.execute(insert(writable(table)), batch)
            except (DataError, IntegrityError) as exc:
                raise StoreError(f"backup {source}: table {table.name}: "
                                 f"{refused_rows(table, batch, exc)}; the database is "
                                 f"unchanged") from None
            count += len(batch)
        _check_count(source, table, count, counts)
        done[table.name] = count
        if progress:
            progress(table.name, count)
    return done


def _batches(source: Path, table: Table,
             uris: dict[str, str]) -> Iterator[list[dict[str, Any]]]:
    rows: Iterator[dict[str, Any]] = _lines(source, table)
    if table.name == "speculators":
        rows = iter(parents_first(list(rows)))
    batch: list[dict[str, Any]] = []
    for row in rows:
        if table.name == "speculators" and row["version"] in uris:
            row["artifact_uri"] = uris[row["version"]]
        batch.append(row)
        if len(batch) >= _BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def parents_first(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Speculator rows ordered so that a version's parent is inserted before it."""
    by_version = {row["version"]: row for row in rows}
    done: set[str] = set()
    ordered: list[dict[str, Any]] = []
    for row in rows:
        chain = []
        while row is not None and row["version"] not in done:
            chain.append(row)
            done.add(row["version"])
            row = by_version.get(row.get("parent"))  # type: ignore[arg-type]
        ordered.extend(reversed(chain))
    return ordered


def reset_sequences(conn: Any, tables: list[Table]) -> None:
    """Set each PostgreSQL id sequence past the highest id restored."""
    for table in tables:
        for column in table.primary_key.columns:
            if column.autoincrement is not True:
                continue
            sequence = conn.scalar(text("SELECT pg_get_serial_sequence(:t, :c)"),
                                   {"t": table.name, "c": column.name})
            if sequence is None:
                continue
            top = conn.scalar(select(func.max(column)))
            conn.execute(text("SELECT setval(:s, :v, :called)"),
                         {"s": sequence, "v": top or 1, "called": top is not None})


def refused_rows(table: Table, batch: list[dict[str, Any]], exc: DBAPIError) -> str:
    """Why the database refused ``batch`` of ``table``: the first row and column whose
    string is too long for the column or holds a NUL, else the batch's first and last rows;
    with the database's own words."""
    said = " ".join(str(exc.orig if exc.orig is not None else exc).split())[:300]
    for row in batch:
        for column in table.columns:
            value = row.get(column.name)
            if not isinstance(value, str):
                continue
            limit = getattr(column.type, "length", None)
            if limit is not None and len(value) > limit:
                return (f"row {_key(table, row)}: column {column.name} holds at most {limit} "
                        f"characters, the backup has {len(value)} ({said})")
            if "\x00" in value:
                return (f"row {_key(table, row)}: column {column.name} contains a NUL "
                        f"character, which PostgreSQL cannot store ({said})")
    return f"rows {_key(table, batch[0])} to {_key(table, batch[-1])}: {said}"


def _key(table: Table, row: dict[str, Any]) -> str:
    columns = list(table.primary_key.columns) or list(table.columns)[:1]
    return ", ".join(f"{c.name}={row.get(c.name)!r}" for c in columns)
