"""What the soak reads back from the store (read-only, through SQLAlchemy and
:mod:`autospec.store`): the audit log's pointer moves and refusals, the controller's cycle
records, training runs and evaluations in progress, and the traffic rows the soak caused
(matched to requests by ``sampling.seed``).

Times are epoch seconds (the store's timestamps are UTC).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import select

from autospec import store
from autospec.store.models import Evaluation, Event, Request, TrainingRun

POINTER_KINDS = ("promotion", "rollback", "override", "unpin")
REFUSALS = ("speculator load", "artifact mismatch")


def epoch(at: datetime) -> float:
    return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()


@dataclass(frozen=True)
class Row:
    """The parts of a traffic row the soak checks."""

    seed: int | None
    version: str | None
    at: float
    drafts: int
    accepted: int


@dataclass(frozen=True)
class RunInfo:
    """A training run: its id, kind and state, when it started and ended (epoch s)."""

    id: int
    kind: str
    status: str
    started: float
    finished: float | None
    version: str | None
    error: str | None


def _run_info(run: TrainingRun) -> RunInfo:
    return RunInfo(id=run.id, kind=run.kind, status=run.status, started=epoch(run.started_at),
                   finished=None if run.finished_at is None else epoch(run.finished_at),
                   version=run.version, error=run.error)


class StoreView:
    """Read-only queries on the soak's store."""

    def __init__(self, url: str) -> None:
        self.engine = store.make_engine(url)

    def close(self) -> None:
        self.engine.dispose()

    def events(self, after_id: int = 0) -> list[dict[str, Any]]:
        """Audit events with an id above ``after_id``, oldest first."""
        with store.session_scope(self.engine, readonly=True) as session:
            rows = session.scalars(select(Event).where(Event.id > after_id).order_by(Event.id))
            return [{"id": e.id, "at": epoch(e.created_at), "kind": e.kind, "actor": e.actor,
                     "reason": e.reason, "version": e.version, "from_version": e.from_version,
                     "details": e.details or {}} for e in rows]

    def last_event_id(self) -> int:
        events = self.events()
        return events[-1]["id"] if events else 0

    def live(self, segment: str | None = None) -> str | None:
        """The deployment's pointer (or ``segment``'s own: None where it has none)."""
        with store.session_scope(self.engine, readonly=True) as session:
            pointer = store.get_live(session, segment=segment)
            return pointer.version if pointer else None

    def serving(self, segment: str) -> str:
        """The version that should draft ``segment``: its own pointer's, else the
        deployment's (builtin-ngram before any)."""
        with store.session_scope(self.engine, readonly=True) as session:
            return store.serving_version(session, segment=segment) or "builtin-ngram"

    def versions(self) -> list[dict[str, Any]]:
        """Registered versions: name, kind, state, artifact, SHA-256, when (epoch seconds)."""
        with store.session_scope(self.engine, readonly=True) as session:
            return [{"version": s.version, "kind": s.kind, "state": s.state,
                     "artifact_uri": s.artifact_uri, "sha256": s.sha256,
                     "registered_at": epoch(s.created_at),
                     "target_id": s.target_id, "target_revision": s.target_revision}
                    for s in store.list_speculators(session)]

    def training_running_since(self, since: float) -> bool:
        """A training run started after ``since`` is running now."""
        with store.session_scope(self.engine, readonly=True) as session:
            runs = session.scalars(select(TrainingRun).where(TrainingRun.status == "running"))
            return any(epoch(r.started_at) >= since for r in runs)

    def running_run(self, since: float, kinds: tuple[str, ...]) -> RunInfo | None:
        """A training run of one of ``kinds`` started after ``since`` and running now."""
        with store.session_scope(self.engine, readonly=True) as session:
            runs = session.scalars(select(TrainingRun).where(
                TrainingRun.status == "running", TrainingRun.kind.in_(kinds)))
            found = [r for r in runs if epoch(r.started_at) >= since]
            return _run_info(found[-1]) if found else None

    def run(self, run_id: int) -> RunInfo:
        """One training run as it stands."""
        with store.session_scope(self.engine, readonly=True) as session:
            return _run_info(session.get_one(TrainingRun, run_id))

    def typical_training_s(self, kind: str) -> float | None:
        """The median duration of the succeeded runs of ``kind`` so far (None: none yet)."""
        with store.session_scope(self.engine, readonly=True) as session:
            runs = session.scalars(select(TrainingRun).where(
                TrainingRun.status == "succeeded", TrainingRun.kind == kind))
            took = sorted(epoch(r.finished_at) - epoch(r.started_at) for r in runs
                          if r.finished_at is not None)
        return took[len(took) // 2] if took else None

    def gate_passed_pending(self) -> str | None:
        """A candidate the gate passed in the cycle running now and not yet promoted, or
        None: an evaluation that decided ``promote`` after the newest cycle record (a
        ``note`` or ``failure`` of type ``cycle``), its candidate not in a promotion since.
        The window between the two is when a controller killed "right after the gate
        passed" must die; an evaluation written before the fault began watching counts too
        (a cycle's evaluations come minutes before its promotion)."""
        events = self.events()
        closed = [e["at"] for e in events if e["kind"] in ("note", "failure")
                  and e["details"].get("type") == "cycle"]
        after = max(closed, default=0.0)
        with store.session_scope(self.engine, readonly=True) as session:
            rows = session.scalars(select(Evaluation).where(Evaluation.decision == "promote")
                                   .order_by(Evaluation.id))
            passed = [(e.candidate, epoch(e.created_at)) for e in rows
                      if epoch(e.created_at) > after]
        promoted = {(e["version"], e["at"]) for e in events if e["kind"] == "promotion"}
        pending = [c for c, at in passed
                   if not any(v == c and t >= at for v, t in promoted)]
        return pending[-1] if pending else None

    def rows(self) -> list[Row]:
        """Every traffic row (the soak's carry their request's number as the seed)."""
        with store.session_scope(self.engine, readonly=True) as session:
            got = session.execute(select(
                Request.sampling, Request.speculator_version, Request.created_at,
                Request.num_drafts, Request.num_accepted_tokens))
            return [Row((s or {}).get("seed"), v, epoch(at), d, a) for s, v, at, d, a in got]


def cycles(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The controller's cycle records (``note`` events of type ``cycle``)."""
    return [{"at": e["at"], "cycle_id": e["details"].get("cycle_id"),
             "outcome": e["details"].get("outcome"), "promoted": e["details"].get("promoted"),
             "reasons": e["details"].get("reasons") or [e["reason"]]}
            for e in events if e["kind"] == "note" and e["details"].get("type") == "cycle"]


def pointer_moves(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] in POINTER_KINDS]


def refusals(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Replicas refusing a version (a load failure or an artifact mismatch)."""
    return [e for e in events
            if e["kind"] == "failure" and e["details"].get("what") in REFUSALS]
