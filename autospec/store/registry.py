"""The speculator registry and the audit log (the live pointers: :mod:`autospec.store.pointers`).

Every function takes the caller's ``session`` first and keyword-only arguments after it; the
caller owns the transaction (``with session_scope(engine) as session: ...``), so several calls
commit together or not at all.

- :func:`register_speculator` checks the artifact against its SHA-256 before storing the row
  (:mod:`autospec.store.artifacts`); a mismatch raises :class:`ArtifactError`.
- :func:`record_event` appends to the audit log; :func:`lock_pointers` serialises pointer
  moves with ``versions prune`` on PostgreSQL.
- :func:`next_version` makes the next free name ``<kind>-<YYYYMMDD>-<NNNN>``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from autospec.names import DEFAULT_DEPLOYMENT as DEFAULT_DEPLOYMENT  # re-exported
from autospec.names import name_problem
from autospec.store.artifacts import artifact_sha256, local_path
from autospec.store.errors import ArtifactError, Conflict, NotFound, StoreError
from autospec.store.models import (
    EVENT_KINDS,
    SPECULATOR_STATES,
    Event,
    Speculator,
    utcnow,
)

log = logging.getLogger(__name__)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# pg_advisory_xact_lock key serialising pointer moves with `versions prune` (any constant;
# SQLite needs none: both write under BEGIN IMMEDIATE)
_POINTER_LOCK = 0x6175746F73706563  # "autospec"


def lock_pointers(session: Session) -> None:
    """Hold, until the transaction ends, the lock that makes pointer moves and a prune take
    turns (PostgreSQL): a prune never marks a version that a concurrent promotion is making
    live, and a promotion never makes live a version a concurrent prune has marked."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_advisory_xact_lock(_POINTER_LOCK)))


def check_name(what: str, value: str) -> None:
    """A :class:`StoreError` unless ``value`` is a name the store takes (a version, kind,
    deployment or segment: 1-64 letters, digits, ``.``, ``_``, ``-``)."""
    problem = name_problem(what, value)
    if problem:
        raise StoreError(problem)


def check_length(what: str, value: str | None, column: Any) -> None:
    """A :class:`StoreError` when ``value`` is longer than the ``String`` ``column`` holds
    (SQLite would keep it, PostgreSQL refuses it mid-transaction)."""
    limit = getattr(column.type, "length", None)
    if value is not None and limit is not None and len(value) > limit:
        raise StoreError(f"{what} {value[:40]!r}… is {len(value)} characters long; the store "
                         f"keeps at most {limit}")


def check_actor(actor: str) -> None:
    """A :class:`StoreError` unless the audit log can record ``actor`` (at most 128 characters)."""
    check_length("actor", actor, Event.actor)


# -- audit log -------------------------------------------------------------------------------


def record_event(
    session: Session,
    *,
    kind: str,
    actor: str,
    reason: str = "",
    deployment: str | None = None,
    version: str | None = None,
    from_version: str | None = None,
    details: dict[str, Any] | None = None,
) -> Event:
    """Append one audit event (kinds: :data:`autospec.store.models.EVENT_KINDS`)."""
    if kind not in EVENT_KINDS:
        raise StoreError(f"unknown event kind {kind!r}; known: {', '.join(EVENT_KINDS)}")
    check_actor(actor)
    for what, value, column in (("deployment", deployment, Event.deployment),
                                ("version", version, Event.version),
                                ("from_version", from_version, Event.from_version)):
        check_length(what, value, column)
    event = Event(
        created_at=utcnow(),
        kind=kind,
        actor=actor,
        reason=reason,
        deployment=deployment,
        version=version,
        from_version=from_version,
        details=details,
    )
    session.add(event)
    session.flush()
    return event


def list_events(
    session: Session,
    *,
    kinds: Sequence[str] | None = None,
    deployment: str | None = None,
    since: datetime | None = None,
    limit: int = 100,
    offset: int = 0,
    with_global: bool = False,
    segment: str | None = None,
) -> list[Event]:
    """Newest first, ``limit`` of them after skipping ``offset``. ``deployment``: only its
    events, and with ``with_global`` also those naming no deployment; ``segment``: only the
    events whose ``details.segment`` is that segment."""
    query = select(Event).order_by(Event.created_at.desc(), Event.id.desc())
    if kinds:
        query = query.where(Event.kind.in_(kinds))
    if deployment is not None:
        named = Event.deployment == deployment
        query = query.where(or_(named, Event.deployment.is_(None)) if with_global else named)
    if since is not None:
        query = query.where(Event.created_at >= since)
    if segment is not None:  # json_extract on SQLite, ->> on PostgreSQL
        query = query.where(Event.details["segment"].as_string() == segment)
    return list(session.scalars(query.offset(offset).limit(limit)))


# -- speculators -----------------------------------------------------------------------------


def register_speculator(
    session: Session,
    *,
    version: str,
    kind: str,
    target_id: str,
    artifact_uri: str,
    sha256: str,
    target_revision: str | None = None,
    parent: str | None = None,
    draft_vocab_size: int | None = None,
    training_run_id: int | None = None,
    meta: dict[str, Any] | None = None,
    actor: str = "autospec",
    verify: bool = True,
) -> Speculator:
    """Register a candidate version after checking its artifact against ``sha256``.

    ``verify=False`` skips the check (only for artifacts this machine cannot read, e.g. an
    object-store URI; the event records that it was not verified).
    """
    check_name("version", version)
    check_name("kind", kind)
    check_length("target id", target_id, Speculator.target_id)
    check_length("target revision", target_revision, Speculator.target_revision)
    check_actor(actor)
    if not _SHA256.fullmatch(sha256):
        raise ArtifactError(f"sha256 {sha256!r} is not 64 lower-case hex digits")
    if verify:
        _verify_artifact(artifact_uri, sha256)
    if session.get(Speculator, version) is not None:
        raise Conflict(f"speculator version {version!r} is already registered")
    if parent is not None and session.get(Speculator, parent) is None:
        raise NotFound(f"parent version {parent!r} is not registered")
    spec = Speculator(
        version=version,
        kind=kind,
        parent=parent,
        target_id=target_id,
        target_revision=target_revision,
        artifact_uri=str(artifact_uri),
        sha256=sha256,
        draft_vocab_size=draft_vocab_size,
        training_run_id=training_run_id,
        created_at=utcnow(),
        state="candidate",
        meta=meta,
    )
    session.add(spec)
    try:
        session.flush()
    except IntegrityError as exc:
        raise Conflict(f"cannot register {version!r}: {exc.orig}") from None
    record_event(session, kind="registration", actor=actor, version=version,
                 details={"kind": kind, "sha256": sha256, "verified": verify})
    return spec


def _verify_artifact(artifact_uri: str, sha256: str) -> None:
    if local_path(artifact_uri) is None:
        raise ArtifactError(
            f"cannot verify artifact {artifact_uri}: not a local path; pass verify=False "
            f"if it was verified where it was written"
        )
    actual = artifact_sha256(artifact_uri)
    if actual != sha256:
        raise ArtifactError(f"artifact {artifact_uri} has SHA-256 {actual}, expected {sha256}")


def registered_with(session: Session, artifact: Path, sha256: str, *,
                    training_run_id: int | None = None) -> bool:
    """Whether version ``artifact.name`` is registered with the artifact at ``artifact`` and
    ``sha256`` (and by run ``training_run_id``, if given): asked after a registering COMMIT
    raised, which may have landed all the same (the connection lost while its reply was in
    flight)."""
    row = session.get(Speculator, artifact.name)
    return row is not None and row.artifact_uri == str(artifact) and row.sha256 == sha256 \
        and (training_run_id is None or row.training_run_id == training_run_id)


def get_speculator(session: Session, *, version: str) -> Speculator:
    spec = session.get(Speculator, version)
    if spec is None:
        raise NotFound(f"speculator version {version!r} is not registered")
    return spec


def list_speculators(
    session: Session, *, state: str | None = None, kind: str | None = None, limit: int = 100
) -> list[Speculator]:
    """Newest first."""
    query = select(Speculator).order_by(Speculator.created_at.desc()).limit(limit)
    if state is not None:
        query = query.where(Speculator.state == state)
    if kind is not None:
        query = query.where(Speculator.kind == kind)
    return list(session.scalars(query))


def set_state(session: Session, *, version: str, state: str, actor: str, reason: str = "") -> None:
    """Mark a version ``rejected`` (or another non-live state); live moves go through set_live."""
    if state not in SPECULATOR_STATES or state == "live":
        raise StoreError(f"cannot set state {state!r}; use set_live to make a version live")
    spec = get_speculator(session, version=version)
    if spec.state == "live":
        raise Conflict(f"{version!r} is live; promote another version or roll back first")
    spec.state = state
    if state == "rejected":
        record_event(session, kind="rejection", actor=actor, reason=reason, version=version)


def next_version(session: Session, *, kind: str, now: datetime | None = None,
                 taken: Callable[[str], bool] | None = None) -> str:
    """The next free version name for ``kind`` today: ``<kind>-<YYYYMMDD>-<NNNN>``, past the
    newest registered one and past any name ``taken`` says is in use (an artifact directory
    left behind by a store reset, say)."""
    check_name("kind", kind)
    prefix = f"{kind}-{(now or utcnow()):%Y%m%d}-"
    names = session.scalars(select(Speculator.version).where(
        Speculator.version.like(f"{prefix}%")))
    numbers = [int(n[len(prefix):]) for n in names if n[len(prefix):].isdigit()]
    number = max(numbers, default=0) + 1
    while taken is not None and taken(f"{prefix}{number:04d}"):
        number += 1
    return f"{prefix}{number:04d}"
