"""Overload is always the replica's OpenAI-shaped 503 with ``Retry-After``: Ray Serve's limits
are set so that Ray never refuses a request itself (see also test_ray_e2e)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from autospec.serve.app import build_app
from autospec.serve.config import ServeConfig
from autospec.serve.http import make_app

from .helpers import make_server

ROOT = Path(__file__).resolve().parents[2]


def assert_overload_answer(status: int, headers: Any, body: bytes) -> None:
    """A refused request is a 503 in the OpenAI error shape with ``Retry-After``."""
    import json

    assert status == 503, (status, body[:200])
    assert headers["content-type"].startswith("application/json"), body[:200]
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "overloaded_error" and int(headers["retry-after"]) >= 1


def _serve_args(path: Path) -> list[dict[str, Any]]:
    doc = yaml.safe_load(path.read_text())
    if doc.get("kind") == "RayService":
        doc = yaml.safe_load(doc["spec"]["serveConfigV2"])
    return [app["args"] for app in doc["applications"]]


@pytest.mark.parametrize("args", [
    {}, {"max_pending_requests": 100},
    *_serve_args(ROOT / "ops" / "serve_config.yaml"),
    *_serve_args(ROOT / "ops" / "kuberay" / "rayservice.yaml"),
], ids=["defaults", "pending-100", "serve_config.yaml", "rayservice.yaml"])
def test_ray_never_refuses_before_the_replica(args):
    cfg = ServeConfig.model_validate(args)
    deployment = build_app(cfg)._bound_deployment
    assert deployment.max_ongoing_requests > cfg.max_pending_requests
    assert deployment.max_queued_requests == -1


def test_a_ray_limit_at_or_below_the_pending_limit_is_refused():
    with pytest.raises(ValueError, match=r"max_ongoing_requests \(32\) must exceed"):
        ServeConfig(max_ongoing_requests=32, max_pending_requests=32)


def test_many_concurrent_requests_get_200_or_an_openai_503_tiny(tiny_llm, db):
    srv = make_server(tiny_llm, db, max_pending_requests=4)

    async def burst() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=make_app(srv))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            body = {"prompt": "load", "max_tokens": 16, "ignore_eos": True}
            calls = [client.post("/v1/completions", json=body | {"stream": i % 2 == 0})
                     for i in range(40)]
            return await asyncio.gather(*calls)

    try:
        answers = asyncio.run(burst())
    finally:
        srv.close()
    refused = [r for r in answers if r.status_code != 200]
    assert 0 < len(refused) < 40
    for r in refused:
        assert_overload_answer(r.status_code, r.headers, r.content)
