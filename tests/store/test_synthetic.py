"""Synthetic sequences: apart from traffic, marked, matched to the target (SQLite, PostgreSQL)."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from autospec import store
from autospec.store import db, migrate
from autospec.store.errors import StoreError

T = store.SyntheticTarget(target_id="tiny", revision="r1", dtype="float32")


def _records(n: int, source: str = "resampled", split: str = "train"):
    return [store.SyntheticRecord(prompt_ids=[1, 2, i], output_ids=[3, i, 4], source=source,
                                  split=split, temperature=0.8, seed=i) for i in range(n)]


def test_rows_are_marked_and_never_traffic(engine) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as session:
        assert store.add_synthetic(session, records=_records(3), target=T, run_id="a") == 3
        store.add_synthetic(session, records=_records(2, "domain:coding", "heldout"), target=T,
                            run_id="a")
    with store.session_scope(engine, readonly=True) as session:
        window = store.traffic_window(session, heldout_fraction=0.5)
        assert window.total == 0  # synthetic rows never appear as traffic or held out
        assert store.request_counts(session) == {None: 0}
        train = store.select_synthetic(session, target=T, split="train")
        held = store.select_synthetic(session, target=T, split="heldout")
        counts = store.count_synthetic(session, target=T)
    assert [r.output_ids for r in train] == [[3, 0, 4], [3, 1, 4], [3, 2, 4]]
    assert {r.source for r in held} == {"domain:coding"} and len(held) == 2
    assert counts == {("resampled", "train"): 3, ("domain:coding", "heldout"): 2}


def test_only_rows_of_the_same_target_revision_and_dtype(engine) -> None:  # type: ignore[no-untyped-def]
    others = [store.SyntheticTarget("tiny", "r2", "float32"),
              store.SyntheticTarget("tiny", "r1", "bfloat16"),
              store.SyntheticTarget("other", "r1", "float32")]
    with store.session_scope(engine) as session:
        for other in others:
            store.add_synthetic(session, records=_records(2), target=other, run_id="x")
        store.add_synthetic(session, records=_records(1), target=T, run_id="y")
    with store.session_scope(engine, readonly=True) as session:
        assert len(store.select_synthetic(session, target=T, split="train")) == 1
        newest = store.select_synthetic(session, target=others[0], split="train", limit=1)
        assert [r.output_ids for r in newest] == [[3, 1, 4]]
        assert store.select_synthetic(session, target=T, split="train",
                                      sources=["domain:support"]) == []


@pytest.mark.parametrize(("field", "value", "message"), [
    ("source", "logged", "not 'resampled' or 'domain:<name>'"),
    ("split", "test", "split 'test'"),
    ("temperature", -0.1, "temperature is >= 0"),
    ("output_ids", [], "needs a prompt and an output"),
])
def test_bad_rows_are_refused_by_name(sqlite_url: str, field: str, value, message: str) -> None:  # type: ignore[no-untyped-def]
    engine = store.open_store(sqlite_url, upgrade=True)
    record = store.SyntheticRecord(prompt_ids=[1], output_ids=[2], source="resampled")
    bad = store.SyntheticRecord(**{**record.__dict__, field: value})
    with pytest.raises(StoreError, match=message), store.session_scope(engine) as session:
        store.add_synthetic(session, records=[record, bad], target=T, run_id="z")
    with store.session_scope(engine, readonly=True) as session:
        assert store.count_synthetic(session) == {}  # nothing of the run was written
    engine.dispose()


def test_migration_0004_up_and_down_from_0003(db_url: str) -> None:
    engine = db.make_engine(db_url)
    migrate.upgrade(engine, "0003")
    assert "synthetic_sequences" not in inspect(engine).get_table_names()
    migrate.upgrade(engine, "0004")
    assert migrate.current_revision(engine) == "0004"
    assert "synthetic_sequences" in inspect(engine).get_table_names()
    migrate.downgrade(engine, "0003")
    assert "synthetic_sequences" not in inspect(engine).get_table_names()
    engine.dispose()


@pytest.mark.parametrize("text_only", [False, True])
def test_purge_drops_rows_resampled_from_purged_requests(engine, text_only: bool) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from autospec.store.models import utcnow

    now = utcnow()
    store.write_requests(engine, [
        store.RequestRecord(prompt_ids=[1, 2], output_ids=[3], request_uid=f"r{i}",
                            created_at=now - timedelta(days=age))
        for i, age in enumerate((40, 1))])
    with store.session_scope(engine, readonly=True) as session:
        old, new = (ex.id for ex in store.traffic_window(session, heldout_fraction=0.0).train)
    rows = [store.SyntheticRecord(prompt_ids=[1, 2], output_ids=[9], source="resampled",
                                  origin_request_id=origin) for origin in (old, new, None)]
    with store.session_scope(engine) as session:
        store.add_synthetic(session, records=rows, target=T, run_id="p")
    with store.session_scope(engine) as session:
        store.purge_requests(session, older_than=timedelta(days=30), text_only=text_only)
    with store.session_scope(engine, readonly=True) as session:
        kept = store.select_synthetic(session, target=T, split="train")
    assert [r.origin_request_id for r in kept] == [new, None]
