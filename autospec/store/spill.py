"""The writer's append-only spill files: where rows wait while the database is unreachable.

Each :class:`SpillFile` is ``<spill_dir>/traffic-<host>-<pid>-<random>.jsonl`` (one JSON row
a line, fsync'ed per batch), held under an exclusive ``flock`` for as long as its writer
lives. Replay hands a whole file over at once: the owner renames its file aside while
holding the lock and keeps the lock through the replay; files left by dead processes (their
lock is free) are adopted by the next writer that replays (:func:`claim_orphans`). A file is
deleted only after all its rows are committed; rows are keyed by ``request_uid``, so a replay
interrupted half-way and repeated stores nothing twice.

Writers that share the folder (replicas on one host, a replica and its successor) never see
each other's files unlocked: a file is created under a name no scan matches
(``.traffic-….jsonl.new``, ``O_EXCL``), locked, and only then renamed to its own name
(:func:`_create_locked`). Created under its own name, it was briefly there unlocked, and
another writer's replay adopted it as an orphan: the owner's append failed and its rows,
spilled because the database was out, were dropped. A replay that stopped part way keeps
the rows it did not store the same way (:func:`keep_rows`: a locked ``.rest`` scratch file
renamed over the spill file). A crash before such a rename leaves the scratch file, which
holds no row that is not also in a spill file or stored; the next scan removes it
(:func:`_sweep_scratch`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no orphan adoption, own file only
    fcntl = None  # type: ignore[assignment]

from autospec.durable import sync_dir
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


#: the scratch files beside a spill file (a name no scan of ``PATTERN`` matches): ``new``
#: while it is created (:func:`_create_locked`), ``rest`` while a replay shortens it
#: (:func:`keep_rows`); :func:`_sweep_scratch` removes those a crash left
SCRATCH_TAGS = ("new", "rest")


def _scratch(path: Path, tag: str) -> Path:
    """The scratch file ``tag`` (one of :data:`SCRATCH_TAGS`) of the spill file at ``path``."""
    return path.with_name(f".{path.name}.{tag}")


def _create_locked(path: Path) -> IO[str]:
    """A new, empty spill file at ``path``, open for appending and locked before it appears
    under that name (see the module docstring); the folder is synced so the name outlasts a
    crash before any row is written to it. OSError when it cannot be made."""
    scratch = _scratch(path, "new")
    fd = os.open(scratch, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o666)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no one else can know this name
        os.rename(scratch, path)
    except BaseException:
        os.close(fd)
        scratch.unlink(missing_ok=True)
        raise
    # named and locked now: a failed sync must not drop the lock (another writer would
    # adopt the file as an orphan) nor the file; the name may just not outlast a crash
    _sync_or_say(path)
    return os.fdopen(fd, "a+", encoding="utf-8")


def _sync_or_say(path: Path) -> None:
    """Sync ``path``'s folder after a rename into it; a failure is logged, not raised: the
    rename is done and what holds the file (its lock, its rows) stays as it is."""
    try:
        sync_dir(path.parent)
    except OSError as exc:
        log.warning("spill file %s: its folder could not be synced to disk (%s); the file "
                    "is in place", path, exc.strerror or exc)


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
                self._fh = _create_locked(self.path)
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

    ``own`` is the caller's live spill file, never an orphan (it is locked before it has its
    name, :func:`_create_locked`, so no other writer's scan can take it either)."""
    if not spill_dir.is_dir():
        return
    _sweep_scratch(spill_dir)
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


#: a scratch file (:data:`SCRATCH_TAGS`) unlocked and older than this was left by a crash
#: between its creation and its rename: :func:`_sweep_scratch` removes it
SCRATCH_STALE_S = 60.0


def _sweep_scratch(spill_dir: Path) -> None:
    """Remove scratch files a crash left behind (they hold no row that is not also in a
    spill file or stored): unlocked, and untouched for :data:`SCRATCH_STALE_S`."""
    for path in spill_dir.glob(f".{PATTERN}.*"):
        if path.suffix.removeprefix(".") not in SCRATCH_TAGS:
            continue
        try:
            fh = path.open("r", encoding="utf-8")  # flock needs no write access
        except OSError:  # gone since the glob, or another user's
            continue
        with fh:
            try:
                stale = time.time() - os.fstat(fh.fileno()).st_mtime > SCRATCH_STALE_S
                if stale and _lock(fh, path):
                    path.unlink()
                    log.info("removed %s, a spill scratch file a crash left", path)
            except OSError:
                continue


def keep_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Make the spill file at ``path`` (locked by the caller) hold only ``rows``, the ones a
    replay did not store: written in full to a scratch file (a name no scan matches), synced,
    then renamed over ``path``. A crash at any point leaves the old file or the new one,
    never a truncated one; rows the old one still holds were stored and are skipped when it
    is replayed again (by ``request_uid``)."""
    scratch = _scratch(path, "rest")  # ours alone while we hold path's lock
    try:
        fd = os.open(scratch, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            if fcntl is not None:  # a sweep (:func:`_sweep_scratch`) leaves it alone
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            out.write("".join(row_to_json(r) + "\n" for r in rows))
            out.flush()
            os.fsync(out.fileno())
            os.replace(scratch, path)
    except BaseException:  # a full disk, say: the old file stays as it was
        scratch.unlink(missing_ok=True)
        raise
    _sync_or_say(path)  # replaced: a failed sync is no failure to keep the rows


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
