"""Joining a Ray cluster at an address where nothing answers (no Ray is started here)."""

from __future__ import annotations

import socket
import time

import pytest

from autospec.train import ray_room, ray_trainer
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
    assert time.monotonic() - began < ray_room.JOIN_PROBE_S + 5
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


def test_a_local_ray_without_a_gpu_for_each_worker_fails_at_once(monkeypatch, tmp_path) -> None:
    """`autospec train --workers 1 --use-gpu` on a machine without a GPU waited for one for
    ever (Ray Train queues a worker group it has no room for)."""
    import ray

    from autospec.train.kinds import TraineeOptions
    from autospec.train.loop import LoopConfig

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray_trainer, "connect_ray", lambda **_kw: "started")
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})

    class Config:
        def model_dump(self, mode: str) -> dict:
            return {}

    class Cache:
        def save(self, path) -> None:
            path.write_text("")

    with pytest.raises(TrainingError, match=r"the local Ray cannot hold the run: 1 Ray Train "
                                            r"workers need 1 GPU \(it has 0\)"):
        ray_trainer.ray_fit(kind="draft", config=Config(), state={}, shared={},
                            opts=TraineeOptions(), cache=Cache(), loop=LoopConfig(),
                            workers=1, use_gpu=True, storage_path=tmp_path, name="r")
    assert not list(tmp_path.iterdir())  # nothing of the run left
    ray_room.check_room(2, False, local=True)  # room for CPU workers: nothing said
    with pytest.raises(TrainingError, match=r"need 3 CPU \(it has 2\)"):
        ray_room.check_room(3, False, local=True)
    ray_room.check_room(3, True, local=False)  # a cluster may grow: only logged
