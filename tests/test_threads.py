"""The cap on torch threads (``autospec/threads.py``): what ``auto`` and a count mean in this
process and per Ray Train worker, and that the cap reaches Ray Train's worker config."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autospec import threads
from autospec.threads import resolve_threads, torch_threads, within, worker_threads


def test_torch_threads_runs_the_block_on_n_threads_and_restores_them() -> None:
    before = torch.get_num_threads()
    with torch_threads(None) as n:
        assert n == before == torch.get_num_threads()
    with torch_threads(1) as n:
        assert n == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(1):
        raise RuntimeError("a failed measurement still gives the threads back")
    assert torch.get_num_threads() == before


@pytest.mark.parametrize(("cpus", "torch_count", "expected"), [
    (2, 2, 1),  # the soak's machine: one CPU left to the replica
    (1, 1, 1),  # never below one
    (16, 8, 8),  # never above torch's own count (physical cores, OMP_NUM_THREADS)
    (8, 8, 7),
])
def test_auto_leaves_one_cpu_and_never_exceeds_torchs_count(
        monkeypatch: pytest.MonkeyPatch, cpus: int, torch_count: int, expected: int) -> None:
    monkeypatch.setattr(threads, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(torch, "get_num_threads", lambda: torch_count)
    assert resolve_threads("auto") == expected
    assert resolve_threads(3) == 3  # a count is taken as it is


@pytest.mark.parametrize("bad", [0, -1, "4", 2.5, True, None])
def test_a_bad_setting_is_an_error_naming_it(bad: object) -> None:
    with pytest.raises(ValueError, match="threads must be 'auto' or a count"):
        resolve_threads(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("setting", "local", "expected"), [
    (None, 2, 4),  # no cap: the node's CPUs shared out (the rule before the cap)
    (None, 1, 8),
    ("auto", 1, 7),
    ("auto", 2, 3),
    (2, 1, 2),
    (3, 2, 1),
    (1, 4, 1),  # more workers than the cap: one thread each
    (32, 2, 4),  # never more than the node's share
])
def test_a_ray_worker_gets_its_share_of_the_cap_on_its_node(
        monkeypatch: pytest.MonkeyPatch, setting: object, local: int, expected: int) -> None:
    monkeypatch.setattr(threads, "usable_cpus", lambda: 8)
    assert worker_threads(setting, local) == expected  # type: ignore[arg-type]


def test_within_bounds_a_count_by_a_cap() -> None:
    assert within(4, 2) == 2 and within(1, 2) == 1
    assert within(None, 2) == 2 and within(3, None) == 3 and within(None, None) is None


def test_the_cap_reaches_the_ray_train_worker_config(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """``ray_fit(threads=...)`` hands the setting to each worker through Ray Train's
    ``train_loop_config`` (the worker resolves it on its node with :func:`worker_threads`)."""
    pytest.importorskip("ray")
    import ray.train.torch

    from autospec.speculators.training import TraineeOptions
    from autospec.train import ray_trainer
    from autospec.train.loop import LoopConfig

    seen: dict = {}

    class Stop(Exception):
        pass

    class FakeTrainer:
        def __init__(self, worker, *, train_loop_config, **_kw) -> None:
            seen.update(train_loop_config, worker=worker)

        def fit(self) -> None:
            raise Stop

    class Config:
        def model_dump(self, mode: str) -> dict:
            return {}

    class Cache:
        def save(self, path: Path) -> None:
            path.write_bytes(b"")

    monkeypatch.setattr(ray.train.torch, "TorchTrainer", FakeTrainer)
    monkeypatch.setattr(ray_trainer, "connect_ray", lambda **_kw: "existing")
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})  # no Ray joined here
    with pytest.raises(Stop):
        ray_trainer.ray_fit(kind="eagle3", config=Config(), state={}, shared={},
                            opts=TraineeOptions(), cache=Cache(), loop=LoopConfig(),  # type: ignore[arg-type]
                            workers=2, storage_path=tmp_path, name="run", threads="auto")
    assert seen["threads"] == "auto" and seen["worker"] is ray_trainer._worker
    assert not (tmp_path / "run").exists()  # a failed run's storage is removed too


def test_set_num_threads_works_again_after_a_block_that_disabled_it() -> None:
    """As vLLM's CPU worker does when its engine is built in this process."""
    import torch

    from autospec.threads import set_num_threads_kept, torch_threads

    real = torch.set_num_threads
    with set_num_threads_kept():
        torch.set_num_threads = lambda n: None
    assert torch.set_num_threads is real
    before = torch.get_num_threads()
    with torch_threads(before + 1) as n:
        assert n == before + 1  # the cap applies again
    assert torch.get_num_threads() == before
