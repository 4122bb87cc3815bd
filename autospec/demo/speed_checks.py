"""Does the gate's speed figure hold? Each promotion's expected speedup against the realised.

For every promotion the demo saw, the speedup over target-only the gate ranked it on
(``measured``: interleaved target-only and speculative decodes of held-out prompts, median
of ratios; ``estimated``: the cost model) beside the speedup the next phase served by that
version **realised** (live tokens/s over target-only tokens/s on the same prompts, sent
back to back). ``within`` is whether the gate's figure (measured where there is one) is
within ``TOLERANCE`` of the realised one — the issue's "within 25 %". Both are rates after
the first token: the demo streams its requests and times each from its first output text
(:func:`autospec.demo.phases.rate`), so prefill and queueing weigh on neither.
"""

from __future__ import annotations

from typing import Any

TOLERANCE = 0.25


def speed_checks(result: Any) -> list[dict[str, Any]]:
    """One row per promotion with a gate figure (see the module docstring)."""
    rows = []
    for decision in result.decisions:
        expected = decision.gate_speedup
        if decision.outcome != "promoted" or not decision.version or not expected:
            continue
        phase = _served_next(result.phases, decision)
        realised = phase.speedup if phase is not None else None
        gate = expected.get("measured") or expected.get("estimated")
        rows.append({
            "version": decision.version, "after_phase": decision.after_phase,
            "measured": expected.get("measured"), "estimated": expected.get("estimated"),
            "realised": realised, "realised_in": phase.name if phase is not None else None,
            "gate_over_realised": _ratio(gate, realised),
            "estimated_over_realised": _ratio(expected.get("estimated"), realised),
            "within": None if realised is None or gate is None
            else abs(gate / realised - 1) <= TOLERANCE})
    return rows


def _served_next(phases: list[Any], decision: Any) -> Any:
    """The first phase after ``decision`` that its version served most of."""
    for phase in phases:
        if phase.start_t >= decision.t and phase.live_version == decision.version:
            return phase
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None
