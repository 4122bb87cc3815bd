"""APScheduler (3.x) wiring of ``autospec controller run``.

Two jobs, both ``coalesce=True`` (missed runs collapse into one), ``max_instances=1`` (a
run still going when the next is due is not doubled) and ``misfire_grace_time`` =
``schedule.misfire_grace`` (a run missed by up to that long still runs, once):

- ``cycle``: :meth:`Controller.run_cycle` on the policy's interval or cron trigger (UTC);
- ``watch``: :meth:`Watcher.run` (canary, drift → early cycle) every ``watch_interval``.

Across restarts: the next cycle time is published as the ``expires_at`` of the lease row
``controller-schedule:<deployment>`` (held by the scheduling process; ``autospec status``
reads it, and a time in the past means no scheduler is running). A scheduler that starts
and finds that time already past (a run was missed while nothing was running) runs one
cycle at once — however many were missed. One that finds it still ahead (``controller run``
restarted: a deploy, a crash) keeps it as its first run — the cadence carries over, so
restarts more often than the interval do not put every cycle off — unless its own trigger
fires sooner (the policy's schedule changed), and takes the row over from the process
before it, so ``status`` names the scheduler that runs.

Jobs never raise into the scheduler: a cycle records its own failures; anything else is
logged. A database that fails under a job (full, locked, its connection lost), where even
the failure cannot be recorded, is one line in the log and the job runs again on its
schedule (:func:`guarded`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, EVENT_JOB_MISSED, JobEvent
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from autospec import store
from autospec.controller import records
from autospec.controller.cycle import Controller
from autospec.controller.policy import Schedule
from autospec.controller.result import CycleResult, moves
from autospec.controller.watch import Watcher
from autospec.memory import release_freed_memory
from autospec.store.db import DATABASE_ERRORS, database_failure
from autospec.store.models import utcnow

log = logging.getLogger(__name__)

JOB_DEFAULTS = {"coalesce": True, "max_instances": 1}


def cycle_trigger(schedule: Schedule) -> BaseTrigger:
    if schedule.cron is not None:
        return CronTrigger.from_crontab(schedule.cron, timezone="UTC")
    assert schedule.interval is not None
    return IntervalTrigger(seconds=schedule.interval.total_seconds(), timezone="UTC")


def build_scheduler(controller: Controller, *, scheduler: BaseScheduler | None = None,
                    watch: bool = True) -> BaseScheduler:
    """A scheduler (default: blocking, UTC) with the policy's jobs added, not started."""
    sched = scheduler or BlockingScheduler(timezone="UTC")
    schedule = controller.policy.schedule
    grace = int(schedule.misfire_grace.total_seconds())
    first = first_run(controller)
    sched.add_job(lambda: guarded("cycle", lambda: run_cycle_job(controller)),
                  cycle_trigger(schedule), id="cycle",
                  name="controller cycle", misfire_grace_time=grace, replace_existing=True,
                  **JOB_DEFAULTS, **({"next_run_time": first} if first else {}))
    if watch:
        sched.add_job(lambda: guarded("watch", Watcher(controller).run), IntervalTrigger(
            seconds=schedule.watch_interval.total_seconds(), timezone="UTC"), id="watch",
            name="canary and drift watch", misfire_grace_time=grace, replace_existing=True,
            **JOB_DEFAULTS)
    sched.add_listener(lambda event: _after_job(sched, controller, event),
                       EVENT_JOB_EXECUTED | EVENT_JOB_ERROR | EVENT_JOB_MISSED)
    return sched


def guarded(job: str, run: Callable[[], Any]) -> Any:
    """``run()``; a database error out of it (what the database or its driver raised: the
    store full, locked, unreachable) is logged in one line, without a traceback, and None
    returned: the scheduler runs the job again on its schedule, once the store answers."""
    try:
        return run()
    except DATABASE_ERRORS as exc:
        log.error("job %s: %s", job, database_failure(exc))
        return None


def run_cycle_job(controller: Controller) -> dict[str, Any]:
    """One scheduled cycle, then the heap it freed handed back (:mod:`autospec.memory`)."""
    try:
        result = controller.run_cycle(trigger="schedule")
    finally:
        release_freed_memory()
    log.info("scheduled cycle: %s", cycle_summary(result))
    return result.as_dict()


def cycle_summary(result: CycleResult) -> str:
    """One log line for a cycle: its outcome, what it promoted over what, and its reasons
    counted (``controller once`` and ``status`` show them all; the last few lines of several
    candidates' reasons, as logged before, read as if they were the promoted one's)."""
    head = f"{result.cycle_id or '-'} {result.outcome}"
    segments = moves(None, result.segments)  # segment pointers it moved
    if result.promoted:
        head += f" {result.promoted} over {result.incumbent or 'nothing'}"
    elif result.candidates:
        head += (f" ({', '.join(result.candidates)} not promoted"
                 f"{' for the deployment' if segments else ''})")
    if segments:
        head += f", {', '.join(segments)}"
    if result.outcome in ("failed", "nothing_to_do", "busy") and result.reasons:
        return f"{head}: {result.reasons[-1]}"
    return f"{head}; {len(result.reasons)} reasons recorded"


def first_run(controller: Controller) -> datetime | None:
    """The cycle job's first run: now when the published next run has passed with nobody
    running it; the published time when it is still ahead and before the trigger's own next
    fire (a restart keeps the cadence); else None (the trigger's own)."""
    with store.session_scope(controller.engine, readonly=True) as session:
        row = store.get_lease(session, name=records.schedule_lease_name(controller.deployment))
    if row is None:
        return None
    now = utcnow()
    if row.expires_at <= now:
        return now
    own = cycle_trigger(controller.policy.schedule).get_next_fire_time(None, now)
    return row.expires_at if own is None or row.expires_at < own else None


def publish_next_run(controller: Controller, next_run: datetime | None, *,
                     take_over: bool = False) -> bool:
    """Record ``next_run`` as the schedule lease's expiry (False: another scheduler has it);
    ``take_over``: from whichever process published before (a scheduler starting)."""
    if next_run is None:
        return False
    ttl = max(next_run.astimezone(timezone.utc) - utcnow(), timedelta(seconds=1))
    name = records.schedule_lease_name(controller.deployment)
    with store.session_scope(controller.engine) as session:
        row = store.get_lease(session, name=name) if take_over else None
        if row is not None and row.holder != controller.holder:
            store.release_lease(session, name=name, holder=row.holder)
        grant = store.acquire_lease(session, name=name, holder=controller.holder, ttl=ttl)
    return grant is not None


def _after_job(sched: BaseScheduler, controller: Controller, event: JobEvent) -> None:
    if getattr(event, "exception", None) is not None:
        log.error("job %s raised: %s", event.job_id, event.exception)
    if event.code == EVENT_JOB_MISSED:
        log.warning("job %s missed its run time beyond the grace period", event.job_id)
    if event.job_id == "cycle":
        publish_from(sched, controller, after=event.scheduled_run_time)


def publish_from(sched: BaseScheduler, controller: Controller, *,
                 after: datetime | None = None) -> None:
    """Publish the cycle job's next run (computed from its trigger: the event may arrive
    before the scheduler has advanced the job)."""
    job = sched.get_job("cycle")
    if job is None:
        return
    now = utcnow()
    next_run = job.trigger.get_next_fire_time(after, now) if after else job.next_run_time
    if next_run is not None and next_run <= now:
        next_run = job.trigger.get_next_fire_time(next_run, now)
    try:
        publish_next_run(controller, next_run)
    except store.StoreError as exc:
        log.warning("could not publish the next run time: %s", exc)
    except DATABASE_ERRORS as exc:
        log.warning("could not publish the next run time: %s", database_failure(exc))


def run_forever(controller: Controller) -> None:
    """``autospec controller run``: block, running the policy's jobs until interrupted."""
    first = first_run(controller)
    sched = build_scheduler(controller)
    trigger = cycle_trigger(controller.policy.schedule)
    next_run = first or trigger.get_next_fire_time(None, utcnow())
    try:
        publish_next_run(controller, next_run, take_over=True)
    except store.StoreError as exc:
        log.warning("could not publish the next run time: %s", exc)
    log.info("controller %s: policy %s, next cycle %s", controller.holder,
             controller.policy.name, next_run)
    sched.start()
