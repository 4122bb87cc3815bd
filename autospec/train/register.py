"""Registration of a training run's candidate: artifact in place, version registered.

:func:`register_candidate` saves the fitted speculator into a partial directory under the
artifact dir (:mod:`autospec.train.partials`), then in one transaction (retried while the
store is out, :mod:`autospec.store.retry`) renames it to ``<artifact dir>/<version>``,
registers the version as a ``candidate`` and closes the run as ``succeeded``. The artifact
is durable before the transaction commits (:mod:`autospec.durable`: its files and directory
synced before the transaction, the artifact dir right after the rename), so a power loss
never leaves a registered version with empty or truncated files, or none. The version takes
the next name free both in the registry and in the artifact directory: a directory left
there under a version's name (a store reset) is never overwritten nor removed. A
failure moves the artifact back and removes it (a failed move is
:class:`~autospec.train.errors.ArtifactMoveError`); the caller records the run as failed.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from autospec import store
from autospec.durable import sync_dir, sync_tree
from autospec.engine.target import Target
from autospec.settings import get_settings
from autospec.speculators.checkpoint import save_speculator
from autospec.speculators.common import SavableSpeculator
from autospec.store.retry import retrying
from autospec.train.errors import ArtifactMoveError
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
        sha = save_speculator(spec, tmp)
        sync_tree(tmp)  # here, not in the transaction (which holds SQLite's write lock)
        version, final = retrying(
            f"registering the candidate of run {run_id}",
            lambda: _register_once(engine, kind, target, tmp, root, sha, metrics, run_id,
                                   parent, meta, getattr(spec.config, "draft_vocab_size", None)))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("registered %s (%s) from run %d", version, final, run_id)
    return version, final, sha


def _register_once(engine: Engine, kind: str, target: Target, tmp: Path,
                   root: Path, sha: str, metrics: dict[str, Any], run_id: int,
                   parent: str | None, meta: dict[str, Any],
                   draft_vocab_size: int | None) -> tuple[str, Path]:
    """One try at the registering transaction: the artifact in ``tmp`` takes its version's
    name, and goes back to ``tmp`` when the transaction fails (for the next try, or its
    removal)."""
    final: Path | None = None
    try:
        with store.session_scope(engine) as session:
            # a directory already named like the next version (left by a store reset, say)
            # is never overwritten nor removed: the version takes the next free name
            version = store.next_version(session, kind=kind,
                                         taken=lambda name: (root / name).exists())
            final = root / version
            try:  # its files were synced before: only the rename is left to sync
                tmp.rename(final)
                sync_dir(root)
            except OSError as exc:
                raise ArtifactMoveError(f"cannot move the candidate's artifact to {final}: "
                                        f"{exc.strerror or exc}") from exc
            store.register_speculator(
                session, version=version, kind=kind, target_id=target.info.target_id,
                target_revision=target.info.revision, artifact_uri=str(final), sha256=sha,
                parent=parent, draft_vocab_size=draft_vocab_size, training_run_id=run_id,
                meta={**meta, "metrics": _summary(metrics)}, actor="trainer")
            store.finish_training_run(session, run_id=run_id, status="succeeded",
                                      version=version, metrics=metrics)
    except BaseException:
        if final is not None and final.exists() and not tmp.exists():
            final.rename(tmp)
        raise
    return version, final


def _summary(metrics: dict[str, Any]) -> dict[str, Any]:
    """The registry row's short view of the metrics (the run row keeps them all)."""
    keys = ("examples_seen", "steps", "train_tokens", "heldout_after", "heldout_replay_tau_k5",
            "corpus_tokens", "init", "window")
    return {k: metrics[k] for k in keys if k in metrics}
