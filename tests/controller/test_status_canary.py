"""``autospec status``'s canary row, on a tiny random-init target: a canary that has the
requests it needs but no verdict yet says the verdict is the next watch's (it read "24 of 10
requests"), and one the policy's canary is off for says no verdict will come."""

from __future__ import annotations

from autospec.controller.cycle import Controller
from autospec.controller.status import collect_status
from autospec.controller.status_view import canary_text

from .helpers import fast_policy, live_requests, log_traffic


def _row(db, policy) -> str:  # type: ignore[no-untyped-def]
    return canary_text(collect_status(db, deployment="default", policy=policy)["canary"])


def test_a_canary_past_its_size_waits_for_the_watch_on_a_tiny_random_init_target(
        db, tiny, traffic) -> None:  # type: ignore[no-untyped-def]
    log_traffic(db, traffic)
    policy = fast_policy()  # canary: 10 requests
    result = Controller(db, policy, tiny).run_cycle()
    assert result.outcome == "promoted", result.reasons
    version = result.promoted
    live_requests(db, version, n=4, tau=2.0)
    assert _row(db, policy).startswith(f"{version}: 4 of 10 requests, live τ 2.000 vs shadow ")
    live_requests(db, version, n=20, tau=2.0)  # no watch has run since
    assert _row(db, policy).startswith(
        f"{version}: 24 requests (≥ 10 needed), verdict at the next `controller watch`; "
        "live τ 2.000 vs shadow "), _row(db, policy)
    off = fast_policy(canary={"enabled": False})
    assert _row(db, off).startswith(
        f"{version}: 24 requests; no verdict will come: the policy's canary is off; live τ")
