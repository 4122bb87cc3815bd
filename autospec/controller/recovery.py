"""Closing the cycles a dead controller left unfinished (a cycle's step 2, and the watch's).

A cycle whose ``cycle_start`` note has no end record was left by a controller that died or
lost its lease mid-cycle, or by this very controller when the store refused its end record
(full, locked, gone: the reason says which of the two). The controller now holding the
lease closes it ``interrupted`` (:func:`autospec.controller.records.close_cycle`: once — a
cycle closed meanwhile, by its own end or another recovery, is left as it is), closes its
``running`` training runs ``failed``, removes their unregistered artifacts and records a
``failure``; its candidates stay unpromoted and are named.
"""

from __future__ import annotations

import logging

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from autospec import store
from autospec.controller import records
from autospec.settings import get_settings
from autospec.train.partials import remove_partials

log = logging.getLogger(__name__)


def recover(engine: Engine, *, deployment: str, holder: str) -> list[str]:
    """Close the deployment's unfinished cycles as ``holder`` (who holds the lease); the ids
    of those it closed."""
    closed = []
    with store.session_scope(engine) as session:
        for cyc in records.cycles(session, deployment=deployment):
            if cyc.end is None and close_interrupted(session, cyc, deployment=deployment,
                                                     holder=holder):
                closed.append(cyc.cycle_id)
    return closed


def close_interrupted(session: Session, cyc: records.CycleRecord, *, deployment: str,
                      holder: str) -> bool:
    """Close ``cyc`` ``interrupted``, its running training runs ``failed``; False (nothing
    done) if it was closed meanwhile."""
    runs = records.runs_of(session, cyc)
    orphans = records.orphans_of(session, runs)
    why = ("its end could not be recorded: the store failed under this controller"
           if cyc.actor == holder else "process died or lost its lease")
    reason = (f"cycle {cyc.cycle_id} of {cyc.actor} did not finish ({why}); nothing was "
              f"promoted; candidates left unpromoted: {', '.join(orphans) or 'none'}")
    _, closed = records.close_cycle(
        session, deployment=deployment, cycle_id=cyc.cycle_id, actor=holder, reason=reason,
        outcome="interrupted", window_key=cyc.start.get("window_key"),
        newest_id=cyc.start.get("newest_id"), candidates=orphans, reasons=[reason],
        recovered_by=holder)
    if not closed:
        return False
    for run in (r for r in runs if r.status == "running"):
        store.finish_training_run(session, run_id=run.id, status="failed",
                                  error=f"interrupted: cycle {cyc.cycle_id} died")
        for path in remove_partials(get_settings().resolved_artifact_dir, run.id):
            log.info("removed %s, left unregistered by run %d", path, run.id)
    log.warning("%s", reason)
    store.record_event(session, kind="failure", actor=holder, reason=reason,
                       deployment=deployment, details={"type": "cycle", "cycle_id": cyc.cycle_id})
    return True
