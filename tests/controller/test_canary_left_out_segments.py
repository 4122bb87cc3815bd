"""The deployment's canary compares live τ and shadow τ over the same segments, on the store
alone: segments with a pointer of their own are left out of both sides (as the pointers are
at the watch; the rows were served under the pointers of their time), and with no segment
left in common the canary waits and says so.

The operator trial: cycle 2 made suffix-…-0003 the deployment's version and json's own; 0003
served 10 json and 14 support requests; support was pinned to builtin-ngram, a cycle moved
it to 0004, json pinned likewise, a cycle moved it to 0005. The watch compared 0003's live
τ over those 24 rows (json, support) with its shadow τ over acme and coder (the segments it
drafts now) and rolled the deployment back."""

from __future__ import annotations

from pathlib import Path

from autospec import store
from autospec.controller.cycle import Controller
from autospec.controller.status import _canary
from autospec.controller.status_view import canary_text
from autospec.controller.watch import Watcher, evaluated_tau_k
from tests.store.test_registry import register

from .helpers import (
    fast_policy,
    live_version,
    no_model,
    pinned_elsewhere,
    segment_requests,
)

V2, V3, V4, V5 = (f"suffix-20261207-000{i}" for i in (2, 3, 4, 5))
BUILTIN = "builtin-ngram"
#: evaluation #1 of 0003: held-out requests and 0003's τ per segment (acme and coder: 4.375)
SEGMENTS = {"acme": (4, 4.5), "coder": (4, 4.25), "json": (20, 2.1), "support": (20, 2.1),
            "sql": (10, 3.0)}


def _move(engine, version: str, segment: str | None, **details) -> None:  # type: ignore[no-untyped-def]
    """A controller promotion (with ``details``), or with none an operator's forced pin."""
    with store.session_scope(engine) as s:
        if details:
            store.set_live(s, version=version, actor="controller", reason="cycle",
                           segment=segment, details=details)
        else:
            store.set_live(s, version=version, actor="op", reason="pinned by hand",
                           segment=segment, kind="override")


def _cycle_two(engine, tmp_path: Path, **speeds: float) -> int:  # type: ignore[no-untyped-def]
    """The deployment on 0002, sql pinned to builtin-ngram; cycle 2 makes 0003 the
    deployment's version and json's own (``speeds``: measured speedups in the promotion)."""
    with store.session_scope(engine) as s:
        for v in (V2, V3, V4, V5):  # builtin-ngram: registered with the store
            register(s, tmp_path, v)
        store.set_live(s, version=V2, actor="t", reason="deployment")
        store.set_live(s, version=BUILTIN, actor="op", reason="pin sql", segment="sql")
        ev = store.record_evaluation(
            s, candidate=V3, incumbent=V2, decision="promote", tau_candidate=2.5,
            tau_incumbent=2.0, per_segment={"segments": {
                name: {"num_requests": n, "tau": {V3: tau, V2: 2.0}}
                for name, (n, tau) in SEGMENTS.items()}})
        s.flush()
        evaluation = int(ev.id)
    _move(engine, V3, None, shadow_tau=2.5, evaluation_id=evaluation, incumbent=V2,
          **speeds)
    _move(engine, V3, "json", shadow_tau=2.1, evaluation_id=evaluation, incumbent=V2)
    return evaluation


def _pins_and_cycles(engine, evaluation: int) -> None:  # type: ignore[no-untyped-def]
    _move(engine, BUILTIN, "support")
    _move(engine, V4, "support", shadow_tau=3.0, evaluation_id=evaluation, incumbent=BUILTIN)
    _move(engine, BUILTIN, "json")
    _move(engine, V5, "json", shadow_tau=3.0, evaluation_id=evaluation, incumbent=BUILTIN)


def test_rows_of_segments_pinned_since_are_not_judged_against_the_others_shadow(
        engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    evaluation = _cycle_two(engine, tmp_path)
    segment_requests(engine, V3, "json", n=10, tau=2.1)  # drafted through json's own pointer
    # through the deployment's, before the pin
    segment_requests(engine, V3, "support", n=14, tau=2.1)
    _pins_and_cycles(engine, evaluation)
    watcher = Watcher(Controller(engine, fast_policy(), no_model))
    pending = watcher.run()
    assert pending.action == "canary_pending" and pending.segment is None, pending.reasons
    assert (f"{V3}: 0 of 10 canary requests served (24 more on json, support, which have "
            "pointers of their own: left out of both τ)") in pending.reasons[0]
    assert live_version(engine) == V3
    with store.session_scope(engine, readonly=True) as s:  # autospec status reads it so
        canary = _canary(s, "default", watcher.policy)
    assert (canary["requests"], canary["shadow_tau"], canary["on_segments_left_out"]) == \
        (0, 4.375, 24)
    assert "0 of 10 requests (24 more on segments with pointers of their own, left out of " \
        "both τ: json, sql, support)" in canary_text(canary)
    segment_requests(engine, V3, "acme", n=5, tau=4.4)
    segment_requests(engine, V3, "coder", n=5, tau=4.2)
    passed = watcher.run()
    assert passed.action == "canary_passed" and passed.segment is None, passed.reasons
    assert (f"canary of {V3}: live τ 4.300 over 10 requests vs shadow τ 4.375, both over the "
            "segments it drafts (left out: json, sql, support, which have pointers of their "
            f"own) (evaluation #{evaluation})") in passed.reasons[0]
    assert live_version(engine) == V3


def test_a_short_live_tau_on_the_segments_it_drafts_still_rolls_back(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    evaluation = _cycle_two(engine, tmp_path)
    # rows of a segment since pinned: not judged
    segment_requests(engine, V3, "support", n=14, tau=4.4)
    _pins_and_cycles(engine, evaluation)
    segment_requests(engine, V3, "acme", n=10, tau=2.0)
    result = Watcher(Controller(engine, fast_policy(), no_model)).run()
    assert result.action == "rolled_back" and result.segment is None, result.reasons
    assert "live τ 2.000 over 10 requests vs shadow τ 4.375" in result.reasons[0]
    assert live_version(engine) == V2


def test_a_segment_whose_own_pointer_names_the_version_is_judged_by_its_own_canary_only(
        engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Right after cycle 2 json's own pointer names 0003: its rows are its own canary's (on
    json alone, against 0003's τ there: nothing re-weighted); the deployment's judges
    support's against 0003's τ over acme, coder and support (2.750) at the live mix: all
    support, whose own τ is 2.100."""
    evaluation = _cycle_two(engine, tmp_path)
    segment_requests(engine, V3, "json", n=10, tau=1.2)  # json's own canary rolls json back, alone
    segment_requests(engine, V3, "support", n=9, tau=2.9)
    watcher = Watcher(Controller(engine, fast_policy(), no_model))
    json = watcher.run()
    assert json.action == "rolled_back" and json.segment == "json", json.reasons
    assert f"live τ 1.200 over 10 requests vs shadow τ 2.100 (evaluation #{evaluation})" \
        in json.reasons[0]
    pending = watcher.run()
    assert pending.action == "canary_pending" and pending.segment is None, pending.reasons
    assert "0 of 10" not in pending.reasons[0] and "9 of 10" in pending.reasons[0]
    segment_requests(engine, V3, "support", n=1, tau=2.9)
    passed = watcher.run()
    assert passed.action == "canary_passed", passed.reasons
    assert "live τ 2.900 over 10 requests vs shadow τ 2.100 at the live mix (2.750 over the " \
        "held-out mix), both over the segments it drafts (left out: json, sql" \
        in passed.reasons[0]


def test_with_every_evaluated_segment_pinned_the_canary_waits_and_says_why(
        engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    evaluation = _cycle_two(engine, tmp_path)
    _pins_and_cycles(engine, evaluation)
    for segment in ("acme", "coder"):
        _move(engine, BUILTIN, segment)
    segment_requests(engine, V3, "chat", n=30, tau=1.1)  # a segment the evaluation never saw
    result = Watcher(Controller(engine, fast_policy(), no_model)).run()
    assert result.action == "canary_pending" and result.segment is None, result.reasons
    assert (f"{V3}: no canary comparison: every segment evaluation #{evaluation} measured it "
            "on has a pointer of its own now (acme, coder, json, sql, support)") \
        in result.reasons[0]
    assert live_version(engine) == V3
    with store.session_scope(engine, readonly=True) as s:  # nor a drift baseline
        assert evaluated_tau_k(s, V3, "default")[0] is None


def test_the_speed_check_leaves_out_the_same_segments(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The replaced version decoded json fast; 0003's json rows (its own pointer's) are not
    the deployment canary's, so its speed is judged on support against support."""
    segment_requests(engine, V2, "json", n=10, tau=2.0, output_tokens=21, tokens_per_s=400.0)
    segment_requests(engine, V2, "support", n=10, tau=2.0, output_tokens=21, tokens_per_s=100.0)
    _cycle_two(engine, tmp_path, measured_speedup=1.5, incumbent_measured_speedup=1.5)
    segment_requests(engine, V3, "json", n=10, tau=2.1, output_tokens=21, tokens_per_s=100.0)
    segment_requests(engine, V3, "support", n=10, tau=2.8, output_tokens=21, tokens_per_s=100.0)
    policy = fast_policy(canary={"speed_check": True, "max_speed_shortfall": 0.2})
    watcher = Watcher(Controller(engine, policy, no_model))
    result = watcher.run()
    if result.segment == "json":  # json's own canary first (it passes)
        result = watcher.run()
    assert result.action == "canary_passed" and result.segment is None, result.reasons
    assert "realised gain over" in result.reasons[1] and "on support traffic" \
        in result.reasons[1] and "10 vs 10 requests" in result.reasons[1]


def test_on_vllm_a_segment_pointer_the_replicas_do_not_follow_leaves_nothing_out(
        engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """vLLM replicas draft every segment with the deployment's eagle3 version: json's pointer
    to another is not followed, so json's rows are the version's and its τ is in both."""
    pinned_elsewhere(engine, tmp_path)
    with store.session_scope(engine) as s:
        store.record_deployment(s, name="default", target="t", target_id="t",
                                target_revision="r", dtype="float32", actor="replica",
                                engine="vllm")
    segment_requests(engine, "b", "json", n=5, tau=4.0)
    segment_requests(engine, "b", "chat", n=5, tau=1.6)
    result = Watcher(Controller(engine, fast_policy(), no_model)).run()
    assert result.action == "canary_passed", result.reasons
    assert "live τ 2.800 over 10 requests vs shadow τ 2.800 (evaluation" in result.reasons[0]


def test_drift_leaves_out_the_same_segments_as_its_baseline(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """b served json at τ 1.0 before json was pinned to s: its drift baseline is its τ on
    chat (1.6), so its live τ is read on chat too, not pulled down by json's old rows."""
    with store.session_scope(engine) as s:
        for v in ("inc", "b", "s"):
            register(s, tmp_path, v)
        store.set_live(s, version="b", actor="t", reason="deployment")  # no canary open
        store.record_evaluation(s, candidate="b", incumbent="inc", decision="promote",
                                tau_candidate=2.8, tau_incumbent=2.0, per_segment={
                                    "segments": {
                                        "json": {"num_requests": 20, "tau": {"b": 4.0}},
                                        "chat": {"num_requests": 20, "tau": {"b": 1.6}}}})
    segment_requests(engine, "b", "json", n=50, tau=1.0)
    _move(engine, "s", "json")
    segment_requests(engine, "b", "chat", n=10, tau=1.6)
    result = Watcher(Controller(engine, fast_policy(), no_model)).run()
    assert result.action == "none", result.reasons
    assert result.reasons[0].startswith("no drift: live τ of b is 1.600 over 10 requests")
