"""The ledger's store queries (SQLite and PostgreSQL: the ``engine`` fixture) and the
ledger read through them end to end, with ``autospec ledger --json`` and ``status --json``
over the same rows."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import update
from typer.testing import CliRunner

from autospec import store
from autospec.cli import app
from autospec.ledger import collect_ledger
from autospec.store.ledger import cycle_notes, decode_rows, target_rates
from autospec.store.models import Evaluation

NOW = datetime.now(timezone.utc).replace(microsecond=0)
SINCE = NOW - timedelta(hours=1)


def _row(segment: str, *, tokens: int, latency_ms: float, ttft_ms: float, at: datetime,
         deployment: str = "default", concurrency: float | None = None) -> store.RequestRecord:
    return store.RequestRecord(
        segment=segment, deployment=deployment, speculator_version="v1", output_tokens=tokens,
        latency_ms=latency_ms, ttft_ms=ttft_ms, created_at=at, opted_out=True,
        sampling={"concurrency": concurrency} if concurrency is not None else None)


def _traffic(engine) -> None:  # type: ignore[no-untyped-def]
    at = SINCE + timedelta(minutes=5)
    store.write_requests(engine, [
        _row("a", tokens=31, latency_ms=1100, ttft_ms=100, at=at, concurrency=2.0),
        _row("a", tokens=1, latency_ms=900, ttft_ms=100, at=at),  # one token: no decode
        _row("b", tokens=11, latency_ms=600, ttft_ms=100, at=at),
        _row("b", tokens=11, latency_ms=100, ttft_ms=100, at=at),  # latency = TTFT: untimed
        _row("a", tokens=11, latency_ms=600, ttft_ms=100, at=SINCE - timedelta(minutes=1)),
        _row("a", tokens=11, latency_ms=600, ttft_ms=100, at=at, deployment="other"),
    ])


def _evaluation(engine, at: datetime, speed: dict | None) -> int:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as session:
        row = store.record_evaluation(session, candidate="builtin-ngram",
                                      incumbent="builtin-ngram", decision="reject",
                                      per_segment={"speed": speed})
        session.flush()
        session.execute(update(Evaluation).where(Evaluation.id == row.id).values(created_at=at))
        return int(row.id)


def _cycle(engine, cycle_id: str, start: datetime, end: datetime, evaluations: list[int],  # type: ignore[no-untyped-def]
           stages: dict | None) -> None:
    with store.session_scope(engine) as session:
        for t, details in ((start, {"type": "cycle_start", "cycle_id": cycle_id}),
                           (end, {"type": "cycle", "cycle_id": cycle_id, "outcome": "rejected",
                                  "evaluations": evaluations, "stages": stages})):
            event = store.record_event(session, kind="note", actor="test", deployment="default",
                                       details=details)
            event.created_at = t
        store.record_event(session, kind="note", actor="test", deployment="default",
                           details={"type": "canary"})


def _seed(engine) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    _traffic(engine)
    old = _evaluation(engine, SINCE - timedelta(hours=3),
                      {"tokens_per_s": {"target-only": 8.0, "v1": 20.0}, "engine": "native"})
    new = _evaluation(engine, SINCE + timedelta(minutes=30),
                      {"tokens_per_s": {"target-only": 12.0}, "engine": "native"})
    unmeasured = _evaluation(engine, SINCE + timedelta(minutes=31), None)
    _cycle(engine, "c0", SINCE - timedelta(hours=3, minutes=1), SINCE - timedelta(hours=3),
           [old], None)
    _cycle(engine, "c1", SINCE + timedelta(minutes=20), SINCE + timedelta(minutes=30, seconds=40),
           [new, unmeasured], {"features": 5.0, "training": 300.0, "shadow": 100.0,
                               "speed": 200.0})
    return old, new


def test_decode_rows_keep_the_timed_requests_of_the_deployment_and_period(engine) -> None:
    _traffic(engine)
    with store.session_scope(engine, readonly=True) as session:
        rows = decode_rows(session, deployment="default", since=SINCE, until=NOW)
    assert sorted((r.segment, r.tokens, r.seconds, r.concurrency) for r in rows) == [
        ("a", 30, 1.0, 2.0), ("b", 10, 0.5, None)]


def test_target_rates_read_the_speed_records_oldest_first(engine) -> None:
    old, new = _seed(engine)
    with store.session_scope(engine, readonly=True) as session:
        rates = target_rates(session, evaluation_ids=[new, old, 999])
        assert target_rates(session, evaluation_ids=[]) == []
    assert [(r.evaluation_id, r.tokens_per_s, r.engine, r.concurrency) for r in rates] == [
        (old, 8.0, "native", 1), (new, 12.0, "native", 1)]


def test_cycle_notes_are_the_cycle_notes_in_the_period(engine) -> None:
    _seed(engine)
    with store.session_scope(engine, readonly=True) as session:
        notes = cycle_notes(session, deployment="default", since=SINCE, until=NOW)
        everything = cycle_notes(session, deployment="default", since=None, until=NOW)
    assert [(d["type"], d["cycle_id"]) for _, d in notes] == [("cycle_start", "c1"),
                                                              ("cycle", "c1")]
    assert len(everything) == 4


def test_the_ledger_of_a_period_from_the_store(engine) -> None:
    old, new = _seed(engine)
    with store.session_scope(engine, readonly=True) as session:
        ledger = collect_ledger(session, deployment="default", since=SINCE, until=NOW)
    # R: the median of 8 and 12 tokens/s; a decoded 30 tokens in 1 s, b 10 in 0.5 s
    assert ledger["target_only"]["tokens_per_s"] == 10.0
    assert ledger["target_only"]["evaluations"] == [old, new]
    total = ledger["total"]
    assert (total["requests"], total["tokens"], total["decode_s"]) == (2, 40, 1.5)
    assert total["saved_s"] == pytest.approx(40 / 10 - 1.5)
    assert ledger["loop"]["cycles"] == 1 and ledger["loop"]["seconds"] == 640.0
    assert ledger["loop"]["stages"]["other"] == pytest.approx(35.0)
    assert total["net_s"] == pytest.approx(2.5 - 640) and ledger["pays"] is False
    a, b = ledger["segments"]
    assert (a["segment"], a["saved_s"], a["loop_s"]) == ("a", pytest.approx(2.0), 480.0)
    assert (b["segment"], b["saved_s"], b["loop_s"]) == ("b", pytest.approx(0.5), 160.0)


def test_ledger_and_status_json(engine, db_url, monkeypatch) -> None:
    monkeypatch.setenv("AUTOSPEC_DATABASE_URL", db_url)
    _seed(engine)
    runner = CliRunner()
    until = NOW.isoformat()
    out = runner.invoke(app, ["ledger", "--period", "1h", "--until", until, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["deployment"] == "default" and data["total"]["tokens"] == 40
    table = runner.invoke(app, ["ledger", "--period", "1h", "--until", until])
    assert table.exit_code == 0 and "paid for itself: no" in " ".join(table.stdout.split())
    other = json.loads(runner.invoke(app, ["ledger", "--deployment", "other", "--json",
                                           "--period", "1h", "--until", until]).stdout)
    assert other["total"]["requests"] == 1 and other["target_only"] is None
    assert other["note"].startswith("no target-only rate measured")
    bad = runner.invoke(app, ["ledger", "--period", "soon"])
    assert bad.exit_code == 2 and "not a duration" in bad.output
    bad_until = runner.invoke(app, ["ledger", "--until", "yesterday"])
    assert bad_until.exit_code == 2 and "not an ISO time" in bad_until.output
    status = json.loads(runner.invoke(app, ["status", "--json", "--period", "7d"]).stdout)
    assert status["ledger"]["period_s"] == 7 * 86400
    assert status["ledger"]["total"]["tokens"] == 50  # the row before the hour counts too
