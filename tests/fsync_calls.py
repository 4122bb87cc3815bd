"""What reaches the disk, in order: every ``os.fsync`` (the path its descriptor names, read
from ``/proc/self/fd``), ``os.rename`` and database COMMIT of a block, for the tests of
:mod:`autospec.durable`'s callers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event

#: the mark of the tests that read ``/proc/self/fd`` (Linux)
needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(),
                                reason="reads /proc/self/fd")


@contextmanager
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, ...]]]:
    """``("fsync", path)``, ``("rename", source, dest)`` and ``("commit",)`` (any engine's
    connection's, ORM session or Core) as they happen in the block."""
    calls: list[tuple[str, ...]] = []
    fsync, rename = os.fsync, os.rename

    def recorded_fsync(fd: int) -> None:
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recorded_rename(source: Any, dest: Any) -> None:
        calls.append(("rename", str(source), str(dest)))
        rename(source, dest)

    def committed(conn: Any) -> None:
        calls.append(("commit",))

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "rename", recorded_rename)
    event.listen(Engine, "commit", committed)
    try:
        yield calls
    finally:
        event.remove(Engine, "commit", committed)


def rename_of(calls: list[tuple[str, ...]], dest: Path) -> tuple[str, ...]:
    """The one rename to ``dest``."""
    (found,) = [c for c in calls if c[0] == "rename" and c[2] == str(dest)]
    return found


def unsynced_before(calls: list[tuple[str, ...]], rename: tuple[str, ...]) -> set[str]:
    """What the renamed directory holds (files and folders, itself included, as they are
    named after the rename, read back under the name they had) that no fsync before the
    rename reached."""
    _, source, dest = rename
    synced = {c[1] for c in calls[:calls.index(rename)] if c[0] == "fsync"}
    inside = {str(p).replace(dest, source, 1) for p in Path(dest).rglob("*")} | {source}
    return inside - synced


def synced_after(calls: list[tuple[str, ...]], rename: tuple[str, ...]) -> list[str]:
    """The paths fsync'ed after ``rename``, in order (a ``commit`` as ``"COMMIT"``)."""
    return [c[1] if c[0] == "fsync" else "COMMIT" for c in calls[calls.index(rename) + 1:]
            if c[0] in ("fsync", "commit")]
