"""The overfitting guard as a pure function of the gate's policy, an evaluation, a decision."""

import numpy as np

from autospec.evaluate.compare import compare_synthetic
from autospec.evaluate.gate import decide
from autospec.evaluate.guard import guard, overfits

from .test_gate import POLICY, _requests, _trial


def _synthetic(seed: int, rate_cand: float, rate_inc: float, n: int = 40):
    rng = np.random.default_rng(seed)
    difficulty = rng.uniform(0.5, 1.5, size=n)
    return compare_synthetic({"cand": _requests(rng, n, rate_cand, difficulty),
                              "inc": _requests(rng, n, rate_inc, difficulty)},
                             resamples=500, seed=seed)


def test_synthetic_gain_without_a_real_one_is_rejected_naming_both():
    for seed in range(5):
        ev = _trial(seed, 0.5, 0.5)
        ev.synthetic = _synthetic(seed, 0.85, 0.5)
        decision = guard(POLICY, ev, decide(POLICY, ev))
        assert overfits(POLICY, ev) and not decision.promote
        reason = decision.reasons[0]
        assert reason.startswith("overfitting guard:")
        assert f"{ev.synthetic.delta.delta:+.3f}" in reason and f"{ev.delta.delta:+.3f}" in reason


def test_a_real_gain_passes_and_no_synthetic_gain_changes_nothing():
    ev = _trial(1, 0.75, 0.5)
    ev.synthetic = _synthetic(1, 0.85, 0.5)
    gate = decide(POLICY, ev)
    assert gate.promote and guard(POLICY, ev, gate) == gate  # the gain shows on real traffic
    ev = _trial(2, 0.5, 0.5)
    ev.synthetic = _synthetic(2, 0.5, 0.5)
    gate = decide(POLICY, ev)
    assert not overfits(POLICY, ev) and guard(POLICY, ev, gate) == gate
    ev.synthetic = None
    assert guard(POLICY, ev, gate) == gate
