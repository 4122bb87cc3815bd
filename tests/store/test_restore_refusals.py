"""A restore that fails changes nothing: a table file cut short, missing, or holding fewer rows
than ``backup.json`` counts is refused before anything is written (the artifact directory
included, with --force over a store whose artifacts differ), and a failure after the staged
artifacts were swapped in (a swap or a COMMIT that fails) puts back what was there. A version
the backup holds no artifact of is restored pointing into this store's artifact directory,
and the text output names it (an operator's trial found all three)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from autospec.store import backup as backups
from autospec.store import db, migrate
from autospec.store.errors import ArtifactError, StoreError
from autospec.store.models import metadata
from tests.store.test_backup import _artifact_root, _files, populate, rows


def _drill(bk: Path, dest: Path, *, other: tuple[str, ...] = ("eagle3-b",),
           rows_too: bool = True) -> Path:
    """A copy of the backup ``bk`` whose artifacts of ``other`` hold other files, each
    consistent: its SHA-256 in backup.json updated to match (and, ``rows_too``, in its row)."""
    shutil.copytree(bk, dest)
    index = json.loads((dest / "backup.json").read_text())
    for version in other:
        art = dest / "artifacts" / version
        (art / "weights.bin").write_bytes(f"other weights of {version}".encode())
        index["artifacts"][version]["sha256"] = store.write_manifest(art)
    (dest / "backup.json").write_text(json.dumps(index))
    specs = dest / "tables" / "speculators.jsonl"
    found = [json.loads(line) for line in specs.read_text().splitlines()]
    for row in found:
        if rows_too and row["version"] in other:
            row["sha256"] = index["artifacts"][row["version"]]["sha256"]
    specs.write_text("".join(json.dumps(row) + "\n" for row in found))
    return dest


def _backed_up(url: str, tmp_path: Path) -> tuple[Any, Path]:
    """A populated store at ``url`` (artifacts in the settings' artifact directory) and a
    backup of it."""
    engine = migrate.open_store(url, upgrade=True)
    populate(engine, _artifact_root())
    backups.backup(engine, tmp_path / "bk")
    return engine, tmp_path / "bk"


def _restore_cli(bk: Path, url: str, *more: str) -> Any:
    return CliRunner().invoke(app, ["db", "restore", str(bk), "--url", url, *more])


def _restored_into_my_artifacts(tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch, *,
                                missing: str) -> Path:
    """``tmp_path/bk`` restored into ``url`` with this store's artifacts in
    ``tmp_path/my-artifacts`` (returned), ``missing`` reported without an artifact."""
    from autospec.settings import get_settings

    mine = tmp_path / "my-artifacts"
    monkeypatch.setenv("AUTOSPEC_ARTIFACT_DIR", str(mine))
    get_settings.cache_clear()
    result = _restore_cli(tmp_path / "bk", url)
    assert result.exit_code == 0, result.output
    assert f"without an artifact (pruned or missing): {missing}" in result.stdout
    return mine


def _one_line_error(result: Any) -> str:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = [line for line in result.stderr.splitlines()  # not the progress ("  events: 5")
             if line.strip() and not line.startswith("  ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_a_forced_restore_of_a_cut_table_file_leaves_store_and_artifacts_as_they_were(
        db_url: str, tmp_path: Path) -> None:
    """The trial: requests.jsonl cut in half, eagle3-b's artifact other (and consistent).
    The artifacts were replaced, the rows rolled back: the registry's SHA no longer matched
    and the next `db backup` refused."""
    engine, bk = _backed_up(db_url, tmp_path)
    drill = _drill(bk, tmp_path / "drills" / "swap")
    requests = drill / "tables" / "requests.jsonl"
    data = requests.read_bytes()
    requests.write_bytes(data[: len(data) // 2])
    before, files = rows(engine), _files(_artifact_root())

    said = _one_line_error(_restore_cli(drill, db_url, "--force"))
    assert f"{requests}:" in said and "nothing was restored" in said
    assert _files(_artifact_root()) == files  # nothing set aside or staged is left either
    assert rows(engine) == before
    backups.backup(engine, tmp_path / "after")  # the registry matches its artifacts
    engine.dispose()


@pytest.mark.parametrize("damage", ["cut", "missing"])
def test_a_restore_into_an_empty_store_from_a_broken_table_file_writes_nothing(
        damage: str, sqlite_url: str, tmp_path: Path) -> None:
    engine, bk = _backed_up(sqlite_url, tmp_path)
    engine.dispose()
    events = bk / "tables" / "events.jsonl"  # the last table read: every artifact was copied
    if damage == "cut":
        events.write_bytes(events.read_bytes()[:-20])
    else:
        events.unlink()
    target = db.make_engine(f"sqlite:///{tmp_path / 'target.db'}")
    elsewhere = tmp_path / "restored-artifacts"
    with pytest.raises(StoreError, match=r"events\.jsonl.*nothing was restored"):
        backups.restore(target, bk, artifact_dir=elsewhere)
    assert not elsewhere.exists()
    assert migrate.current_revision(target) is None  # not even the schema
    target.dispose()


def test_rows_missing_from_a_table_file_are_refused_naming_the_file_and_both_counts(
        db_url: str, tmp_path: Path) -> None:
    """The trial: the last 5 lines of requests.jsonl deleted restored without a word."""
    engine, bk = _backed_up(db_url, tmp_path)
    requests = bk / "tables" / "requests.jsonl"
    lines = requests.read_text().splitlines(keepends=True)
    assert len(lines) == 25
    requests.write_text("".join(lines[:-5]))
    store.write_requests(engine, [store.RequestRecord(prompt_ids=[1], output_ids=[2])])
    before, files = rows(engine), _files(_artifact_root())

    said = _one_line_error(_restore_cli(bk, db_url, "--force"))
    assert "table requests" in said and str(requests) in said
    assert "holds 20 rows" in said and "records 25" in said
    assert rows(engine) == before and _files(_artifact_root()) == files

    index = json.loads((bk / "backup.json").read_text())
    del index["tables"]["requests"]
    (bk / "backup.json").write_text(json.dumps(index))
    said = _one_line_error(_restore_cli(bk, db_url, "--force"))
    assert "records no row count for table requests" in said
    engine.dispose()


def test_a_backup_whose_index_and_rows_name_other_artifacts_is_refused(
        sqlite_url: str, tmp_path: Path) -> None:
    """The trial's drill with its table files whole: backup.json's SHA-256 of eagle3-b
    matched the other files, its row still the first. Restored, the registry named another
    artifact than the one put in place, and the next `db backup` refused."""
    engine, bk = _backed_up(sqlite_url, tmp_path)
    drill = _drill(bk, tmp_path / "drill", rows_too=False)
    before, files = rows(engine), _files(_artifact_root())
    with pytest.raises(StoreError, match=r"row of 'eagle3-b' in speculators.jsonl records "
                                         r"SHA-256 .*, backup.json lists its artifact with"):
        backups.restore(engine, drill, force=True)
    assert rows(engine) == before and _files(_artifact_root()) == files
    engine.dispose()


def test_a_row_the_database_refuses_leaves_the_artifacts_as_they_were(
        db_url: str, tmp_path: Path) -> None:
    """Every file parses and holds its count, but two requests share an id: the insert
    fails inside the transaction, after the artifacts were copied (they were in place)."""
    engine, bk = _backed_up(db_url, tmp_path)
    drill = _drill(bk, tmp_path / "drill")
    requests = drill / "tables" / "requests.jsonl"
    lines = requests.read_text().splitlines(keepends=True)
    requests.write_text("".join(lines[:-1] + lines[:1]))  # the last row is the first again
    before, files = rows(engine), _files(_artifact_root())
    said = _one_line_error(_restore_cli(drill, db_url, "--force"))
    assert "table requests" in said and "the database is unchanged" in said
    assert rows(engine) == before and _files(_artifact_root()) == files
    engine.dispose()


def _forced_drill(sqlite_url: str, tmp_path: Path) -> tuple[Any, Path, dict, dict]:
    engine, bk = _backed_up(sqlite_url, tmp_path)
    drill = _drill(bk, tmp_path / "drill", other=("eagle3-b", "eagle3-c"))
    store.write_requests(engine, [store.RequestRecord(prompt_ids=[1], output_ids=[2])])
    return engine, drill, rows(engine), _files(_artifact_root())


def _refuse_renames(monkeypatch: pytest.MonkeyPatch, refuse: Any) -> None:
    """``os.rename`` fails as a full disk would where ``refuse(source, dest)`` (Paths)."""
    rename = os.rename

    def refusing(source: Any, dest: Any) -> None:
        if refuse(Path(source), Path(dest)):
            raise OSError(28, "No space left on device")
        rename(source, dest)

    monkeypatch.setattr(os, "rename", refusing)


def _left_as_it_was(engine: Any, before: Any, files: dict[str, bytes],
                    monkeypatch: pytest.MonkeyPatch) -> None:
    """With the faults undone: the artifact directory and the rows as before the restore."""
    monkeypatch.undo()
    assert _files(_artifact_root()) == files and rows(engine) == before
    engine.dispose()


def test_a_swap_that_fails_half_way_puts_the_first_artifact_back(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine, drill, before, files = _forced_drill(sqlite_url, tmp_path)
    _refuse_renames(monkeypatch, lambda source, dest:  # eagle3-c's staged copy cannot move in
                    dest == _artifact_root() / "eagle3-c" and "new" in source.parts)
    with pytest.raises(ArtifactError, match="cannot put the backup's artifacts in place"):
        backups.restore(engine, drill, force=True)
    _left_as_it_was(engine, before, files, monkeypatch)


def test_what_cannot_be_put_back_is_named_and_kept(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine, drill, before, _ = _forced_drill(sqlite_url, tmp_path)
    _refuse_renames(monkeypatch, lambda source, dest:  # nothing moves to eagle3-c's name
                    dest == _artifact_root() / "eagle3-c")
    with pytest.raises(ArtifactError, match=r"the restore failed \(cannot put .*\), and the "
                                            r"artifact directory could not be put back as it "
                                            r"was: .*old/eagle3-c could not be moved back to "
                                            r".*/eagle3-c .*set aside are under .*\.restore-"):
        backups.restore(engine, drill, force=True)
    monkeypatch.undo()
    (kept,) = _artifact_root().glob(".restore-*")
    assert (kept / "old" / "eagle3-c" / "weights.bin").is_file()
    assert rows(engine) == before
    engine.dispose()


def _failing_commit(engine: Any, monkeypatch: pytest.MonkeyPatch, *, lands: bool,
                    then: Any = None) -> None:
    """The COMMIT raises as a lost connection's would: after it landed, or without."""
    real = engine.dialect.do_commit

    def do_commit(dbapi_connection: Any) -> None:
        if lands:
            real(dbapi_connection)
        if then is not None:
            then()
        raise engine.dialect.loaded_dbapi.OperationalError("connection lost during COMMIT")

    monkeypatch.setattr(engine.dialect, "do_commit", do_commit)


def _restore_notes(engine: Any) -> int:
    events = metadata.tables["events"]
    with engine.connect() as conn:
        return sum(1 for d in conn.execute(select(events.c.details)).scalars()
                   if (d or {}).get("type") == "restore")


def test_a_commit_that_raises_and_did_not_land_puts_the_artifacts_back(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine, drill, before, files = _forced_drill(sqlite_url, tmp_path)
    _failing_commit(engine, monkeypatch, lands=False)
    with pytest.raises(Exception, match="connection lost during COMMIT"):
        backups.restore(engine, drill, force=True)
    _left_as_it_was(engine, before, files, monkeypatch)


def test_a_commit_that_raises_but_landed_keeps_the_restored_artifacts(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine, drill, _, files = _forced_drill(sqlite_url, tmp_path)
    _failing_commit(engine, monkeypatch, lands=True)
    done = backups.restore(engine, drill, force=True)
    monkeypatch.undo()
    assert done.tables["requests"] == 25 and _restore_notes(engine) == 1
    after = _files(_artifact_root())
    assert after["eagle3-b/weights.bin"] == b"other weights of eagle3-b"
    assert after["eagle3-a/weights.bin"] == files["eagle3-a/weights.bin"]
    assert not any(name.startswith(".restore-") for name in after)
    backups.backup(engine, tmp_path / "after")  # the registry matches its artifacts
    engine.dispose()


def test_a_commit_whose_landing_cannot_be_checked_says_so_and_puts_the_artifacts_back(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine, drill, before, files = _forced_drill(sqlite_url, tmp_path)

    def store_gone() -> None:
        def refused() -> None:
            raise OperationalError("SELECT 1", {}, Exception("server closed the connection"))

        monkeypatch.setattr(engine, "connect", refused)

    _failing_commit(engine, monkeypatch, lands=False, then=store_gone)
    with pytest.raises(StoreError, match=r"COMMIT failed \(connection lost during COMMIT\) "
                                         r"and whether it landed could not be checked.*"
                                         r"`autospec history`.*--force"):
        backups.restore(engine, drill, force=True)
    _left_as_it_was(engine, before, files, monkeypatch)


def test_a_version_without_an_artifact_points_into_this_store_and_is_named(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trial: eagle3-a's row kept the source store's path, and only --json named it."""

    source = migrate.open_store(f"sqlite:///{tmp_path / 'source.db'}", upgrade=True)
    populate(source, tmp_path / "source-artifacts")
    shutil.rmtree(tmp_path / "source-artifacts" / "eagle3-a")  # vanished
    backups.backup(source, tmp_path / "bk")
    source.dispose()
    shutil.rmtree(tmp_path / "source-artifacts")  # the source store's host, say, is gone

    mine = _restored_into_my_artifacts(tmp_path, db_url, monkeypatch, missing="eagle3-a")
    target = db.make_engine(db_url)
    with store.session_scope(target, readonly=True) as session:
        for version in ("eagle3-a", "eagle3-b", "eagle3-c"):
            assert store.get_speculator(session, version=version).artifact_uri == str(
                mine / version)
    again = backups.backup(target, tmp_path / "bk-again")  # reported missing here, too
    assert again.missing_artifacts == ["eagle3-a"] and len(again.artifacts) == 2
    target.dispose()


@pytest.mark.parametrize(("field", "value", "said"), [
    ("artifacts", ["eagle3-a"], "'artifacts' must be an object"),
    ("artifacts", "eagle3-a", "'artifacts' must be an object"),
    ("artifacts.eagle3-a", "abc", "artifact of 'eagle3-a' must be an object with a 'sha256'"),
    ("artifacts.eagle3-a", None, "artifact of 'eagle3-a' must be an object with a 'sha256'"),
    ("artifacts.eagle3-a.sha256", None, "artifact of 'eagle3-a' must be an object with a "
                                        "'sha256'"),
    ("artifacts.eagle3-a.sha256", 5, "artifact of 'eagle3-a' must be an object with a 'sha256'"),
    ("missing_artifacts", "abc", "'missing_artifacts' must be a list of versions, not str"),
    ("missing_artifacts", 7, "'missing_artifacts' must be a list of versions, not int"),
    ("missing_artifacts", [1], "names version 1, which is not a version name"),
    ("missing_artifacts", ["a/b"], "names version 'a/b', which is not a version name"),
])
def test_a_malformed_artifacts_entry_in_backup_json_is_one_line_and_changes_nothing(
        field: str, value: Any, said: str, sqlite_url: str, tmp_path: Path) -> None:
    """backup.json's artifacts / missing_artifacts edited by hand: a traceback
    (AttributeError, TypeError) from restore; a string of missing artifacts ("abc") restored
    with exit 0, each of its letters taken for a version."""
    engine, bk = _backed_up(sqlite_url, tmp_path)
    store.write_requests(engine, [store.RequestRecord(prompt_ids=[1], output_ids=[2])])
    before, files = rows(engine), _files(_artifact_root())
    index = json.loads((bk / "backup.json").read_text())
    *path, last = field.split(".")
    holder = index
    for key in path:
        holder = holder[key]
    if value is None and last == "sha256":
        del holder[last]
    else:
        holder[last] = value
    (bk / "backup.json").write_text(json.dumps(index))
    line = _one_line_error(_restore_cli(bk, sqlite_url, "--force"))
    assert "backup.json" in line and said in line and line.endswith("refused")
    assert rows(engine) == before and _files(_artifact_root()) == files
    engine.dispose()


@pytest.mark.parametrize(("column", "value", "said"), [
    ("version", None, "version is None, not a string"),
    ("parent", ["eagle3-a"], "column parent holds ['eagle3-a'], not a string"),
    ("meta", "pruned", "meta is 'pruned', not an object or null"),
    ("version", "../../x", "version '../../x' is not a version name"),
])
def test_a_speculator_row_restore_cannot_read_is_one_line_naming_it(
        column: str, value: Any, said: str, sqlite_url: str, tmp_path: Path) -> None:
    """speculators.jsonl edited by hand: a row without a version (KeyError) or with a list
    for its parent (TypeError) was a traceback from inside the transaction; a meta that is
    not an object restored, and every later read of the version's meta failed."""
    engine, bk = _backed_up(sqlite_url, tmp_path)
    before, files = rows(engine), _files(_artifact_root())
    specs = bk / "tables" / "speculators.jsonl"
    found = [json.loads(line) for line in specs.read_text().splitlines()]
    if value is None:
        del found[1][column]
    else:
        found[1][column] = value
    specs.write_text("".join(json.dumps(row) + "\n" for row in found))
    line = _one_line_error(_restore_cli(bk, sqlite_url, "--force"))
    assert f"{specs}:2: {said}" in line and "nothing was restored" in line
    assert rows(engine) == before and _files(_artifact_root()) == files
    engine.dispose()


@pytest.mark.parametrize("name", ["backup.json", "tables/speculators.jsonl"])
def test_json_nested_too_deep_in_a_backup_is_one_line(name: str, sqlite_url: str,
                                                      tmp_path: Path) -> None:
    """json raises RecursionError on 100 000 nested lists, which restore did not catch."""
    engine, bk = _backed_up(sqlite_url, tmp_path)
    before = rows(engine)
    (bk / name).write_text("[" * 100_000 + "]" * 100_000 + "\n")
    line = _one_line_error(_restore_cli(bk, sqlite_url, "--force"))
    assert str(bk / name) in line and "recursion" in line
    assert rows(engine) == before
    engine.dispose()


@pytest.mark.parametrize(("table", "column", "value", "said"), [
    ("events", "id", 10**30, "column id holds 1000000000000000000000000000000, not an integer "
                             "of 64 bits"),
    ("events", "kind", 5, "column kind holds 5, not a string"),
    ("requests", "temperature", "hot", "column temperature holds 'hot', not a number"),
    ("requests", "opted_out", "no", "column opted_out holds 'no', not true or false"),
])
def test_a_value_of_another_type_than_its_column_is_one_line_naming_it(
        table: str, column: str, value: Any, said: str, sqlite_url: str,
        tmp_path: Path) -> None:
    """An id past 64 bits was an OverflowError traceback and a float column's string a
    StatementError one, from inside the transaction; a number in a string column restored
    with exit 0 (SQLite stores it)."""
    engine, bk = _backed_up(sqlite_url, tmp_path)
    before = rows(engine)
    file = bk / "tables" / f"{table}.jsonl"
    found = [json.loads(line) for line in file.read_text().splitlines()]
    found[0][column] = value
    file.write_text("".join(json.dumps(row) + "\n" for row in found))
    line = _one_line_error(_restore_cli(bk, sqlite_url, "--force"))
    assert f"{file}:1: {said}" in line and "nothing was restored" in line
    assert rows(engine) == before
    engine.dispose()


def test_a_version_backup_json_lists_nowhere_points_into_this_store_too(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """backup.json edited: eagle3-a in neither artifacts nor missing_artifacts. Its row kept
    the source store's artifact_uri, so the restored store read (and would back up) the
    other store's artifact, which 1d514ea stopped for the versions listed missing."""

    source = migrate.open_store(f"sqlite:///{tmp_path / 'source.db'}", upgrade=True)
    populate(source, tmp_path / "source-artifacts")  # stays there, readable
    backups.backup(source, tmp_path / "bk")
    source.dispose()
    index = json.loads((tmp_path / "bk" / "backup.json").read_text())
    del index["artifacts"]["eagle3-a"]
    (tmp_path / "bk" / "backup.json").write_text(json.dumps(index))
    shutil.rmtree(tmp_path / "bk" / "artifacts" / "eagle3-a")

    mine = _restored_into_my_artifacts(tmp_path, sqlite_url, monkeypatch, missing="eagle3-a")
    target = db.make_engine(sqlite_url)
    with store.session_scope(target, readonly=True) as session:
        assert store.get_speculator(session, version="eagle3-a").artifact_uri == str(
            mine / "eagle3-a")
        assert store.get_speculator(session, version="builtin-ngram").artifact_uri.startswith(
            "builtin:")
    target.dispose()


def test_a_version_on_object_storage_keeps_its_uri(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A version registered with an s3:// artifact (verify=False) is one db backup neither
    copies nor lists missing (this machine cannot read it): restored, its row keeps its
    URI. 068bd3c took it for a version backup.json leaves out and pointed it into this
    store's artifact directory, where no artifact will ever be."""
    from autospec.settings import get_settings

    source = migrate.open_store(f"sqlite:///{tmp_path / 'source.db'}", upgrade=True)
    with store.session_scope(source) as session:
        store.register_speculator(session, version="remote-a", kind="eagle3", target_id="tiny",
                                  artifact_uri="s3://bucket/remote-a", sha256="0" * 64,
                                  verify=False)
    backups.backup(source, tmp_path / "bk")
    source.dispose()
    monkeypatch.setenv("AUTOSPEC_ARTIFACT_DIR", str(tmp_path / "my-artifacts"))
    get_settings.cache_clear()
    result = _restore_cli(tmp_path / "bk", sqlite_url)
    assert result.exit_code == 0, result.output
    assert "remote-a" not in result.stdout  # not "without an artifact"
    target = db.make_engine(sqlite_url)
    with store.session_scope(target, readonly=True) as session:
        assert store.get_speculator(session, version="remote-a").artifact_uri == \
            "s3://bucket/remote-a"
    target.dispose()


def test_a_failed_restore_into_an_empty_database_leaves_it_empty(
        db_url: str, tmp_path: Path) -> None:
    """A trial's find: a restore into an empty database that failed (here two requests share
    an id: the insert fails inside the transaction) left the schema it had made — every
    table, alembic's version — behind, on SQLite and PostgreSQL."""
    from sqlalchemy import inspect

    source, bk = _backed_up(f"sqlite:///{tmp_path / 'source.db'}", tmp_path)
    source.dispose()
    requests = bk / "tables" / "requests.jsonl"
    lines = requests.read_text().splitlines(keepends=True)
    requests.write_text("".join(lines[:-1] + lines[:1]))  # the last row is the first again
    files = _files(_artifact_root())
    said = _one_line_error(_restore_cli(bk, db_url))
    assert "table requests" in said and "the database is unchanged" in said
    target = db.make_engine(db_url)
    with target.connect() as conn:
        assert inspect(conn).get_table_names() == []  # not even alembic_version
    assert migrate.current_revision(target) is None
    assert _files(_artifact_root()) == files
    fixed = bk / "tables" / "requests.jsonl"
    fixed.write_text("".join(lines))  # the backup as taken: it restores into the same database
    assert _restore_cli(bk, db_url).exit_code == 0
    assert rows(target)["requests"] == rows(source)["requests"]
    target.dispose()


def test_a_failed_restore_keeps_a_schema_whose_tables_hold_rows(
        sqlite_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Rows written there meanwhile (or a COMMIT that landed though it raised) are never
    dropped: the schema stays, said in the log."""
    engine = migrate.open_store(sqlite_url, upgrade=True)
    store.write_requests(engine, [store.RequestRecord(prompt_ids=[1], output_ids=[2])])
    with caplog.at_level("WARNING", logger="autospec.store.backup"):
        backups._unmake_schema(engine)
    assert len(rows(engine)["requests"]) == 1
    assert "leaves the schema" in caplog.text and "'requests': 1" in caplog.text
    engine.dispose()


def test_a_failed_restore_drops_only_the_tables_its_migration_made(db_url: str) -> None:
    """A table of another name, made in the database while the restore ran (by something
    else sharing it), is not autospec's: it stays with its rows, and so do they. The undo
    dropped every table it found there."""
    from sqlalchemy import inspect, text

    engine = migrate.open_store(db_url, upgrade=True)  # what the restore's migration made
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE other_app (x INTEGER)"))
        conn.execute(text("INSERT INTO other_app (x) VALUES (7)"))
    backups._unmake_schema(engine)
    with engine.connect() as conn:
        assert inspect(conn).get_table_names() == ["other_app"]
        assert conn.execute(text("SELECT x FROM other_app")).scalar() == 7
    assert migrate.current_revision(engine) is None
    engine.dispose()
