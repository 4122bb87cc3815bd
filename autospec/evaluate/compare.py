"""Paired comparison of speculator versions on the same held-out requests.

τ of a set of requests is :func:`autospec.engine.stats.tau` of their summed counts, a
ratio of sums: tokens per target forward over the whole set (long requests weigh more, as
they do in serving). A set where no request had a verify step (outputs of one token) has
no τ (None): its versions are reported without one and their Δτ has no interval. The
confidence interval of ``Δτ = τ(candidate) − τ(incumbent)`` comes from a **paired**
bootstrap: the same resampled requests for both versions, so the request-to-request
variation that both share cancels (a resample without any step measures nothing and is
left out).

Estimated speedup over target-only decoding, per version:
``τ · t_step / (t_propose(d) + t_verify(d + 1))`` with ``d`` the mean draft tokens per
step, ``t_step`` a 1-token target forward, ``t_verify(n)`` a target forward over ``n``
tokens and ``t_propose(d)`` the speculator's seconds per step, as its replay spent them on
these requests — so a slow speculator with a slightly higher τ does not win.

The estimate is a model; the gate ranks on the **measured** speedup
(:mod:`autospec.evaluate.speed`, ``Evaluation.measured``) when there is one, and falls back
to the estimate only when measurement is off (``Evaluation.speed_basis`` says which).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from autospec.engine.stats import tau

if TYPE_CHECKING:
    from autospec.evaluate.replay import ReplayStats
    from autospec.evaluate.speed import SpeedMeasurement


@dataclass(frozen=True)
class Interval:
    delta: float  # point estimate of τ(candidate) − τ(incumbent)
    low: float
    high: float


@dataclass
class SegmentResult:
    segment: str
    num_requests: int
    tau: dict[str, float | None]  # version -> τ on this segment (None: no step in it)
    delta: Interval | None = None  # candidate vs incumbent, when there are two with a τ
    #: the candidate (versions[0]) vs each other version on this segment's requests (paired
    #: CI; None: no τ to compare): what a per-segment promotion compares against the version
    #: that serves the segment, which need not be the deployment's incumbent
    deltas: dict[str, Interval | None] = field(default_factory=dict)
    #: version -> estimated speedup over target-only on this segment's requests (the cost
    #: model of the module doc, on the segment's replay)
    speedup: dict[str, float] = field(default_factory=dict)
    #: version -> draft tokens per verify step on this segment's requests (replayed)
    draft_tokens_per_step: dict[str, float] = field(default_factory=dict)


@dataclass
class SyntheticResult:
    """τ of each version on held-out synthetic sequences (target-generated, never trained
    on): drafts counted against the synthetic outputs token by token. Reported beside the
    real held-out τ for the overfitting guard; the gate never decides on it."""

    num_sequences: int
    tau: dict[str, float | None]
    delta: Interval | None  # candidate vs incumbent, when there are two versions with a τ


@dataclass
class Costs:
    """Measured seconds of the target: a 1-token step and forwards by size (the speculator's
    side comes from each version's replay, ``ReplayStats.draft_s``)."""

    step_s: float
    verify_s: dict[int, float]  # n tokens -> seconds

    def verify(self, n: float) -> float:
        """Seconds of a target forward over ``n`` tokens (linear between measured sizes)."""
        sizes = sorted(self.verify_s)
        return float(np.interp(n, sizes, [self.verify_s[s] for s in sizes]))


@dataclass
class Evaluation:
    """Everything the gate decides on; versions[0] is the candidate, versions[1] the
    incumbent when comparing two."""

    versions: list[str]
    num_requests: int
    tau: dict[str, float | None]  # None: no held-out request had a verify step
    draft_tokens_per_step: dict[str, float]
    accepted_per_position: dict[str, list[float]]  # acceptance rate at each draft position
    delta: Interval | None  # None: one version only, or no τ to compare
    segments: list[SegmentResult]
    speedup: dict[str, float]  # estimated, over target-only
    k: int
    ci_level: float
    measured: SpeedMeasurement | None = None  # decoded speedup; None: measurement off
    #: what turned measurement off, as the gate's reason names it (None: it was on)
    unmeasured: str | None = None
    synthetic: SyntheticResult | None = None  # held-out synthetic τ; None: no such sequences
    #: requests left out: sampled under settings replay cannot apply (a grammar...)
    unreplayable: int = 0

    @property
    def speed_basis(self) -> str:
        """Which speedup the gate compares: ``measured`` or (measurement off) ``estimated``."""
        return "measured" if self.measured is not None else "estimated"

    @property
    def measured_speedup(self) -> dict[str, float] | None:
        """Replayed τ ÷ measured step cost at the replayed drafts per step, per version
        (``SpeedMeasurement.projected``); None when speed was not measured."""
        return (self.measured.projected(self.tau, self.draft_tokens_per_step)
                if self.measured is not None else None)

    @property
    def gate_speedup(self) -> dict[str, float]:
        """Speedup over target-only per version, as the gate compares and ranks it."""
        return self.measured_speedup or self.speedup

    @property
    def candidate(self) -> str:
        return self.versions[0]

    @property
    def incumbent(self) -> str | None:
        return self.versions[1] if len(self.versions) > 1 else None


def _sums(stats: Sequence[ReplayStats]) -> tuple[np.ndarray, np.ndarray]:
    accepted = np.array([s.accepted for s in stats], dtype=np.float64)
    steps = np.array([s.steps for s in stats], dtype=np.int64)
    return accepted, steps


def set_tau(stats: Sequence[ReplayStats]) -> float | None:
    """τ over a set of requests (see the module doc); None when none had a step."""
    accepted, steps = _sums(stats)
    return tau(float(accepted.sum()), int(steps.sum()))


def tau_text(value: float | None) -> str:
    """A τ as printed: three decimals, or ``—`` where there was no step to measure."""
    return "—" if value is None else f"{value:.3f}"


def paired_bootstrap(candidate: Sequence[ReplayStats], incumbent: Sequence[ReplayStats], *,
                     level: float = 0.95, resamples: int = 2000,
                     seed: int = 0) -> Interval | None:
    """Percentile CI of Δτ over requests resampled with replacement (the same for both);
    None when either version has no τ on these requests."""
    assert len(candidate) == len(incumbent) > 0
    point_c, point_i = set_tau(candidate), set_tau(incumbent)
    if point_c is None or point_i is None:
        return None
    n = len(candidate)
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples)  # [resamples, n]

    def resampled(stats: Sequence[ReplayStats]) -> list[float | None]:
        accepted, steps = _sums(stats)  # [n] each
        return [tau(float(a), int(s)) for a, s in zip(weights @ accepted, weights @ steps,
                                                      strict=True)]

    pairs = zip(resampled(candidate), resampled(incumbent), strict=True)
    deltas = [c - i for c, i in pairs if c is not None and i is not None]
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(deltas, [tail, 100 - tail])
    return Interval(delta=point_c - point_i, low=float(low), high=float(high))


def estimated_speedup(stats: Sequence[ReplayStats], costs: Costs) -> float:
    """τ · t_step / (t_propose + t_verify(d + 1)); see the module docstring. 1.0 (the
    target's own pace) when no request had a step: nothing was sped up or slowed down."""
    steps = sum(s.steps for s in stats)
    measured = set_tau(stats)
    if measured is None:
        return 1.0
    propose_s = sum(s.draft_s for s in stats) / steps
    verify_s = costs.verify(drafts_per_step(stats) + 1)
    return float(measured * costs.step_s / (propose_s + verify_s))


def compare(results: dict[str, list[ReplayStats]], segments: Sequence[str], costs: Costs, *,
            k: int, level: float = 0.95, resamples: int = 2000,
            seed: int = 0) -> Evaluation:
    """Build an :class:`Evaluation` from per-request replay results of each version."""
    versions = list(results)
    n = len(segments)
    assert all(len(v) == n for v in results.values()) and n > 0
    pair = versions[:2] if len(versions) > 1 else None
    delta = (paired_bootstrap(results[pair[0]], results[pair[1]], level=level,
                              resamples=resamples, seed=seed) if pair else None)
    return Evaluation(
        versions=versions, num_requests=n,
        tau={v: set_tau(s) for v, s in results.items()},
        draft_tokens_per_step={v: drafts_per_step(s) for v, s in results.items()},
        accepted_per_position={v: _position_rates(s) for v, s in results.items()},
        delta=delta,
        segments=_segments(results, segments, costs, level, resamples, seed),
        speedup={v: estimated_speedup(s, costs) for v, s in results.items()},
        k=k, ci_level=level,
    )


def compare_synthetic(results: dict[str, list[ReplayStats]], *, level: float = 0.95,
                      resamples: int = 2000, seed: int = 0) -> SyntheticResult:
    """τ per version and the paired CI of Δτ on held-out synthetic sequences."""
    versions = list(results)
    n = len(results[versions[0]])
    assert n > 0 and all(len(v) == n for v in results.values())
    delta = (paired_bootstrap(results[versions[0]], results[versions[1]], level=level,
                              resamples=resamples, seed=seed) if len(versions) > 1 else None)
    return SyntheticResult(num_sequences=n, tau={v: set_tau(s) for v, s in results.items()},
                           delta=delta)


def drafts_per_step(stats: Sequence[ReplayStats]) -> float:
    """Mean draft tokens per verify step (a tree's nodes all count)."""
    steps = sum(s.steps for s in stats)
    return sum(s.draft_tokens for s in stats) / steps if steps else 0.0


def _position_rates(stats: Sequence[ReplayStats]) -> list[float]:
    """Acceptance rate at position i: P(draft i accepted | drafts < i accepted)."""
    width = max((len(s.accepted_per_position) for s in stats), default=0)
    totals = np.zeros(width + 1)
    totals[0] = sum(s.drafted_steps for s in stats)  # a step that proposed nothing is no trial
    for s in stats:
        totals[1 : len(s.accepted_per_position) + 1] += s.accepted_per_position
    return [float(totals[i + 1] / totals[i]) if totals[i] else 0.0 for i in range(width)]


def _segments(results, segments, costs, level, resamples, seed) -> list[SegmentResult]:
    """Per segment: τ and estimated speedup of each version, and the paired CI of the
    candidate (the first version) against each other one (``delta``: against the second)."""
    first, *others = list(results)
    out = []
    for seg in sorted(set(segments)):
        idx = [i for i, s in enumerate(segments) if s == seg]
        sub = {v: [stats[i] for i in idx] for v, stats in results.items()}
        deltas = {v: paired_bootstrap(sub[first], sub[v], level=level, resamples=resamples,
                                      seed=seed) for v in others}
        out.append(SegmentResult(segment=seg, num_requests=len(idx),
                                 tau={v: set_tau(s) for v, s in sub.items()},
                                 delta=deltas[others[0]] if others else None, deltas=deltas,
                                 draft_tokens_per_step={v: drafts_per_step(s)
                                                        for v, s in sub.items()},
                                 speedup={v: estimated_speedup(s, costs)
                                          for v, s in sub.items()}))
    return out
