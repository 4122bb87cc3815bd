"""The soak's database fault timed on a registration (:func:`database_locked` with
``at_registration``): it waits for a gradient run, takes the lock half its hold before the
run's kind usually ends, and is ok only when the run ended after the release with a verdict
and no artifact directory lacks its version. A real SQLite file for the lock; the store view
and the load are stand-ins (what the soak reads back is covered by the short soak)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from autospec.bench.soak.fault_context import FaultContext
from autospec.bench.soak.faults import database_locked
from autospec.bench.soak.storeview import Row, RunInfo


class _View:
    def __init__(self, started: float, ends_as: RunInfo, versions: list[str]) -> None:
        self.started, self.ends_as, self.names = started, ends_as, versions
        self.locked_at: float | None = None

    def running_run(self, since: float, kinds: tuple[str, ...]) -> RunInfo:
        return RunInfo(7, "eagle3", "running", self.started, None, None, None)

    def typical_training_s(self, kind: str) -> float:
        return 4.0

    def run(self, run_id: int) -> RunInfo:
        return self.ends_as

    def versions(self) -> list[dict[str, Any]]:
        return [{"version": v} for v in self.names]

    def rows(self) -> list[Row]:
        return [Row(seed=1, version="v", at=time.time(), drafts=1, accepted=1)]


def _ctx(tmp_path: Path, view: _View) -> FaultContext:
    db = tmp_path / "s.db"
    sqlite3.connect(db).close()
    (tmp_path / "artifacts").mkdir()
    return FaultContext(base_url="", env={}, logs=tmp_path, serve=None,  # type: ignore[arg-type]
                        load=SimpleNamespace(snapshot=lambda: []),  # type: ignore[arg-type]
                        view=view, data_dir=tmp_path, db_path=db,  # type: ignore[arg-type]
                        start_controller=lambda: None,  # type: ignore[arg-type,return-value]
                        deadline=time.time() + 60)


def test_the_lock_is_timed_on_the_runs_expected_end_and_judged_by_its_outcome(tmp_path):
    started = time.time()
    done = RunInfo(7, "eagle3", "succeeded", started, started + 5, "eagle3-0002", None)
    view = _View(started, done, ["builtin-ngram", "eagle3-0002"])
    ctx = _ctx(tmp_path, view)
    (tmp_path / "artifacts" / "eagle3-0002").mkdir()
    rec = database_locked(ctx, hold_s=2.0, at_registration=1.0)
    assert rec.at - started >= 4.0 - 1.0 - 0.2  # half the hold before the usual end (4 s)
    assert rec.ok, rec.detail
    assert any("timed on run 7" in d for d in rec.detail)
    assert any("succeeded" in d and "eagle3-0002" in d for d in rec.detail)


def test_an_artifact_without_its_version_fails_the_fault(tmp_path):
    started = time.time() - 10  # the usual end has passed: the lock is taken at once
    failed = RunInfo(7, "eagle3", "failed", started, time.time() + 3, None, "OperationalError")
    ctx = _ctx(tmp_path, _View(started, failed, ["builtin-ngram"]))
    (tmp_path / "artifacts" / ".partial-abc").mkdir()
    rec = database_locked(ctx, hold_s=0.5, at_registration=1.0)
    assert rec.ok is False
    assert any(".partial-abc" in d for d in rec.detail)
