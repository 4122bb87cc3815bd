"""Holding the controller lease while working: acquire, heartbeat, fence, release.

:class:`HeldLease` wraps :func:`autospec.store.acquire_lease`: a background thread renews
the lease every third of its TTL; if a renewal fails (the lease expired and someone else
took it) :attr:`HeldLease.lost` turns true and long work (training) stops. Before any
pointer move the caller calls :meth:`HeldLease.fence` *inside the move's transaction*: it
renews the lease (a row write, so on PostgreSQL a concurrent acquirer waits for our
commit, and on SQLite the write lock serialises them) and checks the fencing token is
still ours — a controller that lost its lease can never move the pointer.

A holder that dies simply stops renewing; its lease frees after ``ttl``. A holder cut off
from the store for longer than ``ttl`` keeps its lease when the store is back, unless
another holder took it meanwhile (then :attr:`HeldLease.lost`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from autospec import store

log = logging.getLogger(__name__)


class LeaseLost(RuntimeError):
    """The controller no longer holds its lease (expired and taken, or fenced out)."""


def holder_name() -> str:
    """A name unique to this controller instance: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class HeldLease:
    """A lease this process holds; use :func:`try_acquire` to get one."""

    def __init__(self, engine: Engine, grant: store.LeaseGrant, ttl: timedelta) -> None:
        self.engine = engine
        self.grant = grant
        self.ttl = ttl
        self._lost = threading.Event()
        self._after: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, daemon=True,
                                        name=f"lease-{grant.name}")
        self._thread.start()

    @property
    def name(self) -> str:
        return self.grant.name

    @property
    def holder(self) -> str:
        return self.grant.holder

    @property
    def token(self) -> int:
        return self.grant.token

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def _heartbeat(self) -> None:
        interval = max(self.ttl.total_seconds() / 3, 0.05)
        while not self._stop.wait(interval):
            try:
                with store.session_scope(self.engine) as session:
                    ok = store.renew_lease(session, name=self.name, holder=self.holder,
                                           ttl=self.ttl)
            except (store.StoreError, SQLAlchemyError) as exc:  # a store outage (locked,
                # down): keep trying; once the store is back the lease is extended unless
                # another holder took it meanwhile (an uncaught one ended this thread)
                log.warning("lease %s: renewal failed: %s", self.name,
                            str(exc).splitlines()[0][:200])
                continue
            if not ok:
                log.error("lease %s: lost (expired or taken over)", self.name)
                self._lost.set()
                return

    def fence(self, session: Session) -> None:
        """Renew and check the token inside the caller's transaction; :class:`LeaseLost`."""
        if self.lost or not store.renew_lease(session, name=self.name, holder=self.holder,
                                              ttl=self.ttl):
            self._lost.set()
            raise LeaseLost(f"lease {self.name} is no longer held by {self.holder}")
        row = store.get_lease(session, name=self.name)
        if row is None or row.token != self.token:
            self._lost.set()
            raise LeaseLost(f"lease {self.name}: fencing token {self.token} is stale "
                            f"(now {row.token if row else 'none'})")

    def on_release(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once the lease is released (lost or not)."""
        self._after.append(fn)

    def release(self) -> None:
        try:
            self._stop.set()
            self._thread.join(timeout=5)
            if not self.lost:
                self._release_row()
        finally:
            while self._after:
                self._after.pop()()

    def _release_row(self) -> None:
        try:
            with store.session_scope(self.engine) as session:
                store.release_lease(session, name=self.name, holder=self.holder)
        except (store.StoreError, SQLAlchemyError) as exc:  # it expires by itself
            log.warning("lease %s: release failed (it will expire): %s", self.name,
                        str(exc).splitlines()[0][:200])


def try_acquire(engine: Engine, *, name: str, holder: str, ttl: timedelta) -> HeldLease | None:
    """The lease, held and heart-beaten, or None when another holder has it."""
    with store.session_scope(engine) as session:
        grant = store.acquire_lease(session, name=name, holder=holder, ttl=ttl)
    if grant is None:
        return None
    log.debug("lease %s acquired by %s (token %d)", name, holder, grant.token)
    return HeldLease(engine, grant, ttl)


def acquire_with_turn(turn: threading.Lock, engine: Engine, *, name: str, holder: str,
                      ttl: timedelta) -> HeldLease | None:
    """The lease, taken under ``turn`` — a process-local lock held with it and given back
    when it is released: ``controller run``'s cycle and watch jobs run on two threads under
    one holder name, and the (re-entrant) lease alone would let the second in. None, with
    the turn given back, while another job or holder has it; a store error (locked, down)
    gives it back too, so the controller runs again once the store answers."""
    if not turn.acquire(blocking=False):
        return None
    lease = None
    try:
        lease = try_acquire(engine, name=name, holder=holder, ttl=ttl)
        return lease
    finally:
        if lease is None:
            turn.release()
        else:
            lease.on_release(turn.release)
