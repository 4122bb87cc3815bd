"""Artifact paths cannot escape the artifact directory: a backup whose index names
``../x``, an absolute path or another location, holds a symlink, or is restored over a
symlink pointing out is refused with an error naming it, and nothing is written outside;
prune never follows a symlink out; ``import --name`` refuses a path-like name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from autospec import store
from autospec.store import backup as backups
from autospec.store import db, migrate
from autospec.store.artifacts import inside
from autospec.store.errors import ArtifactError
from autospec.store.prune import prune


def _registered_backup(tmp_path: Path, sqlite_url: str) -> Path:
    """A backup of a store holding one version, ``v1``, with its artifact."""
    engine = migrate.open_store(sqlite_url, upgrade=True)
    art = tmp_path / "made" / "v1"
    art.mkdir(parents=True)
    (art / "config.json").write_text("{}")
    (art / "weights.bin").write_bytes(b"weights")
    sha = store.write_manifest(art)
    with store.session_scope(engine) as session:
        store.register_speculator(session, version="v1", kind="ngram", target_id="tiny",
                                  artifact_uri=str(art), sha256=sha)
    backups.backup(engine, tmp_path / "bk")
    engine.dispose()
    return tmp_path / "bk"


def _rename_in_index(bk: Path, version: str, entry: dict[str, str] | None = None) -> None:
    index = json.loads((bk / "backup.json").read_text())
    old = index["artifacts"].pop("v1")
    index["artifacts"][version] = {**old, **(entry or {})}
    (bk / "backup.json").write_text(json.dumps(index))


def _restore(bk: Path, tmp_path: Path, **kw):  # type: ignore[no-untyped-def]
    target = db.make_engine(f"sqlite:///{tmp_path / 'target.db'}")
    try:
        return backups.restore(target, bk, artifact_dir=tmp_path / "artifacts", **kw)
    finally:
        target.dispose()


@pytest.mark.parametrize("version", ["../escaped", "a/../../escaped", "/tmp/escaped-abs"])
def test_restore_refuses_a_version_name_that_leaves_the_directory(
        version: str, sqlite_url: str, tmp_path: Path) -> None:
    bk = _registered_backup(tmp_path, sqlite_url)
    _rename_in_index(bk, version)
    with pytest.raises(ArtifactError, match="refused"):
        _restore(bk, tmp_path)
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/escaped-abs").exists()


def test_restore_refuses_an_index_path_elsewhere_and_a_symlink_inside(
        sqlite_url: str, tmp_path: Path) -> None:
    bk = _registered_backup(tmp_path, sqlite_url)
    good = (bk / "backup.json").read_text()
    _rename_in_index(bk, "v1", {"path": "../made/v1"})
    with pytest.raises(ArtifactError, match=r"listed at '../made/v1'.*refused"):
        _restore(bk, tmp_path)
    (bk / "backup.json").write_text(good)
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    (bk / "artifacts" / "v1" / "extra.bin").symlink_to(secret)
    with pytest.raises(ArtifactError, match="symbolic link"):
        _restore(bk, tmp_path)
    assert not (tmp_path / "artifacts" / "v1").exists()


def test_restore_over_a_symlink_pointing_out_is_refused_even_forced(
        sqlite_url: str, tmp_path: Path) -> None:
    bk = _registered_backup(tmp_path, sqlite_url)
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "v1").symlink_to(outside)
    with pytest.raises(ArtifactError, match="outside"):
        _restore(bk, tmp_path, force=True)
    assert (outside / "keep.txt").read_text() == "keep"
    (tmp_path / "artifacts" / "v1").unlink()
    done = _restore(bk, tmp_path)
    assert done.artifacts == ["v1"] and (tmp_path / "artifacts" / "v1" / "weights.bin").exists()


def test_prune_does_not_follow_a_symlink_out_of_the_artifact_directory(
        sqlite_url: str, tmp_path: Path) -> None:
    engine = migrate.open_store(sqlite_url, upgrade=True)
    root, outside = tmp_path / "artifacts", tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    (outside / "weights.bin").write_bytes(b"w")
    sha = store.write_manifest(outside)
    root.mkdir()
    (root / "old").symlink_to(outside)
    with store.session_scope(engine) as session:
        store.register_speculator(session, version="old", kind="ngram", target_id="tiny",
                                  artifact_uri=str(root / "old"), sha256=sha)
        store.record_evaluation(session, candidate="old", incumbent=None, decision="reject")
    done = prune(engine, artifact_dir=root, keep=0)
    engine.dispose()
    assert not done.prune and done.skipped[0]["why"].startswith("outside the artifact")
    assert (outside / "weights.bin").exists()


def test_inside_accepts_plain_names_only(tmp_path: Path) -> None:
    assert inside(tmp_path, "eagle3-0004") == tmp_path / "eagle3-0004"
    for bad in ("..", ".", "", "../x", "/etc", "a/../../b", "a\\..\\b"):
        with pytest.raises(ArtifactError, match="refused"):
            inside(tmp_path, bad)
    (tmp_path / "link").symlink_to(shutil.os.path.dirname(tmp_path))
    with pytest.raises(ArtifactError, match="outside"):
        inside(tmp_path, "link/x")


@pytest.mark.parametrize("name", ["../x", "/etc/x", "a/b", ".hidden"])
def test_import_refuses_a_path_like_version_name_before_reading_anything(name: str) -> None:
    from autospec.interop.importer import ImportRefused, import_head

    with pytest.raises(ImportRefused, match="invalid version name"):
        import_head("/nonexistent", target=None, engine=None, name=name)  # type: ignore[arg-type]
