"""Speculator versions by name: the built-in one and those registered in the store.

Serving, evaluation and training all turn a version name into a speculator the same way:
``builtin-ngram`` is the training-free n-gram speculator (served while no version is
live); any other name is looked up in the store's registry and its artifact loaded with
:func:`autospec.speculators.checkpoint.load_speculator` (checksums verified, the artifact's
SHA-256 checked against the one registered, target checked). Every refusal is a
:class:`VersionLoadError` naming the version and the reason; an artifact that is not the
one registered (its files replaced by another valid artifact's) is also recorded in the
audit log (a ``failure`` event, ``details.what = "artifact mismatch"``). A version whose
artifact ``autospec versions prune`` deleted is refused saying so.

The built-in version is registered in every store by the schema migrations (a
target-agnostic row without an artifact: it is built in code), so the live pointer can
always go back to it.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import Engine

from autospec import store
from autospec.engine.protocol import Speculator
from autospec.engine.target import Target
from autospec.speculators.checkpoint import (
    ArtifactMismatch,
    SpeculatorLoadError,
    load_speculator,
)
from autospec.speculators.registry import new_speculator
from autospec.store.artifacts import local_path
from autospec.store.models import BUILTIN_VERSION

log = logging.getLogger(__name__)



class VersionLoadError(RuntimeError):
    """A version could not be loaded; the message names the version and why.

    ``audited``: the refusal is already in the audit log (callers need not record it).
    """

    def __init__(self, message: str, *, audited: bool = False) -> None:
        super().__init__(message)
        self.audited = audited


def load_speculator_version(db: Engine | None, target: Target, version: str, *,
                            actor: str = "autospec", deployment: str | None = None,
                            float32: bool = False) -> tuple[str, Speculator]:
    """``(kind, speculator)`` for ``version``; :class:`VersionLoadError` if refused.

    ``actor`` and ``deployment`` name who loaded it in the audit event of a mismatch;
    ``float32``: its weights in float32, the stored values exactly (a warm start; see
    :func:`~autospec.speculators.checkpoint.load_speculator`).
    """
    if version == BUILTIN_VERSION:
        return "ngram", new_speculator("ngram", target)
    if db is None:
        raise VersionLoadError(f"version {version!r}: no database to look it up in")
    try:
        with store.session_scope(db, readonly=True) as session:
            row = store.get_speculator(session, version=version)
            uri, kind, target_id, sha = row.artifact_uri, row.kind, row.target_id, row.sha256
            pruned = (row.meta or {}).get("pruned")
    except store.NotFound as exc:
        raise VersionLoadError(str(exc)) from None
    if pruned:
        raise pruned_error(version, pruned)
    if target_id != target.info.target_id:
        raise VersionLoadError(f"version {version!r} is for target {target_id!r}, "
                               f"not {target.info.target_id!r}")
    path = local_path(uri)
    if path is None:
        raise VersionLoadError(f"version {version!r}: artifact {uri} is not a local directory")
    try:
        return kind, load_speculator(path, target, expected_sha256=sha, float32=float32)
    except ArtifactMismatch as exc:
        message = f"version {version!r}: {exc}"
        _audit_mismatch(db, version=version, reason=message, actor=actor,
                        deployment=deployment, registered=sha, uri=uri)
        raise VersionLoadError(message, audited=True) from None
    except (SpeculatorLoadError, OSError, ValueError) as exc:
        raise VersionLoadError(f"version {version!r}: {exc}") from None


def pruned_error(version: str, pruned: dict[str, Any]) -> VersionLoadError:
    """The refusal of a version whose artifact ``autospec versions prune`` deleted."""
    return VersionLoadError(f"version {version!r} was pruned (`autospec versions prune` "
                            f"deleted its artifact {pruned.get('at', '')}); it cannot be "
                            f"loaded any more")


def _audit_mismatch(db: Engine, *, version: str, reason: str, actor: str,
                    deployment: str | None, registered: str, uri: str) -> None:
    log.error("refused %s: %s", version, reason)
    try:
        with store.session_scope(db) as session:
            store.record_event(session, kind="failure", actor=actor, reason=reason,
                               deployment=deployment, version=version,
                               details={"what": "artifact mismatch", "artifact": uri,
                                        "registered_sha256": registered})
    except store.StoreError:  # the refusal stands even if the audit log cannot be written
        log.exception("could not record the artifact mismatch of %s", version)


def check_registered(db: Engine, versions: list[str]) -> None:
    """Fail fast (before loading a target) on a version that is not registered."""
    with store.session_scope(db, readonly=True) as session:
        for version in versions:
            if version == BUILTIN_VERSION:
                continue
            try:
                store.get_speculator(session, version=version)
            except store.NotFound as exc:
                raise VersionLoadError(str(exc)) from None
