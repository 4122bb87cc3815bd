"""The ledger: does the loop pay for itself? For one deployment and one period, the decode
time speculation saved against the time the controller's cycles spent, per segment and in
total. Pure arithmetic over what :mod:`autospec.store.ledger` reads; a top-level module
because both the controller (``status``, ``autospec ledger``) and the replicas (their
Prometheus gauges, :mod:`autospec.serve.metrics_ledger`) compute it.

**Saved.** A timed request (:func:`autospec.store.ledger.decode_rows`) decoded ``tokens``
output tokens after its first in ``decode_s`` = latency − TTFT seconds (queueing and
prefill, which speculation does not change, left out — the canary's speed check reads the
same rows the same way). Target-only, the same tokens would have taken ``tokens ÷ R``
seconds, where **R** is the target-only tokens/s the gate's speed measurement decoded
(:mod:`autospec.evaluate.speed`, recorded with each evaluation): its target-only rate after
the first token (``speed.decode_tokens_per_s``, timed as the rows are: prefill left out;
whole decodes, ``speed.tokens_per_s["target-only"]``, where that was not recorded, as on
vLLM before 2026-12-05 or before 2026-12-03 — about 9 % lower on the default target's
prompts natively and 22-37 % on vLLM at 4 requests in flight, which would overstate the
saving): the median of the newest
:data:`RATE_EVALUATIONS` evaluations of the deployment's cycles recorded before the
period's end (none before: the first after it). ``saved = Σ tokens ÷ R − Σ decode_s``.
On vLLM the measurement decodes ``concurrency`` requests at once and R is their joint
rate after the first token; a row's ``decode_s`` is then divided by the requests in flight
it recorded, so both sides count seconds of the replica, not of each request.

**R from a holdout.** Where the period holds at least :data:`HOLDOUT_MIN_REQUESTS`
requests a native replica served with speculation off at random (its
``holdout_fraction``, :mod:`autospec.serve.holdout`), R is theirs instead: their tokens
after the first over their seconds after it — a control group timed in the period, at
the load served, on the same traffic, where the gate's rate was timed earlier on a few
prompts (``target_only.source``: ``holdout`` or ``gate``). The held-out rows stay in the
tally: they saved nothing, which is what holding them out cost.

**Spent.** The cycles that ended in the period: each one's wall time (start note to end
note) and its stages (:mod:`autospec.controller.timings`: features, training, shadow,
speed; ``other`` the rest). Cycles train on the whole window, so a segment's share of the
loop's time is its share of the period's decoded tokens.

**Net** = saved − spent: positive when the loop paid for itself. Both are seconds, on
different machines: the replicas' decode time against the controller's; the ledger says so,
it does not convert. Without a measured R (speed measurement off, or no cycle evaluated
yet) nothing is saved or netted: those figures are None, and ``note`` says why.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from autospec import store
from autospec.store.ledger import DecodeRow, TargetRate, cycle_notes, decode_rows, target_rates
from autospec.store.models import utcnow

#: the stages a cycle times (:mod:`autospec.controller.timings` writes them)
STAGES = ("features", "training", "shadow", "speed")
RATE_EVALUATIONS = 5  # newest evaluations whose target-only rates R is the median of
HOLDOUT_MIN_REQUESTS = 10  # held-out requests in the period before R is theirs
TOTAL = "(all)"  # the total line's name (kept apart from the segments' lines)


@dataclass
class Line:
    """One segment's account (or the total's, ``segment`` = :data:`TOTAL`), in seconds."""

    segment: str
    requests: int = 0
    tokens: int = 0
    decode_s: float = 0.0
    baseline_s: float | None = None  # tokens ÷ R: the same tokens decoded target-only
    saved_s: float | None = None
    loop_s: float = 0.0
    net_s: float | None = None


@dataclass(frozen=True)
class Rate:
    """R, the target-only rate the ledger divides by, and where it comes from: ``gate``
    (the evaluations' speed measurements) or ``holdout`` (the period's held-out requests)."""

    tokens_per_s: float
    engine: str
    concurrency: int
    evaluations: list[int]
    source: str = "gate"
    requests: int = 0  # held-out requests R was timed on (source holdout)


@dataclass
class Loop:
    """What the cycles that ended in the period spent."""

    cycles: int = 0
    seconds: float = 0.0
    #: cycles a controller died in, closed later by another's recovery: their time is not
    #: known (start note to recovery would count the downtime), so not counted
    interrupted: int = 0
    stages: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        (*STAGES, "other"), 0.0))


def pick_rate(rates: Sequence[TargetRate], until: datetime) -> Rate | None:
    """R from the evaluations' target-only rates (oldest first): the median of the newest
    :data:`RATE_EVALUATIONS` recorded before ``until``, else the first after; None: none."""
    before = [r for r in rates if r.created_at < until][-RATE_EVALUATIONS:]
    chosen = before or list(rates[:1])
    if not chosen:
        return None
    newest = chosen[-1]
    return Rate(tokens_per_s=statistics.median(r.tokens_per_s for r in chosen),
                engine=newest.engine, concurrency=newest.concurrency,
                evaluations=[r.evaluation_id for r in chosen])


def holdout_rate(rows: Sequence[DecodeRow], *,
                 min_requests: int = HOLDOUT_MIN_REQUESTS) -> Rate | None:
    """R from the period's held-out rows (served target-only at random, native engine:
    :mod:`autospec.serve.holdout`): their tokens after the first over their seconds after
    the first token; None under ``min_requests`` of them."""
    held = [r for r in rows if r.holdout]
    seconds = sum(r.seconds for r in held)
    if len(held) < min_requests or seconds <= 0:
        return None
    return Rate(tokens_per_s=sum(r.tokens for r in held) / seconds, engine="native",
                concurrency=1, evaluations=[], source="holdout", requests=len(held))


def replica_seconds(row: DecodeRow, engine: str) -> float:
    """A row's decode seconds in the replica's time: as recorded on the native engine (one
    request decodes at a time); on vLLM divided by the requests in flight it shared them
    with."""
    if engine == "vllm" and row.concurrency:
        return row.seconds / max(1.0, row.concurrency)
    return row.seconds


def tally(rows: Sequence[DecodeRow], rate: Rate | None) -> tuple[Line, list[Line]]:
    """Requests, tokens, decode seconds and (with ``rate``) baseline and saved seconds: the
    total, and each segment's (by name)."""
    engine = rate.engine if rate else "native"
    total, segments = Line(TOTAL), {}
    for row in rows:
        for line in (total, segments.setdefault(row.segment, Line(row.segment))):
            line.requests += 1
            line.tokens += row.tokens
            line.decode_s += replica_seconds(row, engine)
    lines = [segments[s] for s in sorted(segments)]
    if rate is not None:
        for line in (total, *lines):
            line.baseline_s = line.tokens / rate.tokens_per_s
            line.saved_s = line.baseline_s - line.decode_s
    return total, lines


def loop_cost(notes: Sequence[tuple[datetime, dict[str, Any]]], since: datetime) -> Loop:
    """The cycles whose end note is at or after ``since`` (``notes``: start and end notes,
    oldest first, starts from before ``since`` included): wall time and stages; a cycle
    counted once, an interrupted one's time not at all (:attr:`Loop.interrupted`)."""
    starts = {d.get("cycle_id"): t for t, d in notes if d.get("type") == "cycle_start"}
    loop, ended = Loop(), set()
    for t, d in notes:
        if d.get("type") != "cycle" or t < since or d.get("cycle_id") not in starts \
                or d["cycle_id"] in ended:  # a cycle ends once (its own note comes first)
            continue
        ended.add(d["cycle_id"])
        if d.get("outcome") == "interrupted":
            loop.interrupted += 1
            continue
        wall = (t - starts[d["cycle_id"]]).total_seconds()
        stages = {s: float((d.get("stages") or {}).get(s) or 0.0) for s in STAGES}
        loop.cycles += 1
        loop.seconds += wall
        for stage, seconds in stages.items():
            loop.stages[stage] += seconds
        loop.stages["other"] += max(0.0, wall - sum(stages.values()))
    return loop


def settle(total: Line, segments: Sequence[Line], loop: Loop) -> None:
    """Each line's share of the loop's time (a segment's: its share of the decoded tokens;
    the total: all of it) and its net."""
    for line in (total, *segments):
        share = 1.0 if line is total else (line.tokens / total.tokens if total.tokens else 0.0)
        line.loop_s = loop.seconds * share
        line.net_s = None if line.saved_s is None else line.saved_s - line.loop_s


def account(rows: Sequence[DecodeRow], rates: Sequence[TargetRate],
            notes: Sequence[tuple[datetime, dict[str, Any]]], *, since: datetime,
            until: datetime) -> dict[str, Any]:
    """The ledger of a period from what the store holds (see the module doc), JSON-able."""
    rate = holdout_rate(rows) or pick_rate(rates, until)
    total, segments = tally(rows, rate)
    loop = loop_cost(notes, since)
    settle(total, segments, loop)
    note = None
    if rate is None:
        note = ("no target-only rate measured: no cycle of this deployment has measured its "
                "speed yet (or evaluation.speed is off), so nothing saved can be counted")
    elif not total.requests:
        note = "no timed request in the period"
    return {"since": since, "until": until, "period_s": (until - since).total_seconds(),
            "target_only": asdict(rate) if rate else None,
            "holdout": {"requests": sum(r.holdout for r in rows),
                        "min_requests": HOLDOUT_MIN_REQUESTS},
            "total": asdict(total),
            "segments": [asdict(line) for line in segments],
            "loop": asdict(loop), "pays": None if total.net_s is None else total.net_s > 0,
            "note": note}


def collect_ledger(session: Any, *, deployment: str, since: datetime,
                   until: datetime) -> dict[str, Any]:
    """The ledger of ``deployment`` over ``[since, until)``, read in ``session``."""
    ends = cycle_notes(session, deployment=deployment, since=None, until=until)
    ids = [i for _, d in ends if d.get("type") == "cycle" for i in d.get("evaluations") or []]
    rows = decode_rows(session, deployment=deployment, since=since, until=until)
    notes = [(t, d) for t, d in ends if t >= since - timedelta(days=1)]
    ledger = account(rows, target_rates(session, evaluation_ids=ids), notes, since=since,
                     until=until)
    return {"deployment": deployment, **ledger}


def ledger_for(engine: Engine, *, deployment: str, period: timedelta,
               until: datetime | None = None) -> dict[str, Any]:
    """The ledger of ``deployment`` over the ``period`` before ``until`` (default: now)."""
    until = until or utcnow()
    with store.session_scope(engine, readonly=True) as session:
        return collect_ledger(session, deployment=deployment, since=until - period,
                              until=until)
