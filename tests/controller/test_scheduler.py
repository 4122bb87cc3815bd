"""Scheduler wiring: jobs from the policy with coalesce / max_instances / misfire grace;
the next run is published for ``status``; a run missed while no scheduler was running is
made up once at start-up, however many were missed."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from autospec import store
from autospec.controller import records, scheduler
from autospec.controller.cycle import Controller
from autospec.controller.result import CycleResult
from autospec.controller.status import collect_status
from autospec.store.models import utcnow

from .helpers import fast_policy


def _jobs(controller: Controller) -> dict:
    sched = BackgroundScheduler(timezone="UTC")
    scheduler.build_scheduler(controller, scheduler=sched)
    return {job.id: job for job in sched.get_jobs()}


def test_jobs_follow_the_policy(db, tiny) -> None:
    jobs = _jobs(Controller(db, fast_policy(), tiny))
    assert set(jobs) == {"cycle", "watch"}
    for job in jobs.values():
        assert job.coalesce is True and job.max_instances == 1
        assert job.misfire_grace_time == 3600
    assert isinstance(jobs["cycle"].trigger, IntervalTrigger)
    assert jobs["cycle"].trigger.interval == timedelta(hours=1)
    assert jobs["watch"].trigger.interval == timedelta(seconds=1)
    cron = Controller(db, fast_policy(schedule={"interval": None, "cron": "0 3 * * *"}), tiny)
    assert isinstance(_jobs(cron)["cycle"].trigger, CronTrigger)


def test_a_missed_run_is_made_up_once_and_the_next_run_published(db, tiny,
                                                                  monkeypatch) -> None:
    controller = Controller(db, fast_policy(), tiny)
    with store.session_scope(db) as session:  # a scheduler said "next run 3 h ago", then died
        store.acquire_lease(session, name=records.schedule_lease_name("default"),
                            holder="dead-host:1:abc", ttl=timedelta(hours=-3))
    assert collect_status(db, deployment="default", policy=controller.policy)[
        "schedule"]["overdue"]
    runs: list[str] = []
    ran = threading.Event()

    def fake_cycle(*, trigger: str) -> CycleResult:
        runs.append(trigger)
        ran.set()
        return CycleResult("nothing_to_do")

    monkeypatch.setattr(controller, "run_cycle", fake_cycle)
    sched = BackgroundScheduler(timezone="UTC")
    scheduler.build_scheduler(controller, scheduler=sched, watch=False)
    sched.start()
    try:
        assert ran.wait(10)
        time.sleep(0.5)
        assert runs == ["schedule"]  # one catch-up run, not one per missed interval
        deadline = time.monotonic() + 5
        while True:
            status = collect_status(db, deployment="default", policy=controller.policy)
            if status["schedule"]["holder"] == controller.holder:
                break
            assert time.monotonic() < deadline, status["schedule"]
            time.sleep(0.05)
        next_run = status["schedule"]["next_run"]
        assert not status["schedule"]["overdue"]
        assert timedelta(minutes=55) < next_run - utcnow() <= timedelta(hours=1)
    finally:
        sched.shutdown(wait=False)


def test_cycle_summary_names_the_promoted_version_not_another_candidates_reasons() -> None:
    from autospec.controller.result import CycleResult
    from autospec.controller.scheduler import cycle_summary

    promoted = CycleResult(outcome="promoted", cycle_id="c1", candidates=["s-1", "e-1"],
                           promoted="s-1", incumbent="builtin-ngram",
                           reasons=["s-1: gate passed", "e-1: Δτ CI includes 0"])
    line = cycle_summary(promoted)
    assert line == "c1 promoted s-1 over builtin-ngram; 2 reasons recorded"
    assert "e-1" not in line
    rejected = CycleResult(outcome="rejected", cycle_id="c2", candidates=["e-2"],
                           reasons=["e-2: Δτ CI includes 0"])
    assert cycle_summary(rejected) == "c2 rejected (e-2 not promoted); 1 reasons recorded"
    failed = CycleResult(outcome="failed", cycle_id="c3", reasons=["x", "disk full"])
    assert cycle_summary(failed) == "c3 failed: disk full"


def test_a_restarted_scheduler_keeps_the_published_run_and_takes_the_row_over(db, tiny) -> None:
    """``controller run`` restarted 20 min before its published next cycle: the new process
    runs the cycle then (not an interval after its own start, which restarts more often than
    the interval would put off for ever), and ``status`` names it, not the process before."""
    name = records.schedule_lease_name("default")
    with store.session_scope(db) as session:
        store.acquire_lease(session, name=name, holder="old-host:1:abc",
                            ttl=timedelta(minutes=20))
        published = store.get_lease(session, name=name).expires_at
    controller = Controller(db, fast_policy(), tiny)  # a 1 h interval
    sched = BackgroundScheduler(timezone="UTC")
    scheduler.build_scheduler(controller, scheduler=sched, watch=False)
    sched.start(paused=True)
    try:
        first = sched.get_job("cycle").next_run_time
    finally:
        sched.shutdown(wait=False)
    assert abs((first - published).total_seconds()) < 1
    assert scheduler.publish_next_run(controller, first, take_over=True)
    status = collect_status(db, deployment="default", policy=controller.policy)["schedule"]
    assert status["holder"] == controller.holder and not status["overdue"]
    assert abs((status["next_run"] - published).total_seconds()) < 1


def test_a_published_run_later_than_the_policys_own_gives_way_to_it(db, tiny) -> None:
    """The policy's interval shortened across the restart: its own next fire comes first."""
    with store.session_scope(db) as session:
        store.acquire_lease(session, name=records.schedule_lease_name("default"),
                            holder="old-host:1:abc", ttl=timedelta(hours=20))
    controller = Controller(db, fast_policy(), tiny)  # a 1 h interval
    assert scheduler.first_run(controller) is None
