"""The evaluated τ a deployment's version should show live, once segments have pointers.

A version's shadow τ is over every held-out request of its evaluation; its live τ
(:func:`autospec.store.live_tau`) is over the requests it drafted. A segment whose own
pointer names another version is drafted by that one, so its requests are in the first and
not in the second: a high-τ segment pinned elsewhere makes a healthy version look short of
its shadow τ (a false rollback or drift), a low-τ one hides a real shortfall. The canary and
the drift watch of the deployment's pointer therefore compare live τ with
:func:`drafted_tau`: τ over the evaluation's segments the version drafts now.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from autospec import store
from autospec.store.models import Evaluation


@dataclass(frozen=True)
class DraftedTau:
    """τ to compare live τ with, and the segments it leaves out (pinned to another version)."""

    tau: float
    left_out: tuple[str, ...] = ()

    def note(self) -> str:
        """Said after the τ in a reason (empty when nothing was left out)."""
        if not self.left_out:
            return ""
        return (f" over the segments it drafts (left out: {', '.join(self.left_out)}, "
                "drafted by their own pointers)")


def drafted_tau(session: Session, *, deployment: str, version: str, tau: float,
                evaluation: Evaluation | None) -> DraftedTau:
    """``tau`` (``version``'s over all of ``evaluation``'s held-out requests), or, where some
    of its segments now have a pointer naming another version, the request-weighted mean of
    ``version``'s τ on the others (the evaluation's per-segment figures). Unchanged where the
    evaluation recorded no per-segment τ or every segment is pinned elsewhere."""
    pinned = {p.segment for p in store.list_segment_pointers(session, deployment=deployment)
              if p.version != version}
    segments = _segments(evaluation)
    left_out = tuple(sorted(s for s in segments if s in pinned))
    if not left_out:
        return DraftedTau(tau)
    kept = [(seg["num_requests"], seg["tau"].get(version)) for name, seg in segments.items()
            if name not in pinned]
    kept = [(n, t) for n, t in kept if isinstance(n, int) and n > 0 and t is not None]
    if not kept:
        return DraftedTau(tau)
    return DraftedTau(sum(n * t for n, t in kept) / sum(n for n, _ in kept), left_out)


def _segments(evaluation: Evaluation | None) -> dict[str, Any]:
    per_segment = (evaluation.per_segment if evaluation is not None else None) or {}
    segments = per_segment.get("segments") or {}
    return {name: seg for name, seg in segments.items()
            if isinstance(seg, dict) and isinstance(seg.get("tau"), dict)}
