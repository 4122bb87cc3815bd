"""The speculator registry, the live pointer and the audit log.

Every function takes the caller's ``session`` first and keyword-only arguments after it; the
caller owns the transaction (``with session_scope(engine) as session: ...``), so several calls
commit together or not at all.

- :func:`register_speculator` checks the artifact against its SHA-256 before storing the row
  (:mod:`autospec.store.artifacts`); a mismatch raises :class:`ArtifactError`.
- :func:`set_live` moves a deployment's pointer with a compare-and-swap on
  ``live_pointer.generation``: of two concurrent promotions one wins and the other retries on
  the new state (or fails after a few tries) — there is never a moment with two live versions,
  and speculator ``state`` changes in the same transaction. :func:`rollback` moves the pointer
  back to ``previous_version`` in one step (the pointer then remembers the version rolled back
  from, so a second rollback undoes the first). Every move writes an :class:`Event`.
- A deployment may also keep a pointer per traffic segment (:class:`SegmentPointer`): the same
  functions take ``segment=``, the move is the same compare-and-swap on that row, its event
  carries ``details.segment``, and :func:`serving_version` says which version drafts a
  segment (its own pointer, else the deployment's).
- :func:`next_version` makes the next free name ``<kind>-<YYYYMMDD>-<NNNN>``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from autospec.store.artifacts import artifact_sha256, local_path
from autospec.store.errors import ArtifactError, Conflict, NotFound, StoreError
from autospec.store.models import (
    EVENT_KINDS,
    SPECULATOR_STATES,
    Event,
    LivePointer,
    SegmentPointer,
    Speculator,
    utcnow,
)

log = logging.getLogger(__name__)

DEFAULT_DEPLOYMENT = "default"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CAS_TRIES = 5
# pg_advisory_xact_lock key serialising pointer moves with `versions prune` (any constant;
# SQLite needs none: both write under BEGIN IMMEDIATE)
_POINTER_LOCK = 0x6175746F73706563  # "autospec"


def lock_pointers(session: Session) -> None:
    """Hold, until the transaction ends, the lock that makes pointer moves and a prune take
    turns (PostgreSQL): a prune never marks a version that a concurrent promotion is making
    live, and a promotion never makes live a version a concurrent prune has marked."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_advisory_xact_lock(_POINTER_LOCK)))


def _check_name(what: str, value: str) -> None:
    if not isinstance(value, str) or not _NAME.match(value):
        raise StoreError(
            f"invalid {what} {value!r}: use 1-64 letters, digits, '.', '_' or '-'"
        )


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
) -> list[Event]:
    """Newest first."""
    query = select(Event).order_by(Event.created_at.desc(), Event.id.desc()).limit(limit)
    if kinds:
        query = query.where(Event.kind.in_(kinds))
    if deployment is not None:
        query = query.where(Event.deployment == deployment)
    if since is not None:
        query = query.where(Event.created_at >= since)
    return list(session.scalars(query))


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
    _check_name("version", version)
    _check_name("kind", kind)
    if not _SHA256.match(sha256):
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


def next_version(session: Session, *, kind: str, now: datetime | None = None) -> str:
    """The next free version name for ``kind`` today: ``<kind>-<YYYYMMDD>-<NNNN>``."""
    _check_name("kind", kind)
    prefix = f"{kind}-{(now or utcnow()):%Y%m%d}-"
    names = session.scalars(select(Speculator.version).where(
        Speculator.version.like(f"{prefix}%")))
    numbers = [int(n[len(prefix):]) for n in names if n[len(prefix):].isdigit()]
    return f"{prefix}{max(numbers, default=0) + 1:04d}"


# -- live pointer ----------------------------------------------------------------------------


def get_live(session: Session, *, deployment: str = DEFAULT_DEPLOYMENT,
             segment: str | None = None) -> LivePointer | SegmentPointer | None:
    """The deployment's pointer (version, previous_version, generation), or None; with
    ``segment``, that segment's own pointer (None: the segment follows the deployment's)."""
    if segment is None:
        return session.get(LivePointer, deployment, populate_existing=True)
    return session.get(SegmentPointer, (deployment, segment), populate_existing=True)


def list_segment_pointers(session: Session, *,
                          deployment: str = DEFAULT_DEPLOYMENT) -> list[SegmentPointer]:
    """The deployment's per-segment pointers, by segment name."""
    return list(session.scalars(select(SegmentPointer)
                                .where(SegmentPointer.deployment == deployment)
                                .order_by(SegmentPointer.segment)
                                .execution_options(populate_existing=True)))


def pointers_by_version(session: Session) -> dict[str, list[str]]:
    """Every pointer, by the version it names: ``deployment`` for a deployment's,
    ``deployment/segment`` for a segment's."""
    named: dict[str, list[str]] = {}
    for live in session.scalars(select(LivePointer).order_by(LivePointer.deployment)):
        named.setdefault(live.version, []).append(live.deployment)
    for seg in session.scalars(select(SegmentPointer).order_by(SegmentPointer.deployment,
                                                               SegmentPointer.segment)):
        named.setdefault(seg.version, []).append(f"{seg.deployment}/{seg.segment}")
    return named


def serving_version(session: Session, *, deployment: str = DEFAULT_DEPLOYMENT,
                    segment: str | None = None) -> str | None:
    """The version that drafts ``segment``'s requests: its own pointer's, else the
    deployment's (None when the deployment has no live version)."""
    pointer = get_live(session, deployment=deployment, segment=segment) if segment else None
    pointer = pointer or get_live(session, deployment=deployment)
    return pointer.version if pointer is not None else None


def set_live(
    session: Session,
    *,
    version: str,
    actor: str,
    reason: str,
    deployment: str = DEFAULT_DEPLOYMENT,
    segment: str | None = None,
    kind: str = "promotion",
    details: dict[str, Any] | None = None,
    rejected_ok: bool = False,
) -> LivePointer | SegmentPointer:
    """Make ``version`` live for ``deployment`` — or one ``segment`` of it — (atomic; previous
    version remembered); a ``rejected`` one only as an ``override`` or with ``rejected_ok``."""
    _check_name("deployment", deployment)
    if segment is not None:
        _check_name("segment", segment)
    lock_pointers(session)
    spec = get_speculator(session, version=version)
    if (spec.meta or {}).get("pruned"):
        raise Conflict(f"{version!r} was pruned (its artifact deleted "
                       f"{spec.meta['pruned'].get('at', '')}); it cannot be made live again")
    if spec.state == "rejected" and kind != "override" and not rejected_ok:
        raise Conflict(f"{version!r} was rejected; `autospec promote --force --reason …` "
                       "makes it live anyway (an override)")
    return _move(session, _Key(deployment, segment), to=version, actor=actor, reason=reason,
                 kind=kind, details=details)


def rollback(
    session: Session,
    *,
    actor: str,
    reason: str,
    deployment: str = DEFAULT_DEPLOYMENT,
    segment: str | None = None,
    details: dict[str, Any] | None = None,
) -> LivePointer | SegmentPointer:
    """Point the deployment (or one segment of it) back at its previous version, in one step."""
    key = _Key(deployment, segment)
    pointer = get_live(session, deployment=deployment, segment=segment)
    if pointer is None:
        raise NotFound(f"{key} has no live version to roll back")
    if pointer.previous_version is None:
        raise Conflict(f"{key} has no previous version to roll back to")
    return _move(session, key, to=pointer.previous_version, actor=actor,
                 reason=reason, kind="rollback", details=details)


def clear_segment(session: Session, *, segment: str, actor: str, reason: str,
                  deployment: str = DEFAULT_DEPLOYMENT) -> str:
    """Drop ``segment``'s own pointer: its requests are drafted by the deployment's version
    again. Returns the version the segment had (retired unless another pointer names it);
    the ``unpin`` event names it and the version drafting the segment now."""
    key = _Key(deployment, segment)
    lock_pointers(session)
    pointer = get_live(session, deployment=deployment, segment=segment)
    if pointer is None:
        raise NotFound(f"{key} has no pointer of its own (it follows the deployment's)")
    deleted = session.execute(
        key.where(delete(SegmentPointer)).where(SegmentPointer.generation == pointer.generation)
        .execution_options(synchronize_session=False))
    if deleted.rowcount != 1:
        raise Conflict(f"live pointer of {key} changed meanwhile; try again")
    old = pointer.version
    now_serving = serving_version(session, deployment=deployment)
    _update_states(session, new=now_serving or old, old=old, rolled_back=False)
    record_event(session, kind="unpin", actor=actor, reason=reason, deployment=deployment,
                 version=now_serving, from_version=old, details={"segment": segment})
    log.info("unpin: segment %r of %r no longer drafted by %s (%s)", segment, deployment,
             old, actor)
    return old


@dataclass(frozen=True)
class _Key:
    """One pointer: a deployment's (``segment`` None) or one of its segments'."""

    deployment: str
    segment: str | None

    def __str__(self) -> str:
        if self.segment is None:
            return f"deployment {self.deployment!r}"
        return f"segment {self.segment!r} of deployment {self.deployment!r}"

    @property
    def model(self) -> type[LivePointer] | type[SegmentPointer]:
        return LivePointer if self.segment is None else SegmentPointer

    def where(self, query: Any) -> Any:
        query = query.where(self.model.deployment == self.deployment)
        if self.segment is not None:
            query = query.where(SegmentPointer.segment == self.segment)
        return query

    def row(self, **values: Any) -> LivePointer | SegmentPointer:
        if self.segment is None:
            return LivePointer(deployment=self.deployment, **values)
        return SegmentPointer(deployment=self.deployment, segment=self.segment, **values)


def _move(
    session: Session,
    key: _Key,
    *,
    to: str,
    actor: str,
    reason: str,
    kind: str,
    details: dict[str, Any] | None,
) -> LivePointer | SegmentPointer:
    for _ in range(_CAS_TRIES):
        pointer = get_live(session, deployment=key.deployment, segment=key.segment)
        if pointer is not None and pointer.version == to:
            raise Conflict(f"{to!r} is already live for {key}")
        moved = _compare_and_swap(session, key, pointer, to, actor)
        if moved:
            break
    else:
        raise Conflict(f"live pointer of {key} kept changing; try again")
    previous = pointer.version if pointer is not None else None
    _update_states(session, new=to, old=previous, rolled_back=kind == "rollback")
    if key.segment is not None:
        details = {**(details or {}), "segment": key.segment}
    record_event(session, kind=kind, actor=actor, reason=reason, deployment=key.deployment,
                 version=to, from_version=previous, details=details)
    log.info("%s: %s -> %s for %s (%s)", kind, previous, to, key, actor)
    result = get_live(session, deployment=key.deployment, segment=key.segment)
    assert result is not None
    return result


def _compare_and_swap(
    session: Session, key: _Key, pointer: LivePointer | SegmentPointer | None, to: str,
    actor: str
) -> bool:
    """Move the pointer iff nobody moved it since we read it; False means re-read and retry."""
    now = utcnow()
    if pointer is None:
        try:
            with session.begin_nested():
                session.add(key.row(version=to, previous_version=None, generation=1,
                                    updated_at=now, updated_by=actor))
        except IntegrityError:
            return False
        return True
    result = session.execute(
        key.where(update(key.model))
        .where(key.model.generation == pointer.generation)
        .values(version=to, previous_version=pointer.version,
                generation=pointer.generation + 1, updated_at=now, updated_by=actor)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def _update_states(session: Session, *, new: str, old: str | None, rolled_back: bool) -> None:
    session.execute(
        update(Speculator).where(Speculator.version == new).values(state="live")
        .execution_options(synchronize_session=False)
    )
    if old is not None and old != new:
        still_live = session.scalar(
            select(func.count()).select_from(LivePointer).where(LivePointer.version == old)
        ) or session.scalar(
            select(func.count()).select_from(SegmentPointer).where(SegmentPointer.version == old)
        )
        if not still_live:
            session.execute(
                update(Speculator).where(Speculator.version == old)
                .values(state="rolled_back" if rolled_back else "retired")
                .execution_options(synchronize_session=False)
            )
    session.expire_all()
