"""The traffic writer: fast record(), batched writes, privacy, outage → spill → replay, once."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.engine import make_url

from autospec.store import db, migrate
from autospec.store.codec import unpack_ids
from autospec.store.models import Request
from autospec.store.privacy import no_redaction
from autospec.store.spill import PATTERN, SpillFile, claim_orphans
from autospec.store.traffic import RequestRecord, write_requests
from autospec.store.writer import TrafficWriter

from .helpers import count_rows, record_fields, uid_counts


def _writer(engine, tmp_path: Path, **kw) -> TrafficWriter:  # type: ignore[no-untyped-def]
    kw.setdefault("flush_interval_s", 0.01)
    kw.setdefault("backoff_initial_s", 0.05)
    kw.setdefault("backoff_max_s", 0.2)
    return TrafficWriter(engine, spill_dir=tmp_path / "spill", **kw)


def test_rows_arrive_intact(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with _writer(engine, tmp_path, batch_size=64) as writer:
        for i in range(300):
            writer.record(**record_fields(i, prompt_ids=[i, -1, 2**31 - 1]))
        writer.record(RequestRecord(prompt_ids=[7], output_ids=[8], request_uid="obj"))
        assert writer.flush(10)
        c = writer.counters
    assert (c.written, c.spilled, c.dropped, c.queued) == (301, 0, 0, 0)
    with db.session_scope(engine, readonly=True) as s:
        row = s.scalars(select(Request).where(Request.request_uid == "req-5")).one()
        assert unpack_ids(row.prompt_ids) == [5, -1, 2**31 - 1]
        assert row.accepted_per_position == [3, 2, 1]
        assert (row.prompt_tokens, row.output_tokens) == (3, 3)
        assert row.created_at.tzinfo is not None
    assert count_rows(engine) == 301


def test_record_is_fast(sqlite_url: str, tmp_path: Path) -> None:
    engine = db.make_engine(sqlite_url)
    migrate.upgrade(engine)
    fields = record_fields(0)
    fields.pop("request_uid")
    times = []
    with _writer(engine, tmp_path, max_queue=50_000) as writer:
        for _ in range(5000):
            t = time.perf_counter()
            writer.record(**fields)
            times.append(time.perf_counter() - t)
    times.sort()
    assert times[len(times) // 2] < 50e-6  # the bench measures the real figure; this is a guard
    assert count_rows(engine) == 5000


def test_opt_out_keeps_statistics_only(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with _writer(engine, tmp_path) as writer:
        writer.record(**record_fields(1, opted_out=True))
    with db.session_scope(engine, readonly=True) as s:
        row = s.scalars(select(Request)).one()
    assert row.opted_out
    assert (row.prompt_text, row.output_text, row.prompt_ids, row.output_ids) == (None,) * 4
    assert (row.prompt_tokens, row.output_tokens) == (4, 3)
    assert (row.num_drafts, row.num_accepted_tokens, row.accepted_per_position) == (4, 6, [3, 2, 1])


def test_nul_in_client_text_is_stored_replaced_not_dropped(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A NUL in the prompt, output, segment or a stop string: the row and its statistics are
    stored (PostgreSQL refused the whole row), the NUL as U+FFFD on both backends."""
    sampling = {"stop": ["end\x00", "x"], "max_tokens": 8}
    with _writer(engine, tmp_path) as writer:
        writer.record(**record_fields(1, prompt_text="a\x00b", output_text="\x00",
                                      segment="s\x00", sampling=sampling))
        assert writer.flush(10)
        c = writer.counters
    assert (c.written, c.dropped) == (1, 0)
    with db.session_scope(engine, readonly=True) as s:
        row = s.scalars(select(Request)).one()
    assert (row.prompt_text, row.output_text, row.segment) == ("a\ufffdb", "\ufffd", "s\ufffd")
    assert row.sampling == {"stop": ["end\ufffd", "x"], "max_tokens": 8}
    assert (row.num_accepted_tokens, unpack_ids(row.prompt_ids)) == (6, [1, 2, 3, 1])


def test_redaction_before_writing(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    secret = "my key is sk-live-abcdefghijklmnop123456, mail bob@example.com"
    with _writer(engine, tmp_path) as writer:
        writer.record(**record_fields(1, prompt_text=secret))
        writer.record(**record_fields(2, output_text="AKIAIOSFODNN7EXAMPLE"))
        writer.record(**record_fields(3))
    with db.session_scope(engine, readonly=True) as s:
        rows = {r.request_uid: r for r in s.scalars(select(Request))}
    one = rows["req-1"]
    assert one.prompt_text == "my key is [SECRET], mail [EMAIL]"
    assert one.redacted and one.prompt_ids is None  # ids would still encode the secret
    assert one.output_ids is not None  # the clean output keeps its ids
    assert rows["req-2"].output_text == "[SECRET]" and rows["req-2"].output_ids is None
    assert not rows["req-3"].redacted and rows["req-3"].prompt_ids is not None


def test_custom_and_disabled_redaction(sqlite_url: str, tmp_path: Path) -> None:
    engine = db.make_engine(sqlite_url)
    migrate.upgrade(engine)
    write_requests(engine, [RequestRecord(prompt_text="a@b.example", request_uid="raw")],
                   redact=no_redaction)
    write_requests(engine, [RequestRecord(prompt_text="tell me", request_uid="up")],
                   redact=str.upper)
    with db.session_scope(engine, readonly=True) as s:
        texts = dict(s.execute(select(Request.request_uid, Request.prompt_text)).all())
    assert texts == {"raw": "a@b.example", "up": "TELL ME"}


def test_bad_rows_are_dropped_and_counted(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with _writer(engine, tmp_path) as writer:
        with pytest.raises(TypeError):
            writer.record(not_a_field=1)
        writer.record(**record_fields(1, prompt_ids=[2**40]))  # not int32
        writer.record(**record_fields(2, num_drafts=-1))
        writer.record(**record_fields(3, sampling={"fn": object()}))  # not JSON
        writer.record(**record_fields(4, segment="x" * 500))  # too long for PostgreSQL only
        writer.record(**record_fields(5))
        assert writer.flush(10)
        c = writer.counters
    stored = count_rows(engine)
    assert c.dropped + stored == 5 and stored >= 1
    assert c.spilled == 0


def test_queue_overflow_spills_and_keeps_every_row(sqlite_url: str, tmp_path: Path) -> None:
    engine = db.make_engine(sqlite_url)
    migrate.upgrade(engine)
    with _writer(engine, tmp_path, max_queue=10, batch_size=5) as writer:
        for i in range(500):
            writer.record(**record_fields(i))
        assert writer.flush(10)
    c = writer.counters
    assert c.spilled > 0 and c.dropped == 0
    assert uid_counts(engine) == (500, 500)
    assert not list((tmp_path / "spill").glob(PATTERN))


def test_sqlite_outage_spills_then_replays_once(sqlite_url: str, tmp_path: Path) -> None:
    engine = db.make_engine(sqlite_url, busy_timeout_s=0.05)
    migrate.upgrade(engine)
    path = make_url(sqlite_url).database
    with _writer(engine, tmp_path, batch_size=20) as writer:
        for i in range(100):
            writer.record(**record_fields(i))
        assert writer.flush(10)
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")  # the database is now unwritable for everyone else
        for i in range(100, 300):
            writer.record(**record_fields(i))
        assert writer.flush(10)
        assert writer.counters.spilled > 0 and not writer.counters.database_up
        assert count_rows(engine) == 100
        blocker.rollback()
        blocker.close()
        for i in range(300, 400):
            writer.record(**record_fields(i))
        _wait(lambda: writer.flush(1) and writer.counters.replayed == writer.counters.spilled)
        c = writer.counters
    assert c.written + c.replayed == 400 and c.dropped == 0
    assert uid_counts(engine) == (400, 400)
    assert not list((tmp_path / "spill").glob(PATTERN))


@pytest.mark.postgres
def test_postgres_outage_spills_then_replays_once(postgres_url: str, tmp_path: Path) -> None:
    engine = db.make_engine(postgres_url)
    migrate.upgrade(engine)
    name = make_url(postgres_url).database
    admin = db.make_engine(make_url(postgres_url).set(database="postgres")).execution_options(
        isolation_level="AUTOCOMMIT")
    with _writer(engine, tmp_path, batch_size=20) as writer:
        for i in range(100):
            writer.record(**record_fields(i))
        assert writer.flush(10)
        with admin.connect() as conn:  # take the database away mid-stream
            conn.execute(text(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false'))
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = :n AND pid <> pg_backend_pid()"), {"n": name})
        for i in range(100, 300):
            writer.record(**record_fields(i))
        assert writer.flush(20)
        assert writer.counters.spilled > 0 and not writer.counters.database_up
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true'))
        for i in range(300, 400):
            writer.record(**record_fields(i))
        _wait(lambda: writer.flush(1) and writer.counters.replayed == writer.counters.spilled)
        c = writer.counters
    admin.dispose()
    assert c.written + c.replayed == 400 and c.dropped == 0
    assert uid_counts(engine) == (400, 400)
    engine.dispose()


def test_replaying_an_already_stored_row_stores_it_once(sqlite_url: str, tmp_path: Path) -> None:
    """A batch that committed but whose acknowledgement was lost is spilled and replayed."""
    engine = db.make_engine(sqlite_url)
    migrate.upgrade(engine)
    write_requests(engine, [RequestRecord(**record_fields(i)) for i in range(10)])
    with _writer(engine, tmp_path) as writer:
        writer._spill.append([_prepared(i) for i in range(5, 15)])  # 5..9 already stored
        writer._check_orphans = True
        _wait(lambda: writer.counters.replayed == 10)
    assert uid_counts(engine) == (15, 15)


def _prepared(i: int) -> dict:  # type: ignore[type-arg]
    from autospec.store.traffic import prepare_row

    return prepare_row(RequestRecord(**record_fields(i)))


def test_spill_of_a_dead_process_is_adopted(sqlite_url: str, tmp_path: Path) -> None:
    """A process that spilled and died (no close) leaves a file; the next writer replays it."""
    engine = db.make_engine(sqlite_url)
    migrate.upgrade(engine)
    spill = tmp_path / "spill"
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from helpers import record_fields
        from autospec.store import db
        from autospec.store.writer import TrafficWriter
        engine = db.make_engine("postgresql+psycopg://nobody@127.0.0.1:1/none",
                                connect_timeout_s=1)
        w = TrafficWriter(engine, spill_dir={str(spill)!r}, flush_interval_s=0.01)
        for i in range(50):
            w.record(**record_fields(i))
        w.flush(30)
        assert w.counters.spilled == 50, w.counters
        os._exit(0)  # die without close()
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert len(list(spill.glob(PATTERN))) == 1
    with _writer(engine, tmp_path) as writer:
        _wait(lambda: writer.counters.replayed == 50)
    assert uid_counts(engine) == (50, 50)
    assert not list(spill.glob(PATTERN))


def test_close_flushes_and_refuses_more(sqlite_url: str, tmp_path: Path) -> None:
    engine = db.make_engine(sqlite_url)
    migrate.upgrade(engine)
    writer = _writer(engine, tmp_path, flush_interval_s=5.0)
    for i in range(50):
        writer.record(**record_fields(i))
    writer.close()
    assert count_rows(engine) == 50
    with pytest.raises(RuntimeError):
        writer.record(**record_fields(99))


def test_prometheus_counters(sqlite_url: str, tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from autospec.store.writer import register_prometheus

    engine = db.make_engine(sqlite_url)
    migrate.upgrade(engine)
    registry = CollectorRegistry()
    with _writer(engine, tmp_path) as writer:
        register_prometheus(writer, registry)
        writer.record(**record_fields(1))
        writer.flush()
        exposed = generate_latest(registry).decode()
    assert 'autospec_traffic_rows_total{outcome="written"} 1.0' in exposed


def _wait(condition, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_sqlite_fast_path_matches_sqlalchemy(sqlite_url: str) -> None:
    """The SQLite executemany hot path stores exactly what SQLAlchemy's types would."""
    from datetime import datetime, timedelta, timezone

    from autospec.store.traffic import insert_statement, prepare_row

    engine = db.make_engine(sqlite_url)
    migrate.upgrade(engine)
    when = datetime(2026, 5, 1, 12, 0, 0, tzinfo=timezone(timedelta(hours=2)))  # not UTC
    fast = prepare_row(RequestRecord(**record_fields(1, created_at=when,
                                                     sampling={"top_p": 0.9})))
    slow = dict(fast, request_uid="slow")
    write = db.writer_engine(engine)
    with write.begin() as conn:
        from autospec.store.traffic import insert_rows

        insert_rows(conn, [fast])
        conn.execute(insert_statement("sqlite"), [slow])
    with engine.connect() as conn:
        raw = conn.execute(text("SELECT * FROM requests ORDER BY request_uid")).all()
    a, b = (dict(r._mapping) for r in raw)
    assert {k: v for k, v in a.items() if k not in ("id", "request_uid")} == {
        k: v for k, v in b.items() if k not in ("id", "request_uid")}
    with db.session_scope(engine, readonly=True) as s:
        row = s.scalars(select(Request).where(Request.request_uid == fast["request_uid"])).one()
    assert row.created_at == when and row.sampling == {"top_p": 0.9}


def test_a_writers_own_new_spill_file_is_never_adopted_as_an_orphan(tmp_path: Path) -> None:
    """Between ``append`` creating its file and locking it, a replay on another thread saw
    an unlocked file, adopted it, and the append failed ("locked by another process"):
    rows were dropped under load. The live file is excluded from adoption."""
    spill = SpillFile(tmp_path)
    spill.path.touch()  # append has opened (created) the file, not locked it yet
    orphan = tmp_path / "traffic-gone-1-deadbeef.jsonl"
    orphan.write_text("")
    claimed = list(claim_orphans(tmp_path, own=spill.path))
    assert [p for p, _ in claimed] == [orphan]
    for _, fh in claimed:
        fh.close()
    spill.append([])  # the live file is still this writer's to lock
    assert spill.pending
    spill.close()


def _dead_spill_file(tmp_path: Path, rows: int) -> tuple[Path, Any]:
    """A dead writer's spill file of ``rows`` rows in a folder of its own, claimed: its path
    and its open, locked handle."""
    dead = SpillFile(tmp_path / "dead")
    dead.append([_prepared(i) for i in range(rows)])
    dead.close()
    return next(claim_orphans(tmp_path / "dead", own=tmp_path / "none.jsonl"))


def _store_once_then_fail(writer: TrafficWriter, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's first insert goes through; every later one finds the database down."""
    from sqlalchemy.exc import OperationalError

    real, calls = writer._try_insert, []

    def insert_then_fail(rows):  # type: ignore[no-untyped-def]
        calls.append(len(rows))
        down = OperationalError("INSERT", {}, OSError("down"))
        return real(rows) if len(calls) == 1 else down

    monkeypatch.setattr(writer, "_try_insert", insert_then_fail)


def test_a_replay_that_stops_part_way_keeps_every_unstored_row_through_a_crash(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay stored the file's first batch, then the database went; keeping the rest
    must not first empty the file: a crash while the rest is written (here: its rows fail
    to serialise) leaves every row that is not stored on disk, replayed once later."""
    from autospec.store import spill as spill_module
    from autospec.store import writer as writer_module

    engine = db.make_engine(sqlite_url)
    migrate.upgrade(engine)
    path, fh = _dead_spill_file(tmp_path, 10)

    def crash(row):  # type: ignore[no-untyped-def]
        raise RuntimeError("killed while keeping the rest")

    with _writer(engine, tmp_path, batch_size=4) as writer:
        _store_once_then_fail(writer, monkeypatch)
        for module in (spill_module, writer_module):
            monkeypatch.setattr(module, "row_to_json", crash, raising=False)
        with pytest.raises(RuntimeError, match="killed"):
            writer._replay_file(path, fh)
    monkeypatch.undo()
    assert uid_counts(engine) == (4, 4)  # the first batch
    with path.open() as kept:
        assert len(spill_module.read_rows(kept, path)[0]) == 10  # nothing truncated
    with _writer(engine, tmp_path) as writer:  # the next writer adopts the file: once each
        for orphan, handle in claim_orphans(tmp_path / "dead", own=tmp_path / "none.jsonl"):
            assert writer._replay_file(orphan, handle)
    assert uid_counts(engine) == (10, 10)
    engine.dispose()


def test_a_spill_file_that_cannot_be_shortened_stays_whole_and_is_retried(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk while a part-way replay keeps the rest: no scratch file is left, the
    spill file stays whole, the writer says it will try again (False), nothing raises."""
    from autospec.store import spill as spill_module

    engine = db.make_engine(sqlite_url)
    migrate.upgrade(engine)
    path, fh = _dead_spill_file(tmp_path, 6)
    real_fsync = spill_module.os.fsync

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    with _writer(engine, tmp_path, batch_size=4) as writer:
        _store_once_then_fail(writer, monkeypatch)
        monkeypatch.setattr(spill_module.os, "fsync", full)
        assert writer._replay_file(path, fh) is False
        monkeypatch.setattr(spill_module.os, "fsync", real_fsync)
    assert sorted(p.name for p in (tmp_path / "dead").iterdir()) == [path.name]
    with path.open() as kept:
        assert len(spill_module.read_rows(kept, path)[0]) == 6
    engine.dispose()
