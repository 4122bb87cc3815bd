"""A cycle has one end record. A controller that lost its lease mid-cycle gets its cycle
closed ``interrupted`` by the one that took the lease over; when it later ends the cycle
itself (failed: the lease is gone), that second close writes nothing and says so. The
store alone, no model: the cycle fails before training."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from autospec import store
from autospec.controller import records
from autospec.controller.cycle import Controller
from autospec.store.models import utcnow

from .helpers import fast_policy, log_traffic


def _no_model():  # type: ignore[no-untyped-def]
    pytest.fail("the cycle loaded the target: it should fail before training")


def _ends(engine, cycle_id: str) -> list[dict]:  # type: ignore[type-arg,no-untyped-def]
    with store.session_scope(engine, readonly=True) as s:
        return [e.details for e in records.notes(s, deployment="default", type_="cycle")
                if e.details["cycle_id"] == cycle_id]


def test_a_cycle_closed_by_a_takeovers_recovery_is_not_closed_again(engine) -> None:  # type: ignore[no-untyped-def]
    log_traffic(engine, [([1, 2, 3], [4, 5, 6, 7])] * 40)
    policy = fast_policy(gate={"min_heldout": 10_000})  # the cycle fails after its start
    successor = Controller(engine, policy, _no_model, holder="successor")

    def lease_lost() -> None:  # the successor takes the expired lease and recovers
        with store.session_scope(engine) as s:
            assert store.acquire_lease(s, name=records.lease_name("default"),
                                       holder="successor", ttl=timedelta(seconds=4),
                                       now=utcnow() + timedelta(minutes=1))
        assert len(successor.recover()) == 1

    first = Controller(engine, policy, _no_model, holder="first",
                       hooks={"started": lease_lost})
    result = first.run_cycle()
    assert result.outcome == "failed"
    (end,) = _ends(engine, result.cycle_id)
    assert end["outcome"] == "interrupted" and end["recovered_by"] == "successor"
    assert any("already closed" in r and "interrupted" in r for r in result.reasons), \
        result.reasons
    with store.session_scope(engine, readonly=True) as s:
        failures = [e for e in store.list_events(s, kinds=["failure"])
                    if (e.details or {}).get("cycle_id") == result.cycle_id]
    assert len(failures) == 1 and failures[0].actor == "successor"


def test_two_racing_closes_write_one_end(engine) -> None:  # type: ignore[no-untyped-def]
    """The second closer waits for the first one's transaction (PostgreSQL: the start note's
    row lock; SQLite: the write lock) and then finds its end."""
    with store.session_scope(engine) as s:
        records.note(s, type_="cycle_start", actor="a", deployment="default", cycle_id="c")
    second: list[bool] = []
    with store.session_scope(engine) as s:
        _, written = records.close_cycle(s, deployment="default", cycle_id="c", actor="a",
                                         reason="cycle failed", outcome="failed")
        assert written

        def close() -> None:
            with store.session_scope(engine) as other:
                second.append(records.close_cycle(
                    other, deployment="default", cycle_id="c", actor="b",
                    reason="interrupted", outcome="interrupted")[1])

        racer = threading.Thread(target=close)
        racer.start()
        racer.join(timeout=1.0)
        assert racer.is_alive()  # waiting for this transaction
    racer.join(timeout=30)
    assert second == [False]
    assert [e["outcome"] for e in _ends(engine, "c")] == ["failed"]
