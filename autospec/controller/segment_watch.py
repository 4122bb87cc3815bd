"""The canary and the drift check of segment pointers (the watch's per-segment part).

**Canary.** A segment's newest pointer move (an event with ``details.segment``) that is a
``promotion`` or ``override`` carrying a shadow τ — the controller's per-segment promotions
put the version's τ *on the segment's held-out requests* there — and no ``canary`` verdict
yet is pending. Once the version has served ``canary.requests`` requests **of that
segment** since the move (rows whose ``speculator_version`` is it and ``segment`` the
segment), their live τ is compared with that shadow τ as the deployment's canary does
(``live τ < shadow τ × (1 − canary.max_shortfall)`` fails), and with ``canary.speed_check``
the realised speed gain on the segment's rows against the gain the evaluation projected on
the segment (:func:`autospec.controller.speedcheck.check_speed` with ``segment``). A
failure rolls the **segment's** pointer back (``store.rollback(..., segment=S)``); a
segment that had no pointer of its own before (``previous_version`` empty) is pinned to the
version that served it before the move (``details.incumbent``), since a pointer cannot be
removed by a rollback.

**Drift.** A segment whose serving version (its own pointer's, else the deployment's) has
served ``drift.min_requests`` of its requests in the last ``drift.window`` with a live τ
below that version's evaluated τ *on the segment* (the newest evaluation recording one) by
more than ``drift.max_drop`` drifts, as the deployment does. Segments with a pointer of
their own are always checked; with ``promotion.per_segment`` on, every segment is. A segment
whose own canary is pending is not, nor, while the deployment's canary is pending, one that
follows the deployment's pointer.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from autospec import store
from autospec.controller import records
from autospec.controller.policy import Policy
from autospec.speculators.registry import vllm_per_request
from autospec.store.models import BUILTIN_VERSION, Event
from autospec.store.queries import TauStat

MOVES = ["promotion", "override", "rollback"]


def newest_move(session: Session, *, deployment: str, segment: str | None) -> Event | None:
    """The newest move of the deployment's own pointer (``segment`` None) or of ``segment``'s,
    found in SQL however many moves of other pointers came after it."""
    named = Event.details["segment"].as_string()
    return session.scalars(
        select(Event).where(Event.kind.in_(MOVES), Event.deployment == deployment,
                            named.is_(None) if segment is None else named == segment)
        .order_by(Event.created_at.desc(), Event.id.desc()).limit(1)).first()


def newest_moves(session: Session, *, deployment: str) -> dict[str | None, Event]:
    """The newest pointer move of the deployment (key None) and of each segment that has a
    pointer of its own (its name)."""
    keys = [None, *(p.segment for p in store.list_segment_pointers(session,
                                                                   deployment=deployment))]
    moves = {key: newest_move(session, deployment=deployment, segment=key) for key in keys}
    return {key: move for key, move in moves.items() if move is not None}


def canary_open(session: Session, *, deployment: str, move: Any | None) -> bool:
    """Is ``move`` a promotion with a shadow τ whose pointer still names its version and
    that has no canary verdict yet?"""
    if move is None or move.kind == "rollback" or (move.details or {}).get("shadow_tau") is None:
        return False
    pointer = store.get_live(session, deployment=deployment,
                             segment=(move.details or {}).get("segment"))
    if pointer is None or pointer.version != move.version:
        return False
    return not records.has_canary_verdict(session, deployment=deployment, move=move)


def serves_on_vllm(session: Session, deployment: str) -> bool:
    """Whether ``deployment``'s replicas recorded that they serve on vLLM."""
    row = store.get_deployment(session, name=deployment)
    return row is not None and row.engine == "vllm"


def version_kind(session: Session, version: str) -> str | None:
    """``version``'s kind (the built-in version's: ngram; None: not registered)."""
    if version == BUILTIN_VERSION:
        return "ngram"
    try:
        return store.get_speculator(session, version=version).kind
    except store.NotFound:
        return None


def vllm_segment_refusal(session: Session, *, deployment: str, version: str,
                         follows: str | None = None, on_vllm: bool | None = None) -> str | None:
    """Why ``deployment``'s replicas would not draft a segment with ``version`` of its own
    (None: they would, or they serve natively; ``on_vllm``: whether they serve on vLLM,
    default as they recorded). A vLLM engine has one drafter: a segment's version is held in
    a slot of a proposer that holds several versions of its kind
    (:func:`~autospec.speculators.registry.vllm_per_request`: suffix), so both it and the
    version drafting the deployment (``follows``; default: its pointer's) must be of such a
    kind, the same one."""
    if not (serves_on_vllm(session, deployment) if on_vllm is None else on_vllm):
        return None
    follows = follows or store.serving_version(session, deployment=deployment) \
        or BUILTIN_VERSION
    kinds = {name: version_kind(session, name) for name in (version, follows)}
    for name, role in ((version, "the segment's"), (follows, "the deployment's")):
        kind = kinds[name]
        if not vllm_per_request(kind) or kind != kinds[version]:
            return (f"the deployment serves on vLLM, where a segment is drafted by a version of "
                    f"its own only when it and the deployment's are both suffix versions (one "
                    f"engine has one drafter; autospec's proposer holds an index per segment: "
                    f"docs/vllm.md), and {role} {name} is "
                    f"{'not registered' if kind is None else f'of kind {kind}'}")
    return None


def pending_segment_canaries(session: Session, *, deployment: str) -> list[Any]:
    """The segments' promotion events whose canary is open, by segment name; on a deployment
    whose replicas serve on vLLM only those its replicas draft with (a canary of a pointer
    they do not follow would wait for requests its version never drafts, and keep that
    segment's drift check waiting behind it: :func:`vllm_segment_refusal`)."""
    moves = newest_moves(session, deployment=deployment)
    return [moves[s] for s in sorted(k for k in moves if k is not None)
            if canary_open(session, deployment=deployment, move=moves[s])
            and vllm_segment_refusal(session, deployment=deployment,
                                     version=moves[s].version) is None]


def segment_live(session: Session, *, deployment: str, version: str, segment: str,
                 since: datetime, k: int | None = None) -> TauStat | None:
    """Live τ of ``version`` on ``segment``'s requests since ``since``, over the requests
    drafted at its k (at ``k`` where given: :func:`autospec.store.live_tau`)."""
    stats = store.live_tau(session, since=since, deployment=deployment, by_segment=True,
                           versions=[version], full_k=True, k=k)
    return next((s for s in stats if s.segment == segment), None)


def roll_back_segment(session: Session, *, deployment: str, promo: Any, actor: str,
                      reason: str, details: dict[str, Any]) -> bool:
    """Roll the segment's pointer back from ``promo.version`` (see the module doc); False
    if it no longer names it."""
    segment = promo.details["segment"]
    pointer = store.get_live(session, deployment=deployment, segment=segment)
    if pointer is None or pointer.version != promo.version:
        return False
    if pointer.previous_version is not None:
        store.rollback(session, actor=actor, reason=reason, deployment=deployment,
                       segment=segment, details=details, expect=promo.version)
        return True
    before = promo.details.get("incumbent")
    if not before:
        return False
    store.set_live(session, version=before, actor=actor, deployment=deployment,
                   segment=segment, kind="rollback", details=details, expect=promo.version,
                   reason=f"{reason}; the segment had no pointer of its own before: pinned "
                          f"to {before}, which served it")
    return True


@dataclass(frozen=True)
class Drifted:
    """A version whose live τ fell below its evaluated τ (on a segment, or deployment-wide)."""

    segment: str | None
    version: str
    live_tau: float
    evaluated_tau: float
    requests: int

    def reason(self, span: str, max_drop: float) -> str:
        where = f" on segment {self.segment!r}" if self.segment else ""
        return (f"drift: live τ of {self.version}{where} is {self.live_tau:.3f} over "
                f"{self.requests} requests in the last {span}, below its evaluated τ"
                f"{where} {self.evaluated_tau:.3f} by more than {max_drop:.0%}; early cycle")


def segment_drift(session: Session, *, policy: Policy, since: datetime,
                  waiting: Collection[str | None] = ()) -> Drifted | None:
    """The first segment (by name) that drifts (see the module doc), or None; not a segment
    whose canary is pending (named in ``waiting``), nor, while the deployment's is (None in
    it), one that follows the deployment's pointer."""
    dp, deployment = policy.drift, policy.deployment
    own = {p.segment: p.version for p in store.list_segment_pointers(
        session, deployment=deployment)}
    follows = store.serving_version(session, deployment=deployment) or BUILTIN_VERSION
    evaluations = None
    for stat in store.live_tau(session, since=since, deployment=deployment, by_segment=True,
                               full_k=True):
        segment = stat.segment or ""
        serving = own.get(segment, follows)
        if segment in waiting or (segment not in own and (
                None in waiting or not policy.promotion.per_segment.enabled)) \
                or stat.version != serving or stat.tau is None or stat.requests < dp.min_requests:
            continue
        if evaluations is None:
            evaluations = store.list_evaluations(session, limit=200, deployment=deployment)
        evaluated, k = evaluated_segment_tau(evaluations, stat.version, segment)
        if evaluated is None:
            continue
        if k is not None:  # as replayed: only its requests recorded at that k
            stat = segment_live(session, deployment=deployment, version=stat.version,
                                segment=segment, since=since, k=k)
            if stat is None or stat.tau is None or stat.requests < dp.min_requests:
                continue
        if stat.tau < evaluated * (1 - dp.max_drop):
            return Drifted(segment, stat.version, stat.tau, evaluated, stat.requests)
    return None


def evaluated_segment_tau(evaluations: list[Any], version: str,
                          segment: str) -> tuple[float | None, int | None]:
    """``version``'s τ on ``segment`` in the newest of ``evaluations`` that recorded one, and
    the k it was replayed at (None: not recorded)."""
    for ev in evaluations:
        seg = ((ev.per_segment or {}).get("segments") or {}).get(segment) or {}
        if (value := (seg.get("tau") or {}).get(version)) is not None:
            return float(value), recorded_k(ev)
    return None, None


def recorded_k(ev: Any) -> int | None:
    """The k an evaluation row replayed at (``per_segment["k"]``; None: none, or not
    recorded)."""
    k = (ev.per_segment or {}).get("k") if ev is not None else None
    return k if isinstance(k, int) else None
