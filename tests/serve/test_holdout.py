"""The holdout: requests a native replica serves with speculation off at random, marked so
in their rows, left out of the live version's τ, and the ledger's R where there are enough
of them (tiny random-init target)."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from pydantic import ValidationError

from autospec import store
from autospec.serve.config import OFF_VERSION, ServeConfig
from autospec.serve.holdout import Holdout

from .helpers import make_server, wait_for_rows


def _complete(server, n: int) -> list[str]:  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    from autospec.serve.http import make_app

    versions = []
    with TestClient(make_app(server)) as client:
        for _ in range(n):
            r = client.post("/v1/completions", json={"prompt": "Hello there", "max_tokens": 8,
                                                     "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            versions.append(r.headers["x-autospec-speculator"])
    return versions


def test_the_draw_keeps_its_fraction() -> None:
    draws = Holdout(0.25, random.Random(7))
    share = sum(draws.draw() for _ in range(4000)) / 4000
    assert 0.22 < share < 0.28
    assert not any(Holdout(0.0).draw() for _ in range(100))
    with pytest.raises(ValueError, match="not in"):
        Holdout(1.5)


def test_held_out_requests_are_served_target_only_and_marked(tiny_llm, db) -> None:  # type: ignore[no-untyped-def]
    server = make_server(tiny_llm, db, poll_interval_s=60, holdout_fraction=0.5)
    try:
        server.holdout = Holdout(1.0)  # every request held out
        held = _complete(server, 2)
        server.holdout = Holdout(0.0)
        served = _complete(server, 1)
    finally:
        server.close()
    assert held == [OFF_VERSION, OFF_VERSION] and served == ["builtin-ngram"]
    rows = sorted(wait_for_rows(db, 3), key=lambda r: r.id)
    for row in rows[:2]:
        assert row.speculator_version == OFF_VERSION and row.num_draft_tokens == 0
        assert row.sampling["holdout"] is True and row.output_tokens == 8
    assert "holdout" not in rows[2].sampling and rows[2].num_draft_tokens > 0
    with store.session_scope(db, readonly=True) as session:
        live = store.live_tau(session)  # the held-out rows are not the live version's:
        decoded = store.ledger.decode_rows(session, deployment="default",
                                           since=rows[0].created_at - timedelta(minutes=1),
                                           until=rows[-1].created_at + timedelta(minutes=1))
    by_version = {t.version: t for t in live}  # its τ (canary, drift) is its own rows'
    assert by_version["builtin-ngram"].requests == 1
    assert by_version[OFF_VERSION].requests == 2 and by_version[OFF_VERSION].draft_tokens == 0
    assert [r.holdout for r in decoded] == [True, True, False]


def test_a_holdout_is_refused_on_vllm_and_bounded() -> None:
    with pytest.raises(ValidationError, match="needs the native engine"):
        ServeConfig(engine="vllm", holdout_fraction=0.1)
    with pytest.raises(ValidationError, match="holdout_fraction"):
        ServeConfig(holdout_fraction=0.9)
    assert ServeConfig(engine="vllm").holdout_fraction == 0.0


def test_a_held_out_request_keeps_the_limits_of_the_version_it_was_drawn_from(tiny_llm) -> None:  # type: ignore[no-untyped-def]
    """Holding a request out must not change what the client may ask: a request that only
    fits without the version's k drafts is refused either way (not at random)."""
    from fastapi.testclient import TestClient

    from autospec.serve.http import make_app

    server = make_server(tiny_llm, None, poll_interval_s=60)
    context, k = tiny_llm.info.max_position_embeddings, server.versions.current.engine.k
    prompt = list(range(1, 9))
    body = {"prompt": prompt, "max_tokens": context - len(prompt) - k + 1, "temperature": 0}
    try:
        codes = []
        with TestClient(make_app(server)) as client:
            for fraction in (0.0, 1.0):
                server.holdout = Holdout(fraction)
                codes.append(client.post("/v1/completions", json=body).status_code)
    finally:
        server.close()
    assert codes == [400, 400]
