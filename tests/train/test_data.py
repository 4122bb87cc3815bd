"""Traffic windows -> training sequences: split by time, opt-outs, anchors, bad windows."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from autospec import store
from autospec.train.data import WindowSpec, load_training_data, parse_window
from autospec.train.errors import EmptyWindow, TrainingInputError, WindowTooSmall

from .conftest import T0, log_traffic


def test_parse_window_count_duration_and_both() -> None:
    now = datetime(2026, 1, 2, tzinfo=timezone.utc)
    assert parse_window("500").limit == 500 and parse_window("500").since is None
    assert parse_window("24h", now=now).since == now - timedelta(hours=24)
    both = parse_window("7d:300", now=now)
    assert both.limit == 300 and both.since == now - timedelta(days=7)
    for bad in ("yesterday", "7x", "0", "7d:zero"):
        with pytest.raises(TrainingInputError, match="window"):
            parse_window(bad)


def test_window_tiny_random_init_split_newest_held_out_never_trained(db_with_traffic,
                                                                     traffic) -> None:
    with store.session_scope(db_with_traffic) as s:
        data = load_training_data(s, WindowSpec(heldout_fraction=0.2))
    assert len(data.train) == 48 and len(data.heldout) == 12
    # sequences are prompt + output as logged, oldest first; held-out = the newest 12
    assert [s.ids for s in data.train] == [p + o for p, o in traffic[:48]]
    assert [s.ids for s in data.heldout] == [p + o for p, o in traffic[48:]]
    assert all(s.prompt_len == 8 for s in data.train)
    assert data.split_at is not None and data.split_at > max(
        T0 + timedelta(seconds=i) for i in range(48))


def test_window_tiny_random_init_excludes_opted_out(db, traffic) -> None:
    log_traffic(db, traffic[:20])
    log_traffic(db, traffic[20:40], start=T0 + timedelta(minutes=5), opted_out=True)
    with store.session_scope(db) as s:
        data = load_training_data(s, WindowSpec(heldout_fraction=0.1))
    assert len(data.train) + len(data.heldout) == 20


def test_window_tiny_random_init_by_count_and_anchors(db_with_traffic, traffic) -> None:
    with store.session_scope(db_with_traffic) as s:
        data = load_training_data(s, WindowSpec(limit=20, heldout_fraction=0.25,
                                                anchor_requests=10))
    assert len(data.heldout) == 5 and data.anchors == 10
    # anchors: the 10 requests just before the window, first; then the window's train part
    assert [s.ids for s in data.train[:10]] == [p + o for p, o in traffic[30:40]]
    assert [s.ids for s in data.train[10:]] == [p + o for p, o in traffic[40:55]]


def test_window_empty_and_below_policy_minimum_are_clear_errors(db, traffic) -> None:
    with store.session_scope(db) as s, pytest.raises(EmptyWindow, match="no usable request"):
        load_training_data(s, WindowSpec())
    log_traffic(db, traffic[:5], opted_out=True)
    with store.session_scope(db) as s, pytest.raises(EmptyWindow):
        load_training_data(s, WindowSpec())
    log_traffic(db, traffic[5:15], start=T0 + timedelta(hours=1))
    with store.session_scope(db) as s, pytest.raises(WindowTooSmall, match="minimum is 50"):
        load_training_data(s, WindowSpec(), min_requests=50)
