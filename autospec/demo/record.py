"""What a demo run records: every response (:class:`Sample`), each phase's figures
(:class:`PhaseFigures`), the controller's decisions (:class:`DecisionNote`), and the whole
(:class:`DemoResult`, or :class:`DemoStopped` carrying a partial one).

:class:`Timeline` is the run's record while it runs (the clock, samples, finished phases,
decisions, how many live responses the store should hold); the phase, controller and
serving units write to it, :class:`~autospec.demo.run.Demo` turns it into the result, with
the run's ledger read back from the store (:func:`demo_ledger`). :class:`Reporter` receives
progress. This module measures nothing and starts nothing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from autospec.demo.speed_checks import speed_checks

if TYPE_CHECKING:
    from rich.text import Text

log = logging.getLogger(__name__)


@dataclass
class Sample:
    """One response on the demo's timeline (``t`` seconds since the demo started)."""

    t: float
    phase: str
    app: str  # "live" or "target"
    segment: str
    ok: bool
    version: str | None
    tau: float | None
    tokens: int
    latency_s: float


@dataclass
class SegmentFigures:
    """One traffic segment's share of a mixed phase, from its responses."""

    segment: str
    requests: int = 0
    versions: dict[str, int] = field(default_factory=dict)  # from x-autospec-speculator
    tau_live: float | None = None
    tokens_per_s: float | None = None
    paired_prompts: int = 0
    target_tokens_per_s: float | None = None
    speedup: float | None = None

    @property
    def served_by(self) -> str | None:
        """The version that answered most of the segment's live requests."""
        return max(self.versions, key=self.versions.__getitem__) if self.versions else None


@dataclass
class PhaseFigures:
    name: str
    title: str
    domain: str
    start_t: float
    end_t: float = 0.0
    requests: int = 0
    errors: int = 0
    versions: dict[str, int] = field(default_factory=dict)
    tau_live: float | None = None
    tau_shadow: float | None = None
    tokens_per_s: float | None = None
    paired_prompts: int = 0
    paired_spec_tokens_per_s: float | None = None
    target_tokens_per_s: float | None = None
    speedup: float | None = None
    segments: dict[str, SegmentFigures] = field(default_factory=dict)  # a mixed phase's

    @property
    def live_version(self) -> str | None:
        """The version that answered most of the phase's live requests."""
        return max(self.versions, key=self.versions.__getitem__) if self.versions else None


@dataclass
class DecisionNote:
    """A controller decision as the demo saw it."""

    t: float
    after_phase: str
    kind: str  # cycle, canary, drift, watch
    outcome: str
    version: str | None
    reasons: list[str]
    # a promotion's speedup over target-only as the gate saw it (measured, estimated)
    gate_speedup: dict[str, float | None] | None = None


@dataclass
class DemoResult:
    plan: dict[str, Any]
    target: str
    data_dir: str
    took_s: float
    phases: list[PhaseFigures]
    decisions: list[DecisionNote]
    samples: list[Sample]
    events: list[dict[str, Any]]
    partial: str | None = None  # why the run ended early; None: it ran to the end
    base: str | None = None  # the base eagle3 head the candidates warm-started from
    ledger: dict[str, Any] | None = None  # the run's ledger (:func:`demo_ledger`)
    concurrency: dict[str, Any] | None = None  # vLLM: demo/concurrency.py's table
    mix: dict[str, Any] | None = None  # per-segment versions against one (demo/mix.py)

    def as_dict(self) -> dict[str, Any]:
        return {"plan": self.plan, "target": self.target, "data_dir": self.data_dir,
                "took_s": self.took_s, "complete": self.partial is None,
                "partial": self.partial, "base": self.base,
                "phases": [_phase_dict(p) for p in self.phases],
                "decisions": [asdict(d) for d in self.decisions],
                "speed_checks": speed_checks(self), "ledger": self.ledger,
                "concurrency": self.concurrency, "mix": self.mix,
                "events": self.events, "samples": [asdict(s) for s in self.samples]}


def _phase_dict(p: PhaseFigures) -> dict[str, Any]:
    out = dict(asdict(p), live_version=p.live_version)
    for name, seg in p.segments.items():
        out["segments"][name]["served_by"] = seg.served_by
    return out


def demo_ledger(store_engine: Any, *, took_s: float,
                strict: bool = True) -> dict[str, Any] | None:
    """The ledger (:mod:`autospec.ledger`) of the demo's own period, the last
    ``took_s`` seconds; for a partial report (``strict=False``) None if it cannot be read."""
    from datetime import timedelta

    from autospec.demo.serving import DEPLOYMENT
    from autospec.ledger import ledger_for

    if store_engine is None:
        return None
    try:
        return ledger_for(store_engine, deployment=DEPLOYMENT,
                          period=timedelta(seconds=took_s + 1.0))
    except Exception as exc:
        if strict:
            raise
        log.warning("the ledger could not be read for the partial report: %s", exc)
        return None


class DemoStopped(Exception):
    """The demo ended early (``interrupted``: Ctrl-C; else a failure, the ``__cause__``);
    ``result`` is the partial result (``result.partial`` says why and where). Serve and Ray
    are already shut down when this is raised."""

    def __init__(self, result: DemoResult, *, interrupted: bool) -> None:
        super().__init__(result.partial)
        self.result, self.interrupted = result, interrupted


class Reporter:
    """Progress callbacks; the CLI draws them with rich. The default logs. A message is
    printed as written: a ``str`` is never read as markup (it may carry a path, a reason);
    a rich ``Text`` carries the demo's own styles (logged as its plain text)."""

    def say(self, message: str | Text) -> None:
        log.info("%s", message)

    def request(self, phase: PhaseFigures, sample: Sample) -> None:
        pass


@dataclass
class Timeline:
    """The run's record while it runs; ``now()`` is seconds since it began."""

    t0: float = field(default_factory=time.perf_counter)
    samples: list[Sample] = field(default_factory=list)
    phases: list[PhaseFigures] = field(default_factory=list)  # finished (figures measured)
    decisions: list[DecisionNote] = field(default_factory=list)
    logged: int = 0  # live responses the store should hold

    def now(self) -> float:
        return time.perf_counter() - self.t0


def fmt(value: float | None, spec: str = ".2f") -> str:
    """A figure for a progress line; ``—`` where there is none."""
    return "—" if value is None else format(value, spec)
