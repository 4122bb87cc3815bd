"""Traffic windows, live τ, counts, retention purge."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from autospec import store
from autospec.store.queries import count_purgeable
from autospec.store.traffic import RequestRecord, write_requests

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def _seed(engine) -> None:  # type: ignore[no-untyped-def]
    records = []
    for i in range(20):
        records.append(RequestRecord(
            request_uid=f"r{i}",
            created_at=T0 + timedelta(minutes=i),
            prompt_ids=[1, 2, i], output_ids=[3, i],
            segment="chat" if i % 2 else "code",
            speculator_version="v1" if i < 10 else "v2",
            opted_out=i in (3, 17),
            temperature=0.0 if i % 4 else 0.7,
            num_drafts=4, num_draft_tokens=12,
            num_accepted_tokens=4 if i < 10 else 8,
            accepted_per_position=[2, 1, 1] if i < 10 else [4, 3, 1],
        ))
    write_requests(engine, records)


def test_traffic_window_holds_out_the_newest(engine) -> None:  # type: ignore[no-untyped-def]
    _seed(engine)
    with store.session_scope(engine, readonly=True) as s:
        w = store.traffic_window(s, since=T0, until=T0 + timedelta(hours=1), heldout_fraction=0.25)
    assert w.total == 18  # 2 opted out
    assert all(e.request_uid not in ("r3", "r17") for e in w.train + w.heldout)
    assert [e.request_uid for e in w.heldout] == ["r14", "r15", "r16", "r18", "r19"]
    assert len(w.train) == 13
    assert max(e.created_at for e in w.train) < min(e.created_at for e in w.heldout) == w.split_at
    assert w.train[0].prompt_ids == [1, 2, 0] and w.train[0].output_ids == [3, 0]
    with store.session_scope(engine, readonly=True) as s:
        greedy = store.traffic_window(s, greedy_only=True, heldout_fraction=0.0)
        newest = store.traffic_window(s, limit=4, heldout_fraction=0.5, segment="chat")
    assert all(e.temperature == 0.0 for e in greedy.train) and greedy.heldout == []
    assert [e.request_uid for e in newest.train] == ["r11", "r13"]
    assert [e.request_uid for e in newest.heldout] == ["r15", "r19"]
    with pytest.raises(store.StoreError):
        store.traffic_window(s, heldout_fraction=1.0)


def test_boundary_ties_go_to_heldout(engine) -> None:  # type: ignore[no-untyped-def]
    same = T0 + timedelta(minutes=5)
    write_requests(engine, [
        RequestRecord(request_uid=f"t{i}", created_at=T0 if i < 2 else same,
                      prompt_ids=[1], output_ids=[2]) for i in range(5)])
    with store.session_scope(engine, readonly=True) as s:
        w = store.traffic_window(s, heldout_fraction=0.2)
    assert len(w.train) == 2 and len(w.heldout) == 3


def test_live_tau_per_version_and_segment(engine) -> None:  # type: ignore[no-untyped-def]
    _seed(engine)
    with store.session_scope(engine, readonly=True) as s:
        per_version = store.live_tau(s, since=T0, with_positions=True)
        per_segment = store.live_tau(s, since=T0, by_segment=True, versions=["v2"])
        late = store.live_tau(s, since=T0 + timedelta(minutes=15))
    v1, v2 = per_version
    assert (v1.version, v1.requests, v1.steps, v1.accepted_tokens) == ("v1", 10, 40, 40)
    assert v1.tau == pytest.approx(2.0)  # (accepted + steps) / steps, bonus included
    assert v2.tau == pytest.approx(3.0)
    assert v2.acceptance_by_position == pytest.approx([40 / 40, 30 / 40, 10 / 30])
    assert [(t.version, t.segment, t.requests) for t in per_segment] == [
        ("v2", "chat", 5), ("v2", "code", 5)]
    assert [(t.version, t.requests) for t in late] == [("v2", 5)]


def test_live_tau_at_full_k_leaves_out_what_a_band_or_another_k_drafted(engine) -> None:  # type: ignore[no-untyped-def]
    def row(i: int, accepted: int, sampling: dict | None) -> RequestRecord:
        return RequestRecord(request_uid=f"b{i}", created_at=T0 + timedelta(seconds=i),
                             segment="chat", speculator_version="v", opted_out=True,
                             num_drafts=4, num_draft_tokens=0 if accepted == 0 else 12,
                             num_accepted_tokens=accepted, sampling=sampling,
                             accepted_per_position=[accepted] if accepted else [])
    write_requests(engine, [row(0, 8, {"k": 3}), row(1, 4, None),  # before rows said so
                            row(2, 0, {"k": 0, "banded": True}),
                            row(3, 0, {"k": 0, "banded": True}), row(4, 8, {"banded": False})])
    with store.session_scope(engine, readonly=True) as s:
        (every,) = store.live_tau(s, since=T0)
        (full,) = store.live_tau(s, since=T0, full_k=True, with_positions=True)
        (segment,) = store.live_tau(s, since=T0, full_k=True, by_segment=True)
        (at_3,) = store.live_tau(s, since=T0, full_k=True, k=3)
        (at_5,) = store.live_tau(s, since=T0, full_k=True, k=5, with_positions=True)
    assert (every.requests, every.tau) == (5, pytest.approx(1 + 20 / 20))
    assert (full.requests, full.tau) == (3, pytest.approx(1 + 20 / 12))
    assert full.acceptance_by_position == pytest.approx([20 / 12])
    assert (segment.segment, segment.requests) == ("chat", 3)
    assert at_3.requests == 3  # rows without a recorded k are kept
    assert (at_5.requests, at_5.tau) == (2, pytest.approx(1 + 12 / 8))  # not the k=3 row
    assert at_5.acceptance_by_position == pytest.approx([12 / 8])


def test_request_counts(engine) -> None:  # type: ignore[no-untyped-def]
    _seed(engine)
    with store.session_scope(engine, readonly=True) as s:
        assert store.request_counts(s) == {None: 20}
        assert store.request_counts(s, include_opted_out=False) == {None: 18}
        assert store.request_counts(s, group_by="version") == {"v1": 10, "v2": 10}
        assert store.request_counts(s, since=T0 + timedelta(minutes=18)) == {None: 2}
        with pytest.raises(store.StoreError):
            store.request_counts(s, group_by="colour")  # type: ignore[arg-type]


def test_purge(engine) -> None:  # type: ignore[no-untyped-def]
    _seed(engine)
    now = T0 + timedelta(days=30, minutes=10)  # rows r0..r9 are older than 30 days
    with store.session_scope(engine, readonly=True) as s:  # what a dry run counts
        assert count_purgeable(s, older_than=timedelta(days=30), text_only=True, now=now) == 9
        assert count_purgeable(s, older_than=timedelta(days=30), now=now) == 10
    with store.session_scope(engine) as s:
        assert store.purge_requests(s, older_than=timedelta(days=30), text_only=True, now=now) == 9
        assert count_purgeable(s, older_than=timedelta(days=30), text_only=True, now=now) == 0
        assert store.purge_requests(s, older_than=timedelta(days=30), now=now) == 10
        with pytest.raises(store.StoreError):
            store.purge_requests(s, older_than=timedelta(0))
    with store.session_scope(engine, readonly=True) as s:
        assert store.request_counts(s) == {None: 10}


def test_text_only_purge_leaves_sampling_as_an_opt_out_would(engine) -> None:  # type: ignore[no-untyped-def]
    """Stop strings, the seed and the user are client text: --text-only dropped the prompt
    and output but kept them. Now the rows keep what an opted-out row keeps (num_stop), also
    rows stripped of their text before (counted, then left alone)."""
    from sqlalchemy import select, update

    from autospec.store.models import Request

    sampling = {"stop": ["secret stop", "END"], "seed": 7, "user": "alice", "max_tokens": 9,
                "top_p": 0.9}
    write_requests(engine, [RequestRecord(
        request_uid=f"s{i}", created_at=T0 + timedelta(minutes=i), prompt_text="p",
        output_text="o", prompt_ids=[1], output_ids=[2], sampling=dict(sampling))
        for i in range(3)] + [RequestRecord(request_uid="new", created_at=T0 + timedelta(days=40),
                                            prompt_text="p", sampling=dict(sampling))])
    with store.session_scope(engine) as s:  # stripped by an older autospec: text gone only
        s.execute(update(Request).where(Request.request_uid == "s2").values(
            prompt_text=None, output_text=None, prompt_ids=None, output_ids=None))
    now, age = T0 + timedelta(days=31), timedelta(days=30)
    with store.session_scope(engine, readonly=True) as s:
        assert count_purgeable(s, older_than=age, text_only=True, now=now) == 3
    with store.session_scope(engine) as s:
        assert store.purge_requests(s, older_than=age, text_only=True, now=now) == 3
        assert count_purgeable(s, older_than=age, text_only=True, now=now) == 0
        assert store.purge_requests(s, older_than=age, text_only=True, now=now) == 0
    with store.session_scope(engine, readonly=True) as s:
        rows = {r.request_uid: r for r in s.scalars(select(Request))}
    for uid in ("s0", "s1", "s2"):
        assert rows[uid].sampling == {"max_tokens": 9, "top_p": 0.9, "num_stop": 2}
        assert (rows[uid].prompt_text, rows[uid].output_ids) == (None, None)
    assert rows["new"].sampling == sampling and rows["new"].prompt_text == "p"
