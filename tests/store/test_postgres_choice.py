"""Which PostgreSQL server the tests use: the variable, else a local server that answers,
else none with a message saying so (tests/postgres.py)."""

from __future__ import annotations

import socket

import pytest

from autospec.ports import free_port
from tests.postgres import POSTGRES_ENV, local_url, server_url


def test_the_variable_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POSTGRES_ENV, "postgresql://u@db.example/x")
    assert server_url(port=free_port()) == ("postgresql://u@db.example/x", POSTGRES_ENV)


def test_a_local_server_that_answers_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(POSTGRES_ENV, raising=False)
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        url, source = server_url(port=port)
    assert url == local_url(port) == f"postgresql+psycopg://root@127.0.0.1:{port}/postgres"
    assert "answering on 127.0.0.1" in source


def test_no_server_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(POSTGRES_ENV, raising=False)
    port = free_port()
    url, reason = server_url(port=port)
    assert url is None
    assert f"no server answers on 127.0.0.1:{port}" in reason and POSTGRES_ENV in reason
