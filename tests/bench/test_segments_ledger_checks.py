"""The bench's two ledger checks on rounds written by hand (no decoding): R the gate's, and R
from the period's held-out requests."""

from __future__ import annotations

import pytest

from autospec.bench.segments_ledger import holdout_check, ledger_check, ledger_text
from autospec.bench.segments_measure import SEGMENT, TARGET_ONLY


def _round(segment: str, target_s: float, spec_s: float, tokens: int = 21) -> dict:
    arms = (TARGET_ONLY, SEGMENT)
    return {"segment": segment, "version": {TARGET_ONLY: "target-only", SEGMENT: "v"},
            "tokens": dict.fromkeys(arms, tokens),
            "seconds": {TARGET_ONLY: target_s + 0.1, SEGMENT: spec_s + 0.1},
            "ttft": dict.fromkeys(arms, 0.1)}


def test_a_holdout_timed_in_the_period_follows_a_load_the_gate_missed() -> None:
    """The gate measured the target at 20 tokens/s; in the period it ran at 10 (2 s for 20
    tokens), speculation at 2× (1 s). The gate's R halves the saving; the held-out requests'
    R gets it right."""
    measured = {"rounds": [_round("a" if i % 2 else "b", 2.0, 1.0) for i in range(6)]}
    picks = {"segments": {"a": {"decode_tokens_per_s": 20.0}}}
    gate = ledger_check(measured, picks)
    assert gate["replay_saved_s"] == pytest.approx(6.0)
    assert gate["ledger_saved_s"] == pytest.approx(0.0) and not gate["reached"]
    held = holdout_check(measured)
    assert held is not None and held["held_out"] == 2 and held["rate_source"] == "holdout"
    assert held["rate_tokens_per_s"] == pytest.approx(10.0)
    assert held["replay_saved_s"] == pytest.approx(4.0)  # the 4 requests served by the arm
    assert held["ledger_saved_s"] == pytest.approx(4.0) and held["reached"]
    assert "R from 2 held-out requests" in ledger_text(held) and "reached" in ledger_text(held)
    assert "over 4 requests (2 more held out)" in ledger_text(held)
    assert "R the gate's" in ledger_text(gate) and "over 6 requests" in ledger_text(gate)
    assert "R the gate's" in ledger_text(gate) and "NOT reached" in ledger_text(gate)


def test_too_few_requests_hold_none_out() -> None:
    assert holdout_check({"rounds": [_round("a", 2.0, 1.0)] * 2}) is None
    assert "too few requests" in ledger_text(None)
    with pytest.raises(ValueError, match="no arm"):
        holdout_check({"rounds": []}, arm="elsewhere")
