"""What a deployment serves (its target and numerics) and what each replica reports.

- :func:`record_deployment` — a replica, at start, records the target spec, target id,
  revision and resolved dtype it serves; the row is the one source of truth the controller,
  ``train`` and ``evaluate`` read (:func:`get_deployment`). A change (a new target, another
  dtype) is audited as a ``note`` event.
- :func:`known_deployments` — the names a replica, a pointer, an evaluation or an event has
  given this store; :func:`deployment_known`: one of them, or one its traffic names;
- :func:`set_k_bands` — the controller sets the concurrency bands the replicas draft by
  (the policy's ``serving.k_bands``);
- :func:`report_replica` — a replica's heartbeat: the version it actually serves now;
  :func:`list_replicas` returns the reports of a deployment (newest first);
  :func:`remove_replica` drops a replica's report when it shuts down. A report older than
  :data:`FRESH_REPORT_S` is stale (:func:`fresh_reports_since`): the replica stopped without
  removing it (a crash) or the store was restored; ``autospec status`` leaves it out of what
  the replicas serve and ``autospec versions prune`` keeps no version for it.

Keyword-only arguments after the caller's session, as everywhere in the store.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from autospec.store.errors import Conflict
from autospec.store.models import (
    Deployment,
    Evaluation,
    Event,
    LivePointer,
    ReplicaReport,
    Request,
    SegmentPointer,
    utcnow,
)
from autospec.store.registry import check_actor, check_length, record_event

FRESH_REPORT_S = 60.0  # a replica report older than this is stale (the replica is gone?)


def fresh_reports_since(now: datetime) -> datetime:
    """The oldest ``reported_at`` of a report still fresh at ``now``."""
    return now - timedelta(seconds=FRESH_REPORT_S)


def get_deployment(session: Session, *, name: str) -> Deployment | None:
    return session.get(Deployment, name, populate_existing=True)


def known_deployments(session: Session) -> list[str]:
    """Every deployment a replica has recorded or reported, a pointer names, an evaluation
    replayed the traffic of, or an event names (a move, a controller's policy...), sorted."""
    names: set[str] = set()
    for column in (Deployment.name, ReplicaReport.deployment, LivePointer.deployment,
                   SegmentPointer.deployment, Evaluation.deployment, Event.deployment):
        names.update(session.scalars(select(column).where(column.is_not(None)).distinct()))
    return sorted(names)


def deployment_known(session: Session, name: str) -> bool:
    """Whether ``name`` is among :func:`known_deployments` or a logged request names it
    (read last, and only for that name: the requests table is the large one)."""
    return name in known_deployments(session) or session.scalar(
        select(Request.id).where(Request.deployment == name).limit(1)) is not None


def record_deployment(session: Session, *, name: str, target: str, target_id: str,
                      target_revision: str, dtype: str, actor: str,
                      engine: str = "native", threads: int | None = None) -> Deployment:
    """Record (or update) what ``name`` serves; a change is audited. :class:`Conflict` if
    another replica inserted the row at the same moment (retry: it is an update then)."""
    check_length("target id", target_id, Deployment.target_id)
    check_length("target revision", target_revision, Deployment.target_revision)
    check_actor(actor)
    row = get_deployment(session, name=name)
    now = utcnow()
    new = {"target": target, "target_id": target_id, "target_revision": target_revision,
           "dtype": dtype, "engine": engine, "threads": threads}
    if row is None:
        row = Deployment(name=name, updated_at=now, updated_by=actor, **new)
        try:
            with session.begin_nested():
                session.add(row)
        except IntegrityError:
            raise Conflict(f"deployment {name!r} was recorded concurrently") from None
        return row
    old = {key: getattr(row, key) for key in new}
    if old != new:
        record_event(session, kind="note", actor=actor, deployment=name,
                     reason=f"deployment {name} now serves {target_id} revision "
                            f"{target_revision} in {dtype}",
                     details={"type": "deployment", "from": old, "to": new})
    for key, value in new.items():
        setattr(row, key, value)
    row.updated_at, row.updated_by = now, actor
    session.flush()
    return row


def set_k_bands(session: Session, *, name: str, k_bands: str | None, actor: str) -> bool:
    """Set the concurrency bands ``name``'s replicas draft by (None: their own); audited as
    a ``note``. False when unchanged, or when no replica has recorded the deployment yet."""
    row = get_deployment(session, name=name)
    if row is None or row.k_bands == k_bands:
        return False
    record_event(session, kind="note", actor=actor, deployment=name,
                 reason=f"deployment {name} drafts by concurrency bands {k_bands or 'of its own'}"
                        f" (was {row.k_bands or 'its own'})",
                 details={"type": "k_bands", "from": row.k_bands, "to": k_bands})
    row.k_bands = k_bands
    session.flush()
    return True


def report_replica(session: Session, *, replica: str, deployment: str, version: str,
                   target_id: str, target_revision: str, dtype: str,
                   started_at: datetime) -> None:
    """Insert or refresh ``replica``'s report (the version it serves now)."""
    row = session.get(ReplicaReport, replica)
    values = {"deployment": deployment, "version": version, "target_id": target_id,
              "target_revision": target_revision, "dtype": dtype, "started_at": started_at,
              "reported_at": utcnow()}
    if row is None:
        session.add(ReplicaReport(replica=replica, **values))
    else:
        for key, value in values.items():
            setattr(row, key, value)
    session.flush()


def list_replicas(session: Session, *, deployment: str,
                  since: datetime | None = None) -> list[ReplicaReport]:
    """Reports of ``deployment``'s replicas (refreshed at or after ``since``), newest first."""
    query = (select(ReplicaReport).where(ReplicaReport.deployment == deployment)
             .order_by(ReplicaReport.reported_at.desc()))
    if since is not None:
        query = query.where(ReplicaReport.reported_at >= since)
    return list(session.scalars(query))


def remove_replica(session: Session, *, replica: str) -> None:
    session.execute(delete(ReplicaReport).where(ReplicaReport.replica == replica))
