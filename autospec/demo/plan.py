"""What a demo run does: phase sizes, decoding settings and the controller policy it runs.

:func:`plan_for` gives the ``quick`` (goal ≤ 6 minutes on 2 CPU cores; 7.4 measured on
2026-12-05, README) and ``full`` (goal ≤ 20 minutes) presets; every figure can be overridden
from the CLI. :func:`demo_policy` builds the controller
:class:`~autospec.controller.policy.Policy` the demo runs — the shipped ``default`` policy
scaled down to demo-sized traffic (a few dozen requests instead of thousands, seconds
instead of hours). Nothing here runs anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import timedelta

from autospec.controller.policy import Policy, load_policy
from autospec.threads import usable_cpus


@dataclass(frozen=True)
class DemoPlan:
    """Sizes and settings of one demo run."""

    mode: str
    requests_per_phase: int  # domain requests per phase (the shift phase may stop earlier)
    max_tokens: int  # per request; short, so SmolLM2 on 2 cores keeps up
    baseline_every: int  # every n-th prompt also goes to the target-only app (speedup)
    watch_every: int  # controller watch ticks every n requests of the shift phase
    k: int  # draft tokens per step, serving and evaluation alike
    kinds: tuple[str, ...]  # speculator kinds each cycle trains
    epochs: int
    train_budget_s: float
    heldout_fraction: float
    min_heldout: int
    canary_requests: int
    drift_min_requests: int
    shadow_sample: int  # newest requests of a phase replayed for its shadow τ
    domain_a: str = "json"
    domain_b: str = "support"
    seed: int = 0
    engine: str = "native"  # the serving engine (resolved: native or vllm)

    def with_overrides(self, **changes: object) -> DemoPlan:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def on_engine(self, engine: str) -> DemoPlan:
        """This plan served by ``engine`` (the same kinds: on vLLM eagle3 heads are trained
        as chains, suffix versions run as autospec's custom proposer)."""
        return replace(self, engine=engine)


PRESETS = {
    "quick": DemoPlan(mode="quick", requests_per_phase=30, max_tokens=40, baseline_every=4,
                      watch_every=4, k=5, kinds=("suffix",), epochs=2, train_budget_s=60,
                      heldout_fraction=0.4, min_heldout=8, canary_requests=10,
                      drift_min_requests=20, shadow_sample=6),
    "full": DemoPlan(mode="full", requests_per_phase=48, max_tokens=64, baseline_every=4,
                     watch_every=4, k=5, kinds=("suffix", "eagle3"), epochs=3,
                     train_budget_s=150, heldout_fraction=0.3, min_heldout=14,
                     canary_requests=20, drift_min_requests=32, shadow_sample=12),
}


def plan_for(mode: str) -> DemoPlan:
    try:
        return PRESETS[mode]
    except KeyError:
        raise ValueError(f"unknown demo mode {mode!r}; known: {', '.join(PRESETS)}") from None


def demo_policy(plan: DemoPlan, *, drift_window_s: float = 3600.0) -> Policy:
    """The shipped default policy, scaled to the demo's traffic.

    ``drift_window_s``: how far back live τ is measured for the drift check; the demo sets
    it from the measured request rate so the window covers the newest
    ``drift_min_requests`` requests or so, not the phase before.
    """
    base = load_policy("default")
    n = plan.requests_per_phase
    heldout = max(2, min(plan.min_heldout, int(n * plan.heldout_fraction)))
    policy = base.model_copy(update={
        "name": f"demo-{plan.mode}",
        "description": "the default policy scaled to demo-sized traffic",
        "seed": plan.seed,
        # the demo sends no traffic while a cycle runs: its cycles may use every core
        "threads": usable_cpus(),
        "window": base.window.model_copy(update={
            "min_fresh_requests": max(n * 3 // 4, 4),
            "max_requests": n,
            "heldout_fraction": plan.heldout_fraction}),
        "training": base.training.model_copy(update={
            "kinds": list(plan.kinds), "epochs": plan.epochs,
            "time_budget": timedelta(seconds=plan.train_budget_s),
            "min_train_requests": max(n // 3, 2), "workers": 0,
            "batch_size": 4, "engine": plan.engine}),
        "evaluation": base.evaluation.model_copy(update={"k": plan.k}),
        "gate": base.gate.model_copy(update={
            "min_heldout": heldout, "min_segment_requests": max(heldout // 2, 2)}),
        "promotion": base.promotion.model_copy(update={
            "per_segment": base.promotion.per_segment.model_copy(update={
                "enabled": True, "min_requests": segment_heldout(plan)})}),
        "canary": base.canary.model_copy(update={
            "requests": min(plan.canary_requests, max(n // 2, 1)), "max_shortfall": 0.2}),
        "drift": base.drift.model_copy(update={
            "window": timedelta(seconds=drift_window_s),
            "min_requests": drift_requests(plan), "max_drop": 0.15,
            "min_fresh_requests": drift_requests(plan), "cooldown": timedelta(hours=1)}),
    })
    return Policy.model_validate(policy.model_dump())  # model_copy does not validate


def drift_requests(plan: DemoPlan) -> int:
    """Live requests of the new domain the drift check waits for (at most two thirds of a
    phase): enough that the early cycle's window holds them in its train part as well as
    in its held-out part, so the retrain sees the traffic that drifted."""
    return max(2, min(plan.drift_min_requests, plan.requests_per_phase * 2 // 3))


def heldout_rows(plan: DemoPlan) -> int:
    """Held-out requests of a full window (one phase's worth: ``requests_per_phase``)."""
    return math.ceil(plan.requests_per_phase * plan.heldout_fraction)


def segment_heldout(plan: DemoPlan) -> int:
    """``promotion.per_segment.min_requests`` of the demo's policy: what each of two
    alternating segments has in a full window's held-out part (the smaller half), so the
    cycle after the first mixed phase can decide each segment on its own."""
    return max(2, heldout_rows(plan) // 2)


def mix_sizes(plan: DemoPlan) -> tuple[int, int]:
    """Requests of the two mixed phases, one phase's worth together: M1 (before the
    per-segment cycle) at least fills the window's held-out part, so that part holds both
    domains alternating; M2 (after it) the rest, at least two (one of each domain)."""
    n = plan.requests_per_phase
    before = max(heldout_rows(plan), n // 2)
    return before, max(n - before, 2)
