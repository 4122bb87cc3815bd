"""Deployment (and segment) names an operator types: one the store has never heard of is
named, with the closest known one (``--deployment prodd`` would otherwise show an empty
status, or stage a pointer no replica follows). The default deployment is never flagged: a
fresh store has it before anything has served."""

from __future__ import annotations

import difflib

from sqlalchemy import Engine, select

from autospec import store
from autospec.store.models import Request
from autospec.store.registry import DEFAULT_DEPLOYMENT


def unknown_deployment(engine: Engine, deployment: str) -> str | None:
    """Why ``deployment`` looks like a typo, or None when the store knows it."""
    if deployment == DEFAULT_DEPLOYMENT:
        return None
    with store.session_scope(engine, readonly=True) as session:
        known = sorted({DEFAULT_DEPLOYMENT, *store.known_deployments(session)})
    if deployment in known:
        return None
    close = difflib.get_close_matches(deployment, known, n=1)
    return (f"no replica or pointer of this store names deployment {deployment!r} "
            f"(known: {', '.join(known)})"
            + (f"; did you mean {close[0]!r}?" if close else ""))


def unknown_segment(engine: Engine, deployment: str, segment: str) -> str | None:
    """Why ``segment`` looks like a typo (no logged request and no pointer of ``deployment``
    names it), or None (one read of the segment index, however large the traffic)."""
    with store.session_scope(engine, readonly=True) as session:
        logged = session.scalar(select(Request.id).where(Request.segment == segment).limit(1))
        pinned = store.get_live(session, deployment=deployment, segment=segment)
    if logged is not None or pinned is not None:
        return None
    return (f"no logged request and no pointer of deployment {deployment!r} names segment "
            f"{segment!r} (`autospec status` lists the segment pointers)")
