"""The load a replica serves: each traffic row records it, the store summarizes it, and a
deployment's concurrency bands set the k each request drafts with (tiny random-init target)."""

from __future__ import annotations

from autospec import store
from autospec.serve.server import Job

from .helpers import make_server, wait_for_rows


def _complete(server, n: int = 1):  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    from autospec.serve.http import make_app

    with TestClient(make_app(server)) as client:
        for _ in range(n):
            r = client.post("/v1/completions", json={"prompt": "Hello there", "max_tokens": 8,
                                                     "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text


def test_rows_record_the_load_and_k_and_bands_turn_drafting_off(tiny_llm, db) -> None:  # type: ignore[no-untyped-def]
    plain = make_server(tiny_llm, db, poll_interval_s=60)
    try:
        _complete(plain)
    finally:
        plain.close()
    banded = make_server(tiny_llm, db, poll_interval_s=60, k_bands="1-1:0,2-:3")
    try:
        _complete(banded, 2)
    finally:
        banded.close()
    rows = wait_for_rows(db, 3)
    first, *alone = sorted(rows, key=lambda r: r.id)
    assert first.sampling["k"] == 5 and first.num_draft_tokens > 0
    for row in [first, *alone]:
        assert row.sampling["in_flight"] == 1 and row.sampling["concurrency"] == 1.0
    assert "banded" not in first.sampling  # drafted at the version's k
    for row in alone:  # one request in flight: the band says k = 0, nothing drafted
        assert row.sampling["k"] == 0 and row.num_draft_tokens == 0
        assert row.output_tokens == 8
        assert row.sampling["banded"] is True  # its τ is left out of the canary's and drift's
    with store.session_scope(db, readonly=True) as session:
        assert [s.requests for s in store.live_tau(session, full_k=True)] == [1]
    with store.session_scope(db, readonly=True) as session:
        profile = store.served_concurrency(session, deployment="default")
        assert store.served_concurrency(session, deployment="elsewhere") is None
    assert profile is not None and profile.requests == 3 and profile.p50 == 1.0


def test_the_band_follows_the_requests_in_flight_when_one_starts(tiny_llm) -> None:  # type: ignore[no-untyped-def]
    server = make_server(tiny_llm, None, k_bands="1-1:5,2-3:2,4-:0")
    try:
        version = server.versions.current
        job = Job()
        ks = []
        for n in (1, 2, 3, 4, 9):
            job.in_flight = n
            ks.append(server.k_for(job, version))
        assert ks == [5, 2, 2, 0, 0]
    finally:
        server.close()


def test_status_shows_the_concurrency_served(tiny_llm, db) -> None:  # type: ignore[no-untyped-def]
    from autospec.controller.policy import load_policy
    from autospec.controller.status import collect_status

    assert collect_status(db, deployment="default", policy=load_policy())["concurrency"] is None
    server = make_server(tiny_llm, db, poll_interval_s=60)
    try:
        _complete(server, 2)
    finally:
        server.close()
    wait_for_rows(db, 2)
    got = collect_status(db, deployment="default", policy=load_policy())["concurrency"]
    assert got["requests"] == 2 and got["p50"] == 1.0 and got["max"] == 1.0


def test_a_replica_drafts_by_the_bands_the_controller_set(tiny_llm, db) -> None:  # type: ignore[no-untyped-def]
    server = make_server(tiny_llm, db, poll_interval_s=60, k_bands="1-:5")
    try:
        with store.session_scope(db) as session:
            store.record_deployment(session, name="default", target="tiny",
                                    target_id=tiny_llm.info.target_id, target_revision="r",
                                    dtype="float32", actor="replica")
            store.set_k_bands(session, name="default", k_bands="1-1:0,2-:2", actor="ctl")
        server.versions.poll_once()
        assert str(server.versions.policy_bands) == "1-1:0,2-:2"
        _complete(server)  # alone: the policy's band says 0, over the config's 5
        with store.session_scope(db) as session:
            store.set_k_bands(session, name="default", k_bands=None, actor="ctl")
        server.versions.poll_once()
        assert server.versions.policy_bands is None
        _complete(server)  # the replica's own bands again
    finally:
        server.close()
    first, second = sorted(wait_for_rows(db, 2), key=lambda r: r.id)
    assert first.sampling["k"] == 0 and first.num_draft_tokens == 0
    assert second.sampling["k"] == 5 and second.num_draft_tokens > 0


def test_bands_a_replica_cannot_use_are_ignored_and_it_keeps_its_own(tiny_llm, db, caplog) -> None:  # type: ignore[no-untyped-def]
    server = make_server(tiny_llm, db, poll_interval_s=60, k_bands="1-:5")
    try:
        with store.session_scope(db) as session:
            row = store.record_deployment(session, name="default", target="tiny",
                                          target_id=tiny_llm.info.target_id,
                                          target_revision="r", dtype="float32", actor="r")
            row.k_bands = "2-:3"  # not from this controller: bands must start at 1
        for _ in range(3):
            server.versions.poll_once()
        assert server.versions.policy_bands is None
        assert str(server.versions.bands) == "1-:5"
        refused = [r for r in caplog.records if "ignoring the deployment's concurrency" in
                   r.getMessage()]
        assert len(refused) == 1  # said once, not at every poll
    finally:
        server.close()
