"""Per-segment promotion: after the deployment-wide decision, a traffic segment may get its
own live version — the candidate that wins on that segment's held-out requests.

A request's segment is ``requests.segment`` (its ``x-autospec-segment``, or the serve
config's rule). A segment is served by its own pointer when it has one, else by the
deployment's (:func:`autospec.store.serving_version`). With the policy's
``promotion.per_segment`` on, the cycle:

1. evaluates, beside each candidate and the incumbent, every version a segment pointer
   names (:func:`extra_versions`), so that each candidate has a paired CI of Δτ on each
   segment against the version that serves it (``SegmentResult.deltas``);
2. after the gate, for each segment of the held-out window with at least
   ``per_segment.min_requests`` requests (:func:`plan`, read before the deployment's
   pointer moves): a candidate **wins** the segment when, on its requests, the lower bound
   of that CI reaches ``gate.min_gain`` and its speedup on the segment does not fall below
   the serving version's by more than ``gate.speedup_tolerance``. The segment speedup is,
   with speed measured, the segment's replayed τ over the step cost each version's
   decodes measured, priced at the segment's replayed drafts per step
   (:meth:`SpeedMeasurement.projected` on the segment's τ and drafts: the cost of a
   drafted token itself comes from all held-out prompts, not the segment's), else the cost
   model on the segment's replay. Of several winners the fastest on the segment (then the
   highest τ);
3. moves the segment's pointer to its winner (:func:`apply`, ``store.set_live(...,
   segment=S)``) in the cycle's transaction, the reason naming the evaluation and the
   segment's figures — except where the segment has no pointer of its own and the
   deployment's pointer moves to that same version this cycle (it is served it anyway).

A candidate that failed the deployment-wide gate but won a segment is not marked rejected.
The gate's other deployment-wide checks (the held-out minimum, the overfitting guard) are
not re-applied per segment: the segment's own CI on real traffic is the evidence. Every
segment of the window gets an entry in the cycle record (``segments``): ``promoted``,
``follows`` (the deployment's winner serves it), ``kept`` (no candidate wins it),
``stale`` (its serving version moved during the cycle to one not evaluated) or
``too_few`` requests. A segment whose name no pointer can take (rows logged before the
segment header took only the store's names) is ``kept``, its reason saying so. This module
knows nothing of training or scheduling.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from autospec import store
from autospec.controller.candidates import Candidate
from autospec.controller.policy import Policy
from autospec.controller.result import CycleResult
from autospec.controller.segment_watch import vllm_segment_refusal
from autospec.evaluate.compare import Evaluation, SegmentResult
from autospec.names import is_name
from autospec.store.models import BUILTIN_VERSION
from autospec.store.pointers import UNPINNED

log = logging.getLogger(__name__)


@dataclass
class SegmentOutcome:
    """What a cycle did for one segment of its held-out window (see the module doc)."""

    segment: str
    requests: int
    serving: str  # the version serving it when the cycle decided
    action: str  # promoted | follows | kept | stale | too_few | not_followed
    version: str | None = None  # the winning candidate
    own_pointer: bool = False  # the segment had a pointer of its own
    evaluation_id: int | None = None
    tau: float | None = None  # the winner's τ on the segment
    serving_tau: float | None = None
    delta: list[float] | None = None  # [Δτ, CI low, CI high] of winner vs serving
    speedup: float | None = None  # the winner's speedup on the segment
    serving_speedup: float | None = None
    speed_basis: str | None = None  # measured (projected) or estimated
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def with_segment_versions(db: Engine, policy: Policy, evaluated: list[str]) -> list[str]:
    """``evaluated`` and, after them, the versions segment pointers name that it does not
    hold (none when per-segment promotion is off): evaluated too, so each segment is
    compared with the version that serves it."""
    if not policy.promotion.per_segment.enabled:
        return list(evaluated)
    with store.session_scope(db, readonly=True) as session:
        named = {p.version for p in store.list_segment_pointers(
            session, deployment=policy.deployment)}
    return [*evaluated, *sorted(named - set(evaluated))]


def segment_speedups(ev: Evaluation, seg: SegmentResult) -> tuple[dict[str, float], str]:
    """Each version's speedup over target-only on ``seg`` (see module doc), and its basis."""
    if ev.measured is not None:
        return ev.measured.projected(seg.tau, seg.draft_tokens_per_step), "measured"
    return seg.speedup, "estimated"


def plan(session: Session, *, policy: Policy, candidates: list[Candidate],
         best: Candidate | None, engine: str = "native") -> list[SegmentOutcome]:
    """Each held-out segment's outcome, decided against the pointers as they are now —
    call inside the cycle's transaction, before the deployment's pointer moves. On a
    deployment whose replicas serve on ``engine`` vLLM a segment's winner is promoted only
    where they would draft with it (a suffix version, the deployment's version after this
    cycle a suffix version too: :func:`vllm_segment_refusal`); elsewhere it is named but not
    promoted (``not_followed``), since the pointer would not be followed and its canary
    would wait for requests that never come."""
    evaluated = [c for c in candidates if c.evaluation is not None]
    if not policy.promotion.per_segment.enabled or not evaluated:
        return []
    own = {p.segment: p.version for p in store.list_segment_pointers(
        session, deployment=policy.deployment)}
    deployment = store.get_live(session, deployment=policy.deployment)
    follows = deployment.version if deployment else BUILTIN_VERSION
    sizes = _segment_sizes(evaluated)
    out = []
    for name, n in sorted(sizes.items()):
        serving = own.get(name, follows)
        outcome = SegmentOutcome(name, n, serving, "too_few", own_pointer=name in own)
        if not is_name(name):  # logged before the header took store names
            outcome.action = "kept"
            outcome.reason = (f"{name!r} cannot name a pointer (1-64 letters, digits, '.', "
                              "'_' or '-'); its requests count for the deployment only")
        elif n >= policy.promotion.per_segment.min_requests:
            _decide(outcome, evaluated, policy, best)
            why = None if engine != "vllm" or outcome.action != "promoted" else \
                vllm_segment_refusal(session, deployment=policy.deployment,
                                     version=str(outcome.version),
                                     follows=best.version if best else follows,
                                     on_vllm=True)
            if why is not None:
                outcome.action = "not_followed"
                outcome.reason += f"; not promoted: {why}"
        else:
            outcome.reason = (f"{n} held-out requests; per-segment promotion needs "
                              f"{policy.promotion.per_segment.min_requests}")
        out.append(outcome)
    return out


def _segment_sizes(evaluated: list[Candidate]) -> dict[str, int]:
    """Each held-out segment's requests, the fewest any candidate was evaluated on (a
    candidate's held-out set leaves out what its own training took, so they can differ)."""
    sizes: dict[str, int] = {}
    for cand in evaluated:
        for seg in cand.evaluation.segments:  # type: ignore[union-attr]
            sizes[seg.segment] = min(sizes.get(seg.segment, seg.num_requests), seg.num_requests)
    return sizes


def _decide(outcome: SegmentOutcome, candidates: list[Candidate], policy: Policy,
            best: Candidate | None) -> None:
    """Fill ``outcome`` with the segment's winner, if any, and what to do about it."""
    gate, serving = policy.gate, outcome.serving
    if not any(serving in c.evaluation.versions for c in candidates):  # type: ignore[union-attr]
        outcome.action = "stale"
        outcome.reason = (f"{serving} serves the segment now but was not evaluated (a "
                          "pointer moved during the cycle)")
        return
    found = [w for c in candidates if (w := _wins(c, outcome.segment, serving, gate))]
    if not found:
        outcome.action = "kept"
        outcome.reason = (f"no candidate beats {serving} on the segment's {outcome.requests} "
                          f"held-out requests (Δτ CI low ≥ {gate.min_gain:+.3f}, segment "
                          f"speedup within {gate.speedup_tolerance:.0%})"
                          f"{_lows(candidates, outcome)}")
        return
    cand, figures = min(found, key=lambda w: (-w[1]["speedup"], -w[1]["tau"]))
    for key, value in figures.items():
        setattr(outcome, key, value)
    outcome.version, outcome.evaluation_id = cand.version, cand.evaluation_id
    if best is not None and cand.version == best.version and not outcome.own_pointer:
        outcome.action = "follows"
        outcome.reason = (f"{cand.version} wins the segment and becomes the deployment's "
                          "version; no pointer of its own needed")
        return
    outcome.action = "promoted"
    outcome.reason = _reason(outcome, gate.min_gain, cand.evaluation.ci_level)  # type: ignore[union-attr]


def _wins(cand: Candidate, segment: str, serving: str,
          gate: Any) -> tuple[Candidate, dict[str, Any]] | None:
    """``cand`` and its figures on ``segment`` when it beats ``serving`` there, else None."""
    ev = cand.evaluation
    assert ev is not None
    seg = next((s for s in ev.segments if s.segment == segment), None)
    if seg is None or cand.version == serving or (ci := seg.deltas.get(serving)) is None:
        return None
    speeds, basis = segment_speedups(ev, seg)
    if ci.low < gate.min_gain or speeds[ev.candidate] < speeds[serving] * (
            1 - gate.speedup_tolerance):
        return None
    return cand, {"tau": seg.tau[ev.candidate], "serving_tau": seg.tau[serving],
                  "delta": [ci.delta, ci.low, ci.high], "speedup": speeds[ev.candidate],
                  "serving_speedup": speeds[serving], "speed_basis": basis}


def _lows(candidates: list[Candidate], outcome: SegmentOutcome) -> str:
    """``: c1 Δτ +0.012 [−0.100, +0.130], speedup 0.91× vs 0.93×; ...`` — each candidate's
    Δτ and segment speedup against the serving version's, for a segment none won (either
    can be what kept it)."""
    parts = []
    for cand in candidates:
        ev = cand.evaluation
        assert ev is not None
        seg = next((s for s in ev.segments if s.segment == outcome.segment), None)
        if seg is not None and (ci := seg.deltas.get(outcome.serving)) is not None:
            speeds, basis = segment_speedups(ev, seg)
            parts.append(f"{cand.version} Δτ {ci.delta:+.3f} [{ci.low:+.3f}, {ci.high:+.3f}], "
                         f"{basis} speedup {speeds[ev.candidate]:.2f}× vs "
                         f"{speeds[outcome.serving]:.2f}×")
    return f": {'; '.join(parts)}" if parts else ""


def _reason(o: SegmentOutcome, min_gain: float, level: float) -> str:
    assert o.delta is not None and o.tau is not None and o.serving_tau is not None
    d, low, high = o.delta
    basis = ("replayed segment τ over the step cost at its drafts per step, measured on "
             "all held-out prompts"
             if o.speed_basis == "measured" else "estimated by the cost model")
    return (f"segment {o.segment!r}: {o.version} wins on its {o.requests} held-out requests, "
            f"evaluation #{o.evaluation_id} (segment τ {o.tau:.3f} vs {o.serving_tau:.3f} of "
            f"{o.serving}; Δτ {d:+.3f}, {level:.0%} CI [{low:+.3f}, {high:+.3f}], lower bound "
            f"≥ minimum gain {min_gain:+.3f}; segment speedup {o.speedup:.2f}× vs "
            f"{o.serving_speedup:.2f}×, {basis})")


def apply(session: Session, outcomes: list[SegmentOutcome], *, policy: Policy, actor: str,
          result: CycleResult, token: int) -> set[str]:
    """Move the pointer of each ``promoted`` segment (in the caller's transaction, whose
    fencing ``token`` the details record), note every outcome in ``result``; the versions
    made live."""
    result.segments = [o.as_dict() for o in outcomes]
    context = {"cycle_id": result.cycle_id, "window_key": result.window_key,
               "fencing_token": token}
    moved = set()
    for o in outcomes:
        if o.action != "promoted":
            continue
        assert o.version is not None
        measured = o.speed_basis == "measured"
        store.set_live(
            session, version=o.version, actor=actor, deployment=policy.deployment,
            segment=o.segment, reason=f"controller: {o.reason}; cycle {context['cycle_id']}",
            expect=o.serving if o.own_pointer else UNPINNED,  # as it was judged
            details={"evaluation_id": o.evaluation_id, "shadow_tau": o.tau,
                     "incumbent": o.serving, "incumbent_shadow_tau": o.serving_tau,
                     "delta": o.delta, "requests": o.requests,
                     "measured_speedup": o.speedup if measured else None,
                     "incumbent_measured_speedup": o.serving_speedup if measured else None,
                     "estimated_speedup": None if measured else o.speedup,
                     "per_segment": True, "policy": policy.name, **context})
        log.info("segment %s of %s: %s -> %s", o.segment, policy.deployment, o.serving,
                 o.version)
        moved.add(o.version)
    return moved
