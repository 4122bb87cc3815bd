"""A lease's heartbeat lives through a store outage shorter than its TTL (found by the soak's
database fault, issue 28, 2026-12-04: a renewal that hit ``database is locked`` past the busy
timeout raised a bare ``OperationalError``, which ended the heartbeat thread; the lease then
expired after the store was back, and the running cycle failed with "no longer held").
Real SQLite file, no model."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from autospec import store
from autospec.controller.lease import HeldLease, try_acquire


@contextmanager
def _held(sqlite_url: str, ttl_s: float) -> Iterator[tuple[HeldLease, object]]:
    """The lease ``controller:t`` held by ``h`` on a fresh store, and the store's engine."""
    store.open_store(sqlite_url, upgrade=True).dispose()
    engine = store.make_engine(sqlite_url, busy_timeout_s=0.2)
    lease = try_acquire(engine, name="controller:t", holder="h", ttl=timedelta(seconds=ttl_s))
    assert lease is not None
    try:
        yield lease, engine
    finally:
        lease.release()
        engine.dispose()


def _outage(sqlite_url: str, seconds: float, *, then: str | None = None) -> None:
    """Hold an exclusive lock on the SQLite file for ``seconds``; with ``then``, run that
    statement under the lock and commit it (another writer that still reaches the store)."""
    lock = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), timeout=5.0,
                           isolation_level=None)
    try:
        lock.execute("BEGIN EXCLUSIVE")
        time.sleep(seconds)
        if then is None:
            lock.execute("ROLLBACK")
        else:
            lock.execute(then)
            lock.execute("COMMIT")
    finally:
        lock.close()


def test_the_heartbeat_survives_an_outage_shorter_than_the_ttl(sqlite_url: str) -> None:
    with _held(sqlite_url, ttl_s=3) as (lease, engine):
        _outage(sqlite_url, 1.6)  # renewals every 1 s fail for 1.6 s
        time.sleep(3.0)  # past the TTL counted from before the outage
        assert lease._thread.is_alive() and not lease.lost
        with store.session_scope(engine) as session:
            row = store.get_lease(session, name="controller:t")
            assert row is not None and row.holder == "h"
            lease.fence(session)  # still ours, renewed after the outage


def test_an_outage_longer_than_the_ttl_keeps_the_lease_nobody_took(sqlite_url: str) -> None:
    """The 30-minute vLLM soak (2026-12-04): a 60 s lock on a 30 s lease failed the cycle
    that had just passed its gate ("no longer held"), with no other controller running."""
    with _held(sqlite_url, ttl_s=1) as (lease, engine):
        _outage(sqlite_url, 2.5)  # past the TTL: the row has expired when the store is back
        time.sleep(1.0)
        assert not lease.lost
        with store.session_scope(engine) as session:
            lease.fence(session)
            row = store.get_lease(session, name="controller:t")
            assert row is not None and row.token == lease.token


def test_a_lease_taken_over_during_an_outage_is_lost(sqlite_url: str) -> None:
    with _held(sqlite_url, ttl_s=1) as (lease, _):
        # another controller, which still reaches the store, takes the expired lease
        _outage(sqlite_url, 1.5, then="UPDATE leases SET holder = 'other', "
                "token = token + 1 WHERE name = 'controller:t'")
        time.sleep(1.0)
        assert lease.lost
