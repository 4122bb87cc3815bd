"""Where a cycle's time goes: wall seconds per stage, recorded in its ``cycle`` note.

The ledger (:mod:`autospec.ledger`) sets the time the loop spent against the
decode time speculation saved; this is the spent side. A :class:`StageTimer` lives for one
cycle; the cycle times its training of each kind and its evaluation of each candidate,
and its ``cycle`` note carries :meth:`StageTimer.as_dict` under ``stages``:

- ``features``: target feature extraction, the ``feature_s`` the training run measured
  (gradient kinds; carved out of the training stage's wall time);
- ``training``: the rest of each kind's training, registration included;
- ``shadow``: evaluation other than the speed measurement — the shadow replay, the cost
  model, the paired comparison, the synthetic replay;
- ``speed``: the speed measurement's decodes, from the end of the shadow replay to its last
  decoded round (read off the evaluation's progress callbacks; it takes in the cost model's
  few target forwards, which run between them).

The cycle's own wall time (start to end note) holds these and the rest (window snapshot,
lease, conclusion); the ledger reports that rest as ``other``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from autospec.ledger import STAGES

T = TypeVar("T")
log = logging.getLogger("autospec.controller.cycle")  # the cycle's progress, under its name


class EvaluationMarks:
    """When one evaluation's replay and speed rounds last reported (progress callbacks)."""

    def __init__(self, label: str = "evaluation") -> None:
        self.label = label
        self.started = time.perf_counter()
        self.replayed: float | None = None  # perf_counter of the last replay report
        self.decoded: float | None = None  # ... and of the last speed round

    def concluded(self, promote: bool, tau: float | None) -> None:
        """Log the gate's verdict (the cycle's progress)."""
        log.info("%s %s the gate (τ %s) in %.0f s", self.label,
                 "passes" if promote else "fails", "—" if tau is None else f"{tau:.3f}",
                 time.perf_counter() - self.started)

    def replay(self, done: int, total: int) -> None:
        self.replayed = time.perf_counter()

    def speed(self, done: int, total: int) -> None:
        self.decoded = time.perf_counter()

    def speed_s(self) -> float:
        """Seconds of the speed measurement: last replay report (else the start) to the
        last speed round; 0 when no round was decoded."""
        if self.decoded is None:
            return 0.0
        return max(0.0, self.decoded - (self.replayed or self.started))


class TrainingLap:
    """One kind's training as timed: the run's metrics once it is done."""

    def __init__(self, label: str = "training") -> None:
        self.label = label
        self.started = time.perf_counter()
        self.metrics: dict[str, Any] = {}

    def done(self, outcome: T) -> T:
        """Keep ``outcome.metrics`` (a training run's) and hand ``outcome`` back."""
        self.metrics = dict(getattr(outcome, "metrics", None) or {})
        log.info("%s: %s trained in %.0f s", self.label, getattr(outcome, "version", "?"),
                 time.perf_counter() - self.started)
        return outcome


class StageTimer:
    """Wall seconds per stage of :data:`STAGES` for one cycle."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)

    @contextmanager
    def training(self, label: str = "training", requests: int = 0) -> Iterator[TrainingLap]:
        """Time one kind's training; hand its outcome to the lap's ``done`` so the run's
        ``feature_s`` moves to ``features``. ``label`` names it in the progress log."""
        log.info("%s: training on %d requests", label, requests)
        lap = TrainingLap(label)
        try:
            yield lap
        finally:
            wall = time.perf_counter() - lap.started
            features = min(float(lap.metrics.get("feature_s") or 0.0), wall)
            self.seconds["features"] += features
            self.seconds["training"] += wall - features

    @contextmanager
    def evaluation(self, label: str = "evaluation", incumbent: str = "", heldout: int = 0,
                   timed_on: str | bool = False) -> Iterator[EvaluationMarks]:
        """Time one candidate's evaluation; pass the marks' ``replay`` / ``speed`` as
        the evaluation's progress callbacks so the speed measurement is split out.
        ``label`` names it in the progress log; ``timed_on``: the engine its speed is
        measured on (False: not measured)."""
        log.info("%s: evaluating against %s on %d held-out requests%s", label, incumbent,
                 heldout, f", timing speed on {timed_on}" if timed_on else "")
        marks = EvaluationMarks(label)
        try:
            yield marks
        finally:
            wall = time.perf_counter() - marks.started
            speed = min(marks.speed_s(), wall)
            self.seconds["speed"] += speed
            self.seconds["shadow"] += wall - speed

    def as_dict(self) -> dict[str, float]:
        return {stage: round(s, 3) for stage, s in self.seconds.items()}
