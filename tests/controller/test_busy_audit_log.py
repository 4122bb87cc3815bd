"""On a busy audit log the controller still finds what it must remember: the last consumed
window, an open cycle, a drift cooldown and a pending canary are read by what they are, not
among the newest few hundred events (a deployment with many failed cycles, or many segment
pointer moves, lost them past 500). The store alone, no model: no cycle here trains."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from autospec import store
from autospec.controller import records
from autospec.controller.cycle import Controller
from autospec.controller.segment_watch import pending_segment_canaries
from autospec.controller.watch import Watcher, pending_canary
from autospec.store.artifacts import artifact_sha256
from tests.store.test_registry import make_artifact

from .helpers import fast_policy, live_requests, log_traffic

MANY = 520  # more than the 500 newest events the controller used to scan


def _no_model():  # type: ignore[no-untyped-def]
    pytest.fail("the controller loaded the target: it found no work here")


def _register(session, root: Path, version: str) -> None:  # type: ignore[no-untyped-def]
    uri = make_artifact(root, version)
    store.register_speculator(session, version=version, kind="eagle3",
                              target_id="smollm2-135m", artifact_uri=uri,
                              sha256=artifact_sha256(uri))


def _failed_cycles(engine, n: int) -> None:  # type: ignore[no-untyped-def]
    """``n`` failed cycles of the deployment, each a start and an end note."""
    with store.session_scope(engine) as s:
        for i in range(n):
            records.note(s, type_="cycle_start", actor="c", deployment="default",
                         cycle_id=f"failed{i}", window_key="default/9/9", newest_id=9)
            records.note(s, type_="cycle", actor="c", deployment="default",
                         cycle_id=f"failed{i}", outcome="failed", window_key="default/9/9",
                         newest_id=9, reasons=["no candidate could be trained"])


def _other_notes(engine, n: int) -> None:  # type: ignore[no-untyped-def]
    """``n`` notes the controller does not read (as pruning writes them)."""
    with store.session_scope(engine) as s:
        for i in range(n):
            records.note(s, type_="prune", actor="op", deployment="default", versions=[f"v{i}"])


def test_a_consumed_window_stays_consumed_past_many_failed_cycles(engine) -> None:  # type: ignore[no-untyped-def]
    pairs = [([1, 2, 3], [4, 5, 6, 7])] * 40
    log_traffic(engine, pairs)
    with store.session_scope(engine, readonly=True) as s:
        newest, _ = records.newest_request(s, deployment="default")  # type: ignore[misc]
    key = f"default/{newest}/40"
    with store.session_scope(engine) as s:
        records.note(s, type_="cycle_start", actor="c", deployment="default", cycle_id="done",
                     window_key=key, newest_id=newest)
        records.note(s, type_="cycle", actor="c", deployment="default", cycle_id="done",
                     outcome="rejected", window_key=key, newest_id=newest)
    _failed_cycles(engine, MANY // 2)
    with store.session_scope(engine, readonly=True) as s:
        assert records.last_consumed_newest_id(s, deployment="default") == newest
        assert records.window_done(s, deployment="default", window_key=key)
    result = Controller(engine, fast_policy(), _no_model).run_cycle()
    assert result.outcome == "nothing_to_do", result.reasons
    assert result.fresh_requests == 0, result.reasons


def test_a_dead_cycle_is_closed_past_many_other_notes(engine) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as s:
        records.note(s, type_="cycle_start", actor="dead", deployment="default",
                     cycle_id="dead", window_key="default/9/9", newest_id=9)
    _other_notes(engine, MANY)
    assert Controller(engine, fast_policy(), _no_model).recover() == ["dead"]
    with store.session_scope(engine, readonly=True) as s:
        (cyc,) = records.cycles(s, deployment="default")
        assert cyc.outcome == "interrupted"


def test_the_drift_cooldown_holds_past_many_notes(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as s:
        _register(s, tmp_path, "inc")
        store.set_live(s, version="inc", actor="op", reason="by hand")
        store.record_evaluation(s, candidate="inc", incumbent="builtin-ngram",
                                decision="promote", tau_candidate=3.0, tau_incumbent=1.5,
                                num_requests=50, deployment="default")
        records.note(s, type_="drift", actor="c", deployment="default", reason="drift",
                     version="inc", outcome="rejected", cycle_id="early")
    live_requests(engine, "inc", n=30, tau=1.2,  # against 3.0 evaluated
                  start=datetime.now(timezone.utc) - timedelta(minutes=1))
    _other_notes(engine, MANY)
    result = Watcher(Controller(engine, fast_policy(), _no_model)).run()
    assert result.action == "none", result.reasons
    assert "cooldown" in result.reasons[0], result.reasons


def test_canaries_stay_pending_past_many_pointer_moves(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as s:
        for v in ("inc", "seg", "a", "b"):
            _register(s, tmp_path, v)
        store.set_live(s, version="inc", actor="controller", reason="gate passed",
                       details={"shadow_tau": 3.0, "evaluation_id": 1})
        store.set_live(s, version="seg", actor="controller", reason="segment wins",
                       segment="json", details={"shadow_tau": 3.0, "evaluation_id": 1,
                                                "incumbent": "inc"})
        for i in range(MANY):  # an operator flips another segment's pointer, many times
            store.set_live(s, version="ab"[i % 2], actor="op", reason="by hand",
                           segment="chat")
    with store.session_scope(engine, readonly=True) as s:
        promo = pending_canary(s, deployment="default")
        assert promo is not None and promo.version == "inc"
        assert [p.version for p in pending_segment_canaries(s, deployment="default")] == ["seg"]
