"""Replicas draft by segment, on a tiny random-init target (native engine, SQLite store):
two segments drafted by two versions of their own (rows and headers name them), a third by
the deployment's; a version loaded once however many pointers name it and freed when none
does; a segment version that fails to load is refused, audited, and its segment drafted by
the deployment's version. The vLLM manager (its fake engine, as in test_vllm_server) holds a
segment's suffix version in a slot of the running engine and refuses other kinds."""

from __future__ import annotations

import hashlib
import time

import pytest
from fastapi.testclient import TestClient

from autospec import store
from autospec.serve.http import make_app

from .helpers import make_server, promote, register_artifact, wait_for_rows
from .test_vllm_server import fake_engines, vllm_server  # noqa: F401  (fixtures)

SYSTEM = "You answer in SQL only."
RULES = [{"segment": "alpha", "header": "x-team", "value": "red"},
         {"segment": "beta", "system_sha256": hashlib.sha256(SYSTEM.encode()).hexdigest()[:16]}]


def _point(db, segment: str, version: str) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(db) as session:
        store.set_live(session, version=version, actor="test", reason="test", segment=segment)


@pytest.fixture
def seg_server(tiny_llm, db, tmp_path):  # type: ignore[no-untyped-def]
    for version in ("v-alpha", "v-beta", "v-deploy"):
        register_artifact(db, tiny_llm, tmp_path, version)
    promote(db, "v-deploy")
    _point(db, "alpha", "v-alpha")
    _point(db, "beta", "v-beta")
    server = make_server(tiny_llm, db, poll_interval_s=60.0, segments=RULES)  # polls by hand
    yield server
    server.close()


def _until(condition, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _failures(db) -> list:  # type: ignore[no-untyped-def]
    with store.session_scope(db, readonly=True) as session:
        return [e for e in store.list_events(session, kinds=["failure"])
                if (e.details or {}).get("segment")]


def _complete(client: TestClient, **headers: str) -> str:
    r = client.post("/v1/completions", json={"prompt": "select", "max_tokens": 3},
                    headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["autospec"]["version"] == r.headers["x-autospec-speculator"]
    return r.headers["x-autospec-speculator"]


def test_each_segment_is_drafted_by_its_pointers_version(seg_server, db):
    with TestClient(make_app(seg_server)) as client:
        assert _complete(client, **{"x-team": "red"}) == "v-alpha"  # rule: header
        chat = client.post("/v1/chat/completions", json={
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": "count rows"}], "max_tokens": 3})
        assert chat.status_code == 200 and chat.headers["x-autospec-speculator"] == "v-beta"
        assert _complete(client, **{"x-autospec-segment": "gamma"}) == "v-deploy"
        # the header names the segment itself and wins over the rules
        assert _complete(client, **{"x-autospec-segment": "beta", "x-team": "red"}) == "v-beta"
        assert _complete(client) == "v-deploy"  # no rule matches: the route, the deployment's
        health = client.get("/health").json()
    rows = wait_for_rows(db, 5)
    assert [(r.segment, r.speculator_version) for r in rows] == [
        ("alpha", "v-alpha"), ("beta", "v-beta"), ("gamma", "v-deploy"), ("beta", "v-beta"),
        ("completions", "v-deploy")]
    assert health["version"] == "v-deploy"
    assert health["segments"] == {"alpha": "v-alpha", "beta": "v-beta"}
    assert set(health["segment_versions"]) == {"v-alpha", "v-beta"}


def test_health_gives_null_bytes_for_a_segment_version_without_tensors(seg_server, db,
                                                                       tiny_llm, tmp_path):
    """docs/segments.md: ``null`` for one without tensors (an n-gram version, the built-in
    one); /health said 0. A suffix version's index is its tensors' bytes."""
    register_artifact(db, tiny_llm, tmp_path, "v-suffix", kind="suffix")
    _point(db, "gamma", "v-suffix")
    _point(db, "delta", "builtin-ngram")
    seg_server.versions.poll_once()
    with TestClient(make_app(seg_server)) as client:
        health = client.get("/health").json()
    sizes = health["segment_versions"]
    assert set(sizes) == {"v-alpha", "v-beta", "v-suffix", "builtin-ngram"}, health
    assert sizes["v-alpha"] is None and sizes["builtin-ngram"] is None, sizes
    assert isinstance(sizes["v-suffix"], int)


def test_a_version_is_loaded_once_and_freed_when_no_pointer_names_it(seg_server, db,
                                                                     monkeypatch):
    versions = seg_server.versions
    alpha, beta = versions.for_segment("alpha"), versions.for_segment("beta")
    retired: list[str] = []
    for v in (alpha, beta, versions.current):
        monkeypatch.setattr(v.engine, "retire", lambda name=v.name: retired.append(name))
    _point(db, "beta", "v-alpha")  # two segments, one version: one loaded copy
    versions.poll_once()
    assert versions.for_segment("beta") is alpha
    assert retired == ["v-beta"] and not versions.holds(beta.engine)
    assert set(versions.segment_memory()) == {"v-alpha"}
    _point(db, "alpha", "v-deploy")  # the deployment's version: its loaded copy
    versions.poll_once()
    assert versions.for_segment("alpha") is versions.current
    deployed = versions.current
    promote(db, "v-alpha")  # the deployment moves to the version beta holds: reused
    assert versions.poll_once()
    assert versions.current is versions.for_segment("beta") is alpha
    assert versions.for_segment("alpha") is deployed  # still held for alpha: not retired
    assert retired == ["v-beta"]
    with store.session_scope(db) as session:
        store.rollback(session, actor="test", reason="test", segment="alpha")
    versions.poll_once()  # alpha back on v-alpha: nothing names v-deploy any more
    assert versions.segments == {"alpha": "v-alpha", "beta": "v-alpha"}
    assert retired == ["v-beta", "v-deploy"]


def test_a_segment_version_that_fails_is_refused_and_audited(seg_server, db, tiny_llm, tmp_path):
    bad = register_artifact(db, tiny_llm, tmp_path, "v-bad")
    (bad / "config.json").unlink()
    _point(db, "alpha", "v-bad")
    seg_server.versions.poll_once()
    seg_server.versions.poll_once()  # not retried until the pointer moves again
    with store.session_scope(db, readonly=True) as session:
        failures = store.list_events(session, kinds=["failure"])
    assert [(e.version, e.details["segment"]) for e in failures] == [("v-bad", "alpha")]
    assert seg_server.versions.segments == {"beta": "v-beta"}
    with TestClient(make_app(seg_server)) as client:
        assert _complete(client, **{"x-team": "red"}) == "v-deploy"  # the fallback
        assert client.get("/health").json()["load_failures"] == 1
    (row,) = wait_for_rows(db, 1)
    assert (row.segment, row.speculator_version) == ("alpha", "v-deploy")


def test_an_unpinned_segment_falls_back_before_another_segments_slow_load(
        seg_server, db, tiny_llm, tmp_path, monkeypatch):
    """A segment whose pointer is removed is drafted by the deployment's version at once,
    not once the same poll's load of another segment's version ends (which can take long:
    on vLLM a slot's load waits up to its RPC timeout, 120 s)."""
    import threading

    versions = seg_server.versions
    register_artifact(db, tiny_llm, tmp_path, "v-slow")
    entered, release = threading.Event(), threading.Event()
    load = versions._load_for_segment

    def slow(version: str):  # type: ignore[no-untyped-def]
        if version == "v-slow":
            entered.set()
            release.wait(10)
        return load(version)

    monkeypatch.setattr(versions, "_load_for_segment", slow)
    with store.session_scope(db) as session:  # one poll sees both
        store.set_live(session, version="v-slow", actor="test", reason="test", segment="alpha")
        store.clear_segment(session, segment="beta", actor="test", reason="unpin")
    poll = threading.Thread(target=versions.poll_once)
    poll.start()
    try:
        assert entered.wait(10)
        assert versions.for_segment("beta") is versions.current  # while alpha's load runs
        assert versions.for_segment("alpha").name == "v-alpha"  # until its new one loaded
    finally:
        release.set()
        poll.join(10)
    assert versions.segments == {"alpha": "v-slow"}


def test_the_vllm_replica_holds_a_segments_suffix_version_in_a_slot(
        vllm_server, fake_engines, db, tiny_llm, tmp_path):  # noqa: F811
    """A vLLM engine has one drafter: a segment's suffix version goes into a slot of the
    running engine's proposer beside the deployment's suffix version (no second engine), its
    requests name the slot; a segment version of another kind, or any while the deployment's
    is not a suffix version, is refused and audited; a slot no pointer names is dropped."""
    versions = vllm_server.versions
    register_artifact(db, tiny_llm, tmp_path, "idx-seg", "suffix")
    register_artifact(db, tiny_llm, tmp_path, "v-ngram")  # a kind vLLM drafts on its own
    _point(db, "alpha", "idx-seg")  # the deployment's version is builtin-ngram (vLLM's ngram)
    _until(lambda: len(_failures(db)) == 1)
    (early,) = _failures(db)
    assert "builtin-ngram is not a suffix version" in early.reason
    assert versions.for_segment("alpha") is versions.current
    register_artifact(db, tiny_llm, tmp_path, "idx-dep", "suffix")
    promote(db, "idx-dep")
    _until(lambda: versions.current.name == "idx-dep")
    # the new engine is tried again with the segment's version, without a pointer move
    _point(db, "beta", "v-ngram")
    _until(lambda: "idx-seg" in versions.segments.values() and len(_failures(db)) == 2)
    engine = fake_engines[-1][1]
    assert [v for v, _ in fake_engines] == ["builtin-ngram", "idx-dep"]  # no engine for a slot
    load = [args for m, args in engine.rpcs if m == "autospec_load_index"][-1]
    assert load[2:] == ("idx-seg", "idx-seg")  # version, slot
    assert any("'v-ngram' is ngram" in e.reason and e.details["segment"] == "beta"
               for e in _failures(db))
    held = versions.for_segment("alpha")
    assert held.slot == "idx-seg" and held.engine is engine
    with TestClient(make_app(vllm_server)) as client:
        assert _complete(client, **{"x-autospec-segment": "alpha"}) == "idx-seg"
        assert _complete(client, **{"x-autospec-segment": "beta"}) == "idx-dep"
        health = client.get("/health").json()
    assert engine.slots[-2:] == ["idx-seg", None]
    assert health["segments"] == {"alpha": "idx-seg"}
    assert isinstance(health["segment_versions"]["idx-seg"], int)  # the index's bytes
    rows = wait_for_rows(db, 2)
    assert [(r.segment, r.speculator_version) for r in rows[-2:]] == [
        ("alpha", "idx-seg"), ("beta", "idx-dep")]
    assert not any("drafted_by" in (r.sampling or {}) for r in rows[-2:])
    with store.session_scope(db) as session:
        store.clear_segment(session, segment="alpha", actor="test", reason="unpin")
    _until(lambda: any(m == "autospec_drop_index" for m, _ in engine.rpcs))
    assert versions.for_segment("alpha") is versions.current


def test_vllm_routes_resolve_the_segment_from_headers_and_body_once():
    """vLLM's routes (autospec's hooks around vLLM's request models, vLLM's handler
    stood in for): the rules see the parsed body, the header wins, else the route."""
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    from fastapi import FastAPI
    from pydantic import BaseModel

    from autospec.serve.config import ServeConfig
    from autospec.serve.vllm_http import add_routes
    from autospec.serve.vllm_openai import Binding

    class Answer(BaseModel):
        text: str

    async def handler(req, request):  # type: ignore[no-untyped-def]
        return Answer(text="ok")

    class Layer:  # what add_routes needs of a replica's VllmLayer
        config = ServeConfig(segments=RULES)
        api_args = SimpleNamespace()

        def __init__(self) -> None:
            self.contexts: list = []

        async def openai_api(self):  # type: ignore[no-untyped-def]
            return SimpleNamespace(chat=SimpleNamespace(create_chat_completion=handler),
                                   completion=SimpleNamespace(create_completion=handler))

        def bind(self, ctx):  # type: ignore[no-untyped-def]
            self.contexts.append(ctx)
            version = SimpleNamespace(name="v", engine=SimpleNamespace(loaded=[]))
            return Binding(ctx, SimpleNamespace(), version)

        def release(self, binding) -> None:  # type: ignore[no-untyped-def]
            pass

    layer, app = Layer(), FastAPI()
    add_routes(app, layer)  # type: ignore[arg-type]
    chat = {"model": "m", "max_tokens": 2,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "q"}]}
    with TestClient(app) as client:
        for headers in ({}, {"x-autospec-segment": "mine"}):
            r = client.post("/v1/chat/completions", json=chat, headers=headers)
            assert r.status_code == 200 and r.headers["x-autospec-speculator"] == "v"
        assert client.post("/v1/completions", json={"model": "m", "prompt": "p"},
                           headers={"x-team": "red"}).status_code == 200
        assert client.post("/v1/completions", json={"model": "m", "prompt": "p"}).status_code == 200
    assert [c.segment for c in layer.contexts] == ["beta", "mine", "alpha", "completions"]


def test_an_unpinned_segments_version_is_freed_when_another_load_raises(
        seg_server, db, tiny_llm, tmp_path, monkeypatch):
    """A poll whose load of one segment's version raises (the store down under it) still
    frees the version of a segment unpinned in that poll; it was never freed (its engine
    held until the replica stopped), since the next poll no longer knew of it."""
    versions = seg_server.versions
    register_artifact(db, tiny_llm, tmp_path, "v-new")
    beta = versions.for_segment("beta")
    retired: list[str] = []
    monkeypatch.setattr(beta.engine, "retire", lambda *a, **k: retired.append(beta.name))

    def store_down(version: str):  # type: ignore[no-untyped-def]
        raise RuntimeError("the store went away")

    monkeypatch.setattr(versions, "_load_for_segment", store_down)
    with store.session_scope(db) as session:
        store.set_live(session, version="v-new", actor="test", reason="test", segment="alpha")
        store.clear_segment(session, segment="beta", actor="test", reason="unpin")
    with pytest.raises(RuntimeError, match="went away"):
        versions.poll_once()
    assert retired == ["v-beta"]
    assert versions.for_segment("beta") is versions.current
    assert versions.for_segment("alpha").name == "v-alpha"  # kept until its load succeeds
