"""The canary watch after a promotion, and the drift trigger.

:meth:`Watcher.run` (under the controller lease, like a cycle) does:

**Canary.** The newest move of the deployment's own pointer is a ``promotion`` or ``override``
of the version now live, with a shadow τ in its details (the controller and
``autospec promote`` put it there), and no ``canary`` verdict yet. Once that version has
served at least ``canary.requests`` requests since the move, its live τ
(:func:`autospec.store.live_tau`) is compared with the shadow τ: if
``live τ < shadow τ × (1 − canary.max_shortfall)`` the pointer is rolled back
(:func:`autospec.store.rollback`, in the same transaction as the fencing check, a check
that the pointer still names that version, and the ``canary`` note), the reason giving
both τ and the request count; otherwise the canary passes. Fewer requests: pending.
Where segments have pointers of their own, both sides (here and for drift, the speed check
too) leave them out (:mod:`autospec.controller.drafted_tau`): the shadow τ is the version's
τ over the evaluation's other segments, the live τ over its rows of the other segments; none
left in the evaluation, the canary waits and says so. The deployment's canary compares live τ
with that shadow τ re-weighted to the segment mix of the rows it judges
(:mod:`autospec.controller.live_mix`: each segment's evaluated τ, weighted by its share of the
live steps), not with the held-out set's mix; the drift check keeps the held-out mix.
Live τ here (canary and drift, deployment and segments) counts only the requests drafted at
the k the evaluation replayed at: a request a concurrency band drafted fewer tokens for
(``sampling.banded``, :func:`autospec.serve.bands.drafted_fewer`) has a lower τ by the
band's choice, and one a replica recorded at another k (``sampling.k``) is not comparable
either, so both are left out, and a pending check says how many were.
With ``canary.speed_check`` on, the canary also judges **realised speed**
(:mod:`autospec.controller.speedcheck`): the new version's live tokens/s over the replaced
version's before the move, against the speed gain the evaluation measured; a gain below it
by more than ``canary.max_speed_shortfall`` rolls back too, the reason giving both gains and
both live rates. Either check failing rolls back; the reason lists both.

**Drift.** Checked on every run that gave no canary verdict, pending canaries or not (a
segment whose traffic stopped would keep its canary pending for ever); a pending canary
holds back only the drift check of what it judges — the deployment's, for the
deployment's (and the segments following its pointer), a segment's, for that segment's.
If the live version served at least
``drift.min_requests`` requests in the last ``drift.window`` and its live τ is below its
evaluated τ (the newest evaluation naming it, as candidate or incumbent) by more than
``drift.max_drop`` (relative), an early cycle runs at once with
``drift.min_fresh_requests`` as its fresh-traffic minimum — at most once per
``drift.cooldown``: when it ends, a ``drift`` note recording its outcome starts the
cooldown; one that found nothing to do (too few fresh requests) writes none, so the next
watch tries again.

**Per segment** (:mod:`autospec.controller.segment_watch`): a segment pointer's promotion
has a canary of its own, judged on that segment's live rows against its τ on the segment's
held-out requests, which rolls back the *segment's* pointer; with no canary of its own open,
a segment
whose serving version's live τ there falls below its evaluated τ on the segment drifts
like the deployment (checked after the deployment's own drift; the cooldown is shared).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from autospec import store
from autospec.controller import records
from autospec.controller.drafted_tau import (
    DraftedTau,
    drafted_live,
    drafted_segments,
    drafted_tau,
    pooled,
    served_on,
)
from autospec.controller.lease import HeldLease
from autospec.controller.live_mix import MixTau, at_live_mix
from autospec.controller.policy import Drift
from autospec.controller.result import CycleResult
from autospec.controller.segment_watch import (
    Drifted,
    canary_open,
    newest_move,
    pending_segment_canaries,
    recorded_k,
    roll_back_segment,
    segment_drift,
    segment_live,
)
from autospec.controller.speedcheck import SpeedVerdict, check_speed
from autospec.store.models import BUILTIN_VERSION, Evaluation, utcnow

if TYPE_CHECKING:
    from autospec.controller.cycle import Controller

log = logging.getLogger(__name__)


@dataclass
class WatchResult:
    """What the watch did: ``none``, ``busy``, ``canary_pending``, ``canary_passed``,
    ``rolled_back`` or ``drift``."""

    action: str
    reasons: list[str] = field(default_factory=list)
    version: str | None = None
    cycle: CycleResult | None = None
    segment: str | None = None  # the segment whose canary or drift this is (None: deployment)

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, "reasons": self.reasons, "version": self.version,
                "segment": self.segment, "cycle": self.cycle.as_dict() if self.cycle else None}


class Watcher:
    """Canary and drift checks for a :class:`Controller`'s deployment and policy."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.policy = controller.policy
        self.deployment = controller.deployment

    def run(self) -> WatchResult:
        lease = self.controller._acquire()
        if lease is None:
            return WatchResult("busy")
        try:
            self.controller.recover()
            self.controller.apply_serving()
            canaries = self.canary(lease) if self.policy.canary.enabled else []
            if canaries and canaries[0].action != "canary_pending":
                return canaries[0]
            if not self.policy.drift.enabled:
                return _all_pending(canaries, []) if canaries else WatchResult(
                    "none", ["no canary pending; the drift watch is off in the policy"])
            drift = self.drift(lease, waiting={c.segment for c in canaries})
            if drift.action == "drift" or not canaries:
                return drift
            return _all_pending(canaries, drift.reasons)
        finally:
            lease.release()

    # -- canary -------------------------------------------------------------------------
    def canary(self, lease: HeldLease) -> list[WatchResult]:
        """The first canary verdict alone (the deployment's promotion, then each segment's),
        else every pending one, in that order ([]: no canary open)."""
        with store.session_scope(self.controller.engine) as session:
            promos = [p for p in [pending_canary(session, deployment=self.deployment)] if p]
            promos += pending_segment_canaries(session, deployment=self.deployment)
            pending = []
            for promo in promos:
                result = self._judge(session, lease, promo)
                if result is not None and result.action != "canary_pending":
                    return [result]
                pending += [result] if result is not None else []
        return pending

    def _judge(self, session: Session, lease: HeldLease, promo: Any) -> WatchResult | None:
        """Pass, roll back or keep pending one promotion's canary (None: the pointer no
        longer names its version)."""
        cp = self.policy.canary
        version, segment = promo.version, promo.details.get("segment")
        evaluation = None if segment else promotion_evaluation(session, promo)
        drafted = DraftedTau(float(promo.details["shadow_tau"])) if segment else drafted_tau(
            session, deployment=self.deployment, version=version,
            tau=float(promo.details["shadow_tau"]), evaluation=evaluation)
        if drafted.tau is None:  # no segment left in common: nothing to judge on
            return WatchResult("canary_pending", [drafted.nothing_in_common(
                version, promo.details.get("evaluation_id"))], version, segment=segment)
        where = f" on segment {segment!r}" if segment else ""
        k = evaluation_k(session, promo.details.get("evaluation_id"))
        stat, mix = self._live(session, promo, drafted.tau, drafted.left_out, evaluation, k)
        if stat is None or stat.requests < cp.requests or stat.tau is None:
            seen = stat.requests if stat else 0
            cut = _uncompared(session, self.deployment, version, segment, promo.created_at,
                              seen, k, exclude=drafted.left_out)
            return WatchResult("canary_pending", [f"{version}{where}: {seen} of "
                               f"{cp.requests} canary requests served{cut}"], version,
                               segment=segment)
        limit = mix.tau * (1 - cp.max_shortfall)
        tau_ok = stat.tau >= limit
        reasons = [f"canary of {version}{where}: live τ {stat.tau:.3f} over {stat.requests} "
                   f"requests vs shadow τ {mix.said()}{drafted.note()} (evaluation "
                   f"#{promo.details.get('evaluation_id')}); "
                   f"{'within' if tau_ok else 'below'} the allowed "
                   f"{cp.max_shortfall:.0%} shortfall (τ ≥ {limit:.3f})"]
        speed = self._speed(session, promo, drafted.left_out) if cp.speed_check else None
        if speed is not None:
            reasons.append(speed.reason)
        verdict = "pass" if tau_ok and (speed is None or speed.ok) else "rollback"
        reason = "; ".join(reasons)
        if verdict == "rollback" and not self._roll_back(session, lease, promo, reason,
                                                         stat, mix, speed):
            return None
        records.note(session, type_="canary", actor=self.controller.holder,
                     deployment=self.deployment, reason=reason, version=version,
                     verdict=verdict, promotion_event=promo.id, live_tau=stat.tau,
                     shadow_tau=mix.tau, requests=stat.requests, segment=segment,
                     **mix.details(), **_speed_details(speed))
        log.log(logging.WARNING if verdict == "rollback" else logging.INFO, "%s", reason)
        return WatchResult("rolled_back" if verdict == "rollback" else "canary_passed",
                           reasons, version, segment=segment)

    def _live(self, session: Session, promo: Any, shadow: float, left_out: tuple[str, ...],
              evaluation: Evaluation | None, k: int | None) -> tuple[Any, MixTau]:
        """``promo``'s version's live τ since the move, at ``k``, and the shadow τ to compare
        it with: a segment's canary, on its rows against ``shadow`` (its τ there); the
        deployment's, on its rows off the ``left_out`` segments against ``shadow`` (its τ
        over the others) at their live mix (:mod:`autospec.controller.live_mix`)."""
        version, segment = promo.version, (promo.details or {}).get("segment")
        if segment:  # one segment: no mix to re-weight
            return segment_live(session, deployment=self.deployment, version=version,
                                segment=segment, since=promo.created_at,
                                k=k), MixTau(shadow, shadow)
        rows = drafted_segments(session, deployment=self.deployment, version=version,
                                since=promo.created_at, k=k, left_out=left_out)
        return pooled(version, rows), at_live_mix(shadow, evaluation, version, rows)

    def _speed(self, session: Session, promo: Any, left_out: tuple[str, ...]) -> SpeedVerdict:
        """The speed check of ``promo``, on the rows its τ check compares (``left_out``: the
        segments the deployment's canary leaves out)."""
        segment = (promo.details or {}).get("segment")
        pointer = store.get_live(session, deployment=self.deployment, segment=segment)
        replaced = (promo.details or {}).get("incumbent") or (
            pointer.previous_version if pointer else None)
        return check_speed(session, deployment=self.deployment, promo=promo,
                           replaced=replaced, max_shortfall=self.policy.canary.max_speed_shortfall,
                           segment=segment, exclude=left_out)

    def _roll_back(self, session: Session, lease: HeldLease, promo: Any, reason: str,
                   stat: Any, mix: MixTau, speed: SpeedVerdict | None) -> bool:
        """Roll the pointer (the deployment's, or the promotion's segment's) back from
        ``promo.version``; False if it no longer names it."""
        lease.fence(session)
        details = {"type": "canary", "promotion_event": promo.id, "live_tau": stat.tau,
                   "shadow_tau": mix.tau, "requests": stat.requests, **mix.details(),
                   **_speed_details(speed)}
        try:  # the pointer is read again under the pointer lock: moved meanwhile, a Conflict
            if (promo.details or {}).get("segment"):
                return roll_back_segment(session, deployment=self.deployment, promo=promo,
                                         actor=self.controller.holder, reason=reason,
                                         details=details)
            store.rollback(session, actor=self.controller.holder, reason=reason,
                           deployment=self.deployment, details=details, expect=promo.version)
        except store.Conflict:
            return False  # an operator moved it since the verdict: theirs stands
        return True

    # -- drift --------------------------------------------------------------------------
    def drift(self, lease: HeldLease, waiting: Collection[str | None] = ()) -> WatchResult:
        """The deployment's live version first, then each segment's (segment_watch); not
        those whose canary is pending (``waiting``: segment names, None the deployment's)."""
        dp = self.policy.drift
        now = utcnow()
        with store.session_scope(self.controller.engine) as session:
            version = live_or_builtin(session, self.deployment)
            quiet, stat, evaluated = self._deployment_drift(session, version, now, waiting)
            found = (Drifted(None, version, stat.tau, evaluated, stat.requests)  # type: ignore[arg-type]
                     if quiet is None else
                     segment_drift(session, policy=self.policy, since=now - dp.window,
                                   waiting=waiting))
            if found is None:
                return WatchResult("none", [quiet or ""], version)
            where = f" on segment {found.segment!r}" if found.segment else ""
            recent = records.notes(session, deployment=self.deployment, type_="drift",
                                   after=now - dp.cooldown, limit=1)
            if recent:
                return WatchResult("none", [
                    f"drift seen (live τ of {found.version}{where} {found.live_tau:.3f} against "
                    f"its evaluated τ {found.evaluated_tau:.3f}), but an early cycle ran within "
                    f"the cooldown {_span(dp.cooldown)}"], found.version, segment=found.segment)
        reason = found.reason(_span(dp.window), dp.max_drop)
        log.warning("%s", reason)
        cycle = self.controller.cycle(lease, trigger="drift", min_fresh=dp.min_fresh_requests)
        if cycle.outcome != "nothing_to_do":  # it ran: its note starts the cooldown
            with store.session_scope(self.controller.engine) as session:
                records.note(session, type_="drift", actor=self.controller.holder,
                             deployment=self.deployment, reason=reason, version=found.version,
                             live_tau=found.live_tau, evaluated_tau=found.evaluated_tau,
                             requests=found.requests, segment=found.segment,
                             outcome=cycle.outcome, cycle_id=cycle.cycle_id)
        return WatchResult("drift", [reason], found.version, cycle, segment=found.segment)

    def _deployment_drift(self, session: Session, version: str, now: Any,
                          waiting: Collection[str | None]) -> tuple[str | None, Any, float | None]:
        """Why the deployment's live version does not drift (None: it does), its live τ
        statistic and its evaluated τ; its canary pending (None in ``waiting``), no check."""
        if None in waiting:
            return (f"no drift check of {version} deployment-wide: its canary is pending",
                    None, None)
        dp = self.policy.drift
        drafted, k = evaluated_drafted(session, version, self.deployment)
        if drafted is not None and drafted.tau is None:
            return (f"no drift check of {version} deployment-wide: every segment its "
                    f"evaluation measured it on has a pointer of its own now "
                    f"({', '.join(drafted.left_out)})", None, None)
        evaluated, left = (drafted.tau, drafted.left_out) if drafted else (None, ())
        stat = drafted_live(session, deployment=self.deployment, version=version,
                            since=now - dp.window, k=k, left_out=left)
        return _no_drift(version, evaluated, stat, dp, lambda seen: _uncompared(
            session, self.deployment, version, None, now - dp.window, seen, k,
            exclude=left)), stat, evaluated


def _no_drift(version: str, evaluated: float | None, stat: Any, dp: Drift,
              left_out: Callable[[int], str]) -> str | None:
    """Why the watch sees no drift of ``version`` (None: the live τ has dropped);
    ``left_out(seen)``: what :func:`_uncompared` says of the requests left out, asked only
    while the check still waits for requests."""
    span = _span(dp.window)
    if evaluated is None:
        return f"no drift check: {version} has no evaluated τ to compare with"
    seen = stat.requests if stat is not None and stat.tau is not None else 0
    if seen < dp.min_requests:
        return (f"no drift check: {seen} of the {dp.min_requests} requests of {version} "
                f"needed in the last {span}{left_out(seen)}")
    if stat.tau >= evaluated * (1 - dp.max_drop):
        return (f"no drift: live τ of {version} is {stat.tau:.3f} over {stat.requests} "
                f"requests in the last {span}, within {dp.max_drop:.0%} of its evaluated τ "
                f"{evaluated:.3f}")
    return None


def _all_pending(canaries: list[WatchResult], more: list[str]) -> WatchResult:
    """The first pending canary (its version and segment) with every pending canary's
    reasons, the deployment's first, then ``more``."""
    first = canaries[0]
    reasons = [reason for pending in canaries for reason in pending.reasons]
    return WatchResult(first.action, reasons + more, first.version, segment=first.segment)


def pending_canary(session: Session, *, deployment: str) -> Any | None:
    """The deployment pointer's promotion event whose canary is still open, or None (its
    segments' moves do not count: :func:`pending_segment_canaries`)."""
    promo = newest_move(session, deployment=deployment, segment=None)
    return promo if canary_open(session, deployment=deployment, move=promo) else None


def live_or_builtin(session: Session, deployment: str) -> str:
    pointer = store.get_live(session, deployment=deployment)
    return pointer.version if pointer else BUILTIN_VERSION


def evaluated_tau_k(session: Session, version: str,
                    deployment: str) -> tuple[float | None, int | None]:
    """τ of ``version`` in the newest evaluation naming it (candidate or incumbent), over
    the segments it drafts on ``deployment`` now (:func:`drafted_tau`; None: none, or no
    segment left), and the k that evaluation replayed at (None: not recorded)."""
    drafted, k = evaluated_drafted(session, version, deployment)
    return (drafted.tau if drafted else None), k


def evaluated_drafted(session: Session, version: str,
                      deployment: str) -> tuple[DraftedTau | None, int | None]:
    """:func:`evaluated_tau_k`'s τ with the segments it leaves out, which live τ compared
    with it leaves out too (:func:`drafted_live`); (None, None): no evaluation names it."""
    for ev in store.list_evaluations(session, limit=200, deployment=deployment):
        tau = ev.tau_candidate if ev.candidate == version else \
            ev.tau_incumbent if ev.incumbent == version else None
        if tau is not None:
            return drafted_tau(session, deployment=deployment, version=version,
                               tau=float(tau), evaluation=ev), recorded_k(ev)
    return None, None


def promotion_evaluation(session: Session, promo: Any) -> Evaluation | None:
    """The evaluation a promotion names (None: none, or a name that is not an id)."""
    evaluation_id = (promo.details or {}).get("evaluation_id")
    return session.get(Evaluation, evaluation_id) if isinstance(evaluation_id, int) else None


def evaluation_k(session: Session, evaluation_id: Any) -> int | None:
    """The k of the evaluation a promotion names (None: none, or not recorded)."""
    if not isinstance(evaluation_id, int):
        return None
    return recorded_k(session.get(Evaluation, evaluation_id))


def left_out(session: Session, deployment: str, version: str, segment: str | None,
             since: Any, counted: int, exclude: Collection[str] = ()) -> int:
    """How many of the version's requests since ``since`` (on ``segment``, if given; else
    off the ``exclude`` segments) its live τ left out beyond the ``counted`` ones: recorded
    at another k than evaluated, or drafted with fewer tokens by a concurrency band."""
    stats = store.live_tau(session, since=since, deployment=deployment, versions=[version],
                           by_segment=segment is not None or bool(exclude))
    served = sum(s.requests for s in stats
                 if (segment is None or s.segment == segment) and s.segment not in exclude)
    return max(0, served - counted)


def _uncompared(session: Session, deployment: str, version: str, segment: str | None,
                since: Any, counted: int, k: int | None, exclude: Collection[str] = ()) -> str:
    """What a pending check's reason adds when some of the version's requests were left out
    of its live τ (:func:`left_out`; those on the ``exclude`` segments, which have pointers
    of their own, are said apart); "" when none were."""
    cut = left_out(session, deployment, version, segment, since, counted, exclude)
    at = "" if not cut else " at its k" if k is None else f" at k={k}, as evaluated"
    said = [f"{cut} more served at another k or with fewer draft tokens by a concurrency "
            "band: their τ is not compared"] if cut else []
    elsewhere = served_on(session, deployment=deployment, version=version, since=since,
                          segments=exclude)
    if elsewhere:
        said.append(f"{sum(elsewhere.values())} more on {', '.join(sorted(elsewhere))}, "
                    "which have pointers of their own: left out of both τ")
    return f"{at} ({'; '.join(said)})" if said else ""


def _speed_details(speed: SpeedVerdict | None) -> dict[str, Any]:
    if speed is None or not speed.judged:
        return {}
    return {"speed_ok": speed.ok, "realised_gain": speed.realised_gain,
            "expected_gain": speed.expected_gain}


def _span(window: timedelta) -> str:
    """A drift window as an operator writes it: ``59s``, ``15m``, ``1h``, ``1h30m``."""
    seconds = round(window.total_seconds())
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{v}{unit}" for v, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if v]
    return "".join(parts) or "0s"
