"""Named leases for single-flight work across processes and hosts (e.g. the controller cycle).

A lease row says who holds ``name`` until when. :func:`acquire_lease` succeeds if the lease is
free, expired, or already ours; otherwise it returns None. Both steps are single statements
(INSERT … ON CONFLICT DO NOTHING, then a conditional UPDATE), so two processes racing on
SQLite or PostgreSQL can never both win. Each acquisition from someone else bumps ``token``
(a fencing token: work stamped with an old token is stale). Times come from the caller's
clock (UTC); hosts sharing a lease need synchronised clocks (NTP), and ``ttl`` should be
much longer than the clock skew. Commit the session before relying on the lease.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import case, delete, select, update
from sqlalchemy.orm import Session

from autospec.store.models import Lease, utcnow


@dataclass(frozen=True)
class LeaseGrant:
    name: str
    holder: str
    token: int
    expires_at: datetime


def _insert_if_absent(session: Session, row: dict[str, object]) -> bool:
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    elif dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:  # pragma: no cover
        raise NotImplementedError(f"leases need SQLite or PostgreSQL, not {dialect}")
    table = Lease.__table__
    stmt = (
        insert(table).values(**row)
        .on_conflict_do_nothing(index_elements=["name"])
        .returning(table.c.name)  # rowcount of ON CONFLICT DO NOTHING is not portable
    )
    return session.execute(stmt).first() is not None


def acquire_lease(
    session: Session, *, name: str, holder: str, ttl: timedelta, now: datetime | None = None
) -> LeaseGrant | None:
    """Take (or extend, if already ours) the lease ``name`` for ``ttl``; None if someone has it."""
    now = now or utcnow()
    expires = now + ttl
    row = {"name": name, "holder": holder, "token": 1, "acquired_at": now, "expires_at": expires}
    if not _insert_if_absent(session, row):
        taken = session.execute(
            update(Lease)
            .where(Lease.name == name)
            .where((Lease.expires_at <= now) | (Lease.holder == holder))
            .values(
                holder=holder,
                acquired_at=now,
                expires_at=expires,
                token=case((Lease.holder == holder, Lease.token), else_=Lease.token + 1),
            )
            .execution_options(synchronize_session=False)
        ).rowcount
        if not taken:
            return None
    token = session.scalar(select(Lease.token).where(Lease.name == name))
    assert token is not None
    return LeaseGrant(name=name, holder=holder, token=token, expires_at=expires)


def renew_lease(
    session: Session, *, name: str, holder: str, ttl: timedelta, now: datetime | None = None
) -> bool:
    """Extend our lease; False if someone else holds it now (or nobody does). A lease that
    expired while its holder could not reach the store (an outage longer than ``ttl``) is
    extended too when nobody took it meanwhile: taking it changes the holder and bumps the
    token, so a holder still named on the row has been the only one all along."""
    now = now or utcnow()
    return bool(
        session.execute(
            update(Lease)
            .where(Lease.name == name, Lease.holder == holder)
            .values(expires_at=now + ttl)
            .execution_options(synchronize_session=False)
        ).rowcount
    )


def release_lease(session: Session, *, name: str, holder: str) -> bool:
    """Give the lease up; False if we did not hold it."""
    return bool(
        session.execute(
            delete(Lease)
            .where(Lease.name == name, Lease.holder == holder)
            .execution_options(synchronize_session=False)
        ).rowcount
    )


def get_lease(session: Session, *, name: str) -> Lease | None:
    return session.get(Lease, name, populate_existing=True)
