"""autospec.durable and the writers that rename finished work into place: what they rename
is on disk (every file and folder fsync'ed) before the rename, and the rename (its parent
folder) before they return or commit the rows that name it. Without it a power loss could
leave a backup or a registered artifact there with empty or truncated files.
Recorded by wrapping ``os.fsync`` and ``os.rename`` (``tests/fsync_calls.py``)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from autospec import durable, store
from autospec.interop.export import export_speculator
from autospec.interop.importer import import_head
from autospec.settings import get_settings
from autospec.speculators.registry import new_speculator
from autospec.store import backup as backups
from tests.fsync_calls import needs_proc, recorded, rename_of, synced_after, unsynced_before

pytestmark = needs_proc


def test_rename_into_place_syncs_every_file_and_folder_then_the_rename(
        tmp_path, monkeypatch) -> None:
    source, dest = tmp_path / ".partial", tmp_path / "done"
    (source / "sub").mkdir(parents=True)
    (source / "a.json").write_text("{}")
    (source / "sub" / "b.bin").write_bytes(b"x" * 10)
    with recorded(monkeypatch) as calls:
        durable.rename_into_place(source, dest)
    moved = rename_of(calls, dest)
    assert unsynced_before(calls, moved) == set()
    assert synced_after(calls, moved) == [str(tmp_path)]


def test_a_folder_the_filesystem_cannot_sync_is_skipped_a_failing_disk_is_not(
        tmp_path, monkeypatch) -> None:
    def refusing(code: int):  # type: ignore[no-untyped-def]
        def fsync(fd: int) -> None:
            raise OSError(code, os.strerror(code))
        return fsync

    monkeypatch.setattr(os, "fsync", refusing(errno.EINVAL))
    durable.sync_dir(tmp_path)  # a filesystem without directory sync: nothing to do
    monkeypatch.setattr(os, "fsync", refusing(errno.EIO))
    with pytest.raises(OSError, match="Input/output"):
        durable.sync_dir(tmp_path)
    (tmp_path / "f").write_text("x")
    monkeypatch.setattr(os, "fsync", refusing(errno.EINVAL))
    with pytest.raises(OSError):  # a file's sync failing is never skipped
        durable.sync_file(tmp_path / "f")


def _registered_store(url: str) -> tuple[object, Path]:
    """A store with one registered version whose artifact is on disk."""
    engine = store.open_store(url, upgrade=True)
    artifact = get_settings().resolved_artifact_dir / "eagle3-a"
    artifact.mkdir(parents=True)
    (artifact / "config.json").write_text(json.dumps({"version": "eagle3-a"}))
    (artifact / "weights.bin").write_bytes(bytes(range(200)))
    sha = store.write_manifest(artifact)
    with store.session_scope(engine) as session:
        store.register_speculator(session, version="eagle3-a", kind="eagle3",
                                  target_id="tiny", artifact_uri=str(artifact), sha256=sha)
    return engine, artifact


def test_a_backup_is_on_disk_before_it_takes_its_name(sqlite_url, tmp_path,
                                                       monkeypatch) -> None:
    engine, _ = _registered_store(sqlite_url)
    with recorded(monkeypatch) as calls:
        backups.backup(engine, tmp_path / "bk")
    moved = rename_of(calls, tmp_path / "bk")
    assert (tmp_path / "bk" / "artifacts" / "eagle3-a" / "weights.bin").is_file()
    assert unsynced_before(calls, moved) == set()
    assert synced_after(calls, moved) == [str(tmp_path)]
    engine.dispose()


def test_a_restored_artifact_is_on_disk_before_the_rows_naming_it_commit(
        sqlite_url, tmp_path, monkeypatch) -> None:
    engine, artifact = _registered_store(sqlite_url)
    backups.backup(engine, tmp_path / "bk")
    elsewhere = tmp_path / "restored-artifacts"
    with recorded(monkeypatch) as calls:
        backups.restore(engine, tmp_path / "bk", artifact_dir=elsewhere, force=True)
    moved = rename_of(calls, elsewhere / artifact.name)
    assert unsynced_before(calls, moved) == set()
    after = synced_after(calls, moved)
    assert after.index(str(elsewhere)) < after.index("COMMIT")
    engine.dispose()


def test_an_imported_head_is_on_disk_before_its_registration_commits_tiny(
        tiny, sqlite_url, tmp_path, monkeypatch) -> None:
    engine = store.open_store(sqlite_url, upgrade=True)
    export_speculator(new_speculator("eagle3", tiny, draft_vocab_size=40), tiny,
                      tmp_path / "head", k=4)
    with recorded(monkeypatch) as calls:
        done = import_head(tmp_path / "head", target=tiny, engine=engine, name="imported")
    moved = rename_of(calls, done.artifact)
    assert unsynced_before(calls, moved) == set()
    after = synced_after(calls, moved)
    assert after.index(str(done.artifact.parent)) < after.index("COMMIT")
    engine.dispose()


def test_an_import_whose_commit_raises_keeps_its_artifact_when_the_store_cannot_say_tiny(
        tiny, sqlite_url, tmp_path, monkeypatch) -> None:
    """A COMMIT that raised may have landed: with the store unable to answer the check,
    the artifact stays (never a registered version without files) and the error raised is
    the import's own, not the check's."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine as SAEngine

    from autospec.interop import importer

    engine = store.open_store(sqlite_url, upgrade=True)
    export_speculator(new_speculator("eagle3", tiny, draft_vocab_size=40), tiny,
                      tmp_path / "head", k=4)

    def lost_reply(conn) -> None:  # type: ignore[no-untyped-def]
        raise ConnectionError("connection lost while the COMMIT's reply was in flight")

    def store_down(*_args, **_kwargs):  # type: ignore[no-untyped-def]
        raise store.StoreError("the store is out")

    monkeypatch.setattr(importer.store, "session_scope",
                        _failing_after_first(importer.store.session_scope, store_down))
    event.listen(SAEngine, "commit", lost_reply)
    try:
        with pytest.raises(ConnectionError, match="reply was in flight"):
            import_head(tmp_path / "head", target=tiny, engine=engine, name="imported")
    finally:
        event.remove(SAEngine, "commit", lost_reply)
    artifact = get_settings().resolved_artifact_dir / "imported"
    assert artifact.is_dir() and (artifact / "model.safetensors").is_file()
    engine.dispose()


def _failing_after_first(real, failing):  # type: ignore[no-untyped-def]
    """``real`` up to the import's transaction (its first writing scope), ``failing``
    after it."""
    wrote = []

    def scope(*args, **kwargs):  # type: ignore[no-untyped-def]
        if wrote:
            return failing(*args, **kwargs)
        if not kwargs.get("readonly"):
            wrote.append(1)
        return real(*args, **kwargs)
    return scope


def test_sync_dir_raises_what_it_cannot_open(tmp_path) -> None:
    """Only a platform without directory fds is skipped: a missing folder (or EMFILE, EACCES)
    was skipped silently, the sync said done."""
    with pytest.raises(FileNotFoundError):
        durable.sync_dir(tmp_path / "missing")


def test_a_sync_failing_after_the_rename_says_the_rename_is_done(tmp_path,
                                                                 monkeypatch) -> None:
    source, dest = tmp_path / ".partial", tmp_path / "done"
    source.mkdir()
    (source / "a").write_text("x")
    real_fsync = os.fsync
    renamed = []

    def failing_after_rename(fd: int) -> None:
        if dest.exists():
            renamed.append(fd)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(durable.os, "fsync", failing_after_rename)
    with pytest.raises(durable.RenamedNotSynced, match="is in place, but its folder could "
                                                       "not be synced"):
        durable.rename_into_place(source, dest)
    assert renamed and dest.is_dir() and not source.exists()


def test_an_unnamed_import_skips_a_folder_named_like_the_next_version_tiny(
        tiny, sqlite_url, tmp_path) -> None:
    """A folder an import or registration in doubt left (or a store reset) under the next
    eagle3 name: every unnamed import failed on it (Conflict) for the rest of the day."""
    engine = store.open_store(sqlite_url, upgrade=True)
    export_speculator(new_speculator("eagle3", tiny, draft_vocab_size=40), tiny,
                      tmp_path / "head", k=4)
    with store.session_scope(engine, readonly=True) as session:
        nxt = store.next_version(session, kind="eagle3")
    (get_settings().resolved_artifact_dir / nxt).mkdir(parents=True)
    done = import_head(tmp_path / "head", target=tiny, engine=engine)
    assert done.version != nxt and done.artifact.is_dir()
    assert not any((get_settings().resolved_artifact_dir / nxt).iterdir())  # left alone
    engine.dispose()
