"""The promotion gate: a pure function from a policy and an evaluation to a decision.

A candidate is promoted only when **all** hold, each failure giving a reason (an
evaluation with no τ, where no held-out request had a verify step, is rejected for that
alone):

1. the held-out set has at least ``min_heldout`` requests;
2. the lower bound of the confidence interval of Δτ is at least ``min_gain`` (> 0, so a
   candidate equal to the incumbent is never promoted);
3. no segment with at least ``min_segment_requests`` requests regresses by more than
   ``segment_tolerance`` (point estimate of its Δτ);
4. the speedup over target-only does not fall (within ``speedup_tolerance``, relative):
   the **measured** one (:mod:`autospec.evaluate.speed`), or the estimated one when the
   evaluation did not measure (the reason says which).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from autospec.evaluate.compare import Evaluation

#: why an evaluation did not measure speed, where its caller did not say (a cycle: the
#: policy's evaluation.speed is off)
SPEED_OFF = "evaluation.speed.enabled is off"


class GatePolicy(BaseModel):
    """Thresholds of the promotion gate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_gain: float = Field(0.05, gt=0, description="the CI's lower bound of Δτ must reach this")
    min_heldout: int = Field(30, ge=1, description="fewest held-out requests to decide on")
    segment_tolerance: float = Field(
        0.10, ge=0, description="largest Δτ drop allowed in any segment with enough requests")
    min_segment_requests: int = Field(
        10, ge=1, description="segments with fewer requests are reported, not judged")
    speedup_tolerance: float = Field(
        0.02, ge=0, description="relative drop of the speedup (measured, else estimated) allowed: "
        "measurement noise")
    ci_level: float = Field(0.95, gt=0.5, lt=1, description="confidence level of the interval")


@dataclass(frozen=True)
class Decision:
    promote: bool
    reasons: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "promote" if self.promote else "reject"


def decide(policy: GatePolicy, evaluation: Evaluation) -> Decision:
    """Promote ``evaluation.candidate`` over ``evaluation.incumbent``? With reasons."""
    if evaluation.incumbent is None:
        return Decision(False, ["no incumbent to compare with"])
    if evaluation.delta is None:
        return Decision(False, [f"no τ to compare: none of the {evaluation.num_requests} "
                                "held-out requests had a verify step (outputs of one token)"])
    checks = [_size(policy, evaluation), _gain(policy, evaluation),
              *_segment_checks(policy, evaluation), _speed(policy, evaluation)]
    failed = [msg for ok, msg in checks if not ok]
    if failed:
        return Decision(False, failed)
    return Decision(True, [msg for _, msg in checks])


def _size(policy: GatePolicy, ev: Evaluation) -> tuple[bool, str]:
    ok = ev.num_requests >= policy.min_heldout
    left = (f"; {ev.unreplayable} more left out: decoded under settings replay cannot apply"
            if ev.unreplayable else "")
    return ok, (f"held-out set has {ev.num_requests} requests "
                f"({'≥' if ok else '<'} the policy's minimum {policy.min_heldout}{left})")


def _gain(policy: GatePolicy, ev: Evaluation) -> tuple[bool, str]:
    d = ev.delta
    assert d is not None
    ok = d.low >= policy.min_gain
    return ok, (f"Δτ = {d.delta:+.3f}, {ev.ci_level:.0%} CI [{d.low:+.3f}, {d.high:+.3f}]: "
                f"lower bound {'≥' if ok else '<'} minimum gain {policy.min_gain:+.3f}")


def _segment_checks(policy: GatePolicy, ev: Evaluation) -> list[tuple[bool, str]]:
    checks = []
    for seg in ev.segments:
        if seg.num_requests < policy.min_segment_requests or seg.delta is None:
            continue
        ok = seg.delta.delta >= -policy.segment_tolerance
        checks.append((ok, f"segment {seg.segment!r} ({seg.num_requests} requests): "
                           f"Δτ = {seg.delta.delta:+.3f} "
                           f"{'within' if ok else 'regresses beyond'} the tolerance "
                           f"−{policy.segment_tolerance:.3f}"))
    return checks


def _threads(n: int) -> str:
    return f"{n} thread" + ("" if n == 1 else "s")


def _speed(policy: GatePolicy, ev: Evaluation) -> tuple[bool, str]:
    speed = ev.gate_speedup
    cand, inc = speed[ev.candidate], speed[ev.incumbent or ""]
    ok = cand >= inc * (1 - policy.speedup_tolerance)
    verdict = ("does not fall" if ok
               else f"falls beyond the {policy.speedup_tolerance:.0%} tolerance")
    if ev.measured is None:
        return ok, (f"estimated speedup {cand:.2f}× vs incumbent {inc:.2f}× ({verdict}; "
                    f"not measured: {ev.unmeasured or SPEED_OFF})")
    m = ev.measured
    est_c, est_i = ev.speedup[ev.candidate], ev.speedup[ev.incumbent or ""]
    dec_c, dec_i = m.speedup[ev.candidate], m.speedup[ev.incumbent or ""]
    where = (f"on vLLM at {m.concurrency} request{'s' * (m.concurrency > 1)} in flight"
             if m.engine == "vllm" else f"on {_threads(m.threads)}")
    return ok, (f"measured speedup {cand:.2f}× vs incumbent {inc:.2f}× ({verdict}; replayed "
                f"τ over the step cost at the replayed drafts per step, from {m.rounds} "
                f"interleaved rounds {where}; decoded "
                f"{dec_c:.2f}× vs {dec_i:.2f}×; estimated "
                f"{est_c:.2f}× vs {est_i:.2f}×)")
