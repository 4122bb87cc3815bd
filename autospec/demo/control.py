"""The controller's steps in the demo: a scheduled cycle, a watch (canary verdict, drift
trigger and its early cycle, rollback), each written on the timeline as a
:class:`~autospec.demo.record.DecisionNote` and said in one line; and the audit log the
report lists. The controller itself (:mod:`autospec.controller`) decides; this module
records and waits for the replica to serve what was promoted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from rich.text import Text

from autospec.demo.record import DecisionNote, Timeline
from autospec.demo.serving import DEPLOYMENT

if TYPE_CHECKING:
    from autospec.controller.cycle import CycleResult
    from autospec.controller.watch import WatchResult

log = logging.getLogger(__name__)


class ControllerSteps:
    """Cycles and watches of one demo run.

    ``controller(drift_window_s)`` builds the controller; ``wait_logged()`` waits until the
    store holds the answered requests; ``wait_for_version(version)`` until the live replica
    serves it (None: the live pointer's); ``stage(name)`` names what runs, for a partial
    report."""

    def __init__(self, *, timeline: Timeline, say: Callable[[str | Text], None],
                 controller: Callable[[float], Any], wait_logged: Callable[[], None],
                 wait_for_version: Callable[[str | None], None],
                 stage: Callable[[str], AbstractContextManager[None]]) -> None:
        self.timeline, self.say, self.controller = timeline, say, controller
        self.wait_logged, self.wait_for_version, self.stage = wait_logged, wait_for_version, stage

    def cycle(self, after: str) -> CycleResult:
        """A scheduled cycle after phase ``after``: window → train → shadow-evaluate → gate
        → promote; then the replica serves the promoted version. Returns the result."""
        with self.stage(f"the controller cycle after {after}"):
            self.wait_logged()
            self.say("controller: scheduled cycle (train candidates, shadow-evaluate, gate)...")
            started = self.timeline.now()
            result = self.controller(3600.0).run_cycle(trigger="schedule")
            self._note_cycle(after, result, started)
            return result

    def watch(self, after: str, window_s: float, *, quiet: bool = False) -> WatchResult:
        """One watch with a drift window of ``window_s``; ``quiet``: nothing noted or said
        when it did nothing (or the canary is pending)."""
        from autospec.controller.watch import Watcher

        started = self.timeline.now()
        with self.stage(f"the controller watch after {after}"):
            result = Watcher(self.controller(window_s)).run()
        if result.action in ("none", "canary_pending") and quiet:
            return result
        self.timeline.decisions.append(DecisionNote(
            self.timeline.now(), after, result.action, result.action, result.version,
            list(result.reasons)))
        named = f" {result.version}" if result.version else ""
        self.say(Text.assemble("controller watch: ", (result.action, "bold"),
                               f"{named} — " + "; ".join(result.reasons)))
        if result.cycle is not None:
            self._note_cycle(after, result.cycle, started)
        elif result.action == "rolled_back":
            self.wait_for_version(None)
        return result

    def _note_cycle(self, after: str, result: CycleResult, started: float) -> None:
        now = self.timeline.now()
        moved = [o["reason"] for o in result.segments if o.get("action") == "promoted"]
        self.timeline.decisions.append(DecisionNote(
            now, after, "cycle", result.outcome, result.promoted,
            [*result.reasons, *moved], result.promoted_speedup))
        colour = "green" if result.outcome == "promoted" else "yellow"
        named = f" {result.promoted}" if result.promoted else ""
        self.say(Text.assemble("controller: cycle ", (result.outcome, colour),
                               f"{named} after {now - started:.0f}s — "
                               + "; ".join(moved if moved and not result.promoted
                                           else headline_reasons(result.reasons,
                                                                 result.promoted))))
        if result.promoted:
            self.wait_for_version(result.promoted)


def headline_reasons(reasons: list[str], promoted: str | None) -> list[str]:
    """The promoted candidate's reasons (each reads ``<version>: why``, or ``<version> (base):
    why`` for a base evaluated beside its fine-tune), else the last three."""
    mine = [r for r in reasons
            if promoted and r.startswith((f"{promoted}: ", f"{promoted} (base): "))]
    return mine or reasons[-3:]


def audit_events(store_engine: Any, *, strict: bool = True) -> list[dict[str, Any]]:
    """The deployment's audit log, oldest first; for a partial report (``strict=False``)
    none if it cannot be read."""
    from autospec import store

    if store_engine is None:
        return []
    try:
        with store.session_scope(store_engine, readonly=True) as session:
            rows = store.list_events(session, deployment=DEPLOYMENT, limit=200)
            return [{"kind": e.kind, "version": e.version, "actor": e.actor,
                     "reason": e.reason, "at": e.created_at.isoformat(),
                     "from_version": e.from_version, "details": e.details or {}}
                    for e in reversed(rows)]
    except Exception as exc:
        if strict:
            raise
        log.warning("the audit log could not be read for the partial report: %s", exc)
        return []
