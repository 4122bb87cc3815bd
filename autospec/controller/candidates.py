"""A cycle's candidates: what the cycle learnt of each (its evaluation, shadow τ, speedups,
the gate's verdict) and which passing one it promotes. Each is a version trained this
cycle, or a registered base evaluated as it is (``training.evaluate_base``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autospec.controller.result import CycleFailed

if TYPE_CHECKING:
    from autospec.evaluate.compare import Evaluation


@dataclass
class Candidate:
    version: str
    run_id: int | None  # None: a registered base evaluated as it is (not trained here)
    evaluation_id: int | None = None
    tau: float | None = None
    speedup: float | None = None  # over target-only, as the gate ranks it (measured if on)
    speedup_estimated: float | None = None
    speedup_measured: float | None = None  # None: measurement off
    incumbent_speedup_measured: float | None = None
    promote: bool = False
    reasons: list[str] = field(default_factory=list)
    #: the whole shadow evaluation (per-segment τ, CIs and speedups), for per-segment
    #: promotion (:mod:`autospec.controller.segment_promotion`); None: it failed
    evaluation: Evaluation | None = None
    #: its evaluation could not run (an error not of the window: :meth:`evaluation_failed`)
    unrun: bool = False

    @property
    def is_base(self) -> bool:
        return self.run_id is None

    def take(self, report: Any, incumbent: str) -> None:
        """Its figures and the gate's verdict from its shadow evaluation's ``report``
        (:func:`autospec.evaluate.run.evaluate_versions`) against ``incumbent``."""
        assert report.decision is not None
        ev = self.evaluation = report.evaluation
        self.evaluation_id, self.tau = report.evaluation_id, ev.tau[self.version]
        self.speedup = ev.gate_speedup.get(self.version)
        self.speedup_estimated = ev.speedup.get(self.version)
        if (measured := ev.measured_speedup) is not None:
            self.speedup_measured = measured.get(self.version)
            self.incumbent_speedup_measured = measured.get(incumbent)
        self.promote, self.reasons = report.decision.promote, list(report.decision.reasons)

    def evaluation_failed(self, exc: Exception) -> None:
        """Its evaluation raised ``exc``: not promoted, the reason kept; ``unrun`` unless
        every held-out request had been trained on (the window's fault, which another try
        on it would repeat)."""
        from autospec.evaluate.run import TrainedOnError

        self.reasons = [f"evaluation failed: {exc}"]
        self.unrun = not isinstance(exc, TrainedOnError)


def check_evaluated(candidates: list[Candidate]) -> None:
    """:class:`CycleFailed` when no candidate's evaluation could run: the cause is then
    likely common to all (the incumbent or a segment's version would not load, the speed
    measurement's engine failed), not the candidates', so the cycle fails, keeping its
    window for the next one, and no candidate is rejected for it. Where one ran, another's
    failure was its own (it is rejected with the reason)."""
    if candidates and all(c.unrun for c in candidates):
        raise CycleFailed("no candidate could be evaluated: "
                          + "; ".join(f"{c.version}: {r}" for c in candidates for r in c.reasons))


def best_candidate(candidates: list[Candidate]) -> Candidate | None:
    """The passing candidate with the highest speedup as the gate ranks it (measured, or
    estimated when measurement is off; ties: shadow τ), or None."""
    passing = [c for c in candidates if c.promote]
    return min(passing, key=lambda c: (-(c.speedup or 0), -(c.tau or 0)), default=None)


def gate_reasons(candidates: list[Candidate], *, kept: str | None = None) -> list[str]:
    """Each candidate's reasons from the gate, ``<version>: why`` (``<version> (base): why``
    for a base). ``kept``: the deployment's version when its pointer stayed while a
    segment's moved; each then reads ``deployment: kept <kept> — <version>: why``, a verdict
    on the deployment's pointer rather than the cycle's (which promoted)."""
    head = f"deployment: kept {kept} — " if kept else ""
    return [f"{head}{c.version}{' (base)' if c.is_base else ''}: {r}"
            for c in candidates for r in c.reasons]


def speed_text(cand: Candidate) -> str:
    """The candidate's speedup as the promotion's reason states it."""
    est = f"estimated speedup {cand.speedup_estimated or 0:.2f}×"
    if cand.speedup_measured is None:
        return f"{est}, not measured"
    return f"measured speedup {cand.speedup_measured:.2f}× ({est})"
