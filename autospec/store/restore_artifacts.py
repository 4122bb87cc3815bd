"""The artifacts of :func:`autospec.store.backup.restore`: changed all together, or not at all.

:func:`listed` checks the shape of what ``backup.json`` says of the artifacts (a version that
is not a version name, an entry without its SHA-256: refused before any path is made of
them). :func:`plan` checks every artifact a backup holds against the SHA-256 its index
records, and what the artifact directory already holds under each version's name (another
artifact there is refused unless ``force``); it writes nothing. :class:`Staged` copies the
ones to put in place into a staging folder inside the artifact directory
(``.restore-<random>``, on the same filesystem, so a rename moves each one), checks them
again there and syncs them to disk (:func:`autospec.durable.sync_tree`), before the
database transaction begins.

:meth:`Staged.swap` is the transaction's last step before its COMMIT: each artifact renamed
into place, what was there set aside in the staging folder, then the artifact directory
synced, so the rows naming an artifact commit only once it is on disk (:mod:`autospec.durable`).
A failure before that, a failing swap or a COMMIT that did not land, :meth:`Staged.undo` puts
back what was there, and :meth:`Staged.discard` removes the staging folder: a refused restore
leaves the artifact directory as it was. Only what cannot be put back is another error, an
:class:`ArtifactError` saying where each piece is; a staging folder that cannot be removed is
logged, the restore done.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

from autospec.durable import sync_dir, sync_tree
from autospec.file_modes import copy_as_created
from autospec.names import is_name
from autospec.store.artifacts import artifact_sha256, inside, without_links
from autospec.store.errors import ArtifactError, Conflict

log = logging.getLogger(__name__)

_SHA256 = re.compile(r"[0-9a-f]{64}")


def listed(source: Path, index: dict[str, Any]) -> tuple[dict[str, dict[str, str]], list[str]]:
    """``backup.json``'s ``artifacts`` ({version: {"sha256": ..., "path": ...}}) and
    ``missing_artifacts`` (versions), checked for shape: an :class:`ArtifactError` naming
    the field and what it holds instead (a version that is not a version name is refused
    before any path is made of it)."""
    where = f"backup {source}: backup.json"
    artifacts = index.get("artifacts")
    artifacts = {} if artifacts is None else artifacts
    if not isinstance(artifacts, dict):
        raise ArtifactError(f"{where}: 'artifacts' must be an object of version: "
                            f"{{\"sha256\": ..., \"path\": ...}}, not "
                            f"{type(artifacts).__name__}: refused")
    missing = index.get("missing_artifacts")
    missing = [] if missing is None else missing
    if not isinstance(missing, list):
        raise ArtifactError(f"{where}: 'missing_artifacts' must be a list of versions, not "
                            f"{type(missing).__name__}: refused")
    for version in [*artifacts, *missing]:
        if not is_name(version):
            raise ArtifactError(f"{where} names version {version!r}, which is not a version "
                                f"name (1-64 letters, digits, '.', '_' or '-', starting with "
                                f"a letter or digit): refused")
    for version, entry in artifacts.items():
        sha = entry.get("sha256") if isinstance(entry, dict) else None
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            shown = repr(entry) if len(repr(entry)) <= 80 else repr(entry)[:79] + "…"
            raise ArtifactError(f"{where}: the artifact of {version!r} must be an object "
                                f"with a 'sha256' of 64 lower-case hex digits, found "
                                f"{shown}: refused")
    return artifacts, missing


def plan(source: Path, root: Path, artifacts: dict[str, dict[str, str]], *,
         force: bool) -> dict[str, bool]:
    """Check every artifact of the backup; {version: copy it (False: already there)}."""
    todo: dict[str, bool] = {}
    for version, entry in artifacts.items():
        kept = _kept(source, version, entry)
        try:
            actual = artifact_sha256(kept)
        except ArtifactError as exc:
            raise ArtifactError(f"backup {source}: artifact of {version!r}: {exc}") from None
        if actual != entry["sha256"]:
            raise ArtifactError(f"backup {source}: artifact of {version!r} has SHA-256 "
                                f"{actual[:12]}…, the registry recorded {entry['sha256'][:12]}…")
        dest = inside(root, version)
        if not dest.exists():
            todo[version] = True
            continue
        try:
            same = artifact_sha256(dest) == entry["sha256"]
        except ArtifactError:
            same = False
        if not same and not force:
            raise Conflict(f"{dest} exists and is not the backup's artifact of {version!r}; "
                           f"pass --force to replace it")
        todo[version] = not same
    return todo


def _kept(source: Path, version: str, entry: dict[str, str]) -> Path:
    """Where the backup keeps ``version``'s artifact: ``artifacts/<version>`` inside it, a
    plain directory (an index naming another path, or a name or link reaching out of the
    backup or the artifact directory, is refused)."""
    kept = inside(source / "artifacts", version, what=f"backup {source}: version")
    if entry.get("path", f"artifacts/{version}") != f"artifacts/{version}":
        raise ArtifactError(f"backup {source}: artifact of {version!r} is listed at "
                            f"{entry['path']!r}, not artifacts/{version}: refused")
    return without_links(kept, what=f"backup {source}: artifact of {version!r}")


class Staged:
    """The artifacts a restore puts in place (``plan``'s versions to copy), staged under
    ``root`` until :meth:`swap`."""

    def __init__(self, source: Path, root: Path, todo: dict[str, bool]) -> None:
        self.source, self.root = source, root
        self.versions = [version for version, copy in todo.items() if copy]
        self.folder = root / f".restore-{uuid.uuid4().hex[:12]}"
        self.moved: list[tuple[Path, Path]] = []  # the renames swap did, in order
        self.made_root = False
        self.kept = False  # the staging folder holds what undo could not put back

    def stage(self) -> None:
        """Copy each artifact into the staging folder, check it, sync it all to disk."""
        if not self.versions:
            return
        try:
            self.made_root = not self.root.exists()
            self.root.mkdir(parents=True, exist_ok=True)
            for version in self.versions:
                copy = self.folder / "new" / version
                shutil.copytree(self.source / "artifacts" / version, copy,
                                copy_function=copy_as_created)  # as the umask says
                artifact_sha256(copy)  # checked again where it now lives
            sync_tree(self.folder)  # here, not in the transaction (SQLite's write lock)
        except OSError as exc:
            self.discard(failed=True)
            raise ArtifactError(f"cannot copy the backup's artifacts to {self.folder}: "
                                f"{exc.strerror or exc}; nothing was restored") from None
        except BaseException:
            self.discard(failed=True)
            raise

    def swap(self) -> None:
        """Rename each staged artifact into place (what is there set aside first), then sync
        the artifact directory; a failure is an :class:`ArtifactError` (then :meth:`undo`)."""
        try:
            for version in self.versions:
                dest = inside(self.root, version)
                if dest.exists() or dest.is_symlink():
                    (self.folder / "old").mkdir(exist_ok=True)
                    self._move(dest, self.folder / "old" / version)
                self._move(self.folder / "new" / version, dest)
            if self.moved:
                sync_dir(self.root)  # the renames on disk before the rows naming them commit
        except OSError as exc:
            raise ArtifactError(f"cannot put the backup's artifacts in place under "
                                f"{self.root}: {exc.strerror or exc}") from exc

    def _move(self, source: Path, dest: Path) -> None:
        os.rename(source, dest)
        self.moved.append((source, dest))

    def undo(self, cause: BaseException) -> None:
        """Put back what :meth:`swap` moved, the last first, and sync the artifact directory;
        an :class:`ArtifactError` naming ``cause`` and what stays where, if that fails."""
        failed = []
        for source, dest in reversed(self.moved):
            try:
                os.rename(dest, source)
            except OSError as exc:
                failed.append(f"{dest} could not be moved back to {source} "
                              f"({exc.strerror or exc})")
        if self.moved and not failed:
            try:
                sync_dir(self.root)
            except OSError as exc:
                failed.append(f"{self.root} is as it was, but could not be synced to disk "
                              f"({exc.strerror or exc})")
        self.moved = []
        if failed:
            self.kept = True
            raise ArtifactError(f"the restore failed ({cause}), and the artifact directory "
                                f"could not be put back as it was: {'; '.join(failed)}; "
                                f"the backup's copies and what was set aside are under "
                                f"{self.folder}")

    def discard(self, *, failed: bool = False) -> None:
        """Remove the staging folder (after :meth:`undo`, or what was set aside after the
        COMMIT); and, ``failed``, the artifact directory if :meth:`stage` made it."""
        if self.kept:
            return
        if self.folder.exists():
            try:
                shutil.rmtree(self.folder)
            except OSError as exc:
                log.warning("could not remove the restore's staging folder %s: %s",
                            self.folder, exc.strerror or exc)
        if failed and self.made_root:
            with contextlib.suppress(OSError):  # not empty: something else wrote there
                self.root.rmdir()
