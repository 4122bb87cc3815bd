"""The paired bootstrap and the promotion gate, on synthetic replay results."""

import numpy as np
import pytest
from pydantic import ValidationError

from autospec.evaluate.compare import Costs, compare
from autospec.evaluate.gate import GatePolicy, decide
from autospec.evaluate.replay import ReplayStats

K = 5
COSTS = Costs(step_s=0.05, verify_s={1: 0.05, 6: 0.06})
PROPOSE_S = 0.01  # replayed seconds per step in the speculator, unless a test says otherwise
POLICY = GatePolicy(min_gain=0.05, min_heldout=30, segment_tolerance=0.1,
                    min_segment_requests=10)


def _requests(rng, n, rate, difficulty):
    """Per-request stats: each step accepts a prefix with per-position rate rate*difficulty."""
    out = []
    for i in range(n):
        s = ReplayStats()
        for _ in range(int(rng.integers(5, 30))):
            a = float(np.clip(rate * difficulty[i], 0, 0.99))
            accepted = 0
            while accepted < K and rng.random() < a:
                accepted += 1
            s.observe(K, [1.0] * accepted)
        s.draft_s = PROPOSE_S * s.steps
        out.append(s)
    return out


def _trial(seed, rate_cand, rate_inc, n=60, segments=None):
    rng = np.random.default_rng(seed)
    difficulty = rng.uniform(0.5, 1.5, size=n)  # shared by both versions: paired data
    results = {"cand": _requests(rng, n, rate_cand, difficulty),
               "inc": _requests(rng, n, rate_inc, difficulty)}
    segs = segments or ["chat"] * n
    return compare(results, segs, COSTS, k=K, resamples=1000, seed=seed)


def test_identical_candidate_is_never_promoted():
    rng = np.random.default_rng(0)
    same = _requests(rng, 80, 0.6, np.ones(80))
    ev = compare({"cand": same, "inc": same}, ["chat"] * 80, COSTS, k=K)
    assert ev.delta.low == ev.delta.high == 0.0
    decision = decide(POLICY, ev)
    assert not decision.promote and any("lower bound <" in r for r in decision.reasons)


@pytest.mark.parametrize("rate_cand", [0.5, 0.45, 0.35])
def test_worse_or_equal_candidate_never_promoted_over_20_seeds(rate_cand):
    promoted = [decide(POLICY, _trial(seed, rate_cand, 0.5)).promote for seed in range(20)]
    assert not any(promoted)


def test_clearly_better_candidate_is_promoted_over_20_seeds():
    decisions = [decide(POLICY, _trial(seed, 0.75, 0.5)) for seed in range(20)]
    assert all(d.promote for d in decisions), [d.reasons for d in decisions if not d.promote]


def test_segment_regression_blocks_promotion_even_when_overall_tau_rises():
    rng = np.random.default_rng(3)
    ones = np.ones(40)
    cand = _requests(rng, 40, 0.9, ones) + _requests(rng, 20, 0.2, ones[:20])
    inc = _requests(rng, 40, 0.5, ones) + _requests(rng, 20, 0.6, ones[:20])
    segs = ["support"] * 40 + ["code"] * 20
    ev = compare({"cand": cand, "inc": inc}, segs, COSTS, k=K)
    assert ev.delta.low > POLICY.min_gain  # overall a clear gain
    decision = decide(POLICY, ev)
    assert not decision.promote
    assert any("segment 'code'" in r and "regresses" in r for r in decision.reasons)


def test_small_heldout_set_blocks_promotion():
    ev = _trial(1, 0.8, 0.4, n=12)
    decision = decide(POLICY, ev)
    assert not decision.promote and any("12 requests" in r for r in decision.reasons)


def test_slower_speculator_with_higher_tau_does_not_win():
    rng = np.random.default_rng(2)
    difficulty = np.ones(60)
    results = {"cand": _requests(rng, 60, 0.8, difficulty),
               "inc": _requests(rng, 60, 0.5, difficulty)}
    for s in results["cand"]:  # the candidate drafts 25x slower
        s.draft_s = 0.25 * s.steps
    ev = compare(results, ["chat"] * 60, COSTS, k=K)
    assert ev.delta.low > POLICY.min_gain and ev.speedup["cand"] < ev.speedup["inc"]
    decision = decide(POLICY, ev)
    assert not decision.promote and any("falls" in r for r in decision.reasons)
    assert COSTS.verify(3.5) == pytest.approx(0.055)


def test_acceptance_rate_per_position_is_conditional():
    s = ReplayStats()
    s.observe(3, [1.0, 1.0, 1.0])
    s.observe(3, [1.0])
    s.observe(3, [])
    ev = compare({"v": [s]}, ["x"], COSTS, k=3)
    assert ev.accepted_per_position["v"] == pytest.approx([2 / 3, 1 / 2, 1.0])
    assert ev.tau["v"] == pytest.approx((4 + 3) / 3)


def test_requests_without_a_step_have_no_tau_and_the_gate_says_so():
    """One-token outputs take no verify step: no τ (None, not 1), no interval, a reject
    whose reason says why; a segment of them is reported without a τ and not judged."""
    rng = np.random.default_rng(0)
    steps = {"cand": _requests(rng, 40, 0.8, np.ones(40)),
             "inc": _requests(rng, 40, 0.3, np.ones(40))}
    empty = {"cand": [ReplayStats() for _ in range(40)], "inc": [ReplayStats() for _ in range(40)]}
    ev = compare(empty, ["chat"] * 40, COSTS, k=K)
    assert ev.tau == {"cand": None, "inc": None} and ev.delta is None
    assert ev.speedup == {"cand": 1.0, "inc": 1.0}
    decision = decide(POLICY, ev)
    assert not decision.promote and decision.reasons[0].startswith("no τ to compare")
    mixed = {v: steps[v] + empty[v][:12] for v in steps}
    ev = compare(mixed, ["chat"] * 40 + ["one-token"] * 12, COSTS, k=K, resamples=500)
    one = next(s for s in ev.segments if s.segment == "one-token")
    assert one.tau == {"cand": None, "inc": None} and one.delta is None
    assert ev.delta is not None and ev.delta.delta == pytest.approx(ev.tau["cand"] - ev.tau["inc"])
    assert decide(POLICY, ev).promote  # the segment without a τ is not judged


def test_policy_typo_is_an_error_naming_the_field():
    with pytest.raises(ValidationError, match="min_gian"):
        GatePolicy(min_gian=0.1)
    with pytest.raises(ValidationError, match="min_gain"):
        GatePolicy(min_gain=0)


def test_acceptance_at_position_0_counts_only_steps_that_drafted() -> None:
    """An index that proposes nothing on most steps: those steps are no trial of position 0
    (the rate is P(draft i accepted | drafts before it accepted), a draft at i existing)."""
    from autospec.evaluate.compare import _position_rates
    from autospec.evaluate.replay import ReplayStats

    s = ReplayStats()
    s.observe(3, [1.0, 1.0, 1.0])
    for _ in range(3):
        s.observe(0, [])
    assert (s.steps, s.drafted_steps) == (4, 1)
    assert _position_rates([s]) == [1.0, 1.0, 1.0]  # it had given [0.25, 1.0, 1.0]
