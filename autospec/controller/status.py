"""What ``autospec status`` reports, as one JSON-able dict (the CLI draws it).

Everything is read from the store in one read-only transaction, so the report agrees with
the live pointer the replicas follow: the live version is the pointer's (``builtin-ngram``
when nothing was ever promoted), its shadow τ comes from the newest evaluation naming it,
its live τ from the requests it served in the last hour and day (both, as the drift watch
reads them, without the segments that have a pointer of their own:
:mod:`autospec.controller.drafted_tau`; the pending canary's likewise, its ``shadow_tau``
the figure the canary judges by: at the segment mix of the rows it counts,
:mod:`autospec.controller.live_mix`; ``shadow_tau_held_out`` the one over the held-out
mix); its speedup over
target-only, estimated and measured side by side, from that same newest evaluation; fresh
requests are counted past the last consumed window; the next scheduled cycle is the
schedule lease's expiry. ``ledger``: decode time saved by speculation against the loop's
time over the last ``period`` (:mod:`autospec.ledger`).

The pointer says what replicas *should* serve; ``served`` says what they *do*, from their own
reports (``replica_reports``, refreshed every few seconds by each replica): the versions the
replicas that reported in the last :data:`~autospec.store.deployments.FRESH_REPORT_S` seconds
serve (``versions prune`` keeps those versions by the same rule), and whether they all agree
with the pointer (a version that failed to load leaves them on the previous one).
``numerics`` is the target, revision, dtype and engine the replicas recorded
(:mod:`autospec.numerics`), with the concurrency bands the controller set (``k_bands``).
``segments`` lists the deployment's per-segment pointers (segment, version, since, previous:
``autospec promote VERSION --segment S``); native replicas draft those segments with them,
vLLM replicas where the segment's version and the deployment's are suffix versions; each
pointer's ``refused`` says why its segment is not drafted by it (None: nothing says so).
``concurrency`` is the load the replicas served over the last hour: requests in flight per
replica as the traffic rows recorded it (p50, p90, max, mean; None before any row did).
``traffic`` counts the deployment's requests only, and ``failures`` are its failures of the
last day and those naming no deployment (both filtered in the query, so a busier deployment
sharing the store cannot crowd them out).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from autospec import store
from autospec.controller import records
from autospec.controller.drafted_tau import (
    drafted_live,
    drafted_segments,
    drafted_tau,
    pooled,
    served_on,
)
from autospec.controller.live_mix import at_live_mix
from autospec.controller.operations import cycle_rows
from autospec.controller.policy import Policy
from autospec.controller.segment_watch import serves_on_vllm, vllm_segment_refusal
from autospec.controller.speedcheck import expected_gain
from autospec.controller.watch import (
    evaluated_drafted,
    evaluation_k,
    left_out,
    pending_canary,
    promotion_evaluation,
)
from autospec.ledger import collect_ledger
from autospec.store.models import BUILTIN_VERSION, utcnow


def collect_status(engine: Engine, *, deployment: str, policy: Policy, cycles: int = 5,
                   period: timedelta = timedelta(days=1)) -> dict[str, Any]:
    now = utcnow()
    with store.session_scope(engine, readonly=True) as session:
        pointer = store.get_live(session, deployment=deployment)
        version = pointer.version if pointer else BUILTIN_VERSION
        live = {"version": version, "pointer": pointer is not None,
                "previous_version": pointer.previous_version if pointer else None,
                "updated_at": pointer.updated_at if pointer else None,
                "updated_by": pointer.updated_by if pointer else None,
                "generation": pointer.generation if pointer else 0}
        drafted, k = evaluated_drafted(session, version, deployment)
        shadow, left = (drafted.tau, drafted.left_out) if drafted else (None, ())
        hour = _tau(session, deployment, version, now - timedelta(hours=1), k, left)
        day = _tau(session, deployment, version, now - timedelta(days=1), k, left)
        last_id = records.last_consumed_newest_id(session, deployment=deployment)
        return {
            "deployment": deployment, "time": now, "policy": policy.name, "live": live,
            "tau": {"shadow": shadow,
                    "live_1h": hour.tau if hour else None,
                    "requests_1h": hour.requests if hour else 0,
                    "live_24h": day.tau if day else None,
                    "requests_24h": day.requests if day else 0},
            "speedup": evaluated_speedup(session, version, deployment),
            "last_evaluation": last_evaluation(session, deployment),
            "traffic": {
                "last_hour": _count(session, deployment, now - timedelta(hours=1)),
                "last_day": _count(session, deployment, now - timedelta(days=1)),
                "total": _count(session, deployment, None)},
            "fresh_requests": records.fresh_requests(session, deployment=deployment,
                                                     after_id=last_id,
                                                     max_age=policy.window.max_age),
            "min_fresh_requests": policy.window.min_fresh_requests,
            "cycles": _cycles(session, deployment, cycles, now),
            "schedule": _schedule(session, deployment),
            "lease": _lease(session, records.lease_name(deployment)),
            "canary": _canary(session, deployment, policy),
            "failures": _failures(session, deployment, now - timedelta(days=1)),
            "concurrency": _concurrency(session, deployment, now - timedelta(hours=1)),
            "segments": segment_pointers(session, deployment),
            "ledger": collect_ledger(session, deployment=deployment, since=now - period,
                                     until=now),
            **_served(session, deployment, version, now),
        }


def segment_pointers(session, deployment: str) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """The deployment's per-segment pointers (segment, version, since, previous); a segment
    without one is drafted by the live pointer's version. ``refused``: why the replicas do
    not draft the segment with its pointer's version (None: nothing says so) — a replica's
    refusal since the pointer moved (a ``failure`` event naming the segment and version:
    checksum, missing file), or on a vLLM deployment the rule a vLLM engine's drafter sets
    (:func:`~autospec.controller.segment_watch.vllm_segment_refusal`); the segment is then
    drafted by the deployment's version."""
    pointers = store.list_segment_pointers(session, deployment=deployment)
    refusals = _segment_refusals(session, deployment, pointers)
    on_vllm = bool(pointers) and serves_on_vllm(session, deployment)  # read once, not per pointer
    return [{"segment": p.segment, "version": p.version, "since": p.updated_at,
             "previous_version": p.previous_version, "updated_by": p.updated_by,
             "generation": p.generation,
             "refused": refusals.get((p.segment, p.version, p.updated_at))
             or vllm_segment_refusal(session, deployment=deployment, version=p.version,
                                     on_vllm=on_vllm)}
            for p in pointers]


def _segment_refusals(session, deployment: str,  # type: ignore[no-untyped-def]
                      pointers: list[Any]) -> dict[tuple[str, str, datetime], str]:
    """(segment, version, pointer moved at) → the newest replica refusal of that version
    for that segment since the move."""
    if not pointers:
        return {}
    found: dict[tuple[str, str, datetime], str] = {}
    by_segment = {p.segment: p for p in pointers}
    since = min(p.updated_at for p in pointers)
    for e in store.list_events(session, kinds=["failure"], deployment=deployment,
                               since=since, limit=200):
        p = by_segment.get((e.details or {}).get("segment"))
        if p is not None and e.version == p.version and e.created_at >= p.updated_at:
            found.setdefault((p.segment, p.version, p.updated_at), f"{e.actor}: {e.reason}")
    return found


def evaluated_speedup(session, version: str,  # type: ignore[no-untyped-def]
                      deployment: str | None = None) -> dict[str, Any] | None:
    """Estimated and measured speedup of ``version`` over target-only in the newest
    evaluation naming it (of ``deployment``'s traffic), and which one its gate used."""
    for ev in store.list_evaluations(session, limit=200, deployment=deployment):
        if version not in (ev.candidate, ev.incumbent):
            continue
        data = ev.per_segment or {}
        measured = data.get("speedup_measured") or {}
        return {"estimated": (data.get("speedup") or {}).get(version),
                "measured": measured.get(version),
                "basis": data.get("speed_basis", "estimated"), "evaluation_id": ev.id}
    return None


def last_evaluation(session, deployment: str | None = None) -> dict[str, Any] | None:  # type: ignore[no-untyped-def]
    """The newest evaluation: τ on real held-out traffic (what the gate decided on) and on
    held-out synthetic sequences (None without any), each per version, and its decision."""
    evs = store.list_evaluations(session, limit=1, deployment=deployment)
    if not evs:
        return None
    ev = evs[0]
    syn = (ev.per_segment or {}).get("synthetic") or {}
    return {"evaluation_id": ev.id, "candidate": ev.candidate, "incumbent": ev.incumbent,
            "decision": ev.decision,
            "tau_real": {ev.candidate: ev.tau_candidate, ev.incumbent: ev.tau_incumbent},
            "tau_synthetic": syn.get("tau"), "synthetic_sequences": syn.get("num_sequences", 0),
            "overfits": syn.get("overfits", False)}


def _served(session, deployment: str, pointer_version: str,  # type: ignore[no-untyped-def]
            now: datetime) -> dict[str, Any]:
    fresh_since = store.fresh_reports_since(now)
    replicas = [{"replica": r.replica, "version": r.version, "target_id": r.target_id,
                 "revision": r.target_revision, "dtype": r.dtype, "started_at": r.started_at,
                 "reported_at": r.reported_at, "stale": r.reported_at < fresh_since}
                for r in store.list_replicas(session, deployment=deployment)]
    versions = sorted({r["version"] for r in replicas if not r["stale"]})
    row = store.get_deployment(session, name=deployment)
    numerics = None if row is None else {
        "target": row.target, "target_id": row.target_id, "revision": row.target_revision,
        "dtype": row.dtype, "engine": row.engine, "updated_at": row.updated_at,
        "updated_by": row.updated_by, "k_bands": row.k_bands}
    return {"served": {"versions": versions,
                       "replicas": sum(not r["stale"] for r in replicas),
                       "agrees": versions == [pointer_version] if versions else None},
            "replicas": replicas, "numerics": numerics}


def _concurrency(session, deployment: str, since) -> dict[str, Any] | None:  # type: ignore[no-untyped-def]
    profile = store.served_concurrency(session, deployment=deployment, since=since)
    return None if profile is None else profile.as_dict()


def _tau(session, deployment: str, version: str, since, k, left):  # type: ignore[no-untyped-def]
    # as the drift watch reads it, beside the shadow τ (the same segments left out)
    return drafted_live(session, deployment=deployment, version=version, since=since, k=k,
                        left_out=left)


def _count(session, deployment: str, since) -> int:  # type: ignore[no-untyped-def]
    return sum(store.request_counts(session, since=since, deployment=deployment).values())


def _schedule(session, deployment: str) -> dict[str, Any] | None:  # type: ignore[no-untyped-def]
    """The next scheduled cycle as its scheduler published it. Its time passed: ``running``
    while that scheduler holds the deployment's lease (the cycle of that time runs now: the
    next time is published when it ends), else ``overdue`` (no scheduler is running)."""
    row = store.get_lease(session, name=records.schedule_lease_name(deployment))
    if row is None:
        return None
    now = utcnow()
    lease = store.get_lease(session, name=records.lease_name(deployment))
    running = row.expires_at <= now and lease is not None and lease.expires_at > now \
        and lease.holder == row.holder
    return {"next_run": row.expires_at, "holder": row.holder, "running": running,
            "overdue": row.expires_at <= now and not running}


def _cycles(session, deployment: str, limit: int, now: datetime) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """The newest cycles; one without an end is ``running`` only while its controller holds
    the deployment's lease and no later cycle has started (one cycle at a time holds it),
    else ``unfinished``: its controller died, was stopped or was cut off from the store, and
    the next cycle records it interrupted."""
    rows = cycle_rows(session, deployment=deployment, limit=limit)
    lease = store.get_lease(session, name=records.lease_name(deployment))
    holder = lease.holder if lease is not None and lease.expires_at > now else None
    for i, row in enumerate(rows):
        if row["outcome"] == "running" and (i > 0 or row["actor"] != holder):
            row["outcome"] = "unfinished"
            row["reasons"] = [f"not running: {row['actor']} holds no lease; the next "
                              "cycle records it interrupted"]
    return rows


def _lease(session, name: str) -> dict[str, Any] | None:  # type: ignore[no-untyped-def]
    row = store.get_lease(session, name=name)
    if row is None or row.expires_at <= utcnow():
        return None
    return {"holder": row.holder, "token": row.token, "acquired_at": row.acquired_at,
            "expires_at": row.expires_at}


def _canary(session, deployment: str, policy: Policy) -> dict[str, Any] | None:  # type: ignore[no-untyped-def]
    promo = pending_canary(session, deployment=deployment)
    if promo is None:
        return None
    evaluation = promotion_evaluation(session, promo)
    drafted = drafted_tau(session, deployment=deployment, version=promo.version,
                          tau=float(promo.details["shadow_tau"]), evaluation=evaluation)
    rows = drafted_segments(session, deployment=deployment, version=promo.version,  # as the
                            since=promo.created_at, left_out=drafted.left_out,  # canary
                            k=evaluation_k(session, (promo.details or {}).get("evaluation_id")))
    stat = pooled(promo.version, rows)
    mix = None if drafted.tau is None else at_live_mix(drafted.tau, evaluation, promo.version,
                                                       rows)
    counted = stat.requests if stat else 0
    return {"version": promo.version,
            # what the canary judges by: at the live rows' segment mix (live_mix)
            "shadow_tau": mix.tau if mix else None,
            "shadow_tau_held_out": drafted.tau,
            "expected_speed_gain": expected_gain(promo.details or {}),
            "live_tau": stat.tau if stat else None,
            "requests": counted, "needed": policy.canary.requests,
            "judged": policy.canary.enabled,  # off: the watch gives no verdict
            # served at another k than evaluated, or cut by a concurrency band: not compared
            "left_out": left_out(session, deployment, promo.version, None, promo.created_at,
                                 counted, drafted.left_out),
            # segments with a pointer of their own: left out of both τ
            "segments_left_out": list(drafted.left_out),
            "on_segments_left_out": sum(served_on(
                session, deployment=deployment, version=promo.version,
                since=promo.created_at, segments=drafted.left_out).values())}


def _failures(session, deployment: str, since) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    events = store.list_events(session, kinds=["failure"], since=since, limit=10,
                               deployment=deployment, with_global=True)
    return [{"time": e.created_at, "actor": e.actor, "version": e.version,
             "reason": e.reason} for e in events]
