"""Registration of a training run's candidate: artifact in place, version registered.

:func:`register_candidate` saves the fitted speculator into a partial directory under the
artifact dir (:mod:`autospec.train.partials`), then in one transaction (retried while the
store is out, :mod:`autospec.store.retry`) renames it to ``<artifact dir>/<version>``,
registers the version as a ``candidate`` and closes the run as ``succeeded``. The artifact
is durable before the transaction commits (:mod:`autospec.durable`: its files and directory
synced before the transaction, the artifact dir right after the rename), so a power loss
never leaves a registered version with empty or truncated files, or none. The version takes
the next name free both in the registry and in the artifact directory: a directory left
there under a version's name (a store reset, an artifact whose registration is in doubt,
below) is never overwritten nor removed.

A failure before the COMMIT moves the artifact back to the partial directory (for the next
try, or its removal; a failed move is :class:`~autospec.train.errors.ArtifactMoveError`).
A COMMIT that raises may have landed all the same (the connection lost while its reply was
in flight), so a fresh session asks whether the version is registered with this run's id
and SHA-256: it is, and the registration succeeded (logged; an interrupt is raised all the
same, the artifact kept); it is not, and the artifact moves back as above. While the store
cannot answer, the artifact stays at its version's name and the error is raised: the next
try asks again first; if none is left, the directory stays, registered or an orphan that
the next registration's name skips. When the registration fails for good, the partial
directory is removed and the caller records the run as failed (a run still ``running``:
one whose registration landed stays ``succeeded``).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from autospec import store
from autospec.durable import sync_renamed, sync_tree
from autospec.engine.target import Target
from autospec.settings import get_settings
from autospec.speculators.checkpoint import save_speculator
from autospec.speculators.common import SavableSpeculator
from autospec.store.retry import retrying
from autospec.train.errors import ArtifactMoveError, ArtifactWriteError
from autospec.train.partials import partial_dir

log = logging.getLogger(__name__)


def register_candidate(engine: Engine, spec: SavableSpeculator, target: Target, *, kind: str,
                       artifact_dir: Path | None, metrics: dict[str, Any], run_id: int,
                       parent: str | None, meta: dict[str, Any]) -> tuple[str, Path, str]:
    """Write ``spec``'s artifact under ``artifact_dir`` (default: the settings') and register
    it as run ``run_id``'s candidate of ``kind``: its version, artifact directory, SHA-256."""
    root = artifact_dir or get_settings().resolved_artifact_dir
    root.mkdir(parents=True, exist_ok=True)
    tmp = partial_dir(root, run_id)
    try:
        sha = _write(spec, tmp)
        row = {"kind": kind, "target_id": target.info.target_id,
               "target_revision": target.info.revision, "parent": parent,
               "draft_vocab_size": getattr(spec.config, "draft_vocab_size", None),
               "meta": {**meta, "metrics": _summary(metrics)}}
        registration = _Registration(engine, tmp, root, sha, run_id, row, metrics)
        version, final = retrying(f"registering the candidate of run {run_id}",
                                  registration.once)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("registered %s (%s) from run %d", version, final, run_id)
    return version, final, sha


def _write(spec: SavableSpeculator, tmp: Path) -> str:
    """Save ``spec``'s artifact in ``tmp``, synced (here, not in the registering transaction,
    which holds SQLite's write lock); its SHA-256. A disk that refuses it (full, read-only)
    is an :class:`ArtifactWriteError` naming the directory and the system's reason."""
    from safetensors import SafetensorError

    try:
        sha = save_speculator(spec, tmp)
        sync_tree(tmp)
    except (OSError, SafetensorError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ArtifactWriteError(f"cannot write the candidate's artifact in {tmp.parent}: "
                                 f"{why}") from exc
    return sha


@dataclass
class _Registration:
    """Run ``run_id``'s registering transaction, one try per :meth:`once`."""

    engine: Engine
    tmp: Path  # the partial directory holding the artifact
    root: Path  # the artifact dir
    sha: str
    run_id: int
    row: dict[str, Any]  # the rest of the version's registry row
    metrics: dict[str, Any]
    #: where a try whose COMMIT raised, and whose outcome the store could not tell, left
    #: the artifact
    in_doubt: Path | None = None

    def once(self) -> tuple[str, Path]:
        """One try: the artifact takes its version's name, the version is registered."""
        if self.in_doubt is not None:  # raises again while the store is still out
            if self._landed(self.in_doubt):
                return self._landed_after_all(self.in_doubt)
            self.in_doubt.rename(self.tmp)
            self.in_doubt = None
        final: Path | None = None
        body_done = False
        try:
            with store.session_scope(self.engine) as session:
                # a directory already named like the next version (a store reset, say) is
                # never overwritten nor removed: the version takes the next free name
                version = store.next_version(session, kind=self.row["kind"],
                                             taken=lambda name: (self.root / name).exists())
                final = self.root / version
                try:
                    self.tmp.rename(final)
                except OSError as exc:
                    raise ArtifactMoveError(f"cannot move the candidate's artifact to "
                                            f"{final}: {exc.strerror or exc}") from exc
                sync_renamed(final)  # its files were synced before: only the rename is left
                store.register_speculator(
                    session, version=version, artifact_uri=str(final), sha256=self.sha,
                    training_run_id=self.run_id, actor="trainer", **self.row)
                store.finish_training_run(session, run_id=self.run_id, status="succeeded",
                                          version=version, metrics=self.metrics)
                body_done = True  # what raises from here on is the COMMIT
        except BaseException as exc:
            if final is None or not final.exists() or self.tmp.exists():
                raise  # the artifact never moved
            if body_done:  # the COMMIT raised: it may have landed all the same
                landed = self._landed_or_unknown(final)
                if landed and isinstance(exc, Exception):
                    return self._landed_after_all(final)
                if landed:  # an interrupt still interrupts; the version keeps its artifact
                    self._landed_after_all(final)
                    raise
                if landed is None:
                    self.in_doubt = final
                    raise
            final.rename(self.tmp)
            raise
        return version, final

    def _landed(self, final: Path) -> bool:
        """Whether ``final``'s version is registered by this run, with this artifact."""
        with store.session_scope(self.engine, readonly=True) as session:
            return store.registered_with(session, final, self.sha, training_run_id=self.run_id)

    def _landed_or_unknown(self, final: Path) -> bool | None:
        """:meth:`_landed`, or None (logged) when the store cannot say."""
        try:
            return self._landed(final)
        except (SQLAlchemyError, store.StoreError, OSError) as exc:
            log.warning("run %d: the COMMIT registering %s raised and the store cannot say "
                        "whether it landed (%s); its artifact stays at %s", self.run_id,
                        final.name, exc, final)
            return None

    def _landed_after_all(self, final: Path) -> tuple[str, Path]:
        log.warning("run %d: the COMMIT registering %s raised, but it had landed; its "
                    "artifact stays at %s", self.run_id, final.name, final)
        return final.name, final


def _summary(metrics: dict[str, Any]) -> dict[str, Any]:
    """The registry row's short view of the metrics (the run row keeps them all)."""
    keys = ("examples_seen", "steps", "train_tokens", "heldout_after", "heldout_replay_tau_k5",
            "corpus_tokens", "init", "window")
    return {k: metrics[k] for k in keys if k in metrics}
