"""The overfitting guard: a synthetic gain that does not show on real traffic is rejected.

Applied after the gate (:func:`autospec.evaluate.gate.decide`), which decides on real
held-out traffic only, as before. When the evaluation also replayed held-out synthetic
sequences (``Evaluation.synthetic``) the guard compares the two paired confidence
intervals of Δτ: a candidate whose synthetic Δτ is clearly positive (its lower bound
reaches the gate's ``min_gain``) while its real Δτ's lower bound does not is rejected, and
the first reason names both numbers. Such a candidate learnt the synthetic sequences, not
the traffic. The guard never promotes; with no synthetic sequences it changes nothing.
"""

from __future__ import annotations

from autospec.evaluate.compare import Evaluation
from autospec.evaluate.gate import Decision, GatePolicy

GUARD = "overfitting guard"


def overfits(policy: GatePolicy, ev: Evaluation) -> bool:
    """Clear synthetic gain (CI low ≥ min_gain) without a real one (real CI low < min_gain)."""
    syn = ev.synthetic
    if syn is None or syn.delta is None or ev.delta is None:
        return False
    return syn.delta.low >= policy.min_gain and ev.delta.low < policy.min_gain


def guard(policy: GatePolicy, ev: Evaluation, decision: Decision) -> Decision:
    """``decision``, or a rejection led by the guard's reason when :func:`overfits`."""
    if not overfits(policy, ev):
        return decision
    syn, real = ev.synthetic, ev.delta
    assert syn is not None and syn.delta is not None and real is not None
    reason = (f"{GUARD}: synthetic Δτ = {syn.delta.delta:+.3f} (CI low {syn.delta.low:+.3f}, "
              f"{syn.num_sequences} held-out synthetic sequences) but real Δτ = "
              f"{real.delta:+.3f} (CI low {real.low:+.3f} < minimum gain "
              f"{policy.min_gain:+.3f}, {ev.num_requests} held-out requests): the synthetic "
              f"gain does not show on real traffic")
    return Decision(False, [reason, *decision.reasons])
