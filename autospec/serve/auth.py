"""API-key authentication for the OpenAI routes, as vLLM's ``--api-key`` does it.

Keys come from :attr:`ServeConfig.api_key <autospec.serve.config.ServeConfig>` (one key or
several, comma-separated), else ``AUTOSPEC_API_KEY`` in the replica's environment, and from a
key file (``ServeConfig.api_key_file``, else ``AUTOSPEC_API_KEY_FILE``: one key per line,
``#`` comments), which each replica re-reads when it changes — at most once a second, on the
next request — so keys rotate without a restart: add the new key, move the clients, remove
the old one (a Kubernetes Secret mounted as a file is updated in place the same way).
When any key is configured every request must carry ``Authorization: Bearer <one of
them>``; anything else gets a 401 in the OpenAI error shape (``invalid_api_key``, with
``WWW-Authenticate: Bearer``). Open without a key: ``/health`` (Ray's and load balancers'
probes) and ``/metrics`` (Prometheus scrapes, as in vLLM; it holds counters and version
names, never request text — keep it on the internal network). Keys are compared in
constant time. No key and no key file configured: no check at all. A key file that cannot be
read when the replica starts is an error; one that becomes unreadable later keeps the keys
last read (logged), and one emptied on purpose accepts no key.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from autospec.settings import parse_keys

log = logging.getLogger(__name__)
OPEN_PATHS = frozenset({"/health", "/metrics"})
RECHECK_S = 1.0


class KeyFileError(ValueError):
    """The key file cannot be read when a replica starts (or, at ``autospec serve``'s
    check, holds no key)."""


class KeyRing:
    """The keys a request may carry: fixed ones and those of a key file, re-read when the
    file's modification time, size or inode change."""

    def __init__(self, keys: Sequence[str] = (), file: Path | None = None, *,
                 require_key: bool = False) -> None:
        self.fixed = tuple(keys)
        self.file = file
        self.from_file: tuple[str, ...] = ()
        self._stamp: tuple[int, int, int] | None = None
        self._checked = 0.0
        if file is not None:
            self._load_first(require_key)

    def _load_first(self, require_key: bool) -> None:
        """Read the file; one that holds no key refuses every request (logged) — a replica
        restarted while a Secret is emptied still starts — except where ``require_key``
        (``autospec serve``'s check: an empty file there is a mistake)."""
        try:
            self._reload()
        except (OSError, UnicodeDecodeError) as exc:
            raise KeyFileError(f"API key file {self.file} cannot be read: {exc}") from None
        if require_key and not self.from_file:
            raise KeyFileError(f"API key file {self.file} holds no key (one per line)")

    def keys(self) -> tuple[str, ...]:
        """Every key accepted now (the file re-read first when it changed)."""
        now = time.monotonic()
        if self.file is not None and now - self._checked >= RECHECK_S:
            self._checked = now
            try:
                self._reload()
            except (OSError, UnicodeDecodeError) as exc:
                log.warning("API key file %s cannot be read (%s); keeping the %d keys last "
                            "read", self.file, exc, len(self.from_file))
        return self.fixed + self.from_file

    def _reload(self) -> None:
        assert self.file is not None
        st = os.stat(self.file)
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return
        keys = parse_keys(self.file.read_text(encoding="utf-8"))
        if self._stamp is not None:
            log.info("API key file %s changed: %d keys", self.file, len(keys))
        if not keys:
            log.warning("API key file %s holds no key: every request is refused", self.file)
        self.from_file, self._stamp = keys, stamp

    def allows(self, header: bytes) -> bool:
        """Whether an ``Authorization`` header value carries one of the keys."""
        ok = False
        for key in self.keys():  # no early exit: the time does not say which key matched
            ok |= hmac.compare_digest(header, f"Bearer {key}".encode())
        return ok


def configured_keys(explicit: SecretStr | None, file: Path | None = None) -> KeyRing | None:
    """The keys requests must carry: ``explicit`` (comma-separated), else
    ``AUTOSPEC_API_KEY``; and ``file``, else ``AUTOSPEC_API_KEY_FILE``. None: no auth. An
    ``explicit`` value holding no key (blanks, commas: a template's unset variable) is unset,
    so the environment's key still applies rather than authentication silently ending."""
    from autospec.settings import get_settings

    settings = get_settings()
    fixed = parse_keys(explicit.get_secret_value()) if explicit is not None else ()
    if not fixed:
        env = settings.api_key
        fixed = parse_keys(env.get_secret_value()) if env is not None else ()
    file = file if file is not None else settings.api_key_file
    if not fixed and file is None:
        return None
    return KeyRing(fixed, file)


class ApiKeyAuth:
    """ASGI middleware: refuses HTTP requests without ``Authorization: Bearer <key>``."""

    def __init__(self, app: Any, keys: KeyRing) -> None:
        self.app = app
        self.ring = keys

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or _route(scope) in OPEN_PATHS or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        await _unauthorized(send)

    def _allowed(self, scope: dict[str, Any]) -> bool:
        given = next((value for name, value in scope.get("headers", [])
                      if name == b"authorization"), b"")
        return self.ring.allows(given)


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
