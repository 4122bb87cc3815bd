"""Training runs and shadow evaluations: what the controller did, with its evidence.

Session first, keyword-only arguments; the caller owns the transaction.

- :func:`start_training_run` / :func:`finish_training_run` bracket one training attempt.
- :func:`record_evaluation` stores a candidate-vs-incumbent comparison on the same held-out
  traffic: τ of each, the confidence interval of Δτ, per-segment results, decision, reasons.
- ``list_*`` return newest first.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from autospec.store.errors import NotFound, StoreError
from autospec.store.models import RUN_STATES, Evaluation, TrainingRun, utcnow

DECISIONS = ("promote", "reject", "hold")


def start_training_run(
    session: Session,
    *,
    kind: str,
    parent_version: str | None = None,
    window_start: datetime | None = None,
    window_end: datetime | None = None,
    train_requests: int = 0,
    heldout_requests: int = 0,
    config: dict[str, Any] | None = None,
) -> TrainingRun:
    run = TrainingRun(
        kind=kind,
        parent_version=parent_version,
        status="running",
        started_at=utcnow(),
        window_start=window_start,
        window_end=window_end,
        train_requests=train_requests,
        heldout_requests=heldout_requests,
        config=config,
    )
    session.add(run)
    session.flush()
    return run


def finish_training_run(
    session: Session,
    *,
    run_id: int,
    status: str,
    version: str | None = None,
    metrics: dict[str, Any] | None = None,
    error: str | None = None,
) -> TrainingRun:
    """Close a run as ``succeeded`` (with the version it produced) or ``failed`` (with error)."""
    if status not in RUN_STATES or status == "running":
        raise StoreError(f"a finished run is 'succeeded' or 'failed', not {status!r}")
    run = session.get(TrainingRun, run_id)
    if run is None:
        raise NotFound(f"training run {run_id} does not exist")
    run.status, run.finished_at = status, utcnow()
    run.version, run.metrics, run.error = version, metrics, error
    session.flush()
    return run


def get_training_run(session: Session, *, run_id: int) -> TrainingRun:
    run = session.get(TrainingRun, run_id)
    if run is None:
        raise NotFound(f"training run {run_id} does not exist")
    return run


def list_training_runs(
    session: Session, *, status: str | None = None, limit: int = 50
) -> list[TrainingRun]:
    query = select(TrainingRun).order_by(TrainingRun.started_at.desc(), TrainingRun.id.desc())
    if status is not None:
        query = query.where(TrainingRun.status == status)
    return list(session.scalars(query.limit(limit)))


def record_evaluation(
    session: Session,
    *,
    candidate: str,
    incumbent: str | None,
    decision: str,
    reasons: Sequence[str] = (),
    num_requests: int = 0,
    tau_candidate: float | None = None,
    tau_incumbent: float | None = None,
    delta_ci_low: float | None = None,
    delta_ci_high: float | None = None,
    per_segment: dict[str, Any] | None = None,
    window_start: datetime | None = None,
    window_end: datetime | None = None,
    training_run_id: int | None = None,
    policy: dict[str, Any] | None = None,
    deployment: str | None = None,
) -> Evaluation:
    """Store one shadow evaluation (``decision`` in :data:`DECISIONS`) of ``deployment``'s
    traffic."""
    if decision not in DECISIONS:
        raise StoreError(f"decision must be one of {DECISIONS}, not {decision!r}")
    evaluation = Evaluation(
        created_at=utcnow(),
        deployment=deployment,
        candidate=candidate,
        incumbent=incumbent,
        training_run_id=training_run_id,
        window_start=window_start,
        window_end=window_end,
        num_requests=num_requests,
        tau_candidate=tau_candidate,
        tau_incumbent=tau_incumbent,
        delta_ci_low=delta_ci_low,
        delta_ci_high=delta_ci_high,
        per_segment=per_segment,
        decision=decision,
        reasons=list(reasons),
        policy=policy,
    )
    session.add(evaluation)
    session.flush()
    return evaluation


def list_evaluations(
    session: Session, *, candidate: str | None = None, limit: int = 50,
    deployment: str | None = None,
) -> list[Evaluation]:
    """Newest first; ``deployment``: only evaluations of its traffic (and those recorded
    before evaluations named one)."""
    query = select(Evaluation).order_by(Evaluation.created_at.desc(), Evaluation.id.desc())
    if candidate is not None:
        query = query.where(Evaluation.candidate == candidate)
    if deployment is not None:
        query = query.where(or_(Evaluation.deployment == deployment,
                                Evaluation.deployment.is_(None)))
    return list(session.scalars(query.limit(limit)))
