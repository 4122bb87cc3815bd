"""A restore that fails changes nothing: a table file cut short, missing, or holding fewer rows
than ``backup.json`` counts is refused before anything is written (the artifact directory
included, with --force over a store whose artifacts differ), and a failure after the staged
artifacts were swapped in (a swap or a COMMIT that fails) puts back what was there. A version
the backup holds no artifact of is restored pointing into this store's artifact directory,
and the text output names it (an operator's trial found all three)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from autospec.store import backup as backups
from autospec.store import db, migrate
from autospec.store.errors import StoreError
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
