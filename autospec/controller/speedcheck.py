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

**At the same load.** Speculation's gain depends on the load it is served at (on vLLM a
batch of 8 leaves less spare compute for verifying drafts than a batch of 1), so the two
periods are compared at the same concurrency: each row records the mean number of requests
in flight on its replica during its life (``sampling.concurrency``, :mod:`autospec.serve.load`);
the new version's median sets a band (÷ :data:`LOAD_SPAN` to × :data:`LOAD_SPAN`), and both
sides keep only their rows in that band — when each side still has
:data:`MIN_MATCHED` of them; otherwise (rows written before replicas recorded the load, or
loads that never overlap) all rows are compared and the verdict says so.

**On the same traffic.** A version decodes faster on traffic it drafts well, so the replaced
version's rows are taken from the segments the new version served (``requests.segment``:
the ``x-autospec-segment`` of each request) — when it has :data:`MIN_MATCHED` of them;
otherwise from all its rows, and the verdict says so. After a shift of traffic (the drift
watch's case: the replaced version served JSON extraction, then a little support chat, and
its successor serves support chat) the comparison is support against support, not against
the replaced version's faster JSON. What still does not cancel is a change of traffic
within a segment (the two versions never serve at the same time): the tolerance is there
for that (the module compares periods; it has no concurrent target-only baseline).

A segment's promotion (:mod:`autospec.controller.segment_promotion`) is judged on that
segment's rows alone, the replaced version's too (no fallback to its other segments: too
few there and the speed is not judged), against the gain the evaluation projected on the
segment (its replayed τ over each version's measured step cost). The deployment's
promotion is judged without the segments that have a pointer of their own (on both sides),
as its τ check is (:mod:`autospec.controller.drafted_tau`).

With no measured speedups in the promotion (measurement off, an override without
evaluation) or no timed requests on either side, the check is not judged and says why.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from autospec.store.load import recorded_concurrency
from autospec.store.models import Request

#: the load band around the new version's median concurrency: [median ÷ span, median × span]
LOAD_SPAN = 1.5
#: timed requests each side needs inside the band for the comparison to keep to it
MIN_MATCHED = 5


@dataclass(frozen=True)
class LiveRate:
    requests: int
    tokens: int
    seconds: float
    concurrency: float | None = None  # median of the rows' recorded load (None: not recorded)

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


def _rate(rows: list[Any]) -> LiveRate:
    """Decode rate of timed rows: tokens after the first per second after the first."""
    loads = sorted(x for r in rows if (x := recorded_concurrency(r.sampling)) is not None)
    return LiveRate(requests=len(rows), tokens=sum(r.output_tokens - 1 for r in rows),
                    seconds=sum(r.latency_ms - r.ttft_ms for r in rows) / 1e3,
                    concurrency=loads[len(loads) // 2] if loads else None)


def timed_rows(session: Session, *, deployment: str, version: str,
               since: datetime | None = None, before: datetime | None = None,
               newest: int | None = None, segments: list[str] | None = None,
               exclude: Collection[str] = ()) -> list[Any]:
    """``version``'s timed requests in the period, newest first (``newest``: only the
    newest N; ``segments``: only those segments'; ``exclude``: none of those segments'):
    output tokens, latency, TTFT, sampling (the recorded load) and segment."""
    query = select(Request.output_tokens, Request.latency_ms, Request.ttft_ms,
                   Request.sampling, Request.segment).where(
        Request.deployment == deployment, Request.speculator_version == version,
        Request.latency_ms > Request.ttft_ms, Request.ttft_ms >= 0,
        Request.output_tokens > 1)
    if since is not None:
        query = query.where(Request.created_at >= since)
    if before is not None:
        query = query.where(Request.created_at < before)
    if segments is not None:
        query = query.where(Request.segment.in_(segments))
    if exclude:
        query = query.where(Request.segment.not_in(list(exclude)))
    query = query.order_by(Request.created_at.desc(), Request.id.desc())
    if newest is not None:
        query = query.limit(newest)
    return list(session.execute(query).all())


def replaced_rows(session: Session, *, deployment: str, replaced: str, before: datetime,
                  new: list[Any], segment: str | None = None,
                  exclude: Collection[str] = ()) -> tuple[list[Any], str]:
    """The replaced version's newest timed rows before ``before`` on the segments the new
    version's rows ``new`` are from (see module doc), and how they were chosen; of a
    ``segment``'s promotion, that segment's rows only (too few: none, and it is not judged);
    never of the ``exclude`` segments (the deployment's canary leaves them out)."""
    newest = max(4 * len(new), 1)
    segments = [segment] if segment else sorted({r.segment for r in new})
    same = timed_rows(session, deployment=deployment, version=replaced, before=before,
                      newest=newest, segments=segments)
    if len(same) >= MIN_MATCHED:
        return same, f"on {', '.join(segments)} traffic"
    if segment:
        return [], (f"fewer than {MIN_MATCHED} timed requests of {replaced} on segment "
                    f"{segment} before the move")
    rows = timed_rows(session, deployment=deployment, version=replaced, before=before,
                      newest=newest, exclude=exclude)
    return rows, (f"segments not matched: fewer than {MIN_MATCHED} requests of {replaced} "
                  f"on {', '.join(segments) or 'any segment'}")


def matched(new: list[Any], old: list[Any]) -> tuple[list[Any], list[Any], str]:
    """Both sides' rows within the load band of ``new``'s median (see module doc), and how
    they were matched; all rows when the band leaves either side too few."""
    median = _rate(new).concurrency
    if median is None:
        return new, old, "load not recorded"
    low, high = median / LOAD_SPAN, median * LOAD_SPAN

    def within(row: Any) -> bool:
        load = recorded_concurrency(row.sampling)
        return load is not None and low <= load <= high

    keep_new, keep_old = [r for r in new if within(r)], [r for r in old if within(r)]
    if len(keep_new) < MIN_MATCHED or len(keep_old) < MIN_MATCHED:
        return new, old, (f"loads not matched: fewer than {MIN_MATCHED} requests on a side "
                          f"at {low:.1f}–{high:.1f} in flight")
    return keep_new, keep_old, f"at the same load ({low:.1f}–{high:.1f} requests in flight)"


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
                max_shortfall: float, segment: str | None = None,
                exclude: Collection[str] = ()) -> SpeedVerdict:
    """Realised vs expected speed gain of the promotion event ``promo`` (see module doc);
    ``segment``: of a segment's promotion, on that segment's rows only; ``exclude``: of the
    deployment's, the segments with a pointer of their own, whose rows its τ check leaves out
    too (:mod:`autospec.controller.drafted_tau`), on neither side."""
    expected = expected_gain(promo.details or {})
    if expected is None:
        return SpeedVerdict(False, True, "speed not judged: the promotion carries no measured "
                            "speedup (measurement off, or promoted without one)")
    if replaced is None:
        return SpeedVerdict(False, True, "speed not judged: no replaced version to compare")
    new_rows = timed_rows(session, deployment=deployment, version=promo.version,
                          since=promo.created_at, segments=[segment] if segment else None,
                          exclude=exclude)
    old_rows, traffic = replaced_rows(session, deployment=deployment, replaced=replaced,
                                      before=promo.created_at, new=new_rows, segment=segment,
                                      exclude=exclude)
    new_rows, old_rows, load = matched(new_rows, old_rows)
    new, old = _rate(new_rows), _rate(old_rows[:max(len(new_rows), 1)])  # equal samples
    if not new.requests or not old.requests:
        return SpeedVerdict(False, True, f"speed not judged: no timed requests of "
                            f"{promo.version if not new.requests else replaced} to compare"
                            + ("" if new.requests and old_rows else f" ({traffic})"))
    realised = new.tokens_per_s / old.tokens_per_s
    limit = expected * (1 - max_shortfall)
    ok = realised >= limit
    d = _digits(realised, limit)
    reason = (f"speed of {promo.version}: realised gain over {replaced} {realised:.{d}f}× "
              f"({new.tokens_per_s:.1f} vs {old.tokens_per_s:.1f} tokens/s live decode, "
              f"{new.requests} vs {old.requests} requests, {traffic}, {load}) vs measured "
              f"{expected:.2f}×; {'within' if ok else 'below'} the allowed "
              f"{max_shortfall:.0%} shortfall (gain ≥ {limit:.{d}f}×)")
    return SpeedVerdict(True, ok, reason, realised, expected)


def _digits(realised: float, limit: float) -> int:
    """Decimals that tell ``realised`` from ``limit`` (2, up to 4): a gain just below its
    limit read '2.00× ... below ... (gain ≥ 2.00×)' in a rollback's reason."""
    d = 2
    while d < 4 and realised != limit and f"{realised:.{d}f}" == f"{limit:.{d}f}":
        d += 1
    return d
