"""The soak's "controller SIGKILL right after the gate passed" waits for
:meth:`StoreView.gate_passed_pending`: a promote verdict of the cycle running whose candidate
is not promoted yet. The 30-minute vLLM soak skipped that fault although a cycle passed its
gate a minute before the fault began watching and promoted a minute after: only verdicts
written after the fault began counted. A real store (SQLite and PostgreSQL), rows written
through autospec.store as the controller writes them."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from autospec import store
from autospec.bench.soak.storeview import StoreView


def _evaluate(engine: Engine, candidate: str, decision: str) -> None:
    with store.session_scope(engine) as session:
        store.record_evaluation(session, candidate=candidate, incumbent="live-0",
                                decision=decision)


def _event(engine: Engine, kind: str, version: str | None = None,
           details: dict[str, str] | None = None) -> None:
    with store.session_scope(engine) as session:
        store.record_event(session, kind=kind, actor="vm:1:x", version=version,
                           details=details)


def test_gate_passed_pending_follows_a_cycle(engine: Engine, db_url: str) -> None:
    with store.session_scope(engine) as session:
        for name in ("live-0", "eagle3-0001", "eagle3-0002", "suffix-0001", "suffix-0002"):
            store.register_speculator(session, version=name, kind=name.split("-")[0],
                                      target_id="t", artifact_uri=f"/nowhere/{name}",
                                      sha256="0" * 64, verify=False)
    view = StoreView(db_url)
    try:
        assert view.gate_passed_pending() is None
        _evaluate(engine, "eagle3-0001", "reject")
        assert view.gate_passed_pending() is None
        # the gate passed before anyone looked: still pending until promoted
        _evaluate(engine, "suffix-0001", "promote")
        _evaluate(engine, "eagle3-0002", "reject")
        assert view.gate_passed_pending() == "suffix-0001"
        _event(engine, "promotion", "suffix-0001")
        assert view.gate_passed_pending() is None
        _event(engine, "note", details={"type": "cycle", "outcome": "promoted"})
        # the next cycle: a promote verdict after the cycle record, then the cycle fails
        _evaluate(engine, "suffix-0002", "promote")
        assert view.gate_passed_pending() == "suffix-0002"
        _event(engine, "failure", details={"type": "cycle"})
        assert view.gate_passed_pending() is None
        # a candidate promoted in an earlier cycle and passed again is pending again
        _evaluate(engine, "suffix-0001", "promote")
        assert view.gate_passed_pending() == "suffix-0001"
    finally:
        view.close()
