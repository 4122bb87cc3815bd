"""Operator actions on the registry, shared by the CLI and tests (no printing here).

- :func:`promote_version` — move the pointer to a version that has a *passing* evaluation
  against the version live now (the newest such evaluation is named in the reason and its
  shadow τ recorded, so the canary watch applies); ``force=True`` skips the check and is
  recorded as an ``override`` with the operator's reason.
- :func:`rollback_version` — the pointer back to its previous version, one step.
- :func:`list_versions`, :func:`list_history` — JSON-able rows.

Refusals raise :class:`Refused`; store errors propagate.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from autospec import store
from autospec.controller import records
from autospec.controller.speedcheck import promotion_speeds
from autospec.versions import BUILTIN_VERSION

HISTORY_KINDS = ("promotion", "rollback", "override", "rejection", "failure", "note")


class Refused(Exception):
    """The request is valid but the registry's state or the policy refuses it."""


def _refused(message: str) -> Exception:
    return Refused(message)


def ensure_pointer(session: Session, *, deployment: str, actor: str) -> None:
    """With no pointer yet, point it at the built-in version first, so the first promotion
    has a previous version to roll back to (the schema migrations register the built-in
    version in every store; a store without it is left as it is)."""
    if store.get_live(session, deployment=deployment) is not None:
        return
    try:
        store.get_speculator(session, version=BUILTIN_VERSION)
    except store.NotFound:
        return
    store.set_live(session, version=BUILTIN_VERSION, actor=actor, deployment=deployment,
                   reason=f"pointer initialised at {BUILTIN_VERSION}, served while nothing "
                          f"was live")


def passing_evaluation(session: Session, *, version: str, incumbent: str) -> Any | None:
    """The newest evaluation of ``version`` against ``incumbent`` that decided to promote."""
    for ev in store.list_evaluations(session, candidate=version, limit=200):
        if ev.incumbent == incumbent and ev.decision == "promote":
            return ev
    return None


def promote_version(engine: Engine, *, version: str, actor: str, force: bool = False,
                    reason: str = "", deployment: str = "default") -> dict[str, Any]:
    with store.session_scope(engine) as session:
        store.get_speculator(session, version=version)  # NotFound → exit 2
        pointer = store.get_live(session, deployment=deployment)
        current = pointer.version if pointer else BUILTIN_VERSION
        if current == version:
            raise _refused(f"{version} is already live for deployment {deployment}")
        ev = passing_evaluation(session, version=version, incumbent=current)
        if ev is None and not force:
            raise _refused(_why_not(session, version, current))
        details: dict[str, Any] = {"forced": force}
        if ev is not None:
            details.update(evaluation_id=ev.id, shadow_tau=ev.tau_candidate,
                           incumbent=current, **promotion_speeds(ev))
        ensure_pointer(session, deployment=deployment, actor=actor)
        text = reason.strip() or f"operator promotion: evaluation #{ev.id} passed " \
                                 f"against {current}"  # type: ignore[union-attr]
        kind = "override" if force else "promotion"
        store.set_live(session, version=version, actor=actor, reason=text,
                       deployment=deployment, kind=kind, details=details)
    return {"kind": kind, "version": version, "from": current, "reason": text,
            "evaluation_id": details.get("evaluation_id"), "deployment": deployment}


def _why_not(session: Session, version: str, current: str) -> str:
    evaluations = store.list_evaluations(session, candidate=version, limit=20)
    against = [e for e in evaluations if e.incumbent == current]
    if not against:
        return (f"{version} has no evaluation against the live version {current}; run "
                f"`autospec evaluate {version} {current}` or pass --force --reason \"...\"")
    last = against[0]
    return (f"the newest evaluation of {version} against {current} (#{last.id}) decided "
            f"{last.decision}: {'; '.join(last.reasons or [])}; pass --force --reason \"...\" "
            f"to override")


def rollback_version(engine: Engine, *, actor: str, reason: str,
                     deployment: str = "default") -> dict[str, Any]:
    with store.session_scope(engine) as session:
        pointer = store.get_live(session, deployment=deployment)
        if pointer is None or pointer.previous_version is None:
            raise _refused(f"deployment {deployment} has no previous version to roll back to")
        before = pointer.version
        moved = store.rollback(session, actor=actor, reason=reason, deployment=deployment)
        return {"version": moved.version, "from": before, "reason": reason,
                "deployment": deployment}


def list_versions(engine: Engine, *, state: str | None, limit: int) -> list[dict[str, Any]]:
    with store.session_scope(engine, readonly=True) as session:
        evaluations: dict[str, Any] = {}
        for ev in store.list_evaluations(session, limit=1000):
            evaluations.setdefault(ev.candidate, ev)
        rows = []
        for spec in store.list_speculators(session, state=state, limit=limit):
            ev = evaluations.get(spec.version)
            rows.append({
                "version": spec.version, "kind": spec.kind, "state": spec.state,
                "parent": spec.parent, "created_at": spec.created_at,
                "target_id": spec.target_id, "training_run_id": spec.training_run_id,
                "base": bool((spec.meta or {}).get("base")),  # autospec pretrain's heads
                "evaluation": None if ev is None else {
                    "id": ev.id, "incumbent": ev.incumbent, "decision": ev.decision,
                    "tau_candidate": ev.tau_candidate, "tau_incumbent": ev.tau_incumbent,
                    "delta_ci": [ev.delta_ci_low, ev.delta_ci_high]}})
        return rows


def list_history(engine: Engine, *, deployment: str, limit: int) -> list[dict[str, Any]]:
    with store.session_scope(engine, readonly=True) as session:
        events = store.list_events(session, kinds=list(HISTORY_KINDS), limit=limit * 3)
        rows = []
        for e in events:
            if e.deployment not in (None, deployment):
                continue
            kind = e.kind
            if kind == "note":
                kind = (e.details or {}).get("type", "note")
                if kind == "cycle_start":
                    continue
                if kind == "cycle":
                    kind = f"cycle {(e.details or {}).get('outcome')}"
            rows.append({"time": e.created_at, "event": kind, "actor": e.actor,
                         "version": e.version, "from_version": e.from_version,
                         "reason": e.reason, "details": e.details})
        return rows[:limit]


def cycle_rows(session: Session, *, deployment: str, limit: int) -> list[dict[str, Any]]:
    return [c.as_dict() for c in records.cycles(session, deployment=deployment, limit=limit)]
