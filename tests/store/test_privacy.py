"""Privacy of stored rows (issue 16, item 5): an opted-out row keeps nothing the client wrote,
in any column, in the database or the spill file; redaction reaches every stored string."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select

from autospec.store import db
from autospec.store.models import Request
from autospec.store.traffic import RequestRecord, prepare_row, row_to_json, write_requests

STOP = "my-private-stop-phrase"
SECRET = "sk-live-abcdefghijklmnop123456"


def _client_sampling() -> dict[str, Any]:
    return {"max_tokens": 5, "temperature": 0.7, "top_k": 0, "top_p": 0.9, "seed": 987654321,
            "stop": [STOP, "other stop"], "ignore_eos": False, "k": 5, "route": "chat",
            "user": "alice@example.com"}


def _record(**over: Any) -> RequestRecord:
    fields: dict[str, Any] = {
        "prompt_text": "what is my password", "output_text": "hunter2",
        "prompt_ids": [1, 2, 3], "output_ids": [4, 5], "segment": "chat",
        "speculator_version": "v1", "sampling": _client_sampling(), "temperature": 0.7,
        "num_drafts": 2, "num_draft_tokens": 6, "num_accepted_tokens": 3,
        "accepted_per_position": [2, 1], "request_uid": "r1"}
    fields.update(over)
    return RequestRecord(**fields)


def _stored_text(row: Request) -> str:
    """Every column of ``row`` as one string (blobs as hex)."""
    values = {c.name: getattr(row, c.name) for c in Request.__table__.columns}
    return json.dumps(values, default=lambda v: v.hex() if isinstance(v, bytes) else str(v))


def test_opted_out_row_keeps_no_client_string_in_any_column(engine) -> None:  # type: ignore[no-untyped-def]
    write_requests(engine, [_record(opted_out=True)])
    with db.session_scope(engine, readonly=True) as s:
        row = s.scalars(select(Request)).one()
    stored = _stored_text(row)
    for sent in ("password", "hunter2", STOP, "other stop", "987654321", "alice@example.com"):
        assert sent not in stored, f"{sent!r} stored for an opted-out request"
    assert row.opted_out and row.prompt_tokens == 3 and row.output_tokens == 2
    assert row.sampling == {"max_tokens": 5, "temperature": 0.7, "top_k": 0, "top_p": 0.9,
                            "ignore_eos": False, "k": 5, "route": "chat", "num_stop": 2}


def test_opted_out_spill_line_keeps_no_client_string() -> None:
    line = row_to_json(prepare_row(_record(opted_out=True)))
    for sent in ("password", "hunter2", STOP, "987654321", "alice@example.com"):
        assert sent not in line


def test_redaction_covers_stop_strings_segment_and_every_sampling_string(engine) -> None:  # type: ignore[no-untyped-def]
    sampling = _client_sampling() | {"stop": [f"key {SECRET}", "bob@example.com"]}
    write_requests(engine, [_record(sampling=sampling, segment=f"team-{'Ab1' * 11}")])
    with db.session_scope(engine, readonly=True) as s:
        row = s.scalars(select(Request)).one()
    stored = _stored_text(row)
    for secret in (SECRET, "bob@example.com", "alice@example.com", "Ab1" * 11):
        assert secret not in stored
    assert row.sampling["stop"] == ["key [SECRET]", "[EMAIL]"]
    assert row.redacted
    assert row.prompt_ids is not None  # the prompt text had no secret: its ids stay


def test_clean_sampling_is_not_flagged_redacted(engine) -> None:  # type: ignore[no-untyped-def]
    write_requests(engine, [_record(sampling=_client_sampling() | {"user": "u1"})])
    with db.session_scope(engine, readonly=True) as s:
        row = s.scalars(select(Request)).one()
    assert not row.redacted and row.sampling["stop"] == [STOP, "other stop"]
