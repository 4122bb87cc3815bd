"""``x-autospec-log: off`` end to end (issue 16, item 5): the stored row holds nothing the
client sent — not the texts, ids, stop strings, seed, user or segment label. Tiny target."""

from __future__ import annotations

import json

from sqlalchemy import select

from autospec import store
from autospec.store.models import Request


def _stored_text(row: Request) -> str:
    values = {c.name: getattr(row, c.name) for c in Request.__table__.columns}
    return json.dumps(values, default=lambda v: v.hex() if isinstance(v, bytes) else str(v))


def test_opted_out_request_stores_nothing_the_client_sent_tiny(client, server, db):
    sent = {"prompt": "zebra quartz prompt", "max_tokens": 4, "temperature": 0.8,
            "seed": 424242, "stop": ["velvet-stop-one", "velvet-stop-two"],
            "user": "carol@example.org"}
    headers = {"x-autospec-log": "off", "x-autospec-segment": "patient-4711"}
    for stream in (False, True):
        r = client.post("/v1/completions", json=sent | {"stream": stream}, headers=headers)
        assert r.status_code == 200, r.text
    assert server.writer.flush(10)
    with store.session_scope(db, readonly=True) as session:
        rows = list(session.scalars(select(Request)))
    assert len(rows) == 2
    for row in rows:
        stored = _stored_text(row)
        for client_text in ("zebra", "velvet-stop", "424242", "carol", "patient-4711"):
            assert client_text not in stored, f"{client_text!r} stored despite log: off"
        assert row.opted_out and row.segment == "completions" and row.num_drafts >= 1
        assert row.sampling["num_stop"] == 2 and row.sampling["max_tokens"] == 4


def test_logged_request_keeps_its_stop_strings_segment_and_user_tiny(client, server, db):
    client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 3,
                                         "stop": ["velvet"], "user": "dave-7"},
                headers={"x-autospec-segment": "support"})
    assert server.writer.flush(10)
    with store.session_scope(db, readonly=True) as session:
        row = session.scalars(select(Request)).one()
    assert row.segment == "support" and row.sampling["stop"] == ["velvet"]
    assert row.sampling["user"] == "dave-7"  # the end-user id is kept, not ignored
