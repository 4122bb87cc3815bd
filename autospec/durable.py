"""Finished files made durable before they take their final name (``os`` only).

A rename is atomic, not durable: after a power loss, a directory renamed into place can be
there with its files empty or truncated (their data were still in the page cache), or the
rename itself can be gone. Where something says the renamed thing is there (a registered
version's artifact, whose SHA-256 then fails at load; a backup said to be taken; a cached
target trusted once its files exist), the files' data and the folders' entries go to disk
before the rename (:func:`sync_tree`), and the rename itself (:func:`sync_dir` of the
parent) before a transaction naming it commits:

- :func:`rename_into_place` does all three: a backup (:mod:`autospec.store.backup`), the
  dequantized target cache (:mod:`autospec.engine.target`);
- a candidate's registration (:mod:`autospec.train.register`), an import
  (:mod:`autospec.interop.importer`) and a restore's artifacts
  (:mod:`autospec.store.restore_artifacts`) sync the tree before their transaction (not
  while it holds SQLite's write lock), then rename and sync the artifact dir inside it;
- the spill files (:mod:`autospec.store.spill`) sync their folder after their renames (a
  failure there is logged: the file is in place, locked, its rows kept).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

#: what ``fsync`` of a directory raises on filesystems that cannot sync one: nothing to do
_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}


def sync_file(path: str | Path) -> None:
    """Write ``path``'s data to disk (an ``OSError`` if the disk refuses)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(directory: str | Path) -> None:
    """Write ``directory``'s entries (names created, renamed or removed in it) to disk. A
    platform that cannot open a directory (Windows) or a filesystem that cannot sync one is
    skipped; any other error is raised."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        if os.name == "nt":  # pragma: no cover - a platform without directory fds
            return
        raise
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            raise
    finally:
        os.close(fd)


def sync_tree(root: str | Path) -> None:
    """:func:`sync_file` every file under ``root`` (a file itself: just it), then
    :func:`sync_dir` every directory, the deepest first and ``root`` last. Links are not
    followed."""
    root = Path(root)
    if not root.is_dir():
        sync_file(root)
        return
    for folder, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            path = Path(folder, name)
            if not path.is_symlink():
                sync_file(path)
        sync_dir(folder)


def rename_into_place(source: str | Path, dest: str | Path) -> None:
    """Rename the finished file or directory ``source`` to ``dest``, durably: its contents
    synced before (:func:`sync_tree`), the rename synced after (:func:`sync_dir` of
    ``dest``'s folder). The rename's ``OSError`` (``dest`` there and not empty, say) is
    raised as is, with ``source`` left where it was; a sync failing after the rename is an
    :class:`RenamedNotSynced`, ``dest`` then in place."""
    sync_tree(source)
    os.rename(source, dest)
    sync_renamed(dest)


class RenamedNotSynced(OSError):
    """A rename was done but its folder could not be synced: the new name is there now and
    might not outlast a power loss."""


def sync_renamed(dest: str | Path) -> None:
    """:func:`sync_dir` of ``dest``'s folder after ``dest`` was renamed into place; its
    failure a :class:`RenamedNotSynced` that says so (not that the rename failed)."""
    try:
        sync_dir(Path(dest).parent)
    except OSError as exc:
        raise RenamedNotSynced(exc.errno, f"{dest} is in place, but its folder could not be "
                                          f"synced to disk: {exc.strerror or exc}") from exc
