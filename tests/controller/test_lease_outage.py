"""A lease's heartbeat lives through a store outage shorter than its TTL (found by the soak's
database fault, issue 28, 2026-12-04: a renewal that hit ``database is locked`` past the busy
timeout raised a bare ``OperationalError``, which ended the heartbeat thread; the lease then
expired after the store was back, and the running cycle failed with "no longer held").
Real SQLite file, no model."""

from __future__ import annotations

import sqlite3
import time
from datetime import timedelta

from autospec import store
from autospec.controller.lease import try_acquire


def test_the_heartbeat_survives_an_outage_shorter_than_the_ttl(sqlite_url: str) -> None:
    store.open_store(sqlite_url, upgrade=True).dispose()
    engine = store.make_engine(sqlite_url, busy_timeout_s=0.2)
    lease = try_acquire(engine, name="controller:t", holder="h", ttl=timedelta(seconds=3))
    assert lease is not None
    try:
        lock = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), timeout=5.0,
                               isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")  # renewals every 1 s fail for 1.6 s
        time.sleep(1.6)
        lock.execute("ROLLBACK")
        lock.close()
        time.sleep(3.0)  # past the TTL counted from before the outage
        assert lease._thread.is_alive() and not lease.lost
        with store.session_scope(engine) as session:
            row = store.get_lease(session, name="controller:t")
            assert row is not None and row.holder == "h"
            lease.fence(session)  # still ours, renewed after the outage
    finally:
        lease.release()
        engine.dispose()


def test_an_outage_longer_than_the_ttl_keeps_the_lease_nobody_took(sqlite_url: str) -> None:
    """The 30-minute vLLM soak (2026-12-04): a 60 s lock on a 30 s lease failed the cycle
    that had just passed its gate ("no longer held"), with no other controller running."""
    store.open_store(sqlite_url, upgrade=True).dispose()
    engine = store.make_engine(sqlite_url, busy_timeout_s=0.2)
    lease = try_acquire(engine, name="controller:t", holder="h", ttl=timedelta(seconds=1))
    assert lease is not None
    try:
        lock = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), timeout=5.0,
                               isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
        time.sleep(2.5)  # past the TTL: the row has expired when the store is back
        lock.execute("ROLLBACK")
        lock.close()
        time.sleep(1.0)
        assert not lease.lost
        with store.session_scope(engine) as session:
            lease.fence(session)
            row = store.get_lease(session, name="controller:t")
            assert row is not None and row.token == lease.token
    finally:
        lease.release()
        engine.dispose()


def test_a_lease_taken_over_during_an_outage_is_lost(sqlite_url: str) -> None:
    store.open_store(sqlite_url, upgrade=True).dispose()
    engine = store.make_engine(sqlite_url, busy_timeout_s=0.2)
    lease = try_acquire(engine, name="controller:t", holder="h", ttl=timedelta(seconds=1))
    assert lease is not None
    try:
        lock = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), timeout=5.0,
                               isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
        time.sleep(1.5)
        # another controller, which still reaches the store, takes the expired lease
        lock.execute("UPDATE leases SET holder = 'other', token = token + 1 "
                     "WHERE name = 'controller:t'")
        lock.execute("COMMIT")
        lock.close()
        time.sleep(1.0)
        assert lease.lost
    finally:
        lease.release()
        engine.dispose()
