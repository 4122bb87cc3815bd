"""The watch per segment, on the store alone (no model: no cycle here finds fresh traffic):
a segment promotion's canary is judged on that segment's live rows and rolls back the
segment's pointer only; a segment move does not hide the deployment's own canary; a
segment whose live τ falls well below its evaluated τ there triggers an early cycle."""

from __future__ import annotations

from pathlib import Path

import pytest

from autospec import store
from autospec.controller import records
from autospec.controller.cycle import Controller
from autospec.controller.result import CycleResult
from autospec.controller.watch import Watcher, pending_canary
from autospec.store.artifacts import artifact_sha256
from tests.store.test_registry import make_artifact, register

from .helpers import fast_policy, no_model, pinned_elsewhere, segment_requests


def _setup(engine, tmp_path: Path, *, json_before: str | None,  # type: ignore[no-untyped-def]
           kind: str = "eagle3") -> Controller:
    """Deployment on ``inc``; segment json on ``seg`` by a controller-like promotion with a
    segment shadow τ of 3.0 (after ``json_before``, its own earlier pointer, if any); every
    version of ``kind``."""
    with store.session_scope(engine) as s:
        for v in ("inc", "old", "seg"):
            uri = make_artifact(tmp_path, v)
            store.register_speculator(s, version=v, kind=kind, target_id="smollm2-135m",
                                      artifact_uri=uri, sha256=artifact_sha256(uri))
        store.set_live(s, version="inc", actor="t", reason="deployment")
        if json_before:
            store.set_live(s, version=json_before, actor="op", reason="by hand", segment="json")
        store.set_live(s, version="seg", actor="controller", reason="segment wins",
                       segment="json", details={"shadow_tau": 3.0, "evaluation_id": 1,
                                                "incumbent": json_before or "inc"})
    return Controller(engine, fast_policy(), no_model)


def _json_pointer(engine) -> str | None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine, readonly=True) as s:
        pointer = store.get_live(s, segment="json")
        return pointer.version if pointer else None


def test_a_segment_canary_short_of_its_shadow_rolls_the_segment_back(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    controller = _setup(engine, tmp_path, json_before="old")
    segment_requests(engine, "seg", "json", n=4, tau=1.5)
    segment_requests(engine, "seg", "chat", n=30, tau=3.5)  # another segment's rows do not count
    pending = Watcher(controller).run()
    assert pending.action == "canary_pending" and pending.segment == "json"
    assert "4 of 10" in pending.reasons[0]
    segment_requests(engine, "seg", "json", n=6, tau=1.5)
    result = Watcher(controller).run()
    assert result.action == "rolled_back" and result.segment == "json", result.reasons
    assert "on segment 'json'" in result.reasons[0] and "10 requests" in result.reasons[0]
    assert _json_pointer(engine) == "old"
    with store.session_scope(engine, readonly=True) as s:
        assert store.get_live(s).version == "inc"  # the deployment's pointer never moved
        (rollback,) = store.list_events(s, kinds=["rollback"])
        (note,) = records.notes(s, deployment="default", type_="canary")
    assert rollback.details["segment"] == "json" and rollback.from_version == "seg"
    assert note.details["segment"] == "json" and note.details["verdict"] == "rollback"
    assert Watcher(controller).run().action == "none"  # concluded; not rolled back twice


def test_a_first_segment_pointer_that_fails_is_pinned_to_what_served_it(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    controller = _setup(engine, tmp_path, json_before=None)
    segment_requests(engine, "seg", "json", n=10, tau=1.5)
    assert Watcher(controller).run().action == "rolled_back"
    assert _json_pointer(engine) == "inc"
    with store.session_scope(engine, readonly=True) as s:
        assert store.get_speculator(s, version="seg").state == "rolled_back"
        (rollback,) = store.list_events(s, kinds=["rollback"])
    assert "pinned to inc" in rollback.reason


def test_on_vllm_a_segment_canary_is_not_awaited_and_drift_is_watched(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """vLLM replicas draft every segment with the deployment's version: a segment pointer's
    canary would wait forever for its version's rows, and the drift watch behind it."""
    controller = _setup(engine, tmp_path, json_before="old")
    with store.session_scope(engine) as s:
        store.record_deployment(s, name="default", target="t", target_id="t",
                                target_revision="r", dtype="float32", actor="replica",
                                engine="vllm")
    result = Watcher(controller).run()
    assert result.action == "none" and result.reasons[0].startswith("no drift check"), \
        result.reasons
    assert _json_pointer(engine) == "seg"  # left as it is; the replicas say they ignore it


def test_on_vllm_a_suffix_segment_canary_is_awaited(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Suffix versions: vLLM replicas draft the segment with its own version (a slot of the
    engine's proposer), so its canary is judged as on the native engine."""
    controller = _setup(engine, tmp_path, json_before="old", kind="suffix")
    with store.session_scope(engine) as s:
        store.record_deployment(s, name="default", target="t", target_id="t",
                                target_revision="r", dtype="float32", actor="replica",
                                engine="vllm")
    segment_requests(engine, "seg", "json", n=4, tau=1.5)
    pending = Watcher(controller).run()
    assert pending.action == "canary_pending" and pending.segment == "json", pending.reasons


def test_a_segment_canary_within_tolerance_passes(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    controller = _setup(engine, tmp_path, json_before="old")
    # a band's choice, not judged
    segment_requests(engine, "seg", "json", n=20, tau=1.0, banded=True)
    segment_requests(engine, "seg", "json", n=9, tau=2.9)
    pending = Watcher(controller).run()
    assert pending.action == "canary_pending" and "9 of 10" in pending.reasons[0]
    assert "at its k (20 more served at another k or with fewer draft tokens" \
        in pending.reasons[0]
    segment_requests(engine, "seg", "json", n=1, tau=2.9)
    result = Watcher(controller).run()
    assert result.action == "canary_passed" and result.segment == "json"
    assert _json_pointer(engine) == "seg"


def test_a_canary_verdict_stays_final_however_many_notes_follow_it(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A passed canary is not reopened (and its version not judged again against an old
    shadow τ) when months of cycle notes push its verdict out of the newest few hundred."""
    with store.session_scope(engine) as s:
        for v in ("inc", "new"):
            register(s, tmp_path, v)
        store.set_live(s, version="inc", actor="t", reason="deployment")
        store.set_live(s, version="new", actor="controller", reason="cycle",
                       details={"shadow_tau": 2.0})
    with store.session_scope(engine) as s:
        assert pending_canary(s, deployment="default").version == "new"
        records.note(s, type_="canary", actor="controller", deployment="default",
                     version="new", promotion_event=pending_canary(
                         s, deployment="default").id, verdict="passed")
        for i in range(520):  # rejected cycles' notes, newer than the verdict (past 500)
            records.note(s, type_="cycle", actor="controller", deployment="default",
                         cycle_id=f"c{i}", outcome="rejected")
    with store.session_scope(engine, readonly=True) as s:
        assert pending_canary(s, deployment="default") is None


def test_a_segment_move_does_not_hide_the_deployments_canary(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as s:
        for v in ("inc", "seg"):
            register(s, tmp_path, v)
        store.set_live(s, version="inc", actor="controller", reason="cycle",
                       details={"shadow_tau": 2.0})
        store.set_live(s, version="seg", actor="op", reason="json", segment="json")
    with store.session_scope(engine, readonly=True) as s:
        promo = pending_canary(s, deployment="default")
    assert promo is not None and promo.version == "inc"


def _evaluated(engine, per_segment_tau: dict) -> None:  # type: ignore[no-untyped-def]
    """An evaluation that recorded τ per segment (none deployment-wide)."""
    with store.session_scope(engine) as s:
        store.record_evaluation(s, candidate="seg", incumbent="inc", decision="reject",
                                per_segment={"segments": {
                                    seg: {"num_requests": 40, "tau": taus}
                                    for seg, taus in per_segment_tau.items()}})


def test_a_segment_drifting_below_its_evaluated_tau_triggers_a_cycle(engine, tmp_path,  # type: ignore[no-untyped-def]
                                                                     monkeypatch) -> None:
    controller = _setup(engine, tmp_path, json_before="old")
    segment_requests(engine, "seg", "json", n=10, tau=2.9)
    assert Watcher(controller).run().action == "canary_passed"
    _evaluated(engine, {"json": {"seg": 3.0, "inc": 2.0}})
    segment_requests(engine, "seg", "json", n=20, tau=1.4)  # json's traffic changed
    result = Watcher(controller).run()
    assert result.action == "drift" and result.segment == "json", result.reasons
    assert "on segment 'json'" in result.reasons[0] and "3.000" in result.reasons[0]
    assert result.cycle is not None and result.cycle.outcome == "nothing_to_do"
    with store.session_scope(engine, readonly=True) as s:  # no cycle ran: no cooldown
        assert records.notes(s, deployment="default", type_="drift") == []
    monkeypatch.setattr(controller, "cycle", lambda *a, **k: CycleResult(
        "rejected", cycle_id="c1"))  # fresh traffic came: the early cycle runs
    ran = Watcher(controller).run()
    assert ran.action == "drift" and ran.cycle.outcome == "rejected", ran.reasons  # type: ignore[union-attr]
    with store.session_scope(engine, readonly=True) as s:
        (note,) = records.notes(s, deployment="default", type_="drift")
    assert note.details["segment"] == "json" and note.version == "seg"
    assert note.details["outcome"] == "rejected" and note.details["cycle_id"] == "c1"
    again = Watcher(controller).run()
    assert again.action == "none" and "cooldown" in again.reasons[0]


def test_a_segment_following_the_deployment_drifts_when_per_segment_is_on(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as s:
        for v in ("inc", "seg"):
            register(s, tmp_path, v)
        store.set_live(s, version="inc", actor="t", reason="deployment")
    _evaluated(engine, {"chat": {"inc": 3.0}})
    segment_requests(engine, "inc", "chat", n=20, tau=1.4)
    off = fast_policy(promotion={"per_segment": {"enabled": False}})
    quiet = Watcher(Controller(engine, off, no_model)).run()
    assert quiet.action == "none" and quiet.reasons[0].startswith("no drift check")
    result = Watcher(Controller(engine, fast_policy(), no_model)).run()
    assert result.action == "drift" and result.segment == "chat" and result.version == "inc"


def _pinned_elsewhere(engine, tmp_path: Path) -> Controller:  # type: ignore[no-untyped-def]
    pinned_elsewhere(engine, tmp_path)
    return Controller(engine, fast_policy(), no_model)


def test_the_deployments_canary_compares_with_the_segments_its_version_drafts(
        engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """json is drafted by its own pointer's version, so b's live τ (chat only) is judged
    against b's τ on chat (1.6), not over both (2.8: a false rollback)."""
    controller = _pinned_elsewhere(engine, tmp_path)
    segment_requests(engine, "b", "chat", n=10, tau=1.6)
    result = Watcher(controller).run()
    assert result.action == "canary_passed", result.reasons
    assert "shadow τ 1.600, both over the segments it drafts (left out: json" in result.reasons[0]
    with store.session_scope(engine, readonly=True) as s:
        assert store.get_live(s).version == "b"


def test_drift_compares_with_the_segments_the_live_version_drafts(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from autospec.controller.watch import evaluated_tau_k

    _pinned_elsewhere(engine, tmp_path)
    with store.session_scope(engine, readonly=True) as s:
        assert evaluated_tau_k(s, "b", "default")[0] == pytest.approx(1.6)
        assert evaluated_tau_k(s, "b", "elsewhere")[0] == pytest.approx(2.8)  # nothing pinned
