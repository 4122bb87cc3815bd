"""The live pointers: which version drafts a deployment's requests, and each segment's.

Every function takes the caller's ``session`` first and keyword-only arguments after it; the
caller owns the transaction, as in :mod:`autospec.store.registry`.

- :func:`set_live` moves a deployment's pointer with a compare-and-swap on
  ``live_pointer.generation``: of two concurrent promotions one wins and the other retries on
  the new state (or fails after a few tries) — there is never a moment with two live versions,
  and speculator ``state`` changes in the same transaction. :func:`rollback` moves the pointer
  back to ``previous_version`` in one step (the pointer then remembers the version rolled back
  from, so a second rollback undoes the first). Every move writes an :class:`Event`.
- Both take ``expect``: the version the caller judged the pointer by (the incumbent a cycle
  evaluated, the version a canary judged; :data:`UNPINNED`: a segment with no pointer of
  its own). It is read again under the pointer lock
  (:func:`~autospec.store.registry.lock_pointers`; SQLite's write lock) and a pointer that
  moved meanwhile — an operator's promotion during the cycle — is a :class:`Conflict`, not
  overwritten: a check made before the lock could be stale on PostgreSQL.
- A deployment may also keep a pointer per traffic segment (:class:`SegmentPointer`): the same
  functions take ``segment=``, the move is the same compare-and-swap on that row, its event
  carries ``details.segment``, and :func:`serving_version` says which version drafts a
  segment (its own pointer, else the deployment's).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from autospec.store.errors import Conflict, NotFound
from autospec.store.models import LivePointer, SegmentPointer, Speculator, utcnow
from autospec.store.registry import (
    DEFAULT_DEPLOYMENT,
    check_name,
    get_speculator,
    lock_pointers,
    record_event,
)

log = logging.getLogger(__name__)

_CAS_TRIES = 5
#: ``expect`` for a segment that has no pointer of its own (it follows the deployment's);
#: no version is so named (a name has no parentheses)
UNPINNED = "(unpinned)"


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
    expect: str | None = None,
) -> LivePointer | SegmentPointer:
    """Make ``version`` live for ``deployment`` — or one ``segment`` of it — (atomic; previous
    version remembered); a ``rejected`` one only as an ``override`` or with ``rejected_ok``."""
    check_name("deployment", deployment)
    if segment is not None:
        check_name("segment", segment)
    lock_pointers(session)
    spec = get_speculator(session, version=version)
    if (spec.meta or {}).get("pruned"):
        raise Conflict(f"{version!r} was pruned (its artifact deleted "
                       f"{spec.meta['pruned'].get('at', '')}); it cannot be made live again")
    if spec.state == "rejected" and kind != "override" and not rejected_ok:
        raise Conflict(f"{version!r} was rejected; `autospec promote --force --reason …` "
                       "makes it live anyway (an override)")
    return _move(session, _Key(deployment, segment), to=version, actor=actor, reason=reason,
                 kind=kind, details=details, expect=expect)


def rollback(
    session: Session,
    *,
    actor: str,
    reason: str,
    deployment: str = DEFAULT_DEPLOYMENT,
    segment: str | None = None,
    details: dict[str, Any] | None = None,
    expect: str | None = None,
) -> LivePointer | SegmentPointer:
    """Point the deployment (or one segment of it) back at its previous version, in one step
    (``expect``: the version it must still name, as for :func:`set_live`)."""
    key = _Key(deployment, segment)
    lock_pointers(session)
    pointer = get_live(session, deployment=deployment, segment=segment)
    _check_expected(key, pointer, expect)
    if pointer is None:
        raise NotFound(f"{key} has no live version to roll back")
    if pointer.previous_version is None:
        raise Conflict(f"{key} has no previous version to roll back to")
    return _move(session, key, to=pointer.previous_version, actor=actor,
                 reason=reason, kind="rollback", details=details, expect=expect)


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
    expect: str | None = None,
) -> LivePointer | SegmentPointer:
    for _ in range(_CAS_TRIES):
        pointer = get_live(session, deployment=key.deployment, segment=key.segment)
        _check_expected(key, pointer, expect)
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


def _check_expected(key: _Key, pointer: LivePointer | SegmentPointer | None,
                    expect: str | None) -> None:
    """A :class:`Conflict` where the pointer no longer names ``expect`` (None: no check)."""
    now = pointer.version if pointer is not None else UNPINNED
    if expect is not None and now != expect:
        raise Conflict(f"the live pointer of {key} moved from {expect} to {now} meanwhile "
                       "(another promotion or rollback); nothing was moved")


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
