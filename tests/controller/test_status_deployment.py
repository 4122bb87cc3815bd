"""``autospec status --deployment A`` on a store that another deployment shares: its
traffic counts A's requests only, and its recent failures are A's (and those naming no
deployment), found behind however many newer failures of the other."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from autospec import store
from autospec.controller.status import collect_status

from .helpers import fast_policy


def _rows(engine, deployment: str, n: int) -> None:  # type: ignore[no-untyped-def]
    start = datetime.now(timezone.utc)
    store.write_requests(engine, [store.RequestRecord(
        speculator_version="builtin-ngram", deployment=deployment, num_drafts=10,
        num_draft_tokens=40, num_accepted_tokens=10, opted_out=True,
        created_at=start + timedelta(milliseconds=i)) for i in range(n)])


def test_status_shows_the_deployments_own_traffic_and_failures(engine) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as s:
        store.record_event(s, kind="failure", actor="ctl-a", reason="A's cycle failed",
                           deployment="a")
        store.record_event(s, kind="failure", actor="ops", reason="store-wide")
        for i in range(10):
            store.record_event(s, kind="failure", actor="ctl-b", reason=f"B failure {i}",
                               deployment="b")
    _rows(engine, "a", 5)
    _rows(engine, "b", 50)
    status = collect_status(engine, deployment="a", policy=fast_policy())
    assert sorted(f["reason"] for f in status["failures"]) == ["A's cycle failed",
                                                               "store-wide"]
    assert status["traffic"] == {"last_hour": 5, "last_day": 5, "total": 5}
