"""Canary watch and drift: a promotion whose live τ falls short of its shadow τ is rolled
back automatically (audited, with the reason); drift triggers an early cycle."""

from __future__ import annotations

from datetime import timedelta

from autospec import store
from autospec.controller import records
from autospec.controller.cycle import Controller
from autospec.controller.watch import Watcher

from .helpers import T0, events, fast_policy, live_requests, live_version, log_traffic


def _promoted(db, tiny, traffic) -> tuple[Controller, str, float]:  # type: ignore[no-untyped-def]
    log_traffic(db, traffic)
    controller = Controller(db, fast_policy(), tiny)
    result = controller.run_cycle()
    assert result.outcome == "promoted", result.reasons
    (promo,) = [e for e in events(db, "promotion") if e.version == result.promoted]
    return controller, result.promoted, promo.details["shadow_tau"]


def test_a_canary_shortfall_rolls_back_automatically(db, tiny, traffic) -> None:
    controller, version, shadow = _promoted(db, tiny, traffic)
    live_requests(db, version, n=4, tau=1.2)
    pending = Watcher(controller).run()
    assert pending.action == "canary_pending" and "4 of 10" in pending.reasons[0]
    live_requests(db, version, n=8, tau=1.2)
    result = Watcher(controller).run()
    assert result.action == "rolled_back", result.reasons
    assert live_version(db) == "builtin-ngram"
    (rollback,) = events(db, "rollback")
    assert rollback.version == "builtin-ngram" and rollback.from_version == version
    assert "canary" in rollback.reason and "12 requests" in rollback.reason
    assert f"{shadow:.3f}" in rollback.reason and rollback.details["live_tau"] < shadow
    with store.session_scope(db, readonly=True) as session:
        assert store.get_speculator(session, version=version).state == "rolled_back"
    assert Watcher(controller).run().action == "none"  # concluded; not rolled back twice


def test_a_canary_within_tolerance_passes_once(db, tiny, traffic) -> None:
    controller, version, shadow = _promoted(db, tiny, traffic)
    live_requests(db, version, n=10, tau=shadow * 0.95)
    assert Watcher(controller).run().action == "canary_passed"
    assert live_version(db) == version
    after = Watcher(controller).run()
    assert after.action == "none" and after.version == version
    assert after.reasons[0].startswith(f"no drift: live τ of {version} is "), after.reasons
    assert "10 requests" in after.reasons[0] and "within 30%" in after.reasons[0]


def test_requests_a_band_drafted_less_for_are_not_judged_by_the_canary_or_drift(
        db, tiny, traffic) -> None:
    """Bands that turn drafting off at high load (``serving.k_bands``) give those requests
    τ = 1 by the band's choice: they neither roll a good version back nor count as drift."""
    controller, version, shadow = _promoted(db, tiny, traffic)
    live_requests(db, version, n=30, tau=1.0, banded=True)
    live_requests(db, version, n=4, tau=shadow)
    pending = Watcher(controller).run()
    assert pending.action == "canary_pending", pending.reasons
    assert "4 of 10 canary requests served at k=4, as evaluated (30 more served at another k " \
        "or with fewer draft tokens by a concurrency band" in pending.reasons[0]
    live_requests(db, version, n=6, tau=shadow)
    passed = Watcher(controller).run()
    assert passed.action == "canary_passed", passed.reasons
    assert "over 10 requests" in passed.reasons[0]
    quiet = Watcher(controller).run()
    assert quiet.action == "none" and quiet.reasons[0].startswith("no drift: "), quiet.reasons
    live_requests(db, version, n=20, tau=1.0)  # at its k, acceptance collapses: drift
    assert Watcher(controller).run().action == "drift"


def test_requests_served_at_another_k_than_evaluated_are_not_judged(db, tiny, traffic) -> None:
    """τ grows with k: replicas serving at k 2 while the policy evaluates at 4 would read as
    a shortfall. Their rows are not compared; the pending canary says so."""
    controller, version, shadow = _promoted(db, tiny, traffic)
    live_requests(db, version, n=12, tau=1.3, k=2)
    pending = Watcher(controller).run()
    assert pending.action == "canary_pending", pending.reasons
    assert "0 of 10 canary requests served at k=4, as evaluated (12 more served at another " \
        "k" in pending.reasons[0]
    with store.session_scope(db, readonly=True) as session:  # status says so too
        canary = _status_canary(session, "default", controller.policy)
    assert (canary["requests"], canary["left_out"]) == (0, 12)
    assert "(12 more not compared: served at another k" in _canary_row(canary)
    live_requests(db, version, n=10, tau=shadow)
    assert Watcher(controller).run().action == "canary_passed"


def _status_canary(session, deployment, policy):  # type: ignore[no-untyped-def]
    from autospec.controller.status import _canary

    return _canary(session, deployment, policy)


def _canary_row(canary) -> str:  # type: ignore[no-untyped-def]
    from autospec.controller.status_view import canary_text

    return canary_text(canary)


def test_drift_triggers_an_early_cycle(db, tiny, traffic) -> None:
    controller, version, shadow = _promoted(db, tiny, traffic)
    live_requests(db, version, n=10, tau=shadow)
    assert Watcher(controller).run().action == "canary_passed"
    live_requests(db, version, n=20, tau=1.1)  # acceptance collapses: traffic changed
    log_traffic(db, traffic[:8], start=T0 + timedelta(minutes=30))  # a little fresh traffic
    result = Watcher(controller).run()
    assert result.action == "drift", result.as_dict()
    assert "below its evaluated τ" in result.reasons[0]
    assert result.cycle is not None and result.cycle.outcome in ("promoted", "rejected")
    with store.session_scope(db, readonly=True) as session:
        (latest, *_) = records.cycles(session, deployment="default")
    assert latest.start["trigger"] == "drift"
    again = Watcher(controller).run()  # cooldown: no second early cycle
    assert again.action == "none" and again.cycle is None
    assert "cooldown" in again.reasons[0], again.reasons


def test_drift_window_reads_as_an_operator_writes_it() -> None:
    from datetime import timedelta

    from autospec.controller.watch import _span

    assert _span(timedelta(seconds=58.6)) == "59s"
    assert _span(timedelta(hours=1)) == "1h"
    assert _span(timedelta(hours=1, minutes=30, seconds=5)) == "1h30m5s"


def test_a_quiet_watch_says_why_it_did_nothing(db, tiny, traffic) -> None:
    controller, version, _ = _promoted(db, tiny, traffic)
    pending = Watcher(controller).run()  # nothing served yet
    assert pending.action == "canary_pending" and "0 of 10" in pending.reasons[0]
    off = Controller(db, fast_policy(canary={"enabled": False}), tiny)
    few = Watcher(off).run()
    assert few.action == "none"
    assert few.reasons == [f"no drift check: 0 of the 10 requests of {version} needed in "
                           "the last 1h"]
    neither = Controller(db, fast_policy(canary={"enabled": False}, drift={"enabled": False}),
                         tiny)
    assert Watcher(neither).run().reasons == ["no canary pending; the drift watch is off in "
                                              "the policy"]


def test_an_operator_rollback_after_the_canarys_needs_force(db, tiny, traffic) -> None:
    """The canary rolled a version back; an operator who saw it misbehave then runs
    ``rollback``: that would undo the canary's rollback and put the version live again with
    no canary. Refused (exit 3) naming it; ``--force`` does it."""
    from typer.testing import CliRunner

    from autospec.cli import app

    controller, version, _ = _promoted(db, tiny, traffic)
    live_requests(db, version, n=12, tau=1.2)
    assert Watcher(controller).run().action == "rolled_back"
    url = db.url.render_as_string(hide_password=False)
    runner = CliRunner()
    refused = runner.invoke(app, ["rollback", "--database-url", url])
    assert refused.exit_code == 3, refused.output
    assert "the canary rolled" in refused.output and "--force" in refused.output
    assert live_version(db) == "builtin-ngram"
    forced = runner.invoke(app, ["rollback", "--force", "--database-url", url])
    assert forced.exit_code == 0, forced.output
    assert live_version(db) == version
    again = runner.invoke(app, ["rollback", "--database-url", url])  # an operator's undo
    assert again.exit_code == 0, again.output
    assert live_version(db) == "builtin-ngram"
