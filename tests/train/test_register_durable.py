"""A candidate's registration survives a power loss and a COMMIT whose reply is lost.

- Durability: the artifact's files and directory are fsync'ed before it is renamed to its
  version's name, and the artifact directory (the rename) before the transaction commits;
  without it a power loss could leave the registered version's files empty or truncated.
- A COMMIT that lands but raises (the connection lost while its reply was in flight,
  simulated by wrapping ``Session.commit``): the version stays registered with its
  artifact in place. It used to move the artifact back and remove it (or, the error being
  an outage, register a second version), leaving a registered version without files.

SQLite, and PostgreSQL where the tests' server is reachable (``engine``); tiny target.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from autospec import store
from autospec.settings import get_settings
from autospec.speculators.registry import new_speculator
from autospec.store import retry
from autospec.train import register as register_module
from autospec.train.data import WindowSpec
from autospec.train.register import register_candidate
from autospec.train.run import TrainRequest, train_candidate
from tests.fsync_calls import needs_proc, recorded, rename_of, synced_after, unsynced_before


def _start_run(engine: Engine) -> int:
    with store.session_scope(engine) as session:
        return store.start_training_run(session, kind="suffix").id


def _register(engine: Engine, target: Any, run_id: int) -> tuple[str, Path, str]:
    """A fresh suffix speculator registered as run ``run_id``'s candidate."""
    return register_candidate(engine, new_speculator("suffix", target), target, kind="suffix",
                              artifact_dir=None, metrics={}, run_id=run_id, parent=None,
                              meta={})


def _versions_of(engine: Engine, run_id: int) -> list[Any]:
    with store.session_scope(engine, readonly=True) as session:
        return [v for v in store.list_speculators(session) if v.training_run_id == run_id]


def _artifacts() -> list[str]:
    return sorted(p.name for p in get_settings().resolved_artifact_dir.iterdir())


def _assert_registered_in_place(engine: Engine, run_id: int, version: str) -> None:
    (row,) = _versions_of(engine, run_id)  # one version, not a second one for a retry
    assert row.version == version and row.state == "candidate"
    assert Path(row.artifact_uri).is_dir()
    assert store.artifact_sha256(row.artifact_uri) == row.sha256
    with store.session_scope(engine, readonly=True) as session:
        run = store.get_training_run(session, run_id=run_id)
    assert (run.status, run.version) == ("succeeded", version)


# -- durability -------------------------------------------------------------------------
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


# -- a COMMIT that lands and raises -----------------------------------------------------
def _lost_reply() -> OperationalError:
    return OperationalError("COMMIT", {}, Exception("server closed the connection "
                                                    "unexpectedly"))


def _commit_raising_once(monkeypatch: pytest.MonkeyPatch, *, lands: bool) -> list[int]:
    """The next ``Session.commit`` raises as a lost reply does, after committing (``lands``)
    or without; the list fills once it has."""
    commit, raised = Session.commit, []

    def commit_then_raise(session: Session) -> None:
        if raised:
            return commit(session)
        raised.append(1)
        if lands:
            commit(session)
        raise _lost_reply()

    monkeypatch.setattr(Session, "commit", commit_then_raise)
    return raised


def _store_out_for(monkeypatch: pytest.MonkeyPatch, reads: int) -> None:
    """The next ``reads`` read-only sessions fail as an unreachable store does."""
    scope, left = store.session_scope, [reads]

    def failing(engine: Engine, *, readonly: bool = False) -> Any:
        if readonly and left[0] > 0:
            left[0] -= 1
            raise _lost_reply()
        return scope(engine, readonly=readonly)

    monkeypatch.setattr(store, "session_scope", failing)


def test_a_commit_that_landed_and_raised_keeps_the_version_and_its_artifact_tiny(
        engine, tiny, monkeypatch, caplog) -> None:
    run_id = _start_run(engine)
    raised = _commit_raising_once(monkeypatch, lands=True)
    with caplog.at_level(logging.WARNING, logger="autospec.train.register"):
        version, final, sha = _register(engine, tiny, run_id)
    assert raised
    _assert_registered_in_place(engine, run_id, version)
    assert store.artifact_sha256(final) == sha and _artifacts() == [version]
    assert any("but it had landed" in r.getMessage() for r in caplog.records)


def test_a_landed_commit_the_store_cannot_confirm_is_asked_again_at_the_next_try_tiny(
        db, tiny, monkeypatch) -> None:
    run_id = _start_run(db)
    _commit_raising_once(monkeypatch, lands=True)
    _store_out_for(monkeypatch, reads=1)  # the check right after the COMMIT fails
    version, _final, _sha = _register(db, tiny, run_id)  # the retry asks again
    _assert_registered_in_place(db, run_id, version)
    assert _artifacts() == [version]


def test_past_the_deadline_an_unconfirmed_commit_leaves_the_artifact_in_place_tiny(
        db, tiny, monkeypatch) -> None:
    monkeypatch.setattr(retry, "DEFAULT_DEADLINE_S", 0.0)  # no second try
    run_id = _start_run(db)
    _commit_raising_once(monkeypatch, lands=True)
    _store_out_for(monkeypatch, reads=1)
    with pytest.raises(OperationalError, match="closed the connection"):
        _register(db, tiny, run_id)
    (row,) = _versions_of(db, run_id)
    assert store.artifact_sha256(row.artifact_uri) == row.sha256  # registered, files there
    assert _artifacts() == [row.version]  # and no partial directory left


def test_a_run_whose_unconfirmed_commit_landed_stays_succeeded_tiny(
        db_with_traffic, tiny, monkeypatch) -> None:
    monkeypatch.setattr(retry, "DEFAULT_DEADLINE_S", 0.0)
    save = register_module.save_speculator

    def save_then_fail(*args: Any, **kwargs: Any) -> str:  # armed once the run is under way
        sha = save(*args, **kwargs)
        _commit_raising_once(monkeypatch, lands=True)
        _store_out_for(monkeypatch, reads=1)
        return sha

    monkeypatch.setattr(register_module, "save_speculator", save_then_fail)
    request = TrainRequest(kind="suffix", epochs=1, window=WindowSpec(heldout_fraction=0.2))
    with pytest.raises(OperationalError):
        train_candidate(request, engine=db_with_traffic, target=tiny)
    with store.session_scope(db_with_traffic, readonly=True) as session:
        (run,) = store.list_training_runs(session)
    assert run.version is not None  # not closed as failed over its registered version
    _assert_registered_in_place(db_with_traffic, run.id, run.version)


def test_an_interrupt_in_a_commit_that_landed_keeps_the_artifact_tiny(
        db, tiny, monkeypatch) -> None:
    run_id = _start_run(db)
    commit = Session.commit

    def commit_then_interrupt(session: Session) -> None:
        commit(session)
        raise KeyboardInterrupt

    monkeypatch.setattr(Session, "commit", commit_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        _register(db, tiny, run_id)
    monkeypatch.undo()
    (row,) = _versions_of(db, run_id)
    _assert_registered_in_place(db, run_id, row.version)


def test_an_unconfirmed_commit_that_did_not_land_leaves_an_orphan_the_next_name_skips_tiny(
        db, tiny, monkeypatch) -> None:
    monkeypatch.setattr(retry, "DEFAULT_DEADLINE_S", 0.0)
    first = _start_run(db)
    _commit_raising_once(monkeypatch, lands=False)
    _store_out_for(monkeypatch, reads=1)
    with pytest.raises(OperationalError):
        _register(db, tiny, first)
    (orphan,) = _artifacts()
    assert _versions_of(db, first) == []
    run_id = _start_run(db)
    version, _final, _sha = _register(db, tiny, run_id)
    assert version != orphan and _artifacts() == sorted([orphan, version])
    _assert_registered_in_place(db, run_id, version)


def test_a_commit_that_raised_without_landing_is_tried_again_under_the_same_name_tiny(
        engine, tiny, monkeypatch) -> None:
    run_id = _start_run(engine)
    raised = _commit_raising_once(monkeypatch, lands=False)
    version, _final, _sha = _register(engine, tiny, run_id)
    assert raised and version.endswith("-0001")
    _assert_registered_in_place(engine, run_id, version)
    assert _artifacts() == [version]
