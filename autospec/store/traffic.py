"""Request rows: the :class:`RequestRecord` the serving path fills, and how it becomes a row.

- :class:`RequestRecord` is what ``serve`` hands to the writer (see
  :class:`autospec.store.writer.TrafficWriter`); unknown fields are a ``TypeError`` at once.
- :func:`prepare_row` applies the privacy rules (:mod:`autospec.store.privacy`) and fills the
  uid and time: the result is plain JSON-able data (token ids as lists) — what the spill file
  holds. :func:`to_db_row` packs the ids for the ``requests`` table.
- :func:`write_requests` writes records synchronously (tests, seeding, back-fills);
  :func:`insert_rows` is the idempotent batched insert both it and the writer use: a row whose
  ``request_uid`` is already stored is skipped, so replaying a batch twice stores it once.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
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


def new_uid() -> str:
    return uuid.uuid4().hex


def prepare_row(
    record: RequestRecord, *, created: float | None = None, redact: Redactor | None = redact_default
) -> dict[str, Any]:
    """The row for ``record`` after privacy rules; JSON-able (ids as lists, time as ISO text).

    Raises ``TypeError``/``ValueError`` for a record that cannot be stored.
    """
    row = {name: getattr(record, name) for name in RECORD_FIELDS}
    row["request_uid"] = row["request_uid"] or new_uid()
    when = row["created_at"]
    if when is None:
        when = datetime.fromtimestamp(created, timezone.utc) if created else _now()
    elif when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    row["created_at"] = when.isoformat()
    for key in ("prompt_ids", "output_ids"):
        if row[key] is not None:
            row[key] = [int(t) for t in row[key]]
            pack_ids(row[key])  # OverflowError now for an id outside int32
    for key in _INT_FIELDS:
        if int(row[key]) < 0:
            raise ValueError(f"{key} must be >= 0, got {row[key]}")
    if row["accepted_per_position"] is not None:
        row["accepted_per_position"] = [int(a) for a in row["accepted_per_position"]]
    if row["sampling"] is not None:
        json.dumps(row["sampling"])  # TypeError now, not in the database driver later
    row["redacted"] = False
    return apply_privacy(row, redact)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def to_db_row(row: dict[str, Any]) -> dict[str, Any]:
    """A prepared row as ``requests`` column values (ids packed, time parsed)."""
    out = dict(row)
    out["created_at"] = datetime.fromisoformat(row["created_at"])
    out["prompt_ids"] = pack_ids(row["prompt_ids"])
    out["output_ids"] = pack_ids(row["output_ids"])
    out["temperature"] = float(row["temperature"] or 0.0)
    return out


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
    if rows:
        conn.execute(insert_statement(conn.dialect.name), [to_db_row(r) for r in rows])


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
