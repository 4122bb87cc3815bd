"""``autospec evaluate`` replays only requests no evaluated version trained on: training runs
on a tiny random-init target, on SQLite and PostgreSQL, then the requests their windows
cover (:mod:`autospec.evaluate.unseen`)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from autospec import store
from autospec.controller.evaluate_cli import _held_out
from autospec.evaluate.run import EvaluationError, select_requests
from autospec.evaluate.unseen import trained_on, unseen
from autospec.train.data import WindowSpec
from autospec.train.run import TrainRequest, train_candidate
from tests.train.conftest import T0, log_traffic


@pytest.fixture
def db(engine):  # type: ignore[no-untyped-def]
    """The store on both backends (the ``engine`` fixture) instead of SQLite alone."""
    return engine


def _suffix(db, tiny, **window) -> str:
    spec = WindowSpec(**{"heldout_fraction": 0.2, **window})
    return train_candidate(TrainRequest(kind="suffix", window=spec), engine=db,
                           target=tiny).version


def test_a_version_s_training_requests_are_left_out_and_its_held_out_part_kept(
        db_with_traffic, tiny) -> None:
    version = _suffix(db_with_traffic, tiny)
    examples = select_requests(db_with_traffic, last=100)
    assert len(examples) == 60
    kept, dropped = unseen(examples, trained_on(db_with_traffic, [version, "builtin-ngram"]))
    # the window's oldest 48 trained it; its newest 12 were held out, and only they remain
    assert [ex.id for ex in kept] == [ex.id for ex in examples[-12:]]
    assert dropped == {version: 48}


def test_a_segment_s_version_leaves_other_segments_in(db, traffic, tiny) -> None:
    log_traffic(db, traffic[:30], segment="a")
    log_traffic(db, traffic[30:], segment="b", start=T0 + timedelta(seconds=30))
    version = _suffix(db, tiny, segment="a")
    kept, dropped = unseen(select_requests(db, last=100), trained_on(db, [version]))
    assert dropped == {version: 24}  # a's oldest 24 of 30; its newest 6 held out
    assert sorted(ex.segment for ex in kept) == ["a"] * 6 + ["b"] * 30


def test_a_child_has_seen_what_its_parent_trained_on(db_with_traffic, tiny) -> None:
    parent = _suffix(db_with_traffic, tiny)
    with store.session_scope(db_with_traffic) as s:
        row = store.get_speculator(s, version=parent)
        store.register_speculator(s, version="child", kind="suffix", parent=parent,
                                  target_id=row.target_id, artifact_uri=row.artifact_uri,
                                  sha256=row.sha256, verify=False)
    windows = trained_on(db_with_traffic, ["child"])
    assert [(w.version, w.via) for w in windows] == [("child", parent)]
    assert f"through its ancestor {parent}" in windows[0].describe()
    kept, dropped = unseen(select_requests(db_with_traffic, last=100), windows)
    assert len(kept) == 12 and dropped == {"child": 48}


def test_a_window_wholly_trained_on_is_a_clear_error(db_with_traffic, tiny) -> None:
    version = _suffix(db_with_traffic, tiny, heldout_fraction=0.0)  # nothing held out
    examples = select_requests(db_with_traffic, last=100)
    with pytest.raises(EvaluationError, match=f"every one of the 60 requests of the window "
                       f"'100' was trained on by a version evaluated \\({version} trained"):
        _held_out(db_with_traffic, [version, "builtin-ngram"], examples, "100")
    # traffic logged after the training is held out
    log_traffic(db_with_traffic, [([1, 2, 3], [4, 5, 6])] * 3,
                start=T0 + timedelta(hours=1))
    kept, left_out = _held_out(db_with_traffic, [version, "builtin-ngram"],
                               select_requests(db_with_traffic, last=100), "100")
    assert len(kept) == 3 and left_out == {version: 60}


def test_a_run_without_a_recorded_window_covers_everything_up_to_its_end(
        db_with_traffic, tiny) -> None:
    version = _suffix(db_with_traffic, tiny)
    with store.session_scope(db_with_traffic) as s:
        run_id = store.get_speculator(s, version=version).training_run_id
        run = store.get_training_run(s, run_id=run_id)
        run.metrics = {k: v for k, v in run.metrics.items() if k != "window"}
    kept, dropped = unseen(select_requests(db_with_traffic, last=100),
                           trained_on(db_with_traffic, [version]))
    assert kept == [] and dropped == {version: 60}  # its held-out split is not known
