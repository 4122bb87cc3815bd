"""``autospec status`` does not call a scheduler that is running its cycle 'overdue' (found
by an operator trial, 2026-12-07: a scheduler publishes the next run time when a cycle ends,
so for the whole of a cycle — an eagle3 training can take the hour its budget allows — the
published time was the running cycle's own, already past, and status read "overdue: no
scheduler running?"). Past and held by the scheduler that holds the deployment's lease: its
cycle is running; past and nobody holds the lease: overdue. Real SQLite file."""

from __future__ import annotations

from datetime import timedelta

from autospec import store
from autospec.controller import records
from autospec.controller.status import collect_status
from autospec.controller.status_view import _rows

from .helpers import fast_policy


def _status(db) -> dict:  # type: ignore[no-untyped-def]
    return collect_status(db, deployment="default", policy=fast_policy())


def test_a_past_run_whose_scheduler_holds_the_lease_is_running_not_overdue(db) -> None:
    with store.session_scope(db) as session:  # the run of 10 s ago is the cycle running now
        store.acquire_lease(session, name=records.schedule_lease_name("default"),
                            holder="host:1:abc", ttl=timedelta(seconds=-10))
        store.acquire_lease(session, name=records.lease_name("default"), holder="host:1:abc",
                            ttl=timedelta(minutes=5))
    data = _status(db)
    assert data["schedule"]["running"] and not data["schedule"]["overdue"], data["schedule"]
    (text,) = [str(value) for name, value in _rows(data) if name == "next scheduled cycle"]
    assert "(its cycle is running)" in text and "overdue" not in text, text
    with store.session_scope(db) as session:  # that scheduler died: its lease expired
        store.acquire_lease(session, name=records.lease_name("default"), holder="host:1:abc",
                            ttl=timedelta(seconds=-1))
    sched = _status(db)["schedule"]
    assert sched["overdue"] and not sched["running"], sched
    with store.session_scope(db) as session:  # another controller's job holds the lease
        store.acquire_lease(session, name=records.lease_name("default"), holder="host:2:def",
                            ttl=timedelta(minutes=5))
    assert _status(db)["schedule"]["overdue"]
