"""Found by the soak (issue 28): in ``autospec controller run`` the canary/drift watch job and
the cycle job run on two threads of one process, under one holder name. A watch that starts
while a cycle trains must wait its turn (``busy``), not take the lease as if it were its own,
close the running cycle as ``interrupted`` and release the lease under it (the cycle then
fails: ``lease controller:default is no longer held``)."""

from __future__ import annotations

from typing import Any

from autospec.controller.cycle import Controller
from autospec.controller.watch import Watcher

from .helpers import events, fast_policy, live_version, log_traffic


def test_a_watch_during_a_cycle_of_the_same_controller_leaves_the_cycle_alone(
        db, tiny, traffic) -> None:  # type: ignore[no-untyped-def]
    log_traffic(db, traffic)
    watches: list[Any] = []
    holder: dict[str, Controller] = {}

    def watch_now() -> None:  # the scheduler's watch job, firing mid-cycle
        watches.append(Watcher(holder["controller"]).run())

    holder["controller"] = Controller(db, fast_policy(), tiny,
                                      hooks={"registered": watch_now})
    result = holder["controller"].run_cycle(trigger="schedule")

    assert result.outcome == "promoted", result.reasons
    assert live_version(db) == result.promoted
    interrupted = [e for e in events(db, "failure") if (e.details or {}).get("type") == "cycle"]
    assert interrupted == [], [e.reason for e in interrupted]
    assert watches and watches[0].action in ("busy", "none"), watches
