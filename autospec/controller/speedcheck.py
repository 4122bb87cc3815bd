"""The canary's speed check: does a promotion's measured speed gain show in live serving?

At promotion the evaluation measured, by interleaved decodes on the controller's machine
(:mod:`autospec.evaluate.speed`), the new version's speedup over target-only and the
replaced version's; their ratio is the **expected gain**. Live, each logged request
carries its output tokens, its latency and its time to first token, so a version's **live
rate** is its decode rate ``Σ (output tokens − 1) / Σ (latency − TTFT)`` over its
requests: queueing and prefill, which speculation does not change, are left out. The
**realised gain** is the new version's live rate since the move over the replaced
version's live rate on as many of its newest requests before the move (equal samples). The
check fails when ``realised gain < expected gain × (1 − canary.max_speed_shortfall)``.

What does not cancel is a change of load or of traffic between the two periods (the two
versions never serve at the same time): the tolerance is there for that, and a load that
rises sharply right after a promotion can still read as a shortfall (the module compares
periods; it has no concurrent target-only baseline). With no measured speedups in the
promotion (measurement off, an override without evaluation) or no timed requests on either
side, the check is not judged and says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from autospec.store.models import Request


@dataclass(frozen=True)
class LiveRate:
    requests: int
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class SpeedVerdict:
    judged: bool  # False: not enough to judge on (``reason`` says why)
    ok: bool
    reason: str
    realised_gain: float | None = None
    expected_gain: float | None = None


def live_rate(session: Session, *, deployment: str, version: str,
              since: datetime | None = None, before: datetime | None = None,
              newest: int | None = None) -> LiveRate:
    """Decode rate of ``version``'s timed requests in the period: tokens after the first
    per second after the first (``newest``: only the newest N of them)."""
    query = select(Request.output_tokens, Request.latency_ms, Request.ttft_ms).where(
        Request.deployment == deployment, Request.speculator_version == version,
        Request.latency_ms > Request.ttft_ms, Request.ttft_ms >= 0,
        Request.output_tokens > 1)
    if since is not None:
        query = query.where(Request.created_at >= since)
    if before is not None:
        query = query.where(Request.created_at < before)
    query = query.order_by(Request.created_at.desc(), Request.id.desc())
    if newest is not None:
        query = query.limit(newest)
    rows = session.execute(query).all()
    return LiveRate(requests=len(rows), tokens=sum(r.output_tokens - 1 for r in rows),
                    seconds=sum(r.latency_ms - r.ttft_ms for r in rows) / 1e3)


def expected_gain(details: dict[str, Any]) -> float | None:
    """Measured speedup of the promoted version over the replaced one's, from the
    promotion's details; None when either was not measured."""
    new, old = details.get("measured_speedup"), details.get("incumbent_measured_speedup")
    if not new or not old:
        return None
    return float(new) / float(old)


def promotion_speeds(evaluation: Any) -> dict[str, float | None]:
    """The speedups a promotion records (as the controller's do), from an evaluation row."""
    data = evaluation.per_segment or {}
    measured = data.get("speedup_measured") or {}
    estimated = data.get("speedup") or {}
    return {"estimated_speedup": estimated.get(evaluation.candidate),
            "measured_speedup": measured.get(evaluation.candidate),
            "incumbent_measured_speedup": measured.get(evaluation.incumbent)}


def check_speed(session: Session, *, deployment: str, promo: Any, replaced: str | None,
                max_shortfall: float) -> SpeedVerdict:
    """Realised vs expected speed gain of the promotion event ``promo`` (see module doc)."""
    expected = expected_gain(promo.details or {})
    if expected is None:
        return SpeedVerdict(False, True, "speed not judged: the promotion carries no measured "
                            "speedup (measurement off, or promoted without one)")
    if replaced is None:
        return SpeedVerdict(False, True, "speed not judged: no replaced version to compare")
    new = live_rate(session, deployment=deployment, version=promo.version,
                    since=promo.created_at)
    old = live_rate(session, deployment=deployment, version=replaced,
                    before=promo.created_at, newest=max(new.requests, 1))
    if not new.requests or not old.requests:
        return SpeedVerdict(False, True, f"speed not judged: no timed requests of "
                            f"{promo.version if not new.requests else replaced} to compare")
    realised = new.tokens_per_s / old.tokens_per_s
    limit = expected * (1 - max_shortfall)
    ok = realised >= limit
    reason = (f"speed of {promo.version}: realised gain over {replaced} {realised:.2f}× "
              f"({new.tokens_per_s:.1f} vs {old.tokens_per_s:.1f} tokens/s live decode, "
              f"{new.requests} vs {old.requests} requests) vs measured "
              f"{expected:.2f}×; {'within' if ok else 'below'} the allowed "
              f"{max_shortfall:.0%} shortfall (gain ≥ {limit:.2f}×)")
    return SpeedVerdict(True, ok, reason, realised, expected)
