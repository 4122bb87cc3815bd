"""The writer's append-only spill files: where rows wait while the database is unreachable.

Each :class:`SpillFile` is ``<spill_dir>/traffic-<host>-<pid>-<random>.jsonl`` (one JSON row
a line, fsync'ed per batch), held under an exclusive ``flock`` for as long as its writer
lives. Replay hands a whole file over at once: the owner renames its file aside while
holding the lock and keeps the lock through the replay; files left by dead processes (their
lock is free) are adopted by the next writer that replays (:func:`claim_orphans`). A file is
deleted only after all its rows are committed; rows are keyed by ``request_uid``, so a replay
interrupted half-way and repeated stores nothing twice.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no orphan adoption, own file only
    fcntl = None  # type: ignore[assignment]

from autospec.store.traffic import row_from_json, row_to_json

log = logging.getLogger(__name__)

PATTERN = "traffic-*.jsonl"


def _lock(fh: IO[Any], path: Path) -> bool:
    """Lock ``fh`` exclusively without waiting; True if we now own ``path``'s file."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    try:  # the file may have been replayed and unlinked between open() and flock()
        return os.stat(path).st_ino == os.fstat(fh.fileno()).st_ino
    except FileNotFoundError:
        return False


class SpillFile:
    """This writer's spill file: appended under a lock, handed over whole for replay."""

    def __init__(self, spill_dir: Path) -> None:
        self.dir = Path(spill_dir)
        stem = f"traffic-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.path = self.dir / f"{stem}.jsonl"
        self._replays = 0
        self._fh: IO[str] | None = None
        self._lock = threading.Lock()

    @property
    def pending(self) -> bool:
        return self._fh is not None

    def append(self, rows: list[dict[str, Any]]) -> None:
        """Append rows durably (write + fsync); raises OSError if the disk refuses."""
        data = "".join(row_to_json(r) + "\n" for r in rows)
        with self._lock:
            if self._fh is None:
                self.dir.mkdir(parents=True, exist_ok=True)
                fh = self.path.open("a+", encoding="utf-8")
                if not _lock(fh, self.path):
                    fh.close()  # not ours: the next append tries afresh
                    raise OSError(f"spill file {self.path} is locked by another process")
                self._fh = fh
            self._fh.write(data)
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def hand_over(self) -> tuple[Path, IO[str]] | None:
        """Rename the current file aside (still locked) for replay; new rows go to a new file."""
        with self._lock:
            if self._fh is None:
                return None
            self._replays += 1
            aside = self.path.with_name(f"{self.path.stem}.r{self._replays}.jsonl")
            os.replace(self.path, aside)
            fh, self._fh = self._fh, None
            return aside, fh

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()  # rows stay on disk (and get adopted by the next writer)
                self._fh = None


def claim_orphans(spill_dir: Path, *, own: Path) -> Iterator[tuple[Path, IO[str]]]:
    """Spill files whose owner is gone, each yielded open and locked (close it when done).

    ``own`` is the caller's live spill file: it is never an orphan, even in the instant
    between another thread's ``append`` creating it and locking it (adopting it there made
    that ``append`` fail and its rows were dropped)."""
    if not spill_dir.is_dir():
        return
    for path in sorted(spill_dir.glob(PATTERN)):
        if path == own:
            continue
        try:  # "r+", not "a+": a file renamed away since the glob must not be re-created
            fh = path.open("r+", encoding="utf-8")
        except FileNotFoundError:
            continue
        if _lock(fh, path):
            yield path, fh
        else:
            fh.close()


def read_rows(fh: IO[str], path: Path) -> tuple[list[dict[str, Any]], int]:
    """All rows of a spill file, and how many lines were unreadable (a torn last write)."""
    fh.seek(0)
    rows, bad = [], 0
    for lineno, line in enumerate(fh, 1):
        if not line.strip():
            continue
        try:
            rows.append(row_from_json(line))
        except (ValueError, KeyError, TypeError):  # JSONDecodeError is a ValueError
            bad += 1
            log.error("spill file %s line %d is not JSON; skipped", path, lineno)
    return rows, bad
