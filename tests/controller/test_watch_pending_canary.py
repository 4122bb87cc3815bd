"""A canary still pending does not switch the drift watch off: a segment pointer's canary
whose segment gets no traffic would stay pending for ever. A pending segment canary holds
back that segment's drift check only; a pending deployment canary the deployment's (and
that of the segments following its pointer), not a segment pointer's."""

from __future__ import annotations

from autospec import store
from autospec.controller.watch import Watcher

from .helpers import segment_requests
from .test_segment_watch import _evaluated, _setup


def test_a_pending_segment_canary_does_not_stop_the_deployments_drift(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    controller = _setup(engine, tmp_path, json_before=None)  # json's canary: no json traffic
    with store.session_scope(engine) as s:
        store.record_evaluation(s, candidate="inc", incumbent="builtin-ngram",
                                decision="promote", tau_candidate=3.0, tau_incumbent=1.5,
                                num_requests=50, deployment="default")
    segment_requests(engine, "inc", "chat", n=200, tau=1.2)  # the deployment's τ fell 60%
    result = Watcher(controller).run()
    assert result.action == "drift" and result.segment is None, result.reasons
    assert "live τ of inc is 1.200" in result.reasons[0]


def test_a_pending_deployment_canary_does_not_stop_a_segments_drift(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    controller = _setup(engine, tmp_path, json_before=None)
    with store.session_scope(engine) as s:  # json pinned by hand: no canary of its own
        store.set_live(s, version="old", actor="op", reason="by hand", segment="json")
    _evaluated(engine, {"json": {"old": 3.0}})
    segment_requests(engine, "old", "json", n=20, tau=1.4)
    with store.session_scope(engine) as s:  # a promotion whose version serves no request yet
        store.set_live(s, version="seg", actor="controller", reason="wins",
                       details={"shadow_tau": 3.0, "evaluation_id": 1, "incumbent": "inc"})
    result = Watcher(controller).run()
    assert result.action == "drift" and result.segment == "json", result.reasons


def test_a_pending_canary_says_what_the_drift_watch_saw(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    controller = _setup(engine, tmp_path, json_before=None)
    result = Watcher(controller).run()
    assert result.action == "canary_pending" and result.segment == "json", result.reasons
    assert "0 of 10 canary requests" in result.reasons[0]
    assert result.reasons[1].startswith("no drift check"), result.reasons


def test_every_pending_canary_is_reported(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    controller = _setup(engine, tmp_path, json_before=None)  # json's canary: no json traffic
    with store.session_scope(engine) as s:  # and the deployment's, which serves no request yet
        store.set_live(s, version="old", actor="controller", reason="wins",
                       details={"shadow_tau": 3.0, "evaluation_id": 1, "incumbent": "inc"})
    result = Watcher(controller).run()
    assert result.action == "canary_pending" and result.segment is None, result.reasons
    assert result.reasons[0].startswith("old: 0 of 10 canary requests"), result.reasons
    assert result.reasons[1].startswith("seg on segment 'json': 0 of 10"), result.reasons
