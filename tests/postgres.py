"""Which PostgreSQL server the tests use.

``AUTOSPEC_TEST_POSTGRES_URL`` when set; otherwise the local server when one answers on
127.0.0.1:5432 (``postgresql+psycopg://root@127.0.0.1:5432/postgres``), so a newcomer's
``make test`` runs the PostgreSQL tests it can; otherwise none, and the reason says so.
"""

from __future__ import annotations

import os
import socket

POSTGRES_ENV = "AUTOSPEC_TEST_POSTGRES_URL"
LOCAL_HOST, LOCAL_PORT = "127.0.0.1", 5432


def local_url(port: int = LOCAL_PORT) -> str:
    return f"postgresql+psycopg://root@{LOCAL_HOST}:{port}/postgres"


def answers(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts a TCP connection at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def server_url(port: int = LOCAL_PORT) -> tuple[str | None, str]:
    """(URL, where it came from), or (None, why no PostgreSQL test can run)."""
    explicit = os.environ.get(POSTGRES_ENV)
    if explicit:
        return explicit, POSTGRES_ENV
    if answers(LOCAL_HOST, port):
        return local_url(port), f"{POSTGRES_ENV} unset, the server answering on {LOCAL_HOST}:{port}"
    return None, (f"{POSTGRES_ENV} is not set and no server answers on {LOCAL_HOST}:{port}: "
                  f"PostgreSQL tests did not run")
