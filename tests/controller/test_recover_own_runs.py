"""Recovering an interrupted cycle closes only that cycle's training runs and names only its
candidates: an operator's `autospec train` running meanwhile (the soak's hand-registered
version, say) is not the dead cycle's (tiny random-init target)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from autospec import store
from autospec.controller import records
from autospec.controller.cycle import Controller
from autospec.settings import get_settings
from autospec.store.models import TrainingRun
from autospec.train.partials import partial_dir
from tests.serve.helpers import register_artifact

from .helpers import events, fast_policy


def _run(db, config: dict) -> int:  # type: ignore[no-untyped-def]
    with store.session_scope(db) as session:
        return store.start_training_run(session, kind="suffix", config=config).id


def _register(db, tiny, root: Path, version: str, run_id: int) -> None:  # type: ignore[no-untyped-def]
    register_artifact(db, tiny, root, version, kind="suffix")
    with store.session_scope(db) as session:
        store.get_speculator(session, version=version).training_run_id = run_id


def test_recovery_closes_only_the_dead_cycles_runs(db, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(db) as session:
        records.note(session, type_="cycle_start", actor="dead", deployment="default",
                     cycle_id="c-dead", window_key="default/9/9", newest_id=9)
    mine = _run(db, {"cycle_id": "c-dead"})
    operator = _run(db, {"cycle_id": None})
    older_code = _run(db, {"kind": "suffix"})  # recorded before runs named their cycle
    _register(db, tiny, tmp_path, "suffix-mine", mine)
    _register(db, tiny, tmp_path, "suffix-operator", operator)

    assert Controller(db, fast_policy(), tiny).recover() == ["c-dead"]

    with store.session_scope(db, readonly=True) as session:
        status = dict(session.execute(select(TrainingRun.id, TrainingRun.status)).all())
    assert status == {mine: "failed", operator: "running", older_code: "failed"}
    (failure,) = [e for e in events(db, "failure") if (e.details or {}).get("type") == "cycle"]
    assert "suffix-mine" in failure.reason and "suffix-operator" not in failure.reason


def test_recovery_removes_the_unregistered_artifact_of_a_run_it_closes(db, tiny) -> None:  # type: ignore[no-untyped-def]
    """A controller SIGKILLed while saving a candidate leaves `.partial-run<id>-…` behind
    (the vLLM soak of 2026-12-04 found one); the next controller removes it with the run,
    and leaves an operator's run's partial alone (tiny random-init target)."""
    with store.session_scope(db) as session:
        records.note(session, type_="cycle_start", actor="dead", deployment="default",
                     cycle_id="c-dead", window_key="default/9/9", newest_id=9)
    mine = _run(db, {"cycle_id": "c-dead"})
    operator = _run(db, {"cycle_id": None})
    root = get_settings().resolved_artifact_dir
    left, kept = partial_dir(root, mine), partial_dir(root, operator)
    for path in (left, kept):
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"half a file")

    Controller(db, fast_policy(), tiny).recover()

    assert not left.exists() and kept.exists()
