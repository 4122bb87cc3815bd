"""``autospec versions prune``: delete the artifacts of versions nobody can need any more.

A pruned version keeps its registry row (its evaluations, training run, lineage and the audit
log still name it; ``db purge`` is the retention of *requests*): the row's ``meta.pruned``
records when, by whom and which artifact was deleted, and its artifact directory is removed.
A pruned version cannot be made live again (:func:`autospec.store.pointers.set_live` refuses
it) nor loaded (:mod:`autospec.versions` says it was pruned).

Kept, whatever ``keep`` says (:func:`plan` gives each kept version its reasons):

- every deployment's live version (during a canary, the version under watch) and its
  previous version (the rollback target, also after a rollback: the version rolled back from);
- every version a replica reports serving (a replica still on an older version mid-swap):
  reports older than :data:`~autospec.store.deployments.FRESH_REPORT_S` are left out, as
  ``autospec status`` leaves them out (a crashed replica's, or a restored store's, would pin
  their versions for ever);
- candidates not evaluated yet (pending: the controller may still promote them), but for
  those a controller's cycle trained and closed without evaluating them (``interrupted``: its
  controller died; ``failed``: the store or the evaluation failed), which no cycle goes back
  to;
- base heads (``autospec pretrain``), which later heads are fine-tuned from;
- the newest ``keep`` versions that still have an artifact;
- the built-in version (it has no artifact).

Only directories under the artifact directory are deleted; a version whose artifact lives
elsewhere (registered from another path) is reported as skipped. The rows are marked and the
prune audited (a ``note`` event, ``details.type = "prune"``, shown by ``autospec history``) in
one transaction before the files go, so a crash can leave a file behind but never a version
that looks loadable without its artifact; pruning again removes what was left. That
transaction holds the pointer lock (:func:`autospec.store.registry.lock_pointers`) from the
plan to the marks, so a promotion running at the same moment waits for it and then sees the
marks (PostgreSQL; on SQLite both write under ``BEGIN IMMEDIATE``).
"""

from __future__ import annotations

import logging
import shutil
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from autospec.store.artifacts import local_path
from autospec.store.db import session_scope
from autospec.store.deployments import fresh_reports_since
from autospec.store.models import (
    BUILTIN_VERSION,
    Evaluation,
    Event,
    LivePointer,
    ReplicaReport,
    SegmentPointer,
    Speculator,
    utcnow,
)
from autospec.store.registry import lock_pointers, record_event

log = logging.getLogger(__name__)

DEFAULT_KEEP = 5


@dataclass
class PrunePlan:
    """What a prune does (or, with ``dry_run``, would do)."""

    keep: int
    dry_run: bool
    prune: list[dict[str, Any]] = field(default_factory=list)  # version, artifact, bytes
    kept: dict[str, list[str]] = field(default_factory=dict)  # version -> why
    skipped: list[dict[str, str]] = field(default_factory=list)  # version, artifact, why

    def as_dict(self) -> dict[str, Any]:
        return {"keep": self.keep, "dry_run": self.dry_run, "pruned": self.prune,
                "bytes": sum(p["bytes"] for p in self.prune), "kept": self.kept,
                "skipped": self.skipped}


def is_pruned(meta: dict[str, Any] | None) -> bool:
    return bool((meta or {}).get("pruned"))


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def _under(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return path.resolve() != root.resolve()


def closed_cycles_candidates(session: Session) -> set[str]:
    """The candidates named by a cycle's end record (the controller's ``cycle`` notes,
    :mod:`autospec.controller.records`): whatever became of them, no cycle comes back to
    them."""
    ends = session.scalars(select(Event.details).where(
        Event.kind == "note", Event.details["type"].as_string() == "cycle"))
    return {v for details in ends for v in (details or {}).get("candidates") or ()}


def plan(session: Session, *, keep: int, artifact_dir: Path, dry_run: bool = True) -> PrunePlan:
    """Which versions' artifacts go, which stay and why (reads only)."""
    if keep < 0:
        raise ValueError("keep must be >= 0")
    why: dict[str, list[str]] = defaultdict(list)
    for pointer in session.scalars(select(LivePointer)):
        why[pointer.version].append(f"live for {pointer.deployment}")
        if pointer.previous_version:
            why[pointer.previous_version].append(
                f"previous of {pointer.deployment} (its rollback target)")
    for seg in session.scalars(select(SegmentPointer)):
        why[seg.version].append(f"live for segment {seg.segment} of {seg.deployment}")
        if seg.previous_version:
            why[seg.previous_version].append(
                f"previous of segment {seg.segment} of {seg.deployment}")
    fresh = select(ReplicaReport).where(ReplicaReport.reported_at >= fresh_reports_since(utcnow()))
    for report in session.scalars(fresh):
        why[report.version].append(f"served by replica {report.replica}")
    evaluated = set(session.scalars(select(Evaluation.candidate).distinct()))
    evaluated |= closed_cycles_candidates(session)  # no longer pending either
    specs = list(session.scalars(select(Speculator).order_by(
        Speculator.created_at.desc(), Speculator.version.desc())))
    with_artifact = [s for s in specs if s.version != BUILTIN_VERSION and not is_pruned(s.meta)]
    for spec in with_artifact[:keep]:
        why[spec.version].append(f"among the newest {keep}")
    for spec in with_artifact:
        if spec.state == "candidate" and spec.version not in evaluated:
            why[spec.version].append("a candidate not evaluated yet")
        if (spec.meta or {}).get("base"):
            why[spec.version].append("a base head later heads are trained from")
    result = PrunePlan(keep=keep, dry_run=dry_run)
    for spec in specs:
        if spec.version == BUILTIN_VERSION:
            continue
        path = local_path(spec.artifact_uri)
        if is_pruned(spec.meta):
            if path is not None and path.exists() and _under(path, artifact_dir):
                result.prune.append({"version": spec.version, "artifact": str(path),
                                     "bytes": _size(path), "left_behind": True})
            continue
        if why.get(spec.version):
            result.kept[spec.version] = why[spec.version]
        elif path is None:
            result.skipped.append({"version": spec.version, "artifact": spec.artifact_uri,
                                   "why": "not a local artifact"})
        elif not _under(path, artifact_dir):
            result.skipped.append({"version": spec.version, "artifact": str(path),
                                   "why": f"outside the artifact directory {artifact_dir}"})
        else:
            result.prune.append({"version": spec.version, "artifact": str(path),
                                 "bytes": _size(path)})
    return result


def prune(engine: Engine, *, artifact_dir: Path, keep: int = DEFAULT_KEEP,
          dry_run: bool = False, actor: str = "cli") -> PrunePlan:
    """Prune (or with ``dry_run`` only list) old versions' artifacts; see the module doc."""
    with session_scope(engine, readonly=dry_run) as session:
        if not dry_run:
            lock_pointers(session)  # no promotion between the plan and the marks
        result = plan(session, keep=keep, artifact_dir=artifact_dir, dry_run=dry_run)
        if dry_run or not result.prune:
            return result
        now = utcnow().isoformat()
        for entry in result.prune:
            if entry.get("left_behind"):
                continue
            spec = session.get(Speculator, entry["version"])
            assert spec is not None
            spec.meta = {**(spec.meta or {}), "pruned": {"at": now, "by": actor,
                                                         "artifact": entry["artifact"]}}
        versions = [p["version"] for p in result.prune]
        record_event(session, kind="note", actor=actor,
                     reason=f"pruned the artifacts of {len(versions)} versions "
                            f"({', '.join(versions)}), keeping the newest {keep}",
                     details={"type": "prune", "versions": versions, "keep": keep,
                              "bytes": sum(p["bytes"] for p in result.prune),
                              "kept": sorted(result.kept)})
    for entry in result.prune:
        path = Path(entry["artifact"])
        doomed = path.with_name(f".pruned-{uuid.uuid4().hex[:8]}-{path.name}")
        try:
            path.rename(doomed)
        except FileNotFoundError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        log.info("pruned %s: deleted %s", entry["version"], path)
    return result
