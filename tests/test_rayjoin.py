"""Joining a cluster through a Ray Client server whose per-driver server dies at its start
(ray-project/ray#63202): tried again, and only that (no Ray is started here)."""

from __future__ import annotations

import pytest

from autospec import rayjoin

_DIED = ("Initialization failure from server:\nTraceback (most recent call last):\n"
         "RuntimeError: Starting Ray client server failed. See ray_client_server_23000.err "
         "for detailed logs.")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    import ray

    seen: list[str] = []
    monkeypatch.setattr(ray, "shutdown", lambda: seen.append("shutdown"))
    return seen


def _failing(monkeypatch: pytest.MonkeyPatch, calls: list[str], errors: list[Exception]) -> None:
    import ray

    def init(**kw):  # type: ignore[no-untyped-def]
        calls.append(kw["address"])
        if errors:
            raise errors.pop(0)

    monkeypatch.setattr(ray, "init", init)


def test_a_client_server_that_died_starting_is_tried_again(monkeypatch, calls, caplog) -> None:
    _failing(monkeypatch, calls, [ConnectionAbortedError(_DIED), ConnectionAbortedError(_DIED)])
    rayjoin.join("ray://head:10001", namespace="autospec")
    assert calls == ["ray://head:10001", "shutdown"] * 2 + ["ray://head:10001"]
    assert "ray-project/ray#63202" in caplog.text and "(3 of 5)" in caplog.text


def test_only_that_failure_and_only_so_often(monkeypatch, calls) -> None:
    _failing(monkeypatch, calls, [ConnectionAbortedError(_DIED)] * rayjoin.CLIENT_TRIES)
    with pytest.raises(ConnectionAbortedError, match="Starting Ray client server failed"):
        rayjoin.join("ray://head:10001")
    assert calls.count("ray://head:10001") == rayjoin.CLIENT_TRIES
    calls.clear()
    _failing(monkeypatch, calls, [ConnectionError("ray client connection timeout")])
    with pytest.raises(ConnectionError, match="timeout"):
        rayjoin.join("ray://head:10001")  # nothing answers: Ray's own error, at once
    assert calls == ["ray://head:10001"]
    calls.clear()
    _failing(monkeypatch, calls, [ConnectionAbortedError(_DIED)])
    with pytest.raises(ConnectionAbortedError):
        rayjoin.join("127.0.0.1:6379")  # not a Ray Client address: no second try
    assert calls == ["127.0.0.1:6379"]
