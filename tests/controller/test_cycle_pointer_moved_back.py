"""A pointer moved and moved back while a cycle ran fails the cycle (found by an operator
trial, 2026-12-07: during a cycle's hold after the gate, the operator forced its candidate
live, saw it misbehave and rolled it back to the built-in version; the cycle, finding the
pointer at its incumbent again, promoted the very version just rolled back, on an evaluation
made before both moves). The cycle records the pointer's generation when it starts and
fails, promoting and rejecting nothing, when it has moved since; the first initialisation of
the pointer at the built-in version is no move. Real SQLite file, tiny target."""

from __future__ import annotations

from autospec import store
from autospec.controller import operations
from autospec.controller.cycle import Controller

from .helpers import fast_policy, log_traffic


def _live(db) -> str | None:  # type: ignore[no-untyped-def]
    with store.session_scope(db, readonly=True) as session:
        pointer = store.get_live(session, deployment="default")
        return pointer.version if pointer else None


def test_a_candidate_rolled_back_during_the_cycle_is_not_promoted_tiny(db, tiny,
                                                                        traffic) -> None:  # type: ignore[no-untyped-def]
    log_traffic(db, traffic)
    controller = Controller(db, fast_policy(), tiny)

    def operator() -> None:  # forces the candidate live, then rolls it back
        (candidate,) = candidates()
        operations.promote_version(db, version=candidate, actor="cli:op", force=True,
                                   reason="try it")
        operations.rollback_version(db, actor="cli:op", reason="it misbehaves")

    def candidates() -> list[str]:
        with store.session_scope(db, readonly=True) as session:
            return [s.version for s in store.list_speculators(session, kind="suffix")]

    controller.hooks["evaluated"] = operator
    result = controller.run_cycle(trigger="once")
    assert result.outcome == "failed", result.reasons
    assert "moved 3 times during the cycle and names builtin-ngram again" in result.reasons[-1]
    assert _live(db) == "builtin-ngram"
    with store.session_scope(db, readonly=True) as session:
        states = {s.version: s.state for s in store.list_speculators(session)}
    assert "rejected" not in states.values(), states
    controller.hooks.clear()
    again = controller.run_cycle(trigger="once")  # the window was left to the next cycle
    assert again.outcome == "promoted", again.reasons


def test_the_pointers_first_initialisation_is_no_move_tiny(db, tiny, traffic) -> None:  # type: ignore[no-untyped-def]
    log_traffic(db, traffic)
    controller = Controller(db, fast_policy(), tiny)

    def initialise() -> None:  # an operator's segment promotion pins the deployment first
        with store.session_scope(db) as session:
            operations.ensure_pointer(session, deployment="default", actor="cli:op")

    controller.hooks["evaluated"] = initialise
    result = controller.run_cycle(trigger="once")
    assert result.outcome == "promoted", result.reasons
