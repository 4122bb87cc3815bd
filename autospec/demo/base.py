"""The demo's base eagle3 head: found in the user's store, adopted into the demo's.

``autospec pretrain`` registers a base head (``meta.base``) in the store it is pointed at —
by default the user's (``AUTOSPEC_DATABASE_URL``, else ``AUTOSPEC_DATA_DIR/autospec.db``).
Each demo run has a store of its own, so :func:`adopt_base` registers that head there too
(same version name, same artifact file, its SHA-256 verified again), marked base; the
demo's eagle3 candidates then warm-start from it as any eagle3 training does
(:func:`autospec.train.run.base_version`). :func:`find_base` picks the head: a named
version, or the newest base of the target's id and revision (the revision leaves the
load dtype out, so a base pretrained in float32 serves a bfloat16 demo: same weights,
same tokens to predict). :func:`base_for_demo` is the demo's step that does both and says
what it found. Nothing of the user's store is written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from autospec import store
from autospec.engine.target import Target
from autospec.store.db import describe

AUTO, NONE = "auto", "none"


class BaseUnavailable(ValueError):
    """A named base version that is missing, not eagle3, not a base or for another target."""


@dataclass(frozen=True)
class FoundBase:
    version: str
    artifact_uri: str
    sha256: str
    target_revision: str | None
    draft_vocab_size: int | None
    meta: dict[str, Any]
    source: str  # the store it was found in (password-free)


def find_base(source_url: str, target: Target, wanted: str = AUTO) -> FoundBase | None:
    """The base head ``wanted`` (a version, or ``auto``: the newest for ``target``) in the
    store at ``source_url``; None for ``none``, a store that does not exist, or no base."""
    from autospec.train.run import base_version

    if wanted == NONE or not _exists(source_url):
        if wanted not in (AUTO, NONE):
            raise BaseUnavailable(f"no store at {describe(source_url)} to find base {wanted!r} in")
        return None
    engine = store.open_store(source_url, upgrade=False)
    try:
        with store.session_scope(engine, readonly=True) as session:
            version = base_version(session, "eagle3", target) if wanted == AUTO else wanted
            if version is None:
                return None
            row = _checked(session, version, target)
            return FoundBase(version=row.version, artifact_uri=row.artifact_uri,
                             sha256=row.sha256, target_revision=row.target_revision,
                             draft_vocab_size=row.draft_vocab_size, meta=dict(row.meta or {}),
                             source=describe(source_url))
    finally:
        engine.dispose()


def check_named(source_url: str, wanted: str) -> None:
    """Before a demo starts: :class:`BaseUnavailable` unless ``wanted`` (``auto``, ``none``
    or a version) can be looked for — a named version must be a registered base eagle3 head
    in the store at ``source_url`` (its target is checked once the target is loaded)."""
    if wanted in (AUTO, NONE):
        return
    if not _exists(source_url):
        raise BaseUnavailable(f"no store at {describe(source_url)} to find base {wanted!r} in")
    engine = store.open_store(source_url, upgrade=False)
    try:
        with store.session_scope(engine, readonly=True) as session:
            _checked_kind(session, wanted)
    finally:
        engine.dispose()


def _exists(url: str) -> bool:
    """False for a SQLite file that is not there (opening it would create it); a malformed
    URL is a :class:`~autospec.store.errors.BadDatabaseURL` (sqlalchemy's ArgumentError got
    past ``--base auto``'s fallback to scratch and ended the demo after Ray had started)."""
    from pathlib import Path

    from autospec.store.db import parse_url

    parsed = parse_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return True
    return parsed.database == ":memory:" or Path(parsed.database).exists()


def _checked_kind(session, version: str):  # type: ignore[no-untyped-def]
    try:
        row = store.get_speculator(session, version=version)
    except store.NotFound:
        raise BaseUnavailable(f"base version {version!r} is not registered in the store") \
            from None
    if row.kind != "eagle3" or not (row.meta or {}).get("base"):
        raise BaseUnavailable(f"{version} is a {row.kind} version, not a base eagle3 head "
                              f"(autospec pretrain builds one)")
    return row


def _checked(session, version: str, target: Target):  # type: ignore[no-untyped-def]
    row = _checked_kind(session, version)
    info = target.info
    if row.target_id != info.target_id or (
            row.target_revision and not info.accepts_revision(row.target_revision)):
        raise BaseUnavailable(f"base {version} is for target {row.target_id} (revision "
                              f"{row.target_revision}), not {info.target_id} (revision "
                              f"{info.revision}): pretrain one with the demo's --target and "
                              f"--dtype")
    return row


def adopt_base(engine: Engine, found: FoundBase, target: Target) -> str:
    """Register ``found`` in the demo's store (its artifact checked against its SHA-256)."""
    with store.session_scope(engine) as session:
        store.register_speculator(
            session, version=found.version, kind="eagle3", target_id=target.info.target_id,
            target_revision=found.target_revision, artifact_uri=found.artifact_uri,
            sha256=found.sha256, draft_vocab_size=found.draft_vocab_size,
            meta={**found.meta, "base": True, "adopted_from": found.source}, actor="demo")
    return found.version


def pretrain_hint(target_spec: str, dtype: str) -> str:
    """The command that builds a base head the demo would find (generating on vLLM where
    it is installed, as docs/training.md's recipe does)."""
    from autospec.engine.choice import vllm_installed

    engine = " --engine vllm" if vllm_installed() else ""
    return f"autospec pretrain --target {target_spec} --dtype {dtype}{engine}"


def base_for_demo(engine: Engine, target: Target, *, target_spec: str, wanted: str,
                  source_url: str | None, say: Callable[[str], None]) -> str | None:
    """The demo's set-up step: find the base head (``wanted``: auto, none or a version) in
    ``source_url``, adopt it into the demo's store and say so; its version, or None (the
    eagle3 candidates start from scratch; the line says why and how to build a base). A
    named version that cannot be read raises; ``auto`` falls back to scratch."""
    if wanted == NONE or source_url is None:
        why = "--base none" if wanted == NONE else "no store to look in"
        say(f"eagle3 candidates start from scratch ({why})")
        return None
    try:
        found = find_base(source_url, target, wanted)
    except store.StoreError as exc:
        if wanted != AUTO:
            raise
        say(f"no base head read ({str(exc).splitlines()[0]}): eagle3 candidates "
            f"start from scratch")
        return None
    if found is None:
        hint = pretrain_hint(target_spec, target.dtype_name)
        say(f"no base eagle3 head for {target.info.target_id} ({target.dtype_name}) in "
            f"{describe(source_url)}: eagle3 candidates start from scratch; `{hint}` builds "
            f"one (~15 minutes on 2 CPU cores)")
        return None
    version = adopt_base(engine, found, target)
    sequences = found.meta.get("synthetic_sequences", "?")
    say(f"eagle3 candidates warm-start from base {found.version} ({sequences} "
        f"synthetic sequences; from {found.source})")
    return version
