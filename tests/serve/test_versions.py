"""Hot-swap in process: the live pointer moves, a replica follows between requests, a request
finishes on the version it started with, and a broken version never replaces a working one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from autospec import store
from autospec.serve.schemas import CompletionRequest
from autospec.serve.server import RequestContext, Served

from .helpers import promote, register_artifact


@pytest.fixture
def poll_interval_s() -> float:
    return 60.0  # these tests swap by hand; the watcher test sets its own (below)


def _failures(db) -> list:  # type: ignore[no-untyped-def]
    with store.session_scope(db, readonly=True) as session:
        return store.list_events(session, kinds=["failure"])


@pytest.mark.parametrize("kind", ["ngram", "draft", "eagle3"])
def test_each_kind_is_promoted_and_served(client, server, db, tiny_llm, tmp_path, kind):
    register_artifact(db, tiny_llm, tmp_path, f"{kind}-v1", kind)
    promote(db, f"{kind}-v1")
    assert server.versions.poll_once()
    r = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 6})
    assert r.status_code == 200
    assert r.headers["x-autospec-speculator"] == r.json()["autospec"]["version"] == f"{kind}-v1"
    assert server.versions.current.kind == kind


@pytest.mark.parametrize("poll_interval_s", [0.1])
def test_the_watcher_follows_promotion_and_rollback(server, db, tiny_llm, tmp_path):
    for v in ("v1", "v2"):
        register_artifact(db, tiny_llm, tmp_path, v)
    for expected, move in (("v1", lambda: promote(db, "v1")), ("v2", lambda: promote(db, "v2")),
                           ("v1", lambda: _rollback(db))):
        moved = time.monotonic()
        move()
        while server.versions.current.name != expected:
            assert time.monotonic() - moved < 5, f"still on {server.versions.current.name}"
            time.sleep(0.02)
    assert server.health()["ok"]


def _rollback(db) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(db) as session:
        store.rollback(session, actor="test", reason="test")


def test_a_request_finishes_on_the_version_it_started_with(server, db, tiny_llm, tmp_path):
    register_artifact(db, tiny_llm, tmp_path, "v1")
    server.versions.stop()  # drive the swaps by hand

    async def scenario() -> tuple[Served, Served]:
        ctx = RequestContext(route="completions", segment="x")
        req = CompletionRequest(prompt="one two three", max_tokens=20, ignore_eos=True)
        first = await server.prepare_completion(req, ctx)
        steps = server.stream(first)
        await steps.__anext__()  # decoding has started on builtin-ngram
        promote(db, "v1")
        assert server.versions.poll_once()
        later = await server.prepare_completion(req, ctx)
        items = [item async for item in steps]
        return items[-1], await server.generate(later)

    old, new = asyncio.run(scenario())
    assert old.version.name == "builtin-ngram" and old.result.stats.output_tokens == 20
    assert new.version.name == "v1"


def _corrupt(directory: Path) -> None:
    weights = directory / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["checksum", "missing_file", "wrong_target"])
def test_a_broken_version_leaves_the_replica_on_its_current_one(
        client, server, db, tiny_llm, tmp_path, damage):
    register_artifact(db, tiny_llm, tmp_path, "good")
    promote(db, "good")
    assert server.versions.poll_once()
    if damage == "wrong_target":
        from tests.tiny import tiny_target

        other = tiny_target(vocab_size=49152, hidden_size=32, num_layers=2, seed=3)
        bad = register_artifact(db, other, tmp_path, "bad", "draft")
    else:
        bad = register_artifact(db, tiny_llm, tmp_path, "bad")
        if damage == "checksum":
            _corrupt(bad)
        else:
            (bad / "config.json").unlink()
    promote(db, "bad")
    assert not server.versions.poll_once()
    assert not server.versions.poll_once()  # not retried until the pointer moves again
    assert server.versions.current.name == "good"
    events = _failures(db)
    assert len(events) == 1 and events[0].version == "bad" and events[0].from_version == "good"
    assert events[0].reason
    r = client.post("/v1/completions", json={"prompt": "still fine", "max_tokens": 4})
    assert r.status_code == 200 and r.headers["x-autospec-speculator"] == "good"
    assert client.get("/health").status_code == 200
    assert "autospec:speculator_load_failures_total 1.0" in client.get("/metrics").text


def test_a_database_outage_keeps_serving(server, db, tiny_llm, tmp_path):
    register_artifact(db, tiny_llm, tmp_path, "v1")
    promote(db, "v1")
    assert server.versions.poll_once()
    server.versions.db = store.make_engine("sqlite:////nonexistent-dir/x/y.db")
    assert not server.versions.poll_once()
    assert server.versions.last_poll_error and server.versions.current.name == "v1"


def test_a_pointer_moved_back_to_the_builtin_serves_it_again(server, db, tiny_llm, tmp_path):
    from autospec.versions import BUILTIN_VERSION

    register_artifact(db, tiny_llm, tmp_path, "v1")
    promote(db, "v1")
    assert server.versions.poll_once() and server.versions.current.name == "v1"
    promote(db, BUILTIN_VERSION)  # registered by the migrations
    assert server.versions.poll_once()
    assert server.versions.current.name == BUILTIN_VERSION
    assert server.versions.current.kind == "ngram"


@pytest.mark.parametrize("poll_interval_s", [0.05])
def test_the_watcher_gives_freed_memory_back_after_a_swap(server, db, tiny_llm, tmp_path,
                                                          monkeypatch):
    from autospec.serve import versions

    trims = []
    monkeypatch.setattr(versions, "TRIM_AFTER_S", 0.2)
    monkeypatch.setattr(versions, "release_freed_memory", lambda: trims.append(time.monotonic()))
    register_artifact(db, tiny_llm, tmp_path, "v1")
    time.sleep(0.5)
    assert trims == []  # nothing swapped, nothing to give back
    moved = time.monotonic()
    promote(db, "v1")
    while not trims:
        assert time.monotonic() - moved < 5, "no trim after the swap"
        time.sleep(0.02)
    assert server.versions.current.name == "v1"
    assert trims[0] - moved >= 0.2  # not before the old version's requests could end
    time.sleep(0.5)
    assert len(trims) == 1  # once per swap, not every poll
