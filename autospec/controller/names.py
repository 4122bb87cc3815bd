"""Deployment (and segment) names an operator types: one the store has never heard of is
named, with the closest known one (``--deployment prodd`` would otherwise show an empty
status, or stage a pointer no replica follows). The default deployment is never flagged: a
fresh store has it before anything has served."""

from __future__ import annotations

import difflib

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from autospec import store
from autospec.store.models import Evaluation, Request
from autospec.store.registry import DEFAULT_DEPLOYMENT


def unknown_deployment(engine: Engine, deployment: str) -> str | None:
    """Why ``deployment`` looks like a typo, or None when the store knows it."""
    if deployment == DEFAULT_DEPLOYMENT:
        return None
    with store.session_scope(engine, readonly=True) as session:
        return unknown_deployment_in(session, deployment)


def unknown_deployment_in(session: Session, deployment: str) -> str | None:
    """:func:`unknown_deployment`, read in ``session``: None for the default deployment and
    one the store knows (:func:`autospec.store.deployment_known`: a replica, its traffic, a
    pointer, an evaluation or an event names it)."""
    if deployment == DEFAULT_DEPLOYMENT or store.deployment_known(session, deployment):
        return None
    known = sorted({DEFAULT_DEPLOYMENT, *store.known_deployments(session)})
    close = difflib.get_close_matches(deployment, known, n=1)
    return (f"no replica, request, pointer, evaluation or event of this store names "
            f"deployment {deployment!r} (known: {', '.join(known)})"
            + (f"; did you mean {close[0]!r}?" if close else ""))


def unknown_segment(engine: Engine, deployment: str, segment: str, *,
                    version: str | None = None) -> str | None:
    """Why ``segment`` looks like a typo (no logged request and no pointer of ``deployment``
    names it, nor, with ``version``, an evaluation of that version: its requests may have
    been purged since), or None (one read of the segment index, however large the traffic;
    the version's evaluations, a few)."""
    with store.session_scope(engine, readonly=True) as session:
        logged = session.scalar(select(Request.id).where(Request.segment == segment).limit(1))
        pinned = store.get_live(session, deployment=deployment, segment=segment)
        judged = version is not None and any(
            segment in ((per_segment or {}).get("segments") or {})
            for per_segment in session.scalars(
                select(Evaluation.per_segment).where(Evaluation.candidate == version)))
    if logged is not None or pinned is not None or judged:
        return None
    known = (f"no logged request and no pointer of deployment {deployment!r}" if version is None
             else f"no logged request, no pointer of deployment {deployment!r} and no "
             f"evaluation of {version}")
    return f"{known} names segment {segment!r} (`autospec status` lists the segment pointers)"
