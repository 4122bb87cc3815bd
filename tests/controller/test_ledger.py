"""The ledger's arithmetic (pure functions over rows the store would hand back), the cycle's
stage timer, and the ledger drawn: in a table, in the demo's markdown, as Prometheus
gauges."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import ClassVar

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from autospec.controller.ledger_view import ledger_markdown, summary
from autospec.controller.timings import StageTimer
from autospec.ledger import (
    HOLDOUT_MIN_REQUESTS,
    RATE_EVALUATIONS,
    Loop,
    account,
    holdout_rate,
    loop_cost,
    pick_rate,
    replica_seconds,
    settle,
    tally,
)
from autospec.store.ledger import DecodeRow, TargetRate

T = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _rate(i: int, tps: float, minutes: int, engine: str = "native") -> TargetRate:
    return TargetRate(evaluation_id=i, created_at=T + timedelta(minutes=minutes),
                      tokens_per_s=tps, engine=engine, concurrency=1 if engine == "native" else 4)


def _rows() -> list[DecodeRow]:
    return [DecodeRow("a", "v", 20, 0.5, None), DecodeRow("a", "v", 10, 0.5, None),
            DecodeRow("b", "v", 10, 0.5, None)]


def test_the_rate_is_the_median_of_the_newest_before_the_end_else_the_first_after() -> None:
    rates = [_rate(i, float(i), i) for i in range(1, 9)]
    chosen = pick_rate(rates, T + timedelta(minutes=7, seconds=30))
    assert chosen is not None and chosen.evaluations == [3, 4, 5, 6, 7]
    assert len(chosen.evaluations) == RATE_EVALUATIONS and chosen.tokens_per_s == 5.0
    after = pick_rate(rates, T)
    assert after is not None and after.evaluations == [1] and after.tokens_per_s == 1.0
    assert pick_rate([], T) is None


def test_vllm_rows_count_their_share_of_the_replica() -> None:
    row = DecodeRow("a", "v", 10, 2.0, 4.0)
    assert replica_seconds(row, "native") == 2.0
    assert replica_seconds(row, "vllm") == 0.5
    assert replica_seconds(DecodeRow("a", "v", 10, 2.0, None), "vllm") == 2.0
    assert replica_seconds(DecodeRow("a", "v", 10, 2.0, 0.5), "vllm") == 2.0  # never inflated


def test_saved_is_tokens_over_the_target_only_rate_minus_decode_time() -> None:
    rate = pick_rate([_rate(1, 10.0, 0)], T + timedelta(hours=1))
    total, (a, b) = tally(_rows(), rate)
    assert (total.requests, total.tokens, total.decode_s) == (3, 40, 1.5)
    assert (a.baseline_s, a.saved_s) == (3.0, 2.0)  # 30 tokens at 10/s, decoded in 1 s
    assert (b.baseline_s, b.saved_s) == (1.0, 0.5)
    loop = Loop(cycles=1, seconds=2.0)
    settle(total, [a, b], loop)
    assert (a.loop_s, b.loop_s, total.loop_s) == (1.5, 0.5, 2.0)  # shares of the tokens
    assert (a.net_s, b.net_s, total.net_s) == (0.5, 0.0, 0.5)


def test_without_a_rate_nothing_is_saved_or_netted() -> None:
    total, lines = tally(_rows(), None)
    settle(total, lines, Loop(cycles=1, seconds=2.0))
    assert total.saved_s is None and total.net_s is None and total.loop_s == 2.0
    ledger = account(_rows(), [], [], since=T, until=T + timedelta(hours=1))
    assert ledger["pays"] is None and "no target-only rate" in ledger["note"]


def _held(n: int, tokens: int = 10, seconds: float = 2.0) -> list[DecodeRow]:
    return [DecodeRow("a", "off", tokens, seconds, None, holdout=True) for _ in range(n)]


def test_held_out_requests_of_the_period_give_r_where_there_are_enough() -> None:
    """R is the held-out rows' rate (5 tokens/s), not the gate's 10, once the period holds
    HOLDOUT_MIN_REQUESTS of them; they stay in the tally and save nothing."""
    gate = [_rate(7, 10.0, 0)]
    rows = _rows() + _held(HOLDOUT_MIN_REQUESTS)
    rate = holdout_rate(rows)
    assert rate is not None and rate.source == "holdout" and rate.tokens_per_s == 5.0
    assert rate.requests == HOLDOUT_MIN_REQUESTS and rate.evaluations == []
    ledger = account(rows, gate, [], since=T, until=T + timedelta(hours=1))
    assert ledger["target_only"]["source"] == "holdout"
    assert ledger["holdout"]["requests"] == HOLDOUT_MIN_REQUESTS
    total = ledger["total"]
    # 40 speculative tokens at 5/s = 8 s, decoded in 1.5 s; the held-out rows: 0 saved
    assert total["saved_s"] == pytest.approx(8.0 - 1.5)
    assert "10 held-out requests of the period" in summary({"deployment": "d", **ledger})
    fewer = _rows() + _held(HOLDOUT_MIN_REQUESTS - 1)
    assert holdout_rate(fewer) is None
    kept = account(fewer, gate, [], since=T, until=T + timedelta(hours=1))
    assert kept["target_only"]["source"] == "gate" and kept["target_only"]["tokens_per_s"] == 10
    assert holdout_rate(_held(HOLDOUT_MIN_REQUESTS, seconds=0.0)) is None


def test_the_loop_is_the_cycles_that_ended_in_the_period() -> None:
    since = T + timedelta(minutes=10)
    notes = [
        (T, {"type": "cycle_start", "cycle_id": "old"}),
        (T + timedelta(minutes=5), {"type": "cycle", "cycle_id": "old"}),
        (T + timedelta(minutes=8), {"type": "cycle_start", "cycle_id": "across"}),
        (T + timedelta(minutes=12), {"type": "cycle", "cycle_id": "across",
                                     "stages": {"training": 100.0, "speed": 40.0}}),
        (T + timedelta(minutes=20), {"type": "cycle_start", "cycle_id": "running"}),
        (T + timedelta(minutes=21), {"type": "cycle", "cycle_id": "orphan"}),
    ]
    loop = loop_cost(notes, since)
    assert loop.cycles == 1 and loop.seconds == 240.0
    assert loop.stages == {"features": 0.0, "training": 100.0, "shadow": 0.0, "speed": 40.0,
                           "other": 100.0}


def test_a_cycle_counts_once_and_an_interrupted_ones_downtime_not_at_all() -> None:
    """A controller stopped mid-cycle and restarted 10 h later closes its cycle
    ``interrupted``: the 10 h are downtime, not the loop's work. A cycle that ended itself
    (``failed``, the lease lost) and was closed again by another's recovery counts once."""
    notes = [
        (T, {"type": "cycle_start", "cycle_id": "died"}),
        (T + timedelta(hours=10), {"type": "cycle", "cycle_id": "died",
                                   "outcome": "interrupted"}),
        (T + timedelta(hours=10), {"type": "cycle_start", "cycle_id": "lost"}),
        (T + timedelta(hours=10, seconds=60), {"type": "cycle", "cycle_id": "lost",
                                               "outcome": "failed"}),
        (T + timedelta(hours=11), {"type": "cycle", "cycle_id": "lost",
                                   "outcome": "interrupted"}),
    ]
    loop = loop_cost(notes, T)
    assert (loop.cycles, loop.seconds, loop.interrupted) == (1, 60.0, 1)


class _Clock:
    """A scripted ``perf_counter``: stage times are exact, whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_stage_timer_splits_features_and_speed_out(monkeypatch) -> None:
    from autospec.controller import timings

    class Outcome:
        metrics: ClassVar[dict] = {"feature_s": 0.01}

    clock = _Clock()
    monkeypatch.setattr(timings, "time", clock)
    timer = StageTimer()
    with timer.training() as lap:
        clock.sleep(0.03)
        assert lap.done(Outcome) is Outcome
    with timer.evaluation() as marks:
        clock.sleep(0.02)
        marks.replay(1, 1)
        clock.sleep(0.04)
        marks.speed(1, 1)
    with timer.evaluation():  # a failed evaluation: all shadow, no speed
        clock.sleep(0.01)
    s = timer.seconds
    assert s["features"] == pytest.approx(0.01)
    assert s["training"] == pytest.approx(0.02) and s["speed"] == pytest.approx(0.04)
    assert s["shadow"] == pytest.approx(0.03)
    assert set(timer.as_dict()) == {"features", "training", "shadow", "speed"}


def _ledger() -> dict:
    notes = [(T, {"type": "cycle_start", "cycle_id": "c"}),
             (T + timedelta(seconds=1), {"type": "cycle", "cycle_id": "c",
                                         "stages": {"training": 0.5}})]
    return {"deployment": "default", **account(_rows(), [_rate(7, 10.0, 0)], notes, since=T,
                                               until=T + timedelta(hours=2))}


def test_the_ledger_in_words_and_markdown() -> None:
    ledger = _ledger()
    text = summary(ledger)
    end = (T + timedelta(hours=2)).astimezone(timezone.utc)
    assert f"2 h to {end:%Y-%m-%d %H:%M} UTC" in text  # a period that ended in the past
    assert "10.0 tokens/s" in text and "#7" in text
    assert "1 cycle," in text and "paid for itself: yes" in text
    lines = ledger_markdown(ledger)
    assert lines[1].startswith("## Ledger")
    assert lines[-1].startswith("| (all) | 3 | 40 | 1.5 | 4.0 | 2.5 | 1.0 | 1.5 |")
    assert ledger_markdown(None) == []


def test_a_period_that_ends_now_is_the_last_of_it_and_its_json_form_reads_alike() -> None:
    """``autospec ledger --until`` said "last 10.0 min" of a window that ended hours ago."""
    from autospec.controller.ledger_view import window_text

    now = datetime.now(timezone.utc)
    assert window_text({"until": now, "period_s": 7200.0}) == "last 2 h"
    assert window_text({"until": now.isoformat(), "period_s": 600.0}) == "last 10.0 min"
    past = datetime(2026, 12, 7, 6, 0, tzinfo=timezone.utc)
    assert window_text({"until": past.isoformat(), "period_s": 600.0}) == (
        "10.0 min to 2026-12-07 06:00 UTC")
    future = datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert window_text({"until": future, "period_s": 86400.0}) == (
        "24 h to 2030-01-01 00:00 UTC")


def test_a_period_under_an_hour_reads_in_minutes() -> None:
    """The demo's ledger read "last 0.312904 h"."""
    from autospec.controller.ledger_view import period_text

    assert period_text(0.312904 * 3600) == "18.8 min"
    assert period_text(2 * 3600) == "2 h" and period_text(24 * 3600) == "24 h"
    assert period_text(36.4 * 3600) == "36.4 h" and period_text(59 * 60) == "59.0 min"


def test_the_ledger_as_prometheus_gauges(monkeypatch) -> None:
    from autospec.serve import metrics_ledger

    calls = []

    def fake_ledger_for(db, *, deployment, period):  # type: ignore[no-untyped-def]
        calls.append((db, deployment, period))
        return _ledger()

    monkeypatch.setattr("autospec.ledger.ledger_for", fake_ledger_for)
    registry = CollectorRegistry()
    metrics_ledger.register_ledger(registry, "db", deployment="default")
    text = generate_latest(registry).decode()
    generate_latest(registry)
    assert len(calls) == 1  # cached for REFRESH_S
    assert 'autospec:ledger_saved_seconds{segment="(all)"} 2.5' in text
    assert 'autospec:ledger_net_seconds{segment="a"}' in text
    assert "autospec:ledger_target_only_tokens_per_second 10.0" in text
    assert "autospec:ledger_period_seconds 7200.0" in text
    assert "autospec:ledger_holdout_requests 0.0" in text  # R is the gate's


def test_the_gauges_from_a_real_store_leave_out_what_is_not_known(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from autospec import store
    from autospec.serve.metrics_ledger import register_ledger

    engine = store.open_store(f"sqlite:///{tmp_path / 'a.db'}", upgrade=True)
    registry = CollectorRegistry()
    register_ledger(registry, engine, deployment="default")
    text = generate_latest(registry).decode()
    assert "autospec:ledger_period_seconds 86400.0" in text
    assert 'autospec:ledger_decode_seconds{segment="(all)"} 0.0' in text
    assert "autospec:ledger_saved_seconds{" not in text  # no target-only rate measured
    assert "autospec:ledger_target_only_tokens_per_second" not in text
