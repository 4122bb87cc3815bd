"""One controller cycle: lease → fresh traffic? → window → train → evaluate → gate → promote.

:meth:`Controller.run_cycle` does, in order:

1. takes the deployment's lease (:mod:`autospec.controller.lease`); held by another
   controller → outcome ``busy``, nothing done;
2. closes cycles a dead controller left unfinished (``interrupted``; their ``running``
   training runs are closed ``failed``; their candidates stay unpromoted). A cycle is closed
   once (:func:`records.close_cycle`): a controller that lost its lease mid-cycle, and whose
   cycle was closed so by the one that took the lease over, writes no second end when its
   own cycle fails (its result says so);
3. counts usable requests newer than the last consumed window; fewer than the policy's
   ``window.min_fresh_requests`` → ``nothing_to_do``;
4. snapshots the window: the newest ``max_requests`` usable requests up to the newest one
   now (``until`` pinned), split by time into train and held-out parts. Its key
   ``<deployment>/<newest id>/<size>`` is recorded with a ``cycle_start`` note; a window
   whose key was already consumed → ``nothing_to_do``;
5. trains one ``candidate`` per kind of ``training.kinds`` (ending early, keeping what it
   learnt, when ``training.time_budget`` is used up; stopped, registering nothing, when the
   lease is lost or it overruns by half, in this process or on Ray Train workers alike:
   :mod:`autospec.train.ray_trainer`); a kind that fails is recorded and skipped.
   A candidate warm-started from a *base* head (``autospec pretrain``) brings that base
   along as a candidate of its own (``training.evaluate_base``); a base is never ``rejected``;
6. shadow-evaluates each candidate against the incumbent (the live version, or the built-in
   one) and the segment pointers' versions, on the held-out part (recorded, with each stage's
   seconds: :mod:`autospec.controller.timings`); none could be evaluated → ``failed``;
7. in **one transaction**: checks the fencing token and, under the pointer lock, that the
   pointer still names the incumbent, unmoved since the cycle began (moved, even back to
   it: ``failed``; nothing is promoted or rejected, the window is kept), moves the pointer
   to the best passing candidate (highest **measured** speedup, else the estimated one; then
   shadow τ; the reason names the evaluation and both speedups), moves each segment's own
   pointer to the winner there (:mod:`autospec.controller.segment_promotion`), marks
   failing candidates that won nothing ``rejected``, writes the ``cycle`` record: a crash
   leaves all of the promotion or none.

Outcomes (:attr:`CycleResult.exit_code`): ``promoted`` (a deployment or segment pointer
moved) / ``nothing_to_do`` / ``busy`` → 0, ``rejected`` → 3, ``failed`` → 2. ``promoted`` and
``rejected`` consume the window (a rerun does nothing); ``failed`` does not (it is retried).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine

from autospec import numerics, store
from autospec.controller import records, recovery, segment_promotion, timings
from autospec.controller.candidates import (
    Candidate,
    best_candidate,
    check_evaluated,
    gate_reasons,
    speed_text,
)
from autospec.controller.drills import hold_after_gate
from autospec.controller.lease import HeldLease, LeaseLost, acquire_with_turn, holder_name
from autospec.controller.operations import check_incumbent, ensure_pointer, pointer_generation
from autospec.controller.policy import Policy
from autospec.controller.result import CycleFailed, CycleResult
from autospec.engine.target import Target, TargetLoadError
from autospec.numerics import NumericsMismatch
from autospec.store.db import DATABASE_ERRORS, database_failure
from autospec.store.models import utcnow
from autospec.threads import ThreadSetting, resolve_threads, torch_threads, within
from autospec.versions import BUILTIN_VERSION, VersionLoadError

log = logging.getLogger(__name__)

HOOK_STAGES = ("started", "registered", "evaluated", "promoted")


@dataclass(frozen=True)
class Snapshot:
    """The cycle's pinned window of traffic."""

    window: store.TrafficWindow
    since: datetime | None
    until: datetime
    newest_id: int
    key: str


class Controller:
    """Runs cycles (and the canary/drift watch) for one deployment under one policy.

    ``target`` is the target model or a zero-argument callable that loads it (called at most
    once, only when a cycle has a window to train on). ``hooks`` maps a stage of
    :data:`HOOK_STAGES` to a callable run at that point (crash drills and tests).
    ``threads`` caps the torch threads of a cycle's work (None: the policy's ``threads``;
    :mod:`autospec.threads`): ``self.threads`` in this process, shared out to Ray workers.
    """

    def __init__(self, engine: Engine, policy: Policy,
                 target: Target | Callable[[], Target], *, holder: str | None = None,
                 hooks: Mapping[str, Callable[[], None]] | None = None,
                 threads: ThreadSetting | None = None) -> None:
        if unknown := set(hooks or {}) - set(HOOK_STAGES):
            raise ValueError(f"unknown hook stages {sorted(unknown)}; known: {HOOK_STAGES}")
        self.engine = engine
        self.policy = policy
        self.holder = holder or holder_name()
        self.hooks = dict(hooks or {})
        self._target = target
        self.deployment = policy.deployment
        self._turn = threading.Lock()  # one cycle or watch of this controller at a time
        self.threads_setting = policy.threads if threads is None else threads
        self.threads = resolve_threads(self.threads_setting)

    # -- entry points -------------------------------------------------------------------
    def run_cycle(self, *, trigger: str = "manual") -> CycleResult:
        """One cycle now (see the module docstring)."""
        if (lease := self._acquire()) is None:
            return self._busy()
        try:
            self.recover()
            self.apply_serving()
            return self.cycle(lease, trigger=trigger,
                              min_fresh=self.policy.window.min_fresh_requests)
        finally:
            lease.release()

    def apply_serving(self) -> bool:
        """Hand the policy's ``serving.k_bands`` to the replicas (through the deployment's
        row; audited when it changes); True if it changed."""
        with store.session_scope(self.engine) as session:
            return store.set_k_bands(session, name=self.deployment,
                                     k_bands=self.policy.serving.k_bands, actor=self.holder)

    def target(self) -> Target:
        if callable(self._target) and not isinstance(self._target, Target):
            self._target = self._target()
        return self._target

    def _acquire(self) -> HeldLease | None:
        """The deployment's lease, or None while another controller or another job of this
        one holds it (:func:`~autospec.controller.lease.acquire_with_turn`)."""
        return acquire_with_turn(self._turn, self.engine, holder=self.holder,
                                 name=records.lease_name(self.deployment),
                                 ttl=self.policy.lease.ttl)

    def _busy(self) -> CycleResult:
        with store.session_scope(self.engine, readonly=True) as session:
            lease = store.get_lease(session, name=records.lease_name(self.deployment))
            holder = lease.holder if lease else None
        return CycleResult("busy", [
            "another job of this controller (a cycle or the watch) is running"
            if holder in (None, self.holder) else f"the lease is held by {holder}"])

    def _hook(self, stage: str) -> None:
        self.hooks.get(stage, lambda: None)()

    # -- recovery -----------------------------------------------------------------------
    def recover(self) -> list[str]:
        """Close cycles left unfinished by a dead controller (call while holding the lease)."""
        return recovery.recover(self.engine, deployment=self.deployment, holder=self.holder)

    # -- the cycle ----------------------------------------------------------------------
    def cycle(self, lease: HeldLease, *, trigger: str, min_fresh: int) -> CycleResult:
        """The cycle body, under ``lease`` (held by the caller)."""
        fresh, incumbent = self._fresh_and_incumbent()
        if fresh < min_fresh:
            return CycleResult("nothing_to_do", [f"{fresh} fresh requests since the last "
                               f"cycle; the policy needs {min_fresh}"], fresh_requests=fresh)
        if (snap := self._snapshot()) is None:
            return CycleResult("nothing_to_do", ["no usable traffic"], fresh_requests=fresh)
        result = CycleResult("failed", cycle_id=uuid.uuid4().hex[:12], window_key=snap.key,
                             fresh_requests=fresh, incumbent=incumbent)
        self.stages = timings.StageTimer()  # per stage, in the cycle note (timings module)
        if not self._start(lease, result, snap, trigger):
            return CycleResult("nothing_to_do", [f"window {snap.key} was already consumed"],
                               fresh_requests=fresh)
        try:
            with torch_threads(self.threads):  # the cap on this controller's torch work
                return self._run(lease, result, snap, incumbent)
        except (CycleFailed, LeaseLost, store.StoreError, VersionLoadError,
                NumericsMismatch, TargetLoadError) as exc:
            return self._fail(result, str(exc))
        except DATABASE_ERRORS as exc:  # the store failed mid-cycle: full, locked, gone
            return self._fail(result, database_failure(exc))
        except Exception as exc:  # a boundary: record anything unexpected, keep scheduling
            log.exception("cycle %s failed", result.cycle_id)
            return self._fail(result, f"{type(exc).__name__}: {exc}")

    def _fresh_and_incumbent(self) -> tuple[int, str]:
        with store.session_scope(self.engine, readonly=True) as session:
            last = records.last_consumed_newest_id(session, deployment=self.deployment)
            fresh = records.fresh_requests(session, deployment=self.deployment, after_id=last,
                                           max_age=self.policy.window.max_age)
            pointer = store.get_live(session, deployment=self.deployment)
            return fresh, pointer.version if pointer else BUILTIN_VERSION

    def _snapshot(self) -> Snapshot | None:
        win = self.policy.window
        with store.session_scope(self.engine, readonly=True) as session:
            newest = records.newest_request(session, deployment=self.deployment)
            if newest is None:
                return None
            since = utcnow() - win.max_age if win.max_age else None
            until = newest[1] + timedelta(microseconds=1)
            window = store.traffic_window(
                session, since=since, until=until, heldout_fraction=win.heldout_fraction,
                limit=win.max_requests, deployment=self.deployment)
        return Snapshot(window, since, until, newest[0],
                        f"{self.deployment}/{newest[0]}/{window.total}")

    def _start(self, lease: HeldLease, result: CycleResult, snap: Snapshot,
               trigger: str) -> bool:
        with store.session_scope(self.engine) as session:
            if records.window_done(session, deployment=self.deployment, window_key=snap.key):
                return False
            self.generation = pointer_generation(session, deployment=self.deployment)
            records.note(session, type_="cycle_start", actor=self.holder,
                         deployment=self.deployment, reason=f"cycle ({trigger})",
                         cycle_id=result.cycle_id, window_key=snap.key,
                         newest_id=snap.newest_id, trigger=trigger, token=lease.token,
                         window_requests=snap.window.total,
                         train_requests=len(snap.window.train),
                         heldout_requests=len(snap.window.heldout),
                         incumbent=result.incumbent, policy=self.policy.name,
                         generation=self.generation)
        log.info("cycle %s: window %s (%d train, %d held out), incumbent %s", result.cycle_id,
                 snap.key, len(snap.window.train), len(snap.window.heldout), result.incumbent)
        self._hook("started")
        return True

    def _run(self, lease: HeldLease, result: CycleResult, snap: Snapshot,
             incumbent: str) -> CycleResult:
        if len(snap.window.heldout) < self.policy.gate.min_heldout:
            raise CycleFailed(f"the window holds {len(snap.window.heldout)} held-out requests; "
                              f"the gate needs {self.policy.gate.min_heldout}")
        serving = self._serving_engine()
        target = self.target()
        candidates = self._train_all(lease, snap, target, result, serving)
        if not candidates:
            raise CycleFailed("no candidate could be trained: " + "; ".join(result.reasons))
        for cand in candidates:
            self._evaluate(cand, snap, target, incumbent, result)
        check_evaluated(candidates)
        self._hook("evaluated")
        hold_after_gate(candidates)
        return self._conclude(lease, result, candidates, incumbent, serving)

    # -- training and evaluation --------------------------------------------------------
    def _serving_engine(self) -> str:
        """The engine this cycle's candidates are trained for (the policy's; ``auto``: the
        replicas'), checked against the replicas' record now, each cycle: they may have been
        redeployed on another engine since the last."""
        return numerics.engine_for(self.engine, deployment=self.deployment,
                                   wanted=self.policy.training.engine)

    def _train_all(self, lease: HeldLease, snap: Snapshot, target: Target,
                   result: CycleResult, serving: str) -> list[Candidate]:
        from autospec.train.errors import TrainingError

        out = []
        for kind in self.policy.training.kinds:
            try:
                with self.stages.training(f"cycle {result.cycle_id}: {kind} candidate",
                                          len(snap.window.train)) as lap:
                    outcome = lap.done(
                        self._train(kind, lease, snap, target, serving, result.cycle_id))
            except (TrainingError, store.StoreError, VersionLoadError) as exc:
                self._kind_failed(result, kind, exc)
                continue
            out.append(Candidate(outcome.version, outcome.run_id))
            result.candidates.append(outcome.version)
            self._hook("registered")
            if (base := self._base_parent(outcome.parent, kind, result, serving)) is not None:
                out.append(base)
        return out

    def _base_parent(self, parent: str | None, kind: str, result: CycleResult,
                     serving: str) -> Candidate | None:
        """The base head a candidate was warm-started from, as a candidate of its own, when
        ``training.evaluate_base`` asks, it is not the incumbent, and the serving engine runs
        it as it is (vLLM needs eagle3 heads reshaped). A base is of one kind and each kind
        trains once a cycle, so no base comes twice."""
        tp = self.policy.training
        if not tp.evaluate_base or parent is None or parent == result.incumbent \
                or tp.overrides(kind, serving):
            return None
        with store.session_scope(self.engine, readonly=True) as session:
            if not (store.get_speculator(session, version=parent).meta or {}).get("base"):
                return None
        log.info("cycle %s: base %s is evaluated beside its fine-tune", result.cycle_id, parent)
        result.bases.append(parent)
        return Candidate(parent, None)

    def _train(self, kind: str, lease: HeldLease, snap: Snapshot, target: Target,  # type: ignore[no-untyped-def]
               serving: str, cycle_id: str | None):
        from autospec.train.data import WindowSpec
        from autospec.train.errors import IncumbentMismatch
        from autospec.train.run import TrainRequest, train_candidate

        tp, win = self.policy.training, self.policy.window
        spec = WindowSpec(since=snap.since, until=snap.until, limit=win.max_requests,
                          deployment=self.deployment, heldout_fraction=win.heldout_fraction)
        budget = tp.time_budget.total_seconds()
        deadline = time.monotonic() + 1.5 * budget + 60  # hard stop if the run overruns
        request = TrainRequest(kind=kind, window=spec, epochs=tp.epochs, workers=tp.workers,
                               use_gpu=tp.use_gpu,
                               from_scratch=tp.from_scratch, deployment=self.deployment,
                               min_requests=tp.min_train_requests, seed=self.policy.seed,
                               batch_size=tp.batch_size, time_budget_s=budget,
                               overrides=tp.overrides(kind, serving),
                               synthetic=tp.synthetic.mix(), cycle_id=cycle_id,
                               threads=self.threads_setting)

        def should_stop() -> bool:
            return lease.lost or time.monotonic() > deadline

        try:
            return train_candidate(request, engine=self.engine, target=target,
                                   should_stop=should_stop)
        except IncumbentMismatch as exc:
            log.warning("%s: cannot warm-start (%s); training from scratch", kind, exc)
            request = TrainRequest(**{**request.__dict__, "from_scratch": True})
            return train_candidate(request, engine=self.engine, target=target,
                                   should_stop=should_stop)

    def _kind_failed(self, result: CycleResult, kind: str, exc: Exception) -> None:
        reason = f"training {kind} failed: {exc}"
        log.warning("cycle %s: %s", result.cycle_id, reason)
        result.reasons.append(reason)
        with store.session_scope(self.engine) as session:
            store.record_event(session, kind="failure", actor=self.holder, reason=reason,
                               deployment=self.deployment,
                               details={"type": "training", "kind": kind,
                                        "cycle_id": result.cycle_id})

    def _evaluate(self, cand: Candidate, snap: Snapshot, target: Target, incumbent: str,
                  result: CycleResult) -> None:
        from autospec.evaluate.run import EvaluationError, evaluate_versions, serving_load
        from autospec.evaluate.unseen import held_out_only

        served = numerics.served(self.engine, deployment=self.deployment)
        speed = self.policy.evaluation.speed.within(self.threads)
        versions = segment_promotion.with_segment_versions(self.engine, self.policy,
                                                           [cand.version, incumbent])
        timed_on = speed.enabled and (served.engine if speed.engine == "serving" else "native")
        try:  # a version trained by hand may have seen part of the held-out window
            heldout, _, _ = held_out_only(self.engine, versions, snap.window.heldout,
                                          f"cycle {result.cycle_id}'s held-out part")
            with self.stages.evaluation(f"cycle {result.cycle_id}: {cand.version}", incumbent,
                                        len(heldout), timed_on) as marks:
                report = evaluate_versions(
                    db=self.engine, target=target, versions=versions, deployment=self.deployment,
                    examples=heldout, k=self.policy.evaluation.k, speed=speed,
                    policy=self.policy.gate, record=True, training_run_id=cand.run_id,
                    synthetic_heldout=self.policy.training.synthetic.heldout_sequences,
                    progress=marks.replay, speed_progress=marks.speed,
                    threads=within(served.threads, self.threads),
                    serving=serving_load(self.engine, deployment=self.deployment,
                                         engine=served.engine, concurrency=speed.concurrency))
        except (EvaluationError, VersionLoadError) as exc:
            cand.evaluation_failed(exc)
            return
        cand.take(report, incumbent)
        marks.concluded(cand.promote, cand.tau)
        if report.evaluation_id is not None:
            result.evaluations.append(report.evaluation_id)

    # -- conclusion ---------------------------------------------------------------------
    def _conclude(self, lease: HeldLease, result: CycleResult, candidates: list[Candidate],
                  incumbent: str, serving: str) -> CycleResult:
        best = best_candidate(candidates)
        failing = [c for c in candidates if not c.promote and not c.is_base]
        first = len(result.reasons)
        result.reasons += gate_reasons(candidates)
        with store.session_scope(self.engine) as session:
            lease.fence(session)  # then: evaluated against a version no longer live, failed
            check_incumbent(session, deployment=self.deployment, incumbent=incumbent,
                            generation=self.generation)
            segments = segment_promotion.plan(session, policy=self.policy,
                                              candidates=candidates, best=best, engine=serving)
            if best is not None:
                self._promote(session, lease, best, incumbent, result)
                self._hook("promoted")
            moved = segment_promotion.apply(session, segments, policy=self.policy,
                                            actor=self.holder, result=result, token=lease.token)
            if moved and best is None:  # the gate failed the deployment, not the cycle
                result.reasons[first:] = gate_reasons(candidates, kept=incumbent)
            for cand in (c for c in failing if c.version not in moved):
                store.set_state(session, version=cand.version, state="rejected",
                                actor=self.holder, reason="; ".join(cand.reasons)[:2000])
            result.outcome = "promoted" if best or moved else "rejected"
            result.promoted = best.version if best else None
            if best is not None:
                result.promoted_speedup = {"measured": best.speedup_measured,
                                           "estimated": best.speedup_estimated}
            if not self._end(session, result):  # the fence above keeps a recovery out
                raise LeaseLost(f"cycle {result.cycle_id} was closed by another controller")
        log.info("cycle %s: %s", result.cycle_id, result.headline)
        return result

    def _promote(self, session, lease: HeldLease, best: Candidate, incumbent: str,  # type: ignore[no-untyped-def]
                 result: CycleResult) -> None:
        ensure_pointer(session, deployment=self.deployment, actor=self.holder)
        store.set_live(  # expect: a pointer moved during the cycle fails it (evaluation stale)
            session, version=best.version, actor=self.holder, deployment=self.deployment,
            expect=incumbent,
            reason=f"controller: gate passed, evaluation #{best.evaluation_id} "
                   f"(shadow τ {best.tau:.3f}, {speed_text(best)} vs {incumbent}); "
                   f"cycle {result.cycle_id}",
            details={"evaluation_id": best.evaluation_id, "shadow_tau": best.tau,
                     "estimated_speedup": best.speedup_estimated,
                     "measured_speedup": best.speedup_measured,
                     "incumbent_measured_speedup": best.incumbent_speedup_measured,
                     "incumbent": incumbent, "cycle_id": result.cycle_id,
                     "window_key": result.window_key, "fencing_token": lease.token,
                     "policy": self.policy.name})

    def _end(self, session, result: CycleResult) -> bool:  # type: ignore[no-untyped-def]
        """Write the cycle's end record; False, writing nothing (and saying so in
        ``result.reasons``), when it was closed already (:func:`records.close_cycle`)."""
        newest_id = int(result.window_key.rsplit("/", 2)[1]) if result.window_key else None
        end, written = records.close_cycle(
            session, deployment=self.deployment, cycle_id=result.cycle_id, actor=self.holder,
            reason=f"cycle {result.outcome}", version=result.promoted, outcome=result.outcome,
            window_key=result.window_key, newest_id=newest_id, candidates=result.candidates,
            bases=result.bases, evaluations=result.evaluations, segments=result.segments,
            promoted=result.promoted, incumbent=result.incumbent,
            reasons=result.reasons[-50:], stages=self.stages.as_dict())
        if not written:
            said = (f"cycle {result.cycle_id} was already closed "
                    f"({(end.details or {}).get('outcome')}, by {end.actor}): its end as "
                    f"{result.outcome} is not recorded again")
            if said not in result.reasons:  # _conclude's refusal, then _fail's: said once
                log.warning("%s", said)
                result.reasons.append(said)
        return written

    def _fail(self, result: CycleResult, reason: str) -> CycleResult:
        log.error("cycle %s failed: %s", result.cycle_id, reason)
        result.outcome, result.promoted = "failed", None
        result.reasons.append(reason)
        with store.session_scope(self.engine) as session:
            if self._end(session, result):  # closed already: its failure was recorded then
                store.record_event(session, kind="failure", actor=self.holder, reason=reason,
                                   deployment=self.deployment,
                                   details={"type": "cycle", "cycle_id": result.cycle_id})
        return result
