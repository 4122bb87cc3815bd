"""Every route but /health and /metrics asks for the API key, on the native engine's routes
and on those the vLLM layer installs (a new route without auth fails this), keys are
compared in constant time (every key, whatever the length), and a prompt longer than the
context gets a 400 in OpenAI's error shape. Tiny random-init target."""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.routing import Route

from autospec.serve import auth
from autospec.serve.auth import OPEN_PATHS, KeyRing
from autospec.serve.http import make_app
from autospec.settings import get_settings

from .helpers import make_server

KEY = "test-key-0123456789"


@pytest.fixture
def server(tiny_llm, db, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv("AUTOSPEC_API_KEY", raising=False)
    monkeypatch.delenv("AUTOSPEC_API_KEY_FILE", raising=False)
    get_settings.cache_clear()
    srv = make_server(tiny_llm, db, api_key=KEY, docs=True)
    yield srv
    srv.close()
    get_settings.cache_clear()


def _vllm_routes(server):  # type: ignore[no-untyped-def]
    """The routes vLLM's layer installs, over a stand-in replica (no engine: a request that
    passed auth would fail later, which is not what is tested)."""
    from autospec.serve.vllm_http import add_routes

    replica = SimpleNamespace(api_args=None, config=server.config)
    return SimpleNamespace(install_routes=lambda app: add_routes(app, replica) or True)


@pytest.fixture(params=["native", "vllm"])
def app(request, server) -> Iterator[FastAPI]:  # type: ignore[no-untyped-def]
    if request.param == "vllm":
        pytest.importorskip("vllm")
        server.api = _vllm_routes(server)
    yield make_app(server, replica="id=r1")
    server.api = None


def _requests(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path) for every route of the app, path parameters filled in."""
    found = []
    for route in app.routes:
        assert isinstance(route, Route), f"a route of another kind: {route!r}"
        path = re.sub(r"\{[^}]+\}", "x", route.path)
        found += [(method, path) for method in sorted(route.methods or {"GET"})]
    return found


def test_every_route_but_health_and_metrics_needs_the_key_tiny(app) -> None:
    assert frozenset({"/health", "/metrics"}) == OPEN_PATHS
    routes = _requests(app)
    paths = {path for _, path in routes}
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/openapi.json",
            "/docs", "/health", "/metrics"} <= paths
    with TestClient(app, raise_server_exceptions=False) as client:
        for method, path in routes:
            answer = client.request(method, path, json={"prompt": "x", "max_tokens": 1})
            if path in OPEN_PATHS:
                assert answer.status_code != 401, (method, path)
                continue
            assert answer.status_code == 401, (method, path, answer.status_code)
            if method != "HEAD":  # a HEAD answer has no body
                assert answer.json()["error"]["code"] == "invalid_api_key"
        keyed = client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert keyed.status_code == 200


def test_every_key_is_compared_whatever_the_header(monkeypatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    ring = KeyRing(["first-key", "second-much-longer-key", "k3"])
    for header, allowed in ((b"Bearer first-key", True), (b"Bearer k3", True),
                            (b"", False), (b"Bearer " + b"x" * 500, False),
                            (b"Bearer second-much-longer-key", True)):
        calls.clear()
        assert ring.allows(header) is allowed
        assert len(calls) == 3 and all(a == header for a, _ in calls), header


@pytest.mark.parametrize("route, body", [
    ("/v1/completions", {"prompt": "word " * 2000, "max_tokens": 4}),
    ("/v1/completions", {"prompt": list(range(3, 600)), "max_tokens": 4}),
    ("/v1/completions", {"prompt": "hello", "max_tokens": 510}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 2000}],
                              "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}] * 400,
                              "max_tokens": 4}),
])
def test_a_prompt_over_the_context_is_an_openai_400_tiny(server, route, body) -> None:
    """The tiny target's context is 512 tokens."""
    with TestClient(make_app(server), raise_server_exceptions=False) as client:
        answer = client.post(route, json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and "context" in error["message"]


def test_a_body_over_the_limit_is_an_openai_413_tiny(server) -> None:
    limit = server.config.max_body_bytes
    with TestClient(make_app(server), raise_server_exceptions=False) as client:
        answer = client.post("/v1/completions", json={"prompt": "a" * limit},
                             headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "body_too_large"
