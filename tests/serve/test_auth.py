"""API-key authentication and the docs switch (issue 16, item 8). Tiny random-init target."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from autospec.serve.auth import ApiKeyAuth, KeyRing, configured_keys
from autospec.serve.config import ServeConfig
from autospec.serve.http import make_app
from autospec.settings import get_settings

from .helpers import make_server

KEY = "test-key-0123456789"
BODY = {"prompt": "Hello", "max_tokens": 2}


@pytest.fixture
def no_env_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("AUTOSPEC_API_KEY", raising=False)
    monkeypatch.delenv("AUTOSPEC_API_KEY_FILE", raising=False)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture
def keyed(tiny_llm, db, no_env_key) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    srv = make_server(tiny_llm, db, api_key=KEY)
    try:
        with TestClient(make_app(srv, replica="id=r1"), raise_server_exceptions=False) as c:
            yield c
    finally:
        srv.close()


def _assert_401(r) -> None:  # type: ignore[no-untyped-def]
    assert r.status_code == 401, r.text
    assert r.json() == {"error": {"message": r.json()["error"]["message"],
                                  "type": "invalid_request_error", "param": None,
                                  "code": "invalid_api_key"}}
    assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
    {"Authorization": f"Basic {KEY}"}, {"Authorization": f"Bearer {KEY}x"},
])
def test_requests_without_the_key_get_401_in_openai_shape_tiny(keyed, headers):
    for method, path in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                         ("GET", "/v1/models"), ("GET", "/openapi.json"),
                         ("GET", "/no-such-route")):
        r = keyed.request(method, path, json=BODY, headers=headers)
        _assert_401(r)
        assert r.headers["x-autospec-replica"] == "id=r1"


def test_the_key_opens_every_route_and_health_metrics_stay_open_tiny(keyed):
    auth = {"Authorization": f"Bearer {KEY}"}
    assert keyed.post("/v1/completions", json=BODY, headers=auth).status_code == 200
    assert keyed.get("/v1/models", headers=auth).status_code == 200
    assert keyed.get("/health").status_code == 200
    assert keyed.get("/metrics").status_code == 200


def test_the_official_openai_client_with_the_key_works_tiny(keyed):
    import openai

    good = openai.OpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=keyed,
                         max_retries=0)
    out = good.completions.create(model="tiny", prompt="Hello", max_tokens=2)
    assert out.usage.completion_tokens >= 1
    bad = openai.OpenAI(base_url="http://testserver/v1", api_key="nope", http_client=keyed,
                        max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_the_key_from_the_environment_is_required_tiny(tiny_llm, db, monkeypatch):
    monkeypatch.setenv("AUTOSPEC_API_KEY", KEY)
    get_settings.cache_clear()
    srv = make_server(tiny_llm, db)
    try:
        with TestClient(make_app(srv)) as c:
            _assert_401(c.get("/v1/models"))
            assert c.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).is_success
    finally:
        srv.close()
        get_settings.cache_clear()


def test_no_key_configured_means_no_check(no_env_key, client):
    assert configured_keys(None) is None
    assert client.post("/v1/completions", json=BODY).status_code == 200


def test_paths_are_matched_below_the_serve_route_prefix():
    seen: list[str] = []

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        seen.append(scope["path"])

    import asyncio

    async def send(message):  # type: ignore[no-untyped-def]
        seen.append(message.get("status", "body"))

    guard = ApiKeyAuth(app, keys=KeyRing([KEY]))
    for path in ("/live/health", "/live/metrics", "/live/v1/models"):
        scope = {"type": "http", "path": path, "root_path": "/live", "headers": []}
        asyncio.run(guard(scope, None, send))
    assert seen == ["/live/health", "/live/metrics", 401, "body"]


def test_docs_are_off_by_default_and_can_be_turned_on_tiny(no_env_key, tiny_llm, db, client):
    assert client.get("/docs").status_code == 404 and client.get("/redoc").status_code == 404
    assert client.get("/openapi.json").status_code == 200
    srv = make_server(tiny_llm, db, docs=True)
    try:
        with TestClient(make_app(srv)) as c:
            assert c.get("/docs").status_code == 200
    finally:
        srv.close()


def test_the_key_reaches_replicas_but_never_a_printout():
    cfg = ServeConfig(api_key=KEY)
    assert cfg.to_args()["api_key"] == KEY
    assert ServeConfig.model_validate(cfg.to_args()).api_key.get_secret_value() == KEY
    assert KEY not in repr(cfg) and KEY not in cfg.model_dump_json()


def test_clients_send_the_environment_key(monkeypatch):
    from autospec.loadgen.client import Driver

    monkeypatch.setenv("AUTOSPEC_API_KEY", KEY)
    get_settings.cache_clear()
    try:
        assert Driver("http://127.0.0.1:9").client.api_key == KEY
        assert Driver("http://127.0.0.1:9", api_key="other").client.api_key == "other"
    finally:
        get_settings.cache_clear()
