"""A traffic phase of the demo and what it measures.

:class:`TrafficPhase` sends one phase's greedy chat requests of one domain (or of several
alternating: a mixed phase) to the live application, one client, and every
``baseline_every``-th prompt of each domain to the target-only one too, back to back; each
response becomes a :class:`~autospec.demo.record.Sample`. Then :meth:`TrafficPhase.measure`
fills the phase's figures: live τ, output tokens/s per request, the speedup over
target-only on the paired prompts (a mixed phase: per segment too,
:func:`segment_figures`), and the **shadow τ** of the version that served the phase,
replayed from the logged requests (:func:`shadow_tau`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from autospec.demo.plan import DemoPlan
from autospec.demo.record import PhaseFigures, Reporter, Sample, SegmentFigures, Timeline, fmt
from autospec.demo.serving import DEPLOYMENT
from autospec.engine.stats import tau
from autospec.loadgen.client import Driver, Result, decode_rate
from autospec.loadgen.runner import tau as tau_of
from autospec.loadgen.source import DomainSource, Prompt

log = logging.getLogger(__name__)


class TrafficPhase:
    """One phase's requests (:meth:`send_all`) and figures (:meth:`measure`)."""

    def __init__(self, figures: PhaseFigures, *, plan: DemoPlan, source: DomainSource,
                 live: Driver, baseline: Driver, timeline: Timeline,
                 reporter: Reporter, mix: tuple[str, ...] = ()) -> None:
        self.figures, self.plan, self.source = figures, plan, source
        self.domains = mix or (figures.domain,)  # a mixed phase alternates these
        self.live, self.baseline = live, baseline
        self.timeline, self.reporter = timeline, reporter
        self.results: list[Result] = []  # live responses
        self.paired: list[tuple[Result, Result]] = []  # (live, target-only), same prompt

    def send_all(self, n: int, stop_when: Callable[[int], bool] | None = None) -> None:
        """Up to ``n`` prompts; ``stop_when(done)`` true after a request ends the phase."""
        for i in range(n):
            prompt = self.source.next(self.domains[i % len(self.domains)])
            live = self.send(self.live, prompt, "live")
            self.results.append(live)
            if (i // len(self.domains)) % self.plan.baseline_every == 0:  # each domain's
                self.paired.append((live, self.send(self.baseline, prompt, "target")))
            if stop_when is not None and stop_when(i + 1):
                break

    def send(self, driver: Driver, prompt: Prompt, app: str) -> Result:
        """One request to ``app`` ("live" or "target"), recorded on the timeline."""
        phase, t = self.figures, self.timeline.now()
        result = driver.send(prompt, start_s=t)
        sample = Sample(t=t + result.latency_s, phase=phase.name, app=app,
                        segment=prompt.segment, ok=result.ok, version=result.version,
                        tau=result.tau, tokens=result.completion_tokens,
                        latency_s=result.latency_s)
        self.timeline.samples.append(sample)
        if app == "live":
            phase.requests += 1
            phase.errors += 0 if result.ok else 1
            if result.ok and result.version:
                phase.versions[result.version] = phase.versions.get(result.version, 0) + 1
                self.timeline.logged += 1
            self.reporter.request(phase, sample)
        elif not result.ok:
            log.warning("target-only request failed: %s%s", result.error,
                        f": {result.error_message}" if result.error_message else "")
        return result

    def measure(self, shadow: Callable[[PhaseFigures, int], float | None]) -> None:
        """The phase's figures from its responses; ``shadow(phase, n)``: its shadow τ over
        the last ``n`` logged requests."""
        phase = self.figures
        ok = [r for r in self.results if r.ok]
        phase.end_t = self.timeline.now()
        phase.tau_live = tau_of(ok)
        phase.tokens_per_s = rate(ok)
        both = [(s, t) for s, t in self.paired if s.ok and t.ok]
        phase.paired_prompts = len(both)
        if both:
            phase.paired_spec_tokens_per_s = rate([s for s, _ in both])
            phase.target_tokens_per_s = rate([t for _, t in both])
            if phase.paired_spec_tokens_per_s and phase.target_tokens_per_s:
                phase.speedup = phase.paired_spec_tokens_per_s / phase.target_tokens_per_s
        if len(self.domains) > 1:
            phase.segments = segment_figures(self.results, self.paired)
        phase.tau_shadow = shadow(phase, len(ok))
        self.reporter.say(
            f"phase {phase.name} done in {phase.end_t - phase.start_t:.0f}s: version "
            f"{phase.live_version}, τ live {fmt(phase.tau_live)} / shadow "
            f"{fmt(phase.tau_shadow)}, {fmt(phase.tokens_per_s, '.1f')} tok/s, speedup "
            f"{fmt(phase.speedup, '.2f')}× over target-only ({phase.paired_prompts} "
            f"paired prompts)")


def segment_figures(results: list[Result],
                    paired: list[tuple[Result, Result]]) -> dict[str, SegmentFigures]:
    """Per segment of a mixed phase: its live requests, the versions that answered them,
    live τ, tokens/s and the speedup over target-only on its paired prompts."""
    out: dict[str, SegmentFigures] = {}
    for name in dict.fromkeys(r.segment for r in results):
        mine = [r for r in results if r.segment == name]
        ok = [r for r in mine if r.ok]
        seg = SegmentFigures(segment=name, requests=len(mine), tau_live=tau_of(ok),
                             tokens_per_s=rate(ok))
        for r in ok:
            if r.version:
                seg.versions[r.version] = seg.versions.get(r.version, 0) + 1
        both = [(s, t) for s, t in paired if s.segment == name and s.ok and t.ok]
        seg.paired_prompts = len(both)
        spec, target = rate([s for s, _ in both]), rate([t for _, t in both])
        seg.target_tokens_per_s = target
        seg.speedup = spec / target if spec and target else None
        out[name] = seg
    return out


def rate(results: list[Result]) -> float | None:
    """Output tokens per second after the first token (the demo streams its requests:
    :func:`~autospec.loadgen.client.decode_rate`), as the gate's rounds time decodes."""
    return decode_rate(results)


def shadow_tau(store_engine: Any, target: Any, plan: DemoPlan, phase: PhaseFigures, n: int,
               *, wait: Callable[[], None]) -> float | None:
    """τ of the phase's version replayed on the phase's logged requests (the last ``n``
    logged, at most ``plan.shadow_sample`` of them; ``wait()`` until the store holds them);
    None without any. A mixed phase, whose segments may be served by different versions:
    each row replayed with the version that served it."""
    from autospec.evaluate.replay import replay
    from autospec.evaluate.run import select_requests, to_replay_request
    from autospec.versions import load_speculator_version

    versions = set(phase.versions) if phase.segments else {phase.live_version}
    if phase.live_version is None or n == 0:
        return None
    wait()
    examples = [ex for ex in select_requests(store_engine, last=n, deployment=DEPLOYMENT)
                if ex.speculator_version in versions][-plan.shadow_sample:]
    accepted = steps = 0
    for version in dict.fromkeys(ex.speculator_version for ex in examples):
        assert version is not None
        _, spec = load_speculator_version(store_engine, target, version)
        mine = [to_replay_request(e) for e in examples if e.speculator_version == version]
        stats = replay(target, {version: spec}, mine, plan.k)[version]
        accepted += sum(s.accepted for s in stats)
        steps += sum(s.steps for s in stats)
    return tau(accepted, steps) if examples else None


def wait_logged(store_engine: Any, logged: int, timeout_s: float = 30.0) -> None:
    """Until the store holds ``logged`` requests (the traffic writer flushes in batches)."""
    from autospec import store

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with store.session_scope(store_engine, readonly=True) as session:
            if store.request_counts(session).get(None, 0) >= logged:
                return
        time.sleep(0.2)
    log.warning("the store holds fewer requests than were answered after %.0fs", timeout_s)
