"""Request rows: the :class:`RequestRecord` the serving path fills, and how it becomes a row.

- :class:`RequestRecord` is what ``serve`` hands to the writer (see
  :class:`autospec.store.writer.TrafficWriter`); unknown fields are a ``TypeError`` at once.
- :func:`prepare_row` replaces NUL characters in the client's text (:data:`NUL_REPLACEMENT`),
  applies the privacy rules (:mod:`autospec.store.privacy`), fills the uid and time and packs
  the token ids: the result is the ``requests`` column values.
  :func:`row_to_json` / :func:`row_from_json` turn it into a spill-file line and back.
- :func:`write_requests` writes records synchronously (tests, seeding, back-fills);
  :func:`insert_rows` is the idempotent batched insert both it and the writer use: a row whose
  ``request_uid`` is already stored is skipped, so replaying a batch twice stores it once.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from functools import lru_cache
from operator import itemgetter
from typing import Any

from sqlalchemy import Connection, Engine, Insert

from autospec.store.codec import pack_ids
from autospec.store.db import writer_engine
from autospec.store.models import Request
from autospec.store.privacy import Redactor, apply_privacy, redact_default

REQUEST_TABLE = Request.__table__


@dataclass(slots=True)
class RequestRecord:
    """One served request as the serving path reports it. Times in ms; ids as int lists."""

    prompt_text: str | None = None
    output_text: str | None = None
    prompt_ids: Sequence[int] | None = None
    output_ids: Sequence[int] | None = None
    segment: str = "default"
    deployment: str = "default"
    speculator_version: str | None = None
    opted_out: bool = False
    temperature: float = 0.0
    sampling: dict[str, Any] | None = None
    finish_reason: str | None = None
    latency_ms: float | None = None
    ttft_ms: float | None = None
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    request_uid: str | None = None
    created_at: datetime | None = field(default=None)


RECORD_FIELDS = tuple(f.name for f in fields(RequestRecord))
_INT_FIELDS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
#: what a NUL character (U+0000) in client text is stored as: U+FFFD, the replacement
#: character. PostgreSQL text and JSON cannot hold NUL (psycopg raises DataError, which
#: would drop the whole row, statistics too); replaced on every backend so SQLite and
#: PostgreSQL store the same text. The token ids are kept as they are.
NUL_REPLACEMENT = "\ufffd"
_CLIENT_TEXT = ("prompt_text", "output_text", "segment", "sampling")


def new_uid() -> str:
    return uuid.uuid4().hex


def prepare_row(
    record: RequestRecord, *, created: float | None = None, redact: Redactor | None = redact_default
) -> dict[str, Any]:
    """``requests`` column values for ``record``, after the privacy rules.

    Token ids are packed here (an id outside int32 raises ``OverflowError`` now, not in the
    driver); raises ``TypeError``/``ValueError`` for any other value that cannot be stored.
    """
    row = {name: getattr(record, name) for name in RECORD_FIELDS}
    for key in _CLIENT_TEXT:
        row[key] = _without_nul(row[key])
    row["request_uid"] = row["request_uid"] or new_uid()
    when = row["created_at"]
    if when is None:
        when = datetime.fromtimestamp(created, timezone.utc) if created else _now()
    elif when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    row["created_at"] = when
    for key in _INT_FIELDS:
        if int(row[key]) < 0:
            raise ValueError(f"{key} must be >= 0, got {row[key]}")
    if row["accepted_per_position"] is not None:
        row["accepted_per_position"] = [int(a) for a in row["accepted_per_position"]]
    if row["sampling"] is not None:
        json.dumps(row["sampling"])  # TypeError now, not in the database driver later
    row["temperature"] = float(row["temperature"] or 0.0)
    row["redacted"] = False
    apply_privacy(row, redact)
    row["prompt_ids"] = pack_ids(row["prompt_ids"])
    row["output_ids"] = pack_ids(row["output_ids"])
    return row


def _without_nul(value: Any) -> Any:
    """``value`` with every NUL in its strings (dict keys and values, lists) replaced by
    :data:`NUL_REPLACEMENT`."""
    if isinstance(value, str):
        return value.replace("\x00", NUL_REPLACEMENT) if "\x00" in value else value
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_without_nul(item) for item in value)
    return value


def _now() -> datetime:
    return datetime.now(timezone.utc)


_BLOBS = ("prompt_ids", "output_ids")


def row_to_json(row: dict[str, Any]) -> str:
    """One prepared row as a line of the spill file (ids base64, time ISO 8601)."""
    data = dict(row)
    data["created_at"] = row["created_at"].isoformat()
    for key in _BLOBS:
        if data[key] is not None:
            data[key] = base64.b64encode(data[key]).decode("ascii")
    return json.dumps(data, separators=(",", ":"))


def row_from_json(line: str) -> dict[str, Any]:
    """The inverse of :func:`row_to_json`."""
    row = json.loads(line)
    row["created_at"] = datetime.fromisoformat(row["created_at"])
    for key in _BLOBS:
        if row[key] is not None:
            row[key] = base64.b64decode(row[key])
    return row


def insert_statement(dialect_name: str) -> Insert:
    """INSERT into ``requests`` that skips rows whose ``request_uid`` is already stored."""
    if dialect_name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(REQUEST_TABLE).on_conflict_do_nothing(index_elements=["request_uid"])
    if dialect_name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(REQUEST_TABLE).on_conflict_do_nothing(index_elements=["request_uid"])
    return REQUEST_TABLE.insert()


def insert_rows(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert prepared rows in one executemany (inside the caller's transaction)."""
    if not rows:
        return
    if conn.dialect.name == "sqlite":
        _sqlite_executemany(conn, rows)
    else:
        conn.execute(insert_statement(conn.dialect.name), rows)


# SQLite hot path. SQLAlchemy's per-row bind processing costs about as much as SQLite's own
# insert, so for SQLite the writer hands the driver tuples converted the way SQLAlchemy's
# SQLite types store them: DateTime as naive-UTC "YYYY-MM-DD HH:MM:SS.ffffff", JSON as text.
# tests/store/test_writer.py::test_sqlite_fast_path_matches_sqlalchemy keeps the two identical.
_SQLITE_TIME = "%Y-%m-%d %H:%M:%S.%f"
_JSON_COLUMNS = ("sampling", "accepted_per_position")


@lru_cache(maxsize=8)
def _sqlite_insert(keys: tuple[str, ...], dialect: Any) -> tuple[str, tuple[str, ...]]:
    compiled = insert_statement("sqlite").compile(dialect=dialect, column_keys=list(keys))
    order = tuple(compiled.positiontup or ())
    return compiled.string, order


def _sqlite_executemany(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    sql, order = _sqlite_insert(tuple(rows[0]), conn.dialect)
    pick = itemgetter(*order)
    fixes = [(order.index(k), k) for k in ("created_at", *_JSON_COLUMNS)]
    params = []
    for row in rows:
        values = list(pick(row))
        for index, key in fixes:
            value = values[index]
            if value is None:
                continue
            if key == "created_at":
                values[index] = value.astimezone(timezone.utc).strftime(_SQLITE_TIME)
            else:
                values[index] = json.dumps(value)
        params.append(tuple(values))
    conn.exec_driver_sql(sql, params)


def write_requests(
    engine: Engine,
    records: Iterable[RequestRecord],
    *,
    redact: Redactor | None = redact_default,
) -> list[str]:
    """Write records now, in one transaction; return their request uids."""
    rows = [prepare_row(r, redact=redact) for r in records]
    with writer_engine(engine).begin() as conn:
        insert_rows(conn, rows)
    return [r["request_uid"] for r in rows]
