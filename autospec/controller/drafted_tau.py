"""Live τ and shadow τ of a deployment's version over the same segments, once segments have
pointers.

A version's shadow τ is over every held-out request of its evaluation; its live τ
(:func:`autospec.store.live_tau`) is over the requests it served. A segment with a pointer
of its own is not drafted through the deployment's pointer: if that pointer names another
version, the segment's requests are in the first and not in the second (a high-τ segment
pinned elsewhere makes a healthy version look short of its shadow τ, a low-τ one hides a
real shortfall); if it names the version, the segment's own canary and drift check judge
those rows already. And the rows were served under the pointers of their time: a segment
pinned elsewhere since still has the version's rows from before. So the canary and the drift
watch of the deployment's pointer leave the segments with a pointer of their own *now* out
of **both** sides: :func:`drafted_tau` is the evaluation's τ over its other segments, and
:func:`drafted_live` the live τ over the version's rows outside them. Of a segment with no
pointer of its own now (none then either, or one since unpinned) the version's rows are its
drafting of that segment, which the segment's τ in the evaluation measured. On a
deployment whose replicas serve on vLLM a segment pointer they do not follow
(:func:`~autospec.controller.segment_watch.vllm_segment_refusal`) leaves nothing out: its
segment is drafted by the deployment's version. The canary then holds the live τ to
:func:`drafted_tau` re-weighted to its rows' segment mix (:mod:`autospec.controller.live_mix`,
from :func:`drafted_segments` and :func:`evaluated_segments`); the drift watch to
:func:`drafted_tau` as it is.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from autospec import store
from autospec.controller.segment_watch import serves_on_vllm, vllm_segment_refusal
from autospec.store.models import Evaluation
from autospec.store.queries import TauStat


@dataclass(frozen=True)
class DraftedTau:
    """τ to compare live τ with (None: every segment the evaluation measured the version on
    has a pointer of its own, so there is none), and the segments left out of both sides
    (those with a pointer of their own, by name)."""

    tau: float | None
    left_out: tuple[str, ...] = ()

    def note(self) -> str:
        """Said after the τ in a reason (empty when nothing was left out)."""
        if not self.left_out:
            return ""
        return (f", both over the segments it drafts (left out: {', '.join(self.left_out)}, "
                "which have pointers of their own)")

    def nothing_in_common(self, version: str, evaluation: Any) -> str:
        """Why there is no shadow τ to compare with (:attr:`tau` None)."""
        return (f"{version}: no canary comparison: every segment evaluation #{evaluation} "
                f"measured it on has a pointer of its own now ({', '.join(self.left_out)}), "
                "so it drafts none of them through the deployment's pointer; waiting")


def drafted_tau(session: Session, *, deployment: str, version: str, tau: float,
                evaluation: Evaluation | None) -> DraftedTau:
    """``tau`` (``version``'s over all of ``evaluation``'s held-out requests), or, where some
    of its segments now have a pointer of their own (:func:`own_segments`), the
    request-weighted mean of ``version``'s τ on the others (the evaluation's per-segment
    figures), with the segments left out; τ None when no other segment is left. ``tau``
    where none of them is among the evaluation's segments (they are still left out of live
    τ); unchanged, nothing left out, where it recorded no per-segment τ of ``version``."""
    segments = evaluated_segments(evaluation, version)
    if not segments:
        return DraftedTau(tau)
    own = own_segments(session, deployment=deployment)
    left_out = tuple(sorted(own))
    if not own & segments.keys():
        return DraftedTau(tau, left_out)
    kept = [(n, t) for name, (n, t) in segments.items() if name not in own]
    if not kept:
        return DraftedTau(None, left_out)
    return DraftedTau(sum(n * t for n, t in kept) / sum(n for n, _ in kept), left_out)


def own_segments(session: Session, *, deployment: str) -> set[str]:
    """The segments of ``deployment`` with a pointer of their own that its replicas follow."""
    pointers = store.list_segment_pointers(session, deployment=deployment)
    on_vllm = bool(pointers) and serves_on_vllm(session, deployment)
    return {p.segment for p in pointers
            if vllm_segment_refusal(session, deployment=deployment, version=p.version,
                                    on_vllm=on_vllm) is None}


def drafted_live(session: Session, *, deployment: str, version: str, since: datetime,
                 k: int | None = None, left_out: Collection[str] = ()) -> TauStat | None:
    """Live τ of ``version`` since ``since`` over its requests drafted at its k (at ``k``
    where given: :func:`autospec.store.live_tau`), leaving out ``left_out``'s segments."""
    return pooled(version, drafted_segments(session, deployment=deployment, version=version,
                                            since=since, k=k, left_out=left_out,
                                            by_segment=bool(left_out)))


def drafted_segments(session: Session, *, deployment: str, version: str, since: datetime,
                     k: int | None = None, left_out: Collection[str] = (),
                     by_segment: bool = True) -> list[TauStat]:
    """:func:`drafted_live`'s rows, one per segment (``by_segment`` False and nothing
    ``left_out``: all in one, segment None)."""
    return [s for s in store.live_tau(session, since=since, deployment=deployment,
                                      versions=[version], by_segment=by_segment or
                                      bool(left_out), full_k=True, k=k)
            if s.segment not in left_out]


def pooled(version: str, stats: list[TauStat]) -> TauStat | None:
    """``stats`` (``version``'s, per segment) in one (None: none)."""
    if not stats:
        return None
    return TauStat(version=version, segment=None, requests=sum(s.requests for s in stats),
                   steps=sum(s.steps for s in stats),
                   draft_tokens=sum(s.draft_tokens for s in stats),
                   accepted_tokens=sum(s.accepted_tokens for s in stats))


def served_on(session: Session, *, deployment: str, version: str, since: datetime,
              segments: Collection[str]) -> dict[str, int]:
    """How many requests ``version`` served on each of ``segments`` since ``since`` (any k;
    only segments with some)."""
    if not segments:
        return {}
    return {s.segment: s.requests for s in store.live_tau(
        session, since=since, deployment=deployment, versions=[version], by_segment=True)
        if s.segment in segments and s.requests}


def evaluated_segments(evaluation: Evaluation | None,
                       version: str) -> dict[str, tuple[int, float]]:
    """The evaluation's segments with ``version``'s τ and held-out requests recorded."""
    per_segment = (evaluation.per_segment if evaluation is not None else None) or {}
    segments = per_segment.get("segments") or {}
    found: dict[str, tuple[int, float]] = {}
    for name, seg in segments.items():
        data = seg if isinstance(seg, dict) else {}
        n, taus = data.get("num_requests"), data.get("tau")
        tau = taus.get(version) if isinstance(taus, dict) else None
        if isinstance(n, int) and n > 0 and isinstance(tau, (int, float)):
            found[name] = (n, float(tau))
    return found
