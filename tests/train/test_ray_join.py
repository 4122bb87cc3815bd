"""Joining a Ray cluster at an address where nothing answers (no Ray is started here)."""

from __future__ import annotations

import socket
import time

import pytest

from autospec.train import ray_trainer
from autospec.train.errors import TrainingError


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_address_where_nothing_answers_fails_at_once_naming_it(monkeypatch) -> None:
    """ray.init retried such an address for ever (a RAY_ADDRESS left from an ended cluster:
    `autospec train --workers 2` hung past 5 minutes printing 'Failed to connect to GCS')."""
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **_kw: time.sleep(3600))  # Ray's endless retry
    address = f"127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("RAY_ADDRESS", address)
    began = time.monotonic()
    with pytest.raises(TrainingError, match=f"cannot join the Ray cluster at {address}: "
                                            "nothing answers there"):
        ray_trainer.connect_ray(workers=2)
    assert time.monotonic() - began < ray_trainer.JOIN_PROBE_S + 5
    with pytest.raises(TrainingError, match="not host:port"):
        ray_trainer.connect_ray(address="127.0.0.1:port", workers=2)


def test_auto_and_client_addresses_are_left_to_ray(monkeypatch) -> None:
    import ray

    joined = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: joined.append(kw["address"]))
    for address in ("auto", "ray://127.0.0.1:1"):
        assert ray_trainer.connect_ray(address=address) == "connected"
    assert joined == ["auto", "ray://127.0.0.1:1"]
