"""``autospec db backup`` / ``restore``: every table and every artifact round-trips, between
SQLite and PostgreSQL; a non-empty store, another revision and a bad artifact are refused."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect, select, text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from autospec.store import backup as backups
from autospec.store import backup_format, db, migrate
from autospec.store.errors import ArtifactError, Conflict, SchemaOutdated
from autospec.store.models import utcnow


def _artifact(root: Path, version: str, payload: bytes) -> tuple[str, str]:
    path = root / version
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"version": version}))
    (path / "weights.bin").write_bytes(payload)
    return str(path), store.write_manifest(path)


def populate(engine, artifacts: Path) -> None:  # type: ignore[no-untyped-def]
    """A store with a row in every table: traffic (binary ids, JSON, NULLs), runs, three
    versions (a parent chain), a live pointer with a previous version, an evaluation, a
    deployment, a replica report, a lease, synthetic sequences and the audit log."""
    store.write_requests(engine, [store.RequestRecord(
        prompt_text=f"p{i}", output_text=None if i % 3 else f"o{i}", prompt_ids=[1, 2, i],
        output_ids=[i, 70000, -1], segment="chat", speculator_version="eagle3-a",
        num_drafts=3, num_draft_tokens=9, num_accepted_tokens=4,
        accepted_per_position=[2, 1, 1] if i % 2 else None, latency_ms=1.5 * i,
        sampling={"top_p": 0.9} if i % 2 else None) for i in range(25)])
    with store.session_scope(engine) as session:
        run = store.start_training_run(session, kind="eagle3", config={"lr": 1e-3},
                                       window_start=utcnow() - timedelta(days=1),
                                       window_end=utcnow())
        parent = None
        for i, version in enumerate(["eagle3-a", "eagle3-b", "eagle3-c"]):
            uri, sha = _artifact(artifacts, version, bytes(range(i, 200 + i)))
            store.register_speculator(session, version=version, kind="eagle3",
                                      target_id="tiny", artifact_uri=uri, sha256=sha,
                                      parent=parent, training_run_id=run.id,
                                      meta={"i": i, "nested": {"x": [1, 2]}})
            parent = version
        store.finish_training_run(session, run_id=run.id, status="succeeded",
                                  version="eagle3-c", metrics={"tau": 2.5})
        store.set_live(session, version="eagle3-a", actor="t", reason="first")
        store.set_live(session, version="eagle3-b", actor="t", reason="better")
        store.record_evaluation(session, candidate="eagle3-c", incumbent="eagle3-b",
                                decision="reject", reasons=["no gain"], num_requests=25,
                                tau_candidate=2.0, tau_incumbent=2.1, training_run_id=run.id)
        store.record_deployment(session, name="default", target="tiny", target_id="tiny",
                                target_revision="r1", dtype="float32", actor="replica",
                                threads=2)
        store.report_replica(session, replica="r-1", deployment="default", version="eagle3-b",
                             target_id="tiny", target_revision="r1", dtype="float32",
                             started_at=utcnow())
        store.acquire_lease(session, name="controller", holder="c1", ttl=timedelta(minutes=5))
        store.add_synthetic(session, target=store.SyntheticTarget("tiny", "r1", "float32"),
                            run_id="s1", records=[store.SyntheticRecord(
                                prompt_ids=[1, 2], output_ids=[3, 4, 5], source="domain:support",
                                seed=7)])


def rows(engine) -> dict[str, list[dict[str, Any]]]:  # type: ignore[no-untyped-def]
    """Every table's rows as a backup encodes them, in primary-key order."""
    found = {}
    with engine.connect() as conn:
        for table in backups.tables():
            encode = backup_format.encoder(table)
            found[table.name] = [encode(r) for r in conn.execute(
                select(table).order_by(*backup_format.order(table)))]
    return found


def _without_restore_note(found: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    events = found["events"]
    assert events[-1]["kind"] == "note" and events[-1]["details"]["type"] == "restore"
    return {**found, "events": events[:-1]}


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def _artifact_root() -> Path:
    from autospec.settings import get_settings

    return get_settings().resolved_artifact_dir


@pytest.fixture
def other_postgres(postgres_url: str) -> Iterator[str]:
    """A second fresh database on the same server (restore's target)."""
    url = make_url(postgres_url)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    name = f"autospec_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _status(engine) -> dict:  # type: ignore[no-untyped-def]
    """``autospec status --json``'s report, less the clock it is read at."""
    from autospec.controller.policy import load_policy
    from autospec.controller.status import collect_status

    data = collect_status(engine, deployment="default", policy=load_policy("default"))
    data.pop("time")
    for key in ("since", "until"):  # the ledger's period ends now
        data["ledger"].pop(key)
    return data


def test_sqlite_backup_wipe_restore_gives_the_same_store_and_artifacts(
        sqlite_url: str, tmp_path: Path) -> None:
    engine = migrate.open_store(sqlite_url, upgrade=True)
    artifacts = _artifact_root()
    populate(engine, artifacts)
    before, files = rows(engine), _files(artifacts)
    status_before = _status(engine)
    seen: list[str] = []
    done = backups.backup(engine, tmp_path / "bk", progress=lambda t, n: seen.append(t))
    assert done.tables["requests"] == 25 and sorted(done.artifacts) == [
        "eagle3-a", "eagle3-b", "eagle3-c"]
    assert seen == [t.name for t in backups.tables()] + ["artifacts"]
    engine.dispose()
    Path(make_url(sqlite_url).database).unlink()  # type: ignore[arg-type]
    shutil.rmtree(artifacts)

    engine = db.make_engine(sqlite_url)
    restored = backups.restore(engine, tmp_path / "bk")
    assert restored.tables == done.tables and restored.replaced == {}
    assert _without_restore_note(rows(engine)) == before
    assert _files(artifacts) == files
    assert _status(engine) == status_before  # what `autospec status --json` reports
    migrate.check_schema(engine)
    with store.session_scope(engine, readonly=True) as session:
        live = store.get_live(session)
        assert live is not None and (live.version, live.previous_version) == (
            "eagle3-b", "eagle3-a")
        for version in ("eagle3-a", "eagle3-b", "eagle3-c"):
            row = store.get_speculator(session, version=version)
            assert store.artifact_sha256(row.artifact_uri) == row.sha256
    # ids go on after the restored ones
    (uid,) = store.write_requests(engine, [store.RequestRecord(prompt_ids=[1], output_ids=[2])])
    with engine.connect() as conn:
        assert conn.execute(text("SELECT id FROM requests WHERE request_uid = :u"),
                            {"u": uid}).scalar() == 26
    engine.dispose()


def test_backup_and_restore_copy_artifacts_as_the_umask_says(
        sqlite_url: str, tmp_path: Path) -> None:
    """Copies were ``copy2``'s, with the mode of the file copied: a weights file of 0600 (as
    safetensors wrote them) stayed 0600 in the backup beside its 0644 table files, and again
    in the artifact directory it was restored to."""
    from tests.test_file_modes import modes, umask_of

    engine = migrate.open_store(sqlite_url, upgrade=True)
    artifacts = _artifact_root()
    populate(engine, artifacts)
    for weights in artifacts.rglob("weights.bin"):
        weights.chmod(0o600)
    with umask_of(0o022):
        backups.backup(engine, tmp_path / "bk")
    backed_up = modes(tmp_path / "bk")
    assert "artifacts/eagle3-a/weights.bin" in backed_up and "backup.json" in backed_up
    assert set(backed_up.values()) == {0o644}, backed_up
    engine.dispose()
    Path(make_url(sqlite_url).database).unlink()  # type: ignore[arg-type]
    shutil.rmtree(artifacts)

    engine = db.make_engine(sqlite_url)
    with umask_of(0o027):
        backups.restore(engine, tmp_path / "bk")
    restored = modes(artifacts)
    assert "eagle3-a/weights.bin" in restored and set(restored.values()) == {0o640}, restored
    engine.dispose()


def test_restore_refuses_a_store_that_holds_anything_unless_forced(
        sqlite_url: str, tmp_path: Path) -> None:
    engine = migrate.open_store(sqlite_url, upgrade=True)
    populate(engine, _artifact_root())
    backups.backup(engine, tmp_path / "bk")
    store.write_requests(engine, [store.RequestRecord(prompt_ids=[1], output_ids=[2])])
    with pytest.raises(Conflict, match=r"not empty \(.*requests: 26, .*speculators: 3.*--force"):
        backups.restore(engine, tmp_path / "bk")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM requests")).scalar() == 26
    done = backups.restore(engine, tmp_path / "bk", force=True)
    assert done.replaced["requests"] == 26 and done.tables["requests"] == 25
    engine.dispose()


def test_restore_refuses_another_revision_and_a_tampered_artifact(
        sqlite_url: str, tmp_path: Path) -> None:
    engine = migrate.open_store(sqlite_url, upgrade=True)
    populate(engine, tmp_path / "arts")
    backups.backup(engine, tmp_path / "bk")
    engine.dispose()
    target = db.make_engine(f"sqlite:///{tmp_path / 'target.db'}")

    index = tmp_path / "bk" / "backup.json"
    good = index.read_text()
    index.write_text(good.replace(f'"revision": "{migrate.head_revision()}"',
                                  '"revision": "0004"'))
    with pytest.raises(SchemaOutdated, match=r"'0004'.*`autospec db upgrade`"):
        backups.restore(target, tmp_path / "bk")
    index.write_text(good)

    (tmp_path / "bk" / "artifacts" / "eagle3-b" / "weights.bin").write_bytes(b"tampered")
    with pytest.raises(ArtifactError, match="eagle3-b"):
        backups.restore(target, tmp_path / "bk")
    assert migrate.current_revision(target) is None  # nothing was written
    assert not (_artifact_root() / "eagle3-a").exists()
    target.dispose()

    old = db.make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    migrate.upgrade(old, "0005")
    with pytest.raises(SchemaOutdated, match="autospec db upgrade"):
        backups.restore(old, tmp_path / "bk")
    old.dispose()


def test_backup_refuses_an_existing_directory(sqlite_url: str, tmp_path: Path) -> None:
    engine = migrate.open_store(sqlite_url, upgrade=True)
    (tmp_path / "bk").mkdir()
    (tmp_path / "bk" / "x").write_text("x")
    with pytest.raises(Conflict, match="already exists"):
        backups.backup(engine, tmp_path / "bk")
    engine.dispose()


@pytest.mark.parametrize("points_to", ["nowhere", "an empty directory"])
def test_backup_to_a_symbolic_link_is_one_line_and_writes_nothing(
        points_to: str, sqlite_url: str, tmp_path: Path) -> None:
    """A dangling link, or one to an empty directory, as PATH: the rename into place (or the
    rmdir before it) raised NotADirectoryError, a traceback."""
    migrate.open_store(sqlite_url, upgrade=True).dispose()
    (tmp_path / "out").mkdir()
    if points_to != "nowhere":
        (tmp_path / "empty").mkdir()
    (tmp_path / "out" / "bk").symlink_to(tmp_path / "empty")
    done = CliRunner().invoke(app, ["db", "backup", str(tmp_path / "out" / "bk"), "--url",
                                    sqlite_url])
    assert done.exit_code == 2, done.output
    assert "already exists (a symbolic link)" in done.stderr, done.output
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["bk"]  # no partial left


def test_a_backup_that_cannot_be_written_is_one_line_and_leaves_nothing(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk while the artifacts are copied: an OSError traceback."""
    engine = migrate.open_store(sqlite_url, upgrade=True)
    populate(engine, _artifact_root())
    engine.dispose()

    def full(*args: Any, **kw: Any) -> None:
        raise OSError(28, "No space left on device", str(args[1]))

    monkeypatch.setattr(backups.shutil, "copytree", full)
    (tmp_path / "out").mkdir()
    done = CliRunner().invoke(app, ["db", "backup", str(tmp_path / "out" / "bk"), "--url",
                                    sqlite_url])
    assert done.exit_code == 2, done.output
    assert "cannot back up to" in done.stderr and "No space left on device" in \
        done.stderr and "nothing was written" in done.stderr and "Traceback" not in done.output
    assert list((tmp_path / "out").iterdir()) == []


def test_an_artifact_holding_a_named_pipe_is_one_line_naming_it(
        sqlite_url: str, tmp_path: Path) -> None:
    """copytree refuses to copy a FIFO and raises shutil.Error with every failure listed: a
    traceback, then a line holding the whole list of tuples."""
    import os

    engine = migrate.open_store(sqlite_url, upgrade=True)
    populate(engine, _artifact_root())
    engine.dispose()
    os.mkfifo(_artifact_root() / "eagle3-a" / "pipe")
    (tmp_path / "out").mkdir()
    done = CliRunner().invoke(app, ["db", "backup", str(tmp_path / "out" / "bk"), "--url",
                                    sqlite_url])
    assert done.exit_code == 2, done.output
    line = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert line == [f"error: cannot back up to {tmp_path / 'out' / 'bk'}: "
                    f"`{_artifact_root() / 'eagle3-a' / 'pipe'}` is a named pipe; nothing was "
                    f"written"], done.stderr
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.postgres
def test_postgres_backup_restores_into_another_postgres_database(
        postgres_url: str, other_postgres: str, tmp_path: Path) -> None:
    source = migrate.open_store(postgres_url, upgrade=True)
    populate(source, tmp_path / "arts")
    before = rows(source)
    backups.backup(source, tmp_path / "bk")
    source.dispose()

    target = db.make_engine(other_postgres)
    backups.restore(target, tmp_path / "bk", artifact_dir=tmp_path / "restored-arts")
    after = _without_restore_note(rows(target))
    for spec in after["speculators"]:  # the artifacts now live in the restore's directory
        if spec["version"] != "builtin-ngram":
            assert spec.pop("artifact_uri") == str(tmp_path / "restored-arts" / spec["version"])
    for spec in before["speculators"]:
        if spec["version"] != "builtin-ngram":
            spec.pop("artifact_uri")
    assert after == before
    assert _files(tmp_path / "restored-arts") == _files(tmp_path / "arts")
    # the sequences were reset: new rows get ids after the restored ones
    store.write_requests(target, [store.RequestRecord(prompt_ids=[1], output_ids=[2])])
    with target.connect() as conn:
        assert conn.execute(text("SELECT max(id) FROM requests")).scalar() == 26
        assert conn.execute(text("SELECT count(*) FROM events")).scalar() == len(
            before["events"]) + 1
    target.dispose()


@pytest.mark.postgres
def test_sqlite_store_moves_to_postgres_with_the_cli(
        sqlite_url: str, postgres_url: str, tmp_path: Path) -> None:
    from autospec.cli import app

    engine = migrate.open_store(sqlite_url, upgrade=True)
    populate(engine, _artifact_root())
    before = rows(engine)
    engine.dispose()
    runner = CliRunner()
    result = runner.invoke(app, ["db", "backup", str(tmp_path / "bk"), "--url", sqlite_url,
                                 "--json"])
    assert result.exit_code == 0, result.output
    backed = json.loads(result.stdout)
    assert backed["tables"]["requests"] == 25 and len(backed["artifacts"]) == 3
    assert "  requests: 25" not in result.stdout  # --json: no progress lines on stdout

    result = runner.invoke(app, ["db", "restore", str(tmp_path / "bk"), "--url", postgres_url])
    assert result.exit_code == 0, result.output
    assert "  requests: 25" in result.stderr and "restored" in result.stdout
    target = db.make_engine(postgres_url)
    assert _without_restore_note(rows(target)) == before
    target.dispose()
    result = runner.invoke(app, ["db", "restore", str(tmp_path / "bk"), "--url", postgres_url,
                                 "--json"])
    assert result.exit_code == 2 and "not empty" in result.output and "--force" in result.output
    result = runner.invoke(app, ["db", "restore", str(tmp_path / "bk"), "--url", postgres_url,
                                 "--force", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["replaced"]["requests"] == 25


@pytest.mark.postgres
def test_a_row_postgres_refuses_is_named_and_the_database_left_as_it_was(
        sqlite_url: str, postgres_url: str, tmp_path: Path) -> None:
    """A SQLite store holds a 200-character actor (written before the store checked
    lengths); restored into PostgreSQL it was a StringDataRightTruncation traceback."""
    from sqlalchemy import insert

    from autospec.cli import app
    from autospec.store.models import Event

    engine = migrate.open_store(sqlite_url, upgrade=True)
    with engine.begin() as conn:
        conn.execute(insert(Event.__table__).values(created_at=utcnow(), kind="note",
                                                    actor="x" * 200, reason="old"))
    backups.backup(engine, tmp_path / "bk")
    engine.dispose()
    result = CliRunner().invoke(app, ["db", "restore", str(tmp_path / "bk"), "--url",
                                      postgres_url])
    assert result.exit_code == 2, result.output
    said = " ".join(result.stderr.split())
    assert "table events: row id=1: column actor holds at most 128 characters, the backup " \
           "has 200" in said and "the database is unchanged" in said
    assert result.exception is None or isinstance(result.exception, SystemExit)
    target = db.make_engine(postgres_url)
    with target.connect() as conn:  # empty before, empty after: no schema left behind
        assert inspect(conn).get_table_names() == []
    target.dispose()
