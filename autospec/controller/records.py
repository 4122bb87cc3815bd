"""What the controller writes to, and reads back from, the store's audit log.

The controller keeps no state of its own: everything it must remember lives in the
``events`` table as ``note`` events whose ``details["type"]`` says what they are, plus
``promotion`` / ``rollback`` / ``rejection`` / ``failure`` events written by the registry:

- ``cycle_start`` {cycle_id, window_key, newest_id, trigger, token} — a cycle took the
  lease and snapshotted a window;
- ``cycle`` {cycle_id, window_key, newest_id, outcome, reasons, candidates, evaluations,
  promoted, segments (what per-segment promotion did, one entry per held-out segment), ...}
  — the cycle's end, written once (:func:`close_cycle`). A window whose key has a ``cycle``
  record with a consuming outcome (``promoted``, ``rejected``) is done: a later run over it
  does nothing; ``failed`` and ``interrupted`` cycles do not consume their window;
- ``canary`` {version, promotion_event, verdict, live_tau, shadow_tau (the one judged by:
  the deployment's at the live rows' segment mix), requests, segment (None: the
  deployment's pointer), shadow_tau_held_out where the live mix re-weighted it, and when
  speed was judged speed_ok, realised_gain, expected_gain};
- ``drift`` {version, live_tau, evaluated_tau, segment, outcome, cycle_id} — an early
  cycle ran on drift, written when it ended (one that found nothing to do writes none); the
  watch runs no other early cycle for ``drift.cooldown`` after it.

Every read here selects notes by type, and by the details it needs, in SQL: what the
controller must remember is found however many other events (other deployments', segments',
failed cycles') came after it.

Fresh traffic is counted by request id: usable requests (not opted out, with token ids)
of the deployment with an id above the last consumed window's newest id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from autospec import store
from autospec.store.models import Event, Request, Speculator, TrainingRun, utcnow

CONSUMING = ("promoted", "rejected")


def lease_name(deployment: str) -> str:
    return f"controller:{deployment}"


def schedule_lease_name(deployment: str) -> str:
    """The row whose ``expires_at`` is the scheduler's next cycle (see scheduler module)."""
    return f"controller-schedule:{deployment}"


@dataclass(frozen=True)
class CycleRecord:
    """One cycle as recorded (start, and end when it finished)."""

    cycle_id: str
    started_at: datetime
    start: dict[str, Any]
    end: dict[str, Any] | None
    ended_at: datetime | None
    actor: str

    @property
    def outcome(self) -> str:
        return self.end["outcome"] if self.end else "running"

    def as_dict(self) -> dict[str, Any]:
        end = self.end or {}
        return {"cycle_id": self.cycle_id, "started_at": self.started_at,
                "ended_at": self.ended_at, "actor": self.actor, "outcome": self.outcome,
                "trigger": self.start.get("trigger"), "window_key": self.start.get("window_key"),
                "window_requests": self.start.get("window_requests"),
                "candidates": end.get("candidates", []), "promoted": end.get("promoted"),
                "reasons": end.get("reasons", []), "evaluations": end.get("evaluations", []),
                "segments": end.get("segments", [])}


def runs_of(session: Session, cyc: CycleRecord) -> list[TrainingRun]:
    """The training runs ``cyc`` started: those whose recorded request names its cycle id (a
    run recorded before runs named their cycle: any run started after the cycle began).
    An operator's `autospec train` running meanwhile is not the cycle's."""
    runs = session.scalars(select(TrainingRun).where(TrainingRun.started_at >= cyc.started_at))
    return [r for r in runs if (r.config or {}).get("cycle_id", cyc.cycle_id) == cyc.cycle_id]


def orphans_of(session: Session, runs: list[TrainingRun]) -> list[str]:
    """Unpromoted candidates registered by ``runs``."""
    ids = [r.id for r in runs]
    return list(session.scalars(select(Speculator.version).where(
        Speculator.training_run_id.in_(ids), Speculator.state == "candidate")
        .order_by(Speculator.version))) if ids else []


def note(session: Session, *, type_: str, actor: str, deployment: str, reason: str = "",
         version: str | None = None, **details: Any) -> Event:
    """Append one controller note event."""
    return store.record_event(session, kind="note", actor=actor, reason=reason,
                              deployment=deployment, version=version,
                              details={"type": type_, **details})


def notes(session: Session, *, deployment: str, type_: str, after: datetime | None = None,
          limit: int | None = None, **match: str | Sequence[str]) -> list[Event]:
    """The deployment's notes of one type, newest first: all of them (``limit``: the newest
    that many), those created after ``after``, and each ``match`` key of their details equal
    to its string (or one of its strings). Filtered in SQL, so a note is found however many
    other events came after it."""
    query = _notes_query(deployment, type_, **match)
    if after is not None:
        query = query.where(Event.created_at > after)
    query = query.order_by(Event.created_at.desc(), Event.id.desc())
    return list(session.scalars(query if limit is None else query.limit(limit)))


def _notes_query(deployment: str, type_: str, **match: str | Sequence[str]) -> Select:  # type: ignore[type-arg]
    query = select(Event).where(Event.kind == "note", Event.deployment == deployment,
                                Event.details["type"].as_string() == type_)
    for key, wanted in match.items():
        field = Event.details[key].as_string()
        query = query.where(field == wanted if isinstance(wanted, str) else field.in_(wanted))
    return query


def close_cycle(session: Session, *, deployment: str, cycle_id: str, actor: str, reason: str,
                version: str | None = None, **details: Any) -> tuple[Event, bool]:
    """Write cycle ``cycle_id``'s end record (a ``cycle`` note with ``details``), once:
    (it, True) when this call wrote it; (the one already there, False) when the cycle was
    closed before — a controller that lost its lease mid-cycle finds its cycle closed
    ``interrupted`` by the recovery of the one that took the lease over — and then nothing
    is written. The cycle's start note is locked first (``FOR UPDATE`` on PostgreSQL; on
    SQLite write transactions run one at a time), so of two racing closes the second waits
    for the first's transaction and finds its end."""
    session.scalars(_notes_query(deployment, "cycle_start", cycle_id=cycle_id)
                    .with_for_update()).all()
    ends = notes(session, deployment=deployment, type_="cycle", cycle_id=cycle_id)
    if ends:
        return ends[-1], False
    return note(session, type_="cycle", actor=actor, deployment=deployment, reason=reason,
                version=version, cycle_id=cycle_id, **details), True


def has_canary_verdict(session: Session, *, deployment: str, move: Event) -> bool:
    """Whether a canary note judged pointer move ``move`` (found in SQL among the notes since
    the move, however many came after it; a verdict once given is final)."""
    query = _notes_query(deployment, "canary").where(
        Event.created_at >= move.created_at,
        Event.details["promotion_event"].as_integer() == move.id)  # an int: not a match=
    return session.scalars(query.limit(1)).first() is not None


def cycles(session: Session, *, deployment: str, limit: int = 20) -> list[CycleRecord]:
    """The newest ``limit`` cycles, newest first, each with its end record when it has one
    (the first written, should there be two)."""
    starts = notes(session, deployment=deployment, type_="cycle_start", limit=limit)
    ids = [e.details["cycle_id"] for e in starts]
    ends = {e.details["cycle_id"]: e for e in notes(  # newest first: the oldest stays
        session, deployment=deployment, type_="cycle", cycle_id=ids)} if ids else {}
    records = []
    for e in starts:
        end = ends.get(e.details["cycle_id"])
        records.append(CycleRecord(
            cycle_id=e.details["cycle_id"], started_at=e.created_at, start=e.details,
            end=end.details if end else None, ended_at=end.created_at if end else None,
            actor=e.actor))
    return records


def last_consumed_newest_id(session: Session, *, deployment: str) -> int:
    """The newest request id of the last window a cycle consumed (0: none yet)."""
    for e in notes(session, deployment=deployment, type_="cycle", outcome=CONSUMING, limit=1):
        return int(e.details.get("newest_id") or 0)
    return 0


def window_done(session: Session, *, deployment: str, window_key: str) -> bool:
    return bool(notes(session, deployment=deployment, type_="cycle", window_key=window_key,
                      outcome=CONSUMING, limit=1))


def _usable(deployment: str):  # type: ignore[no-untyped-def]
    return (Request.deployment == deployment, Request.opted_out.is_(False),
            Request.prompt_ids.is_not(None), Request.output_ids.is_not(None))


def fresh_requests(session: Session, *, deployment: str, after_id: int,
                   max_age: timedelta | None = None) -> int:
    """Usable requests of ``deployment`` with an id above ``after_id`` and, with
    ``max_age`` (the policy's ``window.max_age``), no older than that: those a cycle's window
    can take (older ones would start a cycle whose window lacks them, failing each time)."""
    query = select(func.count()).select_from(Request).where(
        Request.id > after_id, *_usable(deployment))
    if max_age is not None:
        query = query.where(Request.created_at >= utcnow() - max_age)
    return int(session.scalar(query) or 0)


def newest_request(session: Session, *, deployment: str) -> tuple[int, datetime] | None:
    """(id, created_at) of the deployment's newest usable request."""
    row = session.execute(
        select(Request.id, Request.created_at).where(*_usable(deployment))
        .order_by(Request.created_at.desc(), Request.id.desc()).limit(1)).first()
    return (int(row.id), row.created_at) if row else None
