"""Speculator versions by name: the built-in one and those registered in the store.

Serving, evaluation and training all turn a version name into a speculator the same way:
``builtin-ngram`` is the training-free n-gram speculator (served while no version is
live); any other name is looked up in the store's registry and its artifact loaded with
:func:`autospec.speculators.checkpoint.load_speculator` (checksums verified, target
checked). Every refusal is a :class:`VersionLoadError` naming the version and the reason.

The built-in version is also registered in the store (:func:`register_builtin`, an
``ngram`` artifact under the artifact directory) the first time something must refer to
it — an evaluation against it, a pointer moving back to it — so the registry's foreign
keys hold.
"""

from __future__ import annotations

import contextlib

from sqlalchemy import Engine

from autospec import store
from autospec.engine.protocol import Speculator
from autospec.engine.target import Target
from autospec.settings import get_settings
from autospec.speculators.checkpoint import (
    SpeculatorLoadError,
    load_speculator,
    save_speculator,
)
from autospec.speculators.registry import new_speculator
from autospec.store.artifacts import local_path

BUILTIN_VERSION = "builtin-ngram"


class VersionLoadError(RuntimeError):
    """A version could not be loaded; the message names the version and why."""


def load_speculator_version(db: Engine | None, target: Target,
                            version: str) -> tuple[str, Speculator]:
    """``(kind, speculator)`` for ``version``; :class:`VersionLoadError` if refused."""
    if version == BUILTIN_VERSION:
        return "ngram", new_speculator("ngram", target)
    if db is None:
        raise VersionLoadError(f"version {version!r}: no database to look it up in")
    try:
        with store.session_scope(db, readonly=True) as session:
            row = store.get_speculator(session, version=version)
            uri, kind, target_id = row.artifact_uri, row.kind, row.target_id
    except store.NotFound as exc:
        raise VersionLoadError(str(exc)) from None
    if target_id != target.info.target_id:
        raise VersionLoadError(f"version {version!r} is for target {target_id!r}, "
                               f"not {target.info.target_id!r}")
    path = local_path(uri)
    if path is None:
        raise VersionLoadError(f"version {version!r}: artifact {uri} is not a local directory")
    try:
        return kind, load_speculator(path, target)
    except (SpeculatorLoadError, OSError, ValueError) as exc:
        raise VersionLoadError(f"version {version!r}: {exc}") from None


def register_builtin(db: Engine, target: Target) -> None:
    """Register :data:`BUILTIN_VERSION` for ``target`` if it is not registered yet."""
    with store.session_scope(db, readonly=True) as session:
        try:
            store.get_speculator(session, version=BUILTIN_VERSION)
            return
        except store.NotFound:
            pass
    path = get_settings().resolved_artifact_dir / BUILTIN_VERSION / target.info.revision
    sha = save_speculator(new_speculator("ngram", target), path)
    # another process may register it first: then its row stands
    with contextlib.suppress(store.Conflict), store.session_scope(db) as session:
        store.register_speculator(
            session, version=BUILTIN_VERSION, kind="ngram", target_id=target.info.target_id,
            target_revision=target.info.revision, artifact_uri=str(path), sha256=sha,
            meta={"builtin": True})


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
