"""The deployment's canary holds live τ to the shadow τ at the segment mix of the rows it
judges (each segment's evaluated τ, weighted by its share of the live steps), not at the
held-out set's mix; on the store alone, no segment pointer anywhere.

The evaluation of ``cand``: acme 10 held-out requests at τ 4.5, coder 10 at 4.25, support 50
at 2.1: 2.75 over the held-out mix, so at the test policy's 20% shortfall a limit of 2.2. Since
the move only support had traffic: a version doing there exactly what it was evaluated to do
(2.1) was rolled back."""

from __future__ import annotations

import pytest

from autospec import store
from autospec.controller import records
from autospec.controller.cycle import Controller
from autospec.controller.status import _canary
from autospec.controller.status_view import canary_text
from autospec.controller.watch import Watcher
from tests.store.test_registry import register

from .helpers import fast_policy, live_version, no_model, segment_requests

#: held-out requests and cand's τ per segment
SEGMENTS = {"acme": (10, 4.5), "coder": (10, 4.25), "support": (50, 2.1)}


def _promoted(engine, tmp_path, segments=SEGMENTS) -> int:  # type: ignore[no-untyped-def]
    """``cand`` promoted over ``inc`` with its evaluation's τ per segment (``segments``);
    its shadow τ the request-weighted mean over them. The evaluation's id."""
    held_out = sum(n * t for n, t in segments.values()) / sum(n for n, _ in segments.values())
    with store.session_scope(engine) as s:
        for v in ("inc", "cand"):
            register(s, tmp_path, v)
        store.set_live(s, version="inc", actor="t", reason="deployment")
        ev = store.record_evaluation(
            s, candidate="cand", incumbent="inc", decision="promote", tau_candidate=held_out,
            tau_incumbent=2.0, per_segment={"segments": {
                name: {"num_requests": n, "tau": {"cand": t, "inc": 2.0}}
                for name, (n, t) in segments.items()}})
        s.flush()
        store.set_live(s, version="cand", actor="controller", reason="cycle", details={
            "shadow_tau": held_out, "evaluation_id": ev.id, "incumbent": "inc"})
        return int(ev.id)


def test_a_version_as_evaluated_on_support_only_traffic_is_not_rolled_back(
        engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    evaluation = _promoted(engine, tmp_path)
    segment_requests(engine, "cand", "support", n=9, tau=2.1)
    watcher = Watcher(Controller(engine, fast_policy(), no_model))
    assert watcher.run().action == "canary_pending"
    with store.session_scope(engine, readonly=True) as s:  # autospec status: the same figure
        canary = _canary(s, "default", watcher.policy)
    assert canary["shadow_tau"] == pytest.approx(2.1)
    assert canary["shadow_tau_held_out"] == pytest.approx(2.75)
    assert "live τ 2.100 vs shadow 2.100 at the live mix (2.750 over the held-out mix)" \
        in canary_text(canary)
    segment_requests(engine, "cand", "support", n=1, tau=2.1)
    result = watcher.run()
    assert result.action == "canary_passed", result.reasons
    assert ("canary of cand: live τ 2.100 over 10 requests vs shadow τ 2.100 at the live mix "
            f"(2.750 over the held-out mix) (evaluation #{evaluation}); within the allowed 20% "
            "shortfall (τ ≥ 1.680)") in result.reasons[0]
    assert live_version(engine) == "cand"
    with store.session_scope(engine, readonly=True) as s:
        (note,) = records.notes(s, deployment="default", type_="canary")
    assert note.details["shadow_tau"] == pytest.approx(2.1)
    assert note.details["shadow_tau_held_out"] == pytest.approx(2.75)


def test_a_shortfall_at_the_live_mix_rolls_back_though_the_held_out_mix_would_pass(
        engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """acme at 3.0 where it was evaluated at 4.5, support as evaluated: live τ 2.55, above
    the held-out mix's limit (2.2) but below the live mix's (0.8 × 3.3 = 2.64)."""
    _promoted(engine, tmp_path)
    segment_requests(engine, "cand", "acme", n=5, tau=3.0)
    segment_requests(engine, "cand", "support", n=5, tau=2.1)
    result = Watcher(Controller(engine, fast_policy(), no_model)).run()
    assert result.action == "rolled_back", result.reasons
    assert ("live τ 2.550 over 10 requests vs shadow τ 3.300 at the live mix (2.750 over the "
            "held-out mix)") in result.reasons[0] and "below the allowed 20%" in result.reasons[0]
    assert live_version(engine) == "inc"
    with store.session_scope(engine, readonly=True) as s:
        (rollback,) = store.list_events(s, kinds=["rollback"])
    assert rollback.details["shadow_tau"] == pytest.approx(3.3)
    assert rollback.details["shadow_tau_held_out"] == pytest.approx(2.75)


def test_a_short_version_on_support_only_traffic_still_rolls_back(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _promoted(engine, tmp_path)
    segment_requests(engine, "cand", "support", n=10, tau=1.6)  # below 0.8 × 2.1 = 1.68
    result = Watcher(Controller(engine, fast_policy(), no_model)).run()
    assert result.action == "rolled_back", result.reasons
    assert "vs shadow τ 2.100 at the live mix" in result.reasons[0]
    assert live_version(engine) == "inc"


def test_live_segments_without_an_evaluated_tau_of_their_own_take_the_overall_shadow(
        engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """legal had 4 held-out requests (fewer than the gate's 10: its τ 1.0 there is no
    evidence) and default (the rows with no segment) none: both are held to the overall
    shadow τ (2.655). Live: support 5 rows at 2.1, default 3 and legal 2 at 1.6 (τ 1.85);
    the expected τ is ½·2.1 + ½·2.655 = 2.378, limit 1.902: rolled back. Had legal's 1.0
    counted, or default been left out of the mix, the limit would be 1.637 or 1.680."""
    _promoted(engine, tmp_path, {**SEGMENTS, "legal": (4, 1.0)})
    segment_requests(engine, "cand", "support", n=5, tau=2.1)
    segment_requests(engine, "cand", "default", n=3, tau=1.6)
    segment_requests(engine, "cand", "legal", n=2, tau=1.6)
    result = Watcher(Controller(engine, fast_policy(), no_model)).run()
    assert result.action == "rolled_back", result.reasons
    assert ("live τ 1.850 over 10 requests vs shadow τ 2.378 at the live mix (2.655 over the "
            "held-out mix, which stands in for default, legal: no τ of its own in the "
            "evaluation)") in result.reasons[0]
    assert "(τ ≥ 1.902)" in result.reasons[0]


def test_with_no_per_segment_figures_the_shadow_tau_stands_as_it_is(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _promoted(engine, tmp_path, {"support": (4, 2.1), "acme": (4, 4.5)})  # both too few
    segment_requests(engine, "cand", "support", n=10, tau=2.5)
    result = Watcher(Controller(engine, fast_policy(), no_model)).run()
    assert result.action == "rolled_back", result.reasons  # 2.5 < 0.8 × 3.3
    assert "live τ 2.500 over 10 requests vs shadow τ 3.300 (evaluation" in result.reasons[0]
