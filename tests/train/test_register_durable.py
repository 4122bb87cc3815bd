"""A candidate's registration survives a power loss: the artifact's files and directory are
fsync'ed before it is renamed to its version's name, and the artifact directory (the
rename) before the transaction commits; without it a power loss could leave the registered
version's files empty or truncated (its SHA-256 then fails at load). Tiny target, SQLite.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from autospec import store
from autospec.speculators.registry import new_speculator
from autospec.train.register import register_candidate
from tests.fsync_calls import needs_proc, recorded, rename_of, synced_after, unsynced_before


def _start_run(engine: Engine) -> int:
    with store.session_scope(engine) as session:
        return store.start_training_run(session, kind="suffix").id


def _register(engine: Engine, target: Any, run_id: int) -> tuple[str, Path, str]:
    """A fresh suffix speculator registered as run ``run_id``'s candidate."""
    return register_candidate(engine, new_speculator("suffix", target), target, kind="suffix",
                              artifact_dir=None, metrics={}, run_id=run_id, parent=None,
                              meta={})


@needs_proc
def test_the_artifact_is_synced_before_its_rename_and_the_rename_before_the_commit_tiny(
        db, tiny, monkeypatch) -> None:
    run_id = _start_run(db)
    with recorded(monkeypatch) as calls:
        _version, final, _sha = _register(db, tiny, run_id)
    moved = rename_of(calls, final)
    assert {Path(p).name for p in Path(final).iterdir()} == {
        "config.json", "model.safetensors", "manifest.json"}
    assert unsynced_before(calls, moved) == set()
    after = synced_after(calls, moved)
    assert after.index(str(final.parent)) < after.index("COMMIT"), "the rename synced late"
