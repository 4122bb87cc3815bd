"""What the ledger (:mod:`autospec.ledger`) reads from the store, for one
deployment and one period: the decode time its requests took, the target-only decode rates
its cycles' evaluations measured, and its cycles' notes.

Three queries, no arithmetic beyond unpacking rows. Knows nothing of the controller: a
cycle note is an ``events`` row of kind ``note`` whose ``details["type"]`` is
``cycle_start`` or ``cycle`` (:mod:`autospec.controller.records` writes them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from autospec.store.load import recorded_concurrency
from autospec.store.models import Evaluation, Event, Request

TARGET_ONLY = "target-only"  # the baseline's name in an evaluation's speed record
HOLDOUT_KEY = "holdout"  # a held-out row's ``sampling`` mark (autospec/serve/holdout.py)


@dataclass(frozen=True)
class DecodeRow:
    """One timed request: its segment and version, the output tokens after the first and
    the seconds after the first token (latency − TTFT: queueing and prefill left out)."""

    segment: str
    version: str | None
    tokens: int
    seconds: float
    concurrency: float | None  # mean requests in flight on its replica (None: not recorded)
    holdout: bool = False  # served with speculation off as the ledger's control group


@dataclass(frozen=True)
class TargetRate:
    """The target-only decode rate one evaluation measured (its speed measurement)."""

    evaluation_id: int
    created_at: datetime
    tokens_per_s: float
    engine: str  # "native": one request at a time; "vllm": ``concurrency`` at once
    concurrency: int


def decode_rows(session: Session, *, deployment: str, since: datetime,
                until: datetime) -> list[DecodeRow]:
    """The deployment's timed requests created in ``[since, until)`` (more than one output
    token, latency above TTFT: the rows the canary's speed check reads too)."""
    query = select(Request.segment, Request.speculator_version, Request.output_tokens,
                   Request.latency_ms, Request.ttft_ms, Request.sampling).where(
        Request.deployment == deployment, Request.created_at >= since,
        Request.created_at < until, Request.latency_ms > Request.ttft_ms,
        Request.ttft_ms >= 0, Request.output_tokens > 1)
    return [DecodeRow(segment=r.segment, version=r.speculator_version,
                      tokens=r.output_tokens - 1, seconds=(r.latency_ms - r.ttft_ms) / 1e3,
                      concurrency=recorded_concurrency(r.sampling),
                      holdout=bool((r.sampling or {}).get(HOLDOUT_KEY)))
            for r in session.execute(query)]


def target_rates(session: Session, *, evaluation_ids: Iterable[int]) -> list[TargetRate]:
    """The target-only rate of each of these evaluations that measured speed, oldest first."""
    ids = sorted(set(evaluation_ids))
    if not ids:
        return []
    rows = session.scalars(select(Evaluation).where(Evaluation.id.in_(ids))
                           .order_by(Evaluation.created_at, Evaluation.id))
    out = []
    for ev in rows:
        speed = (ev.per_segment or {}).get("speed") or {}
        # after the first token where measured (as the rows are timed), else whole decodes
        rate = speed.get("decode_tokens_per_s") or (speed.get("tokens_per_s") or {}).get(
            TARGET_ONLY)
        if rate:
            out.append(TargetRate(evaluation_id=ev.id, created_at=ev.created_at,
                                  tokens_per_s=float(rate),
                                  engine=str(speed.get("engine") or "native"),
                                  concurrency=int(speed.get("concurrency") or 1)))
    return out


def cycle_notes(session: Session, *, deployment: str, since: datetime | None,
                until: datetime) -> list[tuple[datetime, dict[str, Any]]]:
    """(time, details) of the deployment's ``cycle_start`` and ``cycle`` notes created in
    ``[since, until)`` (``since`` None: from the first), oldest first."""
    query = select(Event.created_at, Event.details).where(
        Event.kind == "note", Event.deployment == deployment, Event.created_at < until)
    if since is not None:
        query = query.where(Event.created_at >= since)
    query = query.order_by(Event.created_at, Event.id)
    return [(r.created_at, r.details) for r in session.execute(query)
            if (r.details or {}).get("type") in ("cycle_start", "cycle")]
