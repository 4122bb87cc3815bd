"""Operator actions on the registry, shared by the CLI and tests (no printing here).

- :func:`promote_version` — move the pointer to a version that has a *passing* evaluation
  against the version live now (the newest such evaluation is named in the reason and its
  shadow τ recorded, so the canary watch applies); ``force=True`` skips the check and is
  recorded as an ``override`` with the operator's reason.
- :func:`rollback_version` — the pointer back to its previous version, one step.
- :func:`list_versions`, :func:`list_history` — JSON-able rows.

Each move takes ``segment=``: the pointer of one traffic segment of the deployment moves
instead (:mod:`autospec.serve.segments`; a segment without a pointer is drafted by the
deployment's version). For a segment, *passing* means: an evaluation of the version against
the version drafting that segment now (its pointer's, else the deployment's) whose
per-segment results have the segment with Δτ ≥ 0 on at least the gate's
``min_segment_requests`` of its requests (:func:`passing_segment_evaluation`) — the
overall decision may be a rejection: that is what a segment's own pointer is for. The first
move of a segment first pins its pointer at the version drafting it then
(:func:`ensure_segment_pointer`), so a rollback has somewhere to go.

A promotion to a deployment the store does not know (:mod:`autospec.controller.names`) is
refused unless ``new_deployment`` (a typo would start a pointer no replica follows); one of
a version whose artifact is here but fails its SHA-256 (a file changed, cut short or gone,
the directory gone from a folder holding others), ``force`` or not: no replica would load it.

Refusals raise :class:`Refused`; store errors propagate. A promotion or rollback moves the
pointer only if it still names the version the command read (``expect``): one a controller
moved in between is left as it is, and the :class:`~autospec.store.Conflict` names the move.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from autospec import store
from autospec.controller import records
from autospec.controller.names import unknown_deployment_in
from autospec.controller.result import CycleFailed
from autospec.controller.segment_watch import newest_move, vllm_segment_refusal
from autospec.controller.speedcheck import promotion_speeds
from autospec.evaluate.gate import GatePolicy
from autospec.store.artifacts import artifact_sha256, local_path
from autospec.store.errors import ArtifactError
from autospec.store.models import BUILTIN_VERSION, Event
from autospec.store.registry import lock_pointers

#: what ``autospec history`` shows: every move of a pointer, decision and failure, the
#: replicas' swaps (in place or a new engine), imported heads, the policies controllers ran
#: and request purges; not registrations (``autospec versions``) nor lease hand-overs
HISTORY_KINDS = ("promotion", "rollback", "override", "unpin", "rejection", "failure", "note",
                 "swap", "import", "policy", "purge")


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


def pointer_generation(session: Session, *, deployment: str) -> int:
    """The deployment's pointer's generation (0: no pointer yet)."""
    pointer = store.get_live(session, deployment=deployment)
    return pointer.generation if pointer is not None else 0


def check_incumbent(session: Session, *, deployment: str, incumbent: str,
                    generation: int | None = None) -> None:
    """A :class:`~autospec.controller.result.CycleFailed` unless the deployment's pointer,
    read under the pointer lock until the transaction ends, still names ``incumbent`` (no
    pointer: the built-in version), the version a cycle's candidates were evaluated against,
    and, given the ``generation`` it had when the cycle started, has not moved since (an
    operator's promote then rollback back to ``incumbent``; its first initialisation at the
    built-in version is no move)."""
    lock_pointers(session)
    now = store.serving_version(session, deployment=deployment) or BUILTIN_VERSION
    if now != incumbent:
        raise CycleFailed(f"the live pointer moved from {incumbent} to {now} during the cycle "
                          f"(its candidates were evaluated against {incumbent}); none was "
                          "promoted or rejected, and the window is left to the next cycle")
    moves = 0 if generation is None else \
        pointer_generation(session, deployment=deployment) - generation
    if moves and not (generation == 0 and moves == 1):
        raise CycleFailed(f"the live pointer moved {moves} times during the cycle and names "
                          f"{incumbent} again (`autospec history` has the moves; a version "
                          "rolled back meanwhile is not promoted over that); none was "
                          "promoted or rejected, and the window is left to the next cycle")


def ensure_segment_pointer(session: Session, *, deployment: str, segment: str,
                           actor: str) -> None:
    """With no pointer for ``segment`` yet, pin it at the version drafting it now (the
    deployment's), so its first move has a previous version to roll back to."""
    if store.get_live(session, deployment=deployment, segment=segment) is not None:
        return
    ensure_pointer(session, deployment=deployment, actor=actor)
    version = store.serving_version(session, deployment=deployment)
    if version is not None:
        store.set_live(session, version=version, actor=actor, deployment=deployment,
                       segment=segment, reason=f"segment pointer initialised at {version}, "
                       f"the deployment's version that drafted it")


def segment_result(ev: Any, segment: str) -> dict[str, Any] | None:
    """``segment``'s results in evaluation ``ev`` (requests, τ per version, Δτ, CI), or None."""
    return ((ev.per_segment or {}).get("segments") or {}).get(segment)


def passing_segment_evaluation(session: Session, *, version: str, incumbent: str,
                               segment: str, deployment: str | None = None) -> Any | None:
    """The newest evaluation of ``version`` against ``incumbent`` in which ``segment`` has a
    Δτ ≥ 0 on at least the gate's ``min_segment_requests`` requests, as that evaluation's
    policy set it (whatever the overall decision)."""
    for ev in store.list_evaluations(session, candidate=version, limit=200,
                                     deployment=deployment):
        result = segment_result(ev, segment) if ev.incumbent == incumbent else None
        if result is not None and result.get("delta") is not None and result["delta"] >= 0 \
                and (result.get("num_requests") or 0) >= min_segment_requests(ev):
            return ev
    return None


def min_segment_requests(ev: Any) -> int:
    """The fewest requests of a segment evaluation ``ev`` judged (its gate policy's
    ``min_segment_requests``): fewer, and its Δτ there is reported, not evidence."""
    recorded = (ev.policy or {}).get("min_segment_requests")
    return int(recorded) if recorded else GatePolicy().min_segment_requests


def passing_evaluation(session: Session, *, version: str, incumbent: str,
                       deployment: str | None = None) -> Any | None:
    """The newest evaluation of ``version`` against ``incumbent`` (on ``deployment``'s
    traffic) that decided to promote."""
    for ev in store.list_evaluations(session, candidate=version, limit=200,
                                     deployment=deployment):
        if ev.incumbent == incumbent and ev.decision == "promote":
            return ev
    return None


def promote_version(engine: Engine, *, version: str, actor: str, force: bool = False,
                    reason: str = "", deployment: str = "default",
                    segment: str | None = None, new_deployment: bool = False) -> dict[str, Any]:
    """Move the deployment's pointer (or ``segment``'s) to ``version`` if it passed against
    the version there now (see the module doc), or with ``force``; a deployment the store
    does not know is refused unless ``new_deployment`` (see the module doc)."""
    checked = _checked_artifact(engine, version, None if new_deployment else deployment)
    with store.session_scope(engine) as session:
        row = store.get_speculator(session, version=version)
        if (row.artifact_uri, row.sha256) != checked:  # a restore in between
            raise _refused(f"not promoting {version}: its artifact changed in the registry "
                           f"while promote checked it; run it again")
        own = store.get_live(session, deployment=deployment, segment=segment)
        current = store.serving_version(session, deployment=deployment, segment=segment) \
            or BUILTIN_VERSION
        where = _where(deployment, segment).rstrip(",")
        if (own.version if own else current if segment is None else None) == version:
            raise _refused(f"{version} is already live for {where}")
        if own is None and current == version:  # a segment drafted by the deployment's
            raise _refused(f"{version} already drafts segment {segment} of deployment "
                           f"{deployment}: the segment follows the deployment's pointer, so "
                           "there is nothing to move")
        if segment is not None and (why := vllm_segment_refusal(
                session, deployment=deployment, version=version)) is not None:
            raise _refused(f"not moving segment {segment}'s pointer of deployment "
                           f"{deployment}: {why}; `autospec serve --engine native` "
                           "replicas follow every segment pointer")
        ev, details = _evidence(session, version, current, segment, deployment)
        if ev is None and not force:
            raise _refused(_why_not(session, version, current, segment, deployment))
        details["forced"] = force
        if segment is None:
            ensure_pointer(session, deployment=deployment, actor=actor)
        else:
            ensure_segment_pointer(session, deployment=deployment, segment=segment, actor=actor)
        on = f" on segment {segment}" if segment else ""
        text = reason.strip() or f"operator promotion: evaluation #{ev.id} passed " \
                                 f"against {current}{on}"  # type: ignore[union-attr]
        kind = "override" if force else "promotion"
        with _moved_meanwhile(session, deployment, segment, current, f"promoting {version}"):
            store.set_live(session, version=version, actor=actor, reason=text,
                           deployment=deployment, segment=segment, kind=kind,
                           details=details, expect=current,
                           rejected_ok=segment is not None and ev is not None)
    return {"kind": kind, "version": version, "from": current, "reason": text,
            "evaluation_id": details.get("evaluation_id"), "deployment": deployment,
            **_named(segment)}


def _checked_artifact(engine: Engine, version: str, deployment: str | None) -> tuple[str, str]:
    """``version``'s (artifact URI, SHA-256), its artifact checked (:func:`_check_artifact`)
    outside the write transaction: hashing a head of a GB or two takes seconds, and on SQLite
    that transaction holds the write lock every replica's request log waits on; refused
    before it: an unregistered version (NotFound), then an unknown ``deployment``."""
    with store.session_scope(engine, readonly=True) as session:
        row = store.get_speculator(session, version=version)
        if deployment is not None and (why := unknown_deployment_in(session, deployment)):
            raise _refused(f"not promoting {version}: {why}; pass --new-deployment if a new "
                           f"deployment is meant (its pointer starts at {version})")
    _check_artifact(row)
    return row.artifact_uri, row.sha256


def _check_artifact(row: Any) -> None:
    """Refuse a version whose artifact is here but is not the one registered (a file
    changed, cut short or gone, or its directory gone from a folder this machine has: no
    replica would load it), ``--force`` or not. An artifact whose folder this machine does
    not have is not checked, nor one gone from an empty folder: the operator CLI may run
    where the shared artifact storage is not mounted, its mount point left empty (the
    replicas check it as they load it)."""
    path = local_path(row.artifact_uri)
    if path is None or row.artifact_uri.startswith("builtin:") or (row.meta or {}).get("pruned") \
            or not (path.exists() or path.is_symlink() or _holds_anything(path.parent)):
        return
    try:
        actual = artifact_sha256(path)
    except ArtifactError as exc:
        raise _refused(f"not promoting {row.version}: its artifact fails its checks ({exc}); "
                       f"no replica would load it") from None
    if actual != row.sha256:
        raise _refused(f"not promoting {row.version}: its artifact at {path} has SHA-256 "
                       f"{actual[:12]}…, the registry records {row.sha256[:12]}… (its files "
                       f"were replaced); no replica would load it")


def _holds_anything(folder: Path) -> bool:
    """Whether ``folder`` is a directory with something in it: an empty one is most likely
    the mount point of shared storage that is not mounted here."""
    try:
        return folder.is_dir() and next(folder.iterdir(), None) is not None
    except OSError:
        return False


def _named(segment: str | None) -> dict[str, str]:
    """The ``segment`` key of a move's JSON, when a segment's pointer moved."""
    return {} if segment is None else {"segment": segment}


def _evidence(session: Session, version: str, current: str, segment: str | None,
              deployment: str) -> tuple[Any | None, dict[str, Any]]:
    """The passing evaluation of ``deployment``'s traffic (None: none) and what the move
    records of it."""
    if segment is None:
        ev = passing_evaluation(session, version=version, incumbent=current,
                                deployment=deployment)
        return ev, {} if ev is None else {"evaluation_id": ev.id, "shadow_tau": ev.tau_candidate,
                                          "incumbent": current, **promotion_speeds(ev)}
    ev = passing_segment_evaluation(session, version=version, incumbent=current,
                                    segment=segment, deployment=deployment)
    if ev is None:
        return None, {}
    result = segment_result(ev, segment) or {}
    tau = result.get("tau") or {}
    # as the controller's segment promotions record it: the segment's canary compares its
    # live τ on the segment with this shadow τ (τ on the segment's held-out requests)
    return ev, {"evaluation_id": ev.id, "shadow_tau": tau.get(version), "incumbent": current,
                "incumbent_shadow_tau": tau.get(current), "delta": result.get("delta"),
                "requests": result.get("num_requests")}


def _why_not(session: Session, version: str, current: str, segment: str | None,
             deployment: str) -> str:
    evaluations = store.list_evaluations(session, candidate=version, limit=20,
                                         deployment=deployment)
    against = [e for e in evaluations if e.incumbent == current]
    hint = "pass --force --reason \"...\""
    if not against:
        return (f"{version} has no evaluation against the live version {current}; run "
                f"`autospec evaluate {version} {current}` or {hint}")
    last = against[0]
    if segment is not None:
        result = segment_result(last, segment)
        least = min_segment_requests(last)
        found = "has no requests of it" if result is None or result.get("delta") is None \
            else (f"has Δτ {result['delta']:+.3f} on {result.get('num_requests') or 0} of its "
                  f"requests (a segment passes with Δτ ≥ 0 on at least {least})")
        return (f"no evaluation of {version} against {current} passes segment {segment}: "
                f"the newest (#{last.id}) {found}; {hint} to override")
    return (f"the newest evaluation of {version} against {current} (#{last.id}) decided "
            f"{last.decision}: {'; '.join(last.reasons or [])}; {hint} to override")


def rollback_version(engine: Engine, *, actor: str, reason: str, deployment: str = "default",
                     segment: str | None = None, force: bool = False) -> dict[str, Any]:
    """The deployment's pointer (or ``segment``'s) back to its previous version. Where the
    pointer's newest move was the canary rolling a version back, that version is not put
    live again (a second rollback undoes the first: it would, with no canary) unless
    ``force``."""
    with store.session_scope(engine) as session:
        pointer = store.get_live(session, deployment=deployment, segment=segment)
        where = _where(deployment, segment)
        if pointer is None or pointer.previous_version is None:
            raise _refused(f"{where} has no previous version to roll back to")
        canary = None if force else _canary_rollback(session, pointer, deployment, segment)
        if canary is not None:
            raise _refused(
                f"the canary rolled {where} back from {canary.from_version} to "
                f"{pointer.version} ({canary.reason}); rolling back would put "
                f"{canary.from_version} live again with no canary. Pass --force to do it "
                f"anyway, or `autospec promote {canary.from_version} --force --reason ...` to "
                f"put it live under a canary")
        before = pointer.version
        with _moved_meanwhile(session, deployment, segment, before, "rolling it back"):
            moved = store.rollback(session, actor=actor, reason=reason,
                                   deployment=deployment, segment=segment, expect=before)
        return {"version": moved.version, "from": before, "reason": reason,
                "deployment": deployment, **_named(segment)}


def _canary_rollback(session: Session, pointer: Any, deployment: str,
                     segment: str | None) -> Event | None:
    """The canary's rollback event that made ``pointer`` what it is (its newest move), or
    None when its newest move was anything else."""
    move = newest_move(session, deployment=deployment, segment=segment)
    if (move is None or move.kind != "rollback" or (move.details or {}).get("type") != "canary"
            or move.version != pointer.version):
        return None
    return move


def _where(deployment: str, segment: str | None) -> str:
    """A pointer as messages name it mid-sentence: ``deployment D`` or ``deployment D,
    segment S,``."""
    return f"deployment {deployment}" + (f", segment {segment}," if segment else "")


@contextmanager
def _moved_meanwhile(session: Session, deployment: str, segment: str | None, read: str,
                     doing: str) -> Iterator[None]:
    """A move told to expect ``read`` (the version this command read and reports as the one
    moved from): its Conflict, where the pointer, read again, names another version (a
    controller's promotion committed in between), as one that says so (exit 2)."""
    try:
        yield
    except store.Conflict:
        pointer = store.get_live(session, deployment=deployment, segment=segment)
        now = pointer.version if pointer is not None else BUILTIN_VERSION
        if now == read:
            raise
        where = _where(deployment, segment)
        raise store.Conflict(f"the live pointer of {where} moved from {read} to {now} while "
                             f"{doing} (another promotion or rollback committed meanwhile); "
                             "nothing was moved: run it again") from None


def unpin_segment(engine: Engine, *, actor: str, reason: str, deployment: str = "default",
                  segment: str) -> dict[str, Any]:
    """Drop ``segment``'s own pointer: the deployment's version drafts it again."""
    with store.session_scope(engine) as session:
        try:
            before = store.clear_segment(session, segment=segment, actor=actor, reason=reason,
                                         deployment=deployment)
        except store.NotFound as exc:
            raise _refused(str(exc)) from exc
        now = store.serving_version(session, deployment=deployment)
        return {"version": now, "from": before, "reason": reason, "deployment": deployment,
                "segment": segment, "unpinned": True}


def list_versions(engine: Engine, *, state: str | None, limit: int) -> list[dict[str, Any]]:
    """Registered versions, newest first; ``live_for``: the pointers naming each one
    (``deployment``, ``deployment/segment``); ``default_live``: the built-in version while no
    pointer exists at all (every deployment drafts with it)."""
    with store.session_scope(engine, readonly=True) as session:
        evaluations: dict[str, Any] = {}
        for ev in store.list_evaluations(session, limit=1000):
            evaluations.setdefault(ev.candidate, ev)
        pointers = store.pointers_by_version(session)
        rows = []
        for spec in store.list_speculators(session, state=state, limit=limit):
            ev = evaluations.get(spec.version)
            rows.append({
                "version": spec.version, "kind": spec.kind, "state": spec.state,
                "live_for": pointers.get(spec.version, []),
                "default_live": spec.version == BUILTIN_VERSION and not pointers,
                "parent": spec.parent,
                "created_at": spec.created_at,
                "target_id": spec.target_id, "training_run_id": spec.training_run_id,
                "base": bool((spec.meta or {}).get("base")),  # autospec pretrain's heads
                "evaluation": None if ev is None else {
                    "id": ev.id, "incumbent": ev.incumbent, "decision": ev.decision,
                    "tau_candidate": ev.tau_candidate, "tau_incumbent": ev.tau_incumbent,
                    "delta_ci": [ev.delta_ci_low, ev.delta_ci_high]}})
        return rows


def list_history(engine: Engine, *, deployment: str, limit: int,
                 segment: str | None = None) -> list[dict[str, Any]]:
    """The audit log's moves, failures and cycles, newest first; with ``segment``, only
    the events of that segment (``details.segment``: its pointer's moves, its load
    failures)."""
    with store.session_scope(engine, readonly=True) as session:
        rows: list[dict[str, Any]] = []
        for e in _history_events(session, deployment=deployment, segment=segment):
            if len(rows) >= limit:
                break
            kind = e.kind
            if kind == "note":
                kind = (e.details or {}).get("type", "note")
                if kind == "cycle_start":
                    continue
                if kind == "cycle":
                    kind = f"cycle {(e.details or {}).get('outcome')}"
            rows.append({"time": e.created_at, "event": kind, "actor": e.actor,
                         "segment": (e.details or {}).get("segment"),
                         "version": e.version, "from_version": e.from_version,
                         "reason": e.reason, "details": e.details})
        return rows


def _history_events(session: Session, *, deployment: str,
                    segment: str | None) -> Iterator[Event]:
    """The events ``autospec history`` may show, newest first: ``deployment``'s and those
    naming no deployment (with ``segment``, only that segment's), filtered in SQL and read a
    page at a time, so other deployments' newer events never crowd them out."""
    offset, page = 0, 200
    while True:
        events = store.list_events(session, kinds=list(HISTORY_KINDS), deployment=deployment,
                                   with_global=True, segment=segment, offset=offset, limit=page)
        yield from events
        if len(events) < page:
            return
        offset += page


def cycle_rows(session: Session, *, deployment: str, limit: int) -> list[dict[str, Any]]:
    return [c.as_dict() for c in records.cycles(session, deployment=deployment, limit=limit)]
