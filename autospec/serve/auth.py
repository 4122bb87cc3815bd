"""API-key authentication for the OpenAI routes, as vLLM's ``--api-key`` does it.

When a key is configured (:attr:`ServeConfig.api_key <autospec.serve.config.ServeConfig>`,
else ``AUTOSPEC_API_KEY`` in the replica's environment), every request must carry
``Authorization: Bearer <key>``; anything else gets a 401 in the OpenAI error shape
(``invalid_api_key``, with ``WWW-Authenticate: Bearer``). Open without a key: ``/health``
(Ray's and load balancers' probes) and ``/metrics`` (Prometheus scrapes, as in vLLM; it
holds counters and version names, never request text — keep it on the internal network).
Keys are compared in constant time. No key configured: no check at all.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from pydantic import SecretStr

OPEN_PATHS = frozenset({"/health", "/metrics"})


def configured_key(explicit: SecretStr | None) -> str | None:
    """The key requests must carry: ``explicit``, else ``AUTOSPEC_API_KEY``; None: no auth."""
    from autospec.settings import api_key

    return (explicit.get_secret_value() or None) if explicit is not None else api_key()


class ApiKeyAuth:
    """ASGI middleware: refuses HTTP requests without ``Authorization: Bearer <key>``."""

    def __init__(self, app: Any, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or _route(scope) in OPEN_PATHS or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        await _unauthorized(send)

    def _allowed(self, scope: dict[str, Any]) -> bool:
        given = next((value for name, value in scope.get("headers", [])
                      if name == b"authorization"), b"")
        return hmac.compare_digest(given, self.expected)


def _route(scope: dict[str, Any]) -> str:
    """The path below the app's mount point (Ray Serve mounts it at its route prefix)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):]
    return path.rstrip("/") or "/"


async def _unauthorized(send: Any) -> None:
    body = json.dumps({"error": {
        "message": "missing or invalid API key: send 'Authorization: Bearer <key>'",
        "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", b"Bearer")]})
    await send({"type": "http.response.body", "body": body})
