"""The shadow τ the deployment's canary judges by: re-weighted to the segment mix of the live
rows it judges.

A version's shadow τ (:func:`~autospec.controller.drafted_tau.drafted_tau`) is its τ over the
held-out requests of the segments it drafts, so it is weighted by the held-out set's segment
mix. Its live τ since the move is over the rows it has served, whose mix can be quite another:
right after a move the high-τ segments may have had no traffic yet, and a version that does on
every segment exactly what its evaluation measured then shows a live τ well below the
held-out mix's (a false rollback). The deployment's canary therefore compares live τ with the
shadow τ *at the live mix*::

    expected τ = 1 + Σ_s w_s (τ̂_s − 1),   w_s = live steps on segment s / all live steps

(``= Σ_s w_s τ̂_s``, the w_s summing to 1), τ̂_s the evaluation's τ of the version on segment
s, over the very rows its live τ counts (at the evaluation's k, full drafts, without the
segments that have a pointer of their own). **Steps, not requests**: τ = (accepted + steps) /
steps pools over verify steps, so live τ is exactly the step-weighted mean of the segments'
live τ; weighted by steps, a version whose live τ on each segment equals τ̂_s meets the
expected τ exactly whatever the mix (weighted by requests it would not: a segment of long
answers has more steps per request, and τ pools them so). A real shortfall still shows: on
each segment the live rows are held to what the version did there in the evaluation.

A segment with live rows but no τ̂_s of its own — fewer held-out requests than the
evaluation's ``gate.min_segment_requests`` (its τ there is reported, not evidence), none, no
step there, or a segment the evaluation never saw — has the evaluation's shadow τ over the
drafted segments stand in for it. With no live step, or no per-segment figures in the
evaluation (an override without one), the expected τ is that shadow τ.

Only the deployment's canary is re-weighted: a segment's canary judges one segment, so there
is no mix to re-weight, and the drift watch keeps the held-out weighting on purpose (a shift
of the traffic to segments where the version does worse is what it is there to notice).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autospec.controller.drafted_tau import evaluated_segments
from autospec.controller.operations import min_segment_requests
from autospec.store.models import Evaluation
from autospec.store.queries import TauStat


@dataclass(frozen=True)
class MixTau:
    """The shadow τ to judge by (``tau``), the one over the held-out mix it came from
    (``held_out``), whether any live segment's own τ re-weighted it (``mixed``), and the
    live segments the held-out figure stands in for (``stand_in``)."""

    tau: float
    held_out: float
    mixed: bool = False
    stand_in: tuple[str, ...] = ()

    def said(self) -> str:
        """The shadow τ as a canary's reason gives it (after "shadow τ "): one figure where
        both read the same."""
        if not self.mixed or f"{self.tau:.3f}" == f"{self.held_out:.3f}":
            return f"{self.tau:.3f}"
        stood = (f", which stands in for {', '.join(self.stand_in)}: no τ of its own in the "
                 "evaluation") if self.stand_in else ""
        return (f"{self.tau:.3f} at the live mix ({self.held_out:.3f} over the held-out "
                f"mix{stood})")

    def details(self) -> dict[str, Any]:
        """What a canary note and rollback record beside ``shadow_tau`` (= :attr:`tau`)."""
        return {"shadow_tau_held_out": self.held_out} if self.mixed else {}


def at_live_mix(held_out: float, evaluation: Evaluation | None, version: str,
                rows: Sequence[TauStat]) -> MixTau:
    """``held_out`` (``version``'s shadow τ over the drafted segments' held-out requests)
    re-weighted to the segment mix of ``rows`` (its live τ per segment, the rows the canary
    counts) with ``evaluation``'s τ of ``version`` per segment (see module doc)."""
    steps = sum(r.steps for r in rows)
    if evaluation is None or steps <= 0:
        return MixTau(held_out, held_out)
    least = min_segment_requests(evaluation)
    own = {name: tau for name, (n, tau) in evaluated_segments(evaluation, version).items()
           if n >= least}
    served = [r for r in rows if r.steps > 0]
    if not any(r.segment in own for r in served):
        return MixTau(held_out, held_out)
    expected = 1 + sum(r.steps * (own.get(str(r.segment), held_out) - 1)
                       for r in served) / steps
    stand_in = tuple(sorted({str(r.segment) for r in served if r.segment not in own}))
    return MixTau(expected, held_out, True, stand_in)
