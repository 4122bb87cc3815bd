"""Two writers sharing a spill folder (replicas on one host, a replica and its successor):
one's replay never adopts the other's new spill file.

A spill file was created under its own name and locked just after; a replay of another
writer scanning the folder in between found it unlocked, took it as an orphan (replayed
its nothing, deleted it), and the owner's append failed ("locked by another process"):
the batch it was spilling, because the database was out, was dropped. Now a file is locked
before it has its name. Deterministic: the other writer's scan runs exactly in that window
(flock locks belong to each open file, so two writers in one process contend as two
processes do)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autospec.store import spill as spill_module
from autospec.store.spill import PATTERN, SpillFile, claim_orphans, read_rows
from autospec.store.traffic import prepare_row

from .helpers import record_fields


def test_a_replay_of_another_writer_never_adopts_a_new_spill_file(tmp_path: Path,
                                                                   monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import fcntl

    from autospec.store.traffic import RequestRecord

    mine, theirs = SpillFile(tmp_path), SpillFile(tmp_path)
    adopted: list[tuple[Path, Any]] = []

    class RacingFcntl:
        """fcntl, where the first lock taken lets the other writer's replay scan first."""

        LOCK_EX, LOCK_NB = fcntl.LOCK_EX, fcntl.LOCK_NB
        raced = False

        def flock(self, fd: int, operation: int) -> None:
            if not RacingFcntl.raced:
                RacingFcntl.raced = True
                adopted.extend(claim_orphans(tmp_path, own=theirs.path))  # held: replaying
            fcntl.flock(fd, operation)

    monkeypatch.setattr(spill_module, "fcntl", RacingFcntl())
    rows = [prepare_row(RequestRecord(**record_fields(i))) for i in range(3)]
    try:
        mine.append(rows)  # raised "locked by another process": rows dropped
        assert RacingFcntl.raced and adopted == []
        assert [p.name for p in tmp_path.glob(PATTERN)] == [mine.path.name]
        assert not list(tmp_path.glob(".*"))  # no scratch name left behind
        taken = mine.hand_over()
        assert taken is not None
        path, fh = taken
        got, bad = read_rows(fh, path)
        fh.close()
        assert [r["request_uid"] for r in got] == [r["request_uid"] for r in rows] and bad == 0
    finally:
        for _, fh in adopted:
            fh.close()
        mine.close()
        theirs.close()


def test_scratch_files_a_crash_left_are_swept_and_live_ones_kept(tmp_path: Path) -> None:
    """A ``.new`` or ``.rest`` scratch file left by a crash (unlocked, old) goes at the next
    scan; a fresh one, or one its writer holds locked, stays."""
    import fcntl
    import os
    import time

    from autospec.store import spill

    folder = tmp_path / "spill"
    folder.mkdir()
    old = time.time() - 2 * spill.SCRATCH_STALE_S
    names = {"crash-new": ".traffic-a.jsonl.new", "crash-rest": ".traffic-b.jsonl.rest",
             "fresh": ".traffic-c.jsonl.rest", "locked": ".traffic-d.jsonl.rest",
             "other": ".traffic-e.jsonl.bak"}
    for key, name in names.items():
        (folder / name).write_text("{}\n")
        if key != "fresh":
            os.utime(folder / name, (old, old))
    with (folder / names["locked"]).open("r+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert list(spill.claim_orphans(folder, own=folder / "none.jsonl")) == []
        left = sorted(p.name for p in folder.iterdir())
    assert left == sorted([names["fresh"], names["locked"], names["other"]])


def test_a_folder_sync_failing_after_the_rename_keeps_the_file_locked_and_its_rows(
        tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The name is taken and locked once renamed: a failed fsync of the folder (EIO) was
    raised after it, the lock dropped with the closed fd, the file left unlocked under the
    live name (another writer adopts it) and the batch dropped. Now it is logged."""
    import errno
    import os

    from autospec import durable
    from autospec.store.traffic import RequestRecord

    real_fsync = os.fsync

    def failing_on_dirs(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(durable.os, "fsync", failing_on_dirs)
    mine, theirs = SpillFile(tmp_path), SpillFile(tmp_path)
    rows = [prepare_row(RequestRecord(**record_fields(i))) for i in range(2)]
    try:
        mine.append(rows)  # raised: the batch was dropped
        assert list(claim_orphans(tmp_path, own=theirs.path)) == []  # still locked: not theirs
        taken = mine.hand_over()
        assert taken is not None
        path, fh = taken
        got, _ = read_rows(fh, path)
        fh.close()
        assert [r["request_uid"] for r in got] == [r["request_uid"] for r in rows]
        spill_module.keep_rows(path, rows[1:])  # replaced; its sync failure only logged
        with open(path, encoding="utf-8") as kept:
            assert [r["request_uid"] for r in read_rows(kept, path)[0]] == \
                [rows[1]["request_uid"]]
    finally:
        mine.close()
        theirs.close()
