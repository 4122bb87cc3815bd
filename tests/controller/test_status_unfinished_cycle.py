"""``autospec status`` says a cycle is running only while it can be (found by an operator
trial, 2026-12-07: a ``controller once`` killed mid-evaluation stayed ``running`` in recent
cycles after its lease had expired, beside "lease: free", until another controller closed
it). A cycle without an end runs only while its controller holds the deployment's lease and
no later cycle has started; otherwise it is ``unfinished`` and says why. Real SQLite file."""

from __future__ import annotations

from datetime import timedelta

from autospec import store
from autospec.controller import records
from autospec.controller.status import collect_status

from .helpers import fast_policy

LEASE = records.lease_name("default")


def _start(db, cycle_id: str, holder: str) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(db) as session:
        records.note(session, type_="cycle_start", actor=holder, deployment="default",
                     reason="cycle (once)", cycle_id=cycle_id, window_key=f"default/{cycle_id}",
                     trigger="once", token=1)


def _outcomes(db) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    rows = collect_status(db, deployment="default", policy=fast_policy())["cycles"]
    return [(r["cycle_id"], r["outcome"]) for r in rows]


def _lease(db, holder: str, ttl_s: float) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(db) as session:
        store.release_lease(session, name=LEASE, holder="h1")
        assert store.acquire_lease(session, name=LEASE, holder=holder,
                                   ttl=timedelta(seconds=ttl_s)) is not None


def test_a_cycle_whose_controller_holds_no_lease_is_unfinished_not_running(db) -> None:
    _start(db, "c1", "h1")
    _lease(db, "h1", 60)
    assert _outcomes(db) == [("c1", "running")]
    _lease(db, "h1", -1)  # its controller was killed: the lease expired
    assert _outcomes(db) == [("c1", "unfinished")]
    row = collect_status(db, deployment="default", policy=fast_policy())["cycles"][0]
    assert "not running: h1 holds no lease" in row["reasons"][0]
    assert "the next cycle records it interrupted" in row["reasons"][0]
    with store.session_scope(db) as session:
        store.release_lease(session, name=LEASE, holder="h1")
    assert _outcomes(db) == [("c1", "unfinished")]  # released: no lease at all
    _lease(db, "h2", 60)  # another controller holds it (its watch, say)
    assert _outcomes(db) == [("c1", "unfinished")]


def test_only_the_newest_cycle_of_the_holder_runs(db) -> None:
    _start(db, "c1", "h1")  # its end could not be written (the store failed), then the
    _start(db, "c2", "h1")  # same controller started its next cycle
    _lease(db, "h1", 60)
    assert _outcomes(db) == [("c2", "running"), ("c1", "unfinished")]
