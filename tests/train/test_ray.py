"""Ray Train with 2 CPU workers (DDP) on a tiny random-init target; slow (Ray start-up)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
import torch

from autospec import store
from autospec.settings import get_settings
from autospec.speculators.checkpoint import load_speculator
from autospec.train.data import WindowSpec
from autospec.train.errors import TrainingError, TrainingStopped
from autospec.train.ray_trainer import (
    PLACEMENT_FILE,
    RunStop,
    end_workers,
    fit_off_the_main_thread,
    note_placement_group,
)
from autospec.train.run import TrainRequest, train_candidate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _request(tmp_path, epochs: int = 3, **kw) -> TrainRequest:
    return TrainRequest(kind="eagle3", epochs=epochs, workers=2,
                        window=WindowSpec(heldout_fraction=0.2),
                        overrides={"draft_vocab_size": 40}, storage_path=tmp_path / "ray", **kw)


def test_ray_tiny_random_init_killed_run_leaves_no_candidate(ray_local, db_with_traffic, tiny,
                                                             tmp_path) -> None:
    with pytest.raises(TrainingError, match="injected worker failure"):
        train_candidate(_request(tmp_path, fail_at_step=2, max_failures=0),
                        engine=db_with_traffic, target=tiny)
    with store.session_scope(db_with_traffic) as s:
        assert [v.version for v in store.list_speculators(s)] == ["builtin-ngram"]
        (run,) = store.list_training_runs(s)
        assert run.status == "failed" and "injected worker failure" in run.error
    root = get_settings().resolved_artifact_dir
    assert not root.exists() or not any(root.iterdir())
    assert not any((tmp_path / "ray").iterdir())  # a failed run's storage is removed too


def test_ray_two_workers_tiny_random_init_stop_on_request_together_and_register_nothing(
        ray_local, db_with_traffic, tiny, tmp_path) -> None:
    """``should_stop`` (a cycle's deadline, a lost lease) reaches the workers: both ranks stop
    before the same step (apart, one would wait in DDP's next all-reduce), long before the
    run's 180 steps; nothing is registered and the run's storage is removed. Rank 0 named
    its placement group in the job (the driver would remove it, should it give the run up)."""
    storage = tmp_path / "ray"
    named: list[str] = []

    def after_the_first_checkpoint() -> bool:
        if not any(storage.glob("*/checkpoint_*")):
            return False
        named.extend(p.read_text() for p in storage.glob(f"*/job/{PLACEMENT_FILE}"))
        return True

    with pytest.raises(TrainingStopped, match=r"^stopped on request at step \d+$") as stopped:
        train_candidate(_request(tmp_path, epochs=60), engine=db_with_traffic, target=tiny,
                        should_stop=after_the_first_checkpoint)
    step = int(re.findall(r"\d+", str(stopped.value))[-1])
    assert 3 <= step < 180  # 3 steps an epoch: at least the first one's
    assert len(named) == 1 and re.fullmatch("[0-9a-f]{36}", named[0]), named
    with store.session_scope(db_with_traffic) as s:
        assert [v.version for v in store.list_speculators(s)] == ["builtin-ngram"]
        (run,) = store.list_training_runs(s)
        assert run.status == "failed" and run.error == f"stopped: {stopped.value}"
    assert not any(storage.iterdir())


def test_a_given_up_ray_run_has_its_workers_ended_and_their_cpus_freed(ray_local,
                                                                      tmp_path) -> None:
    """A run whose step hangs (it never asks for the marker) is given up after the grace;
    the driver removes the placement group rank 0 named in the job, so the workers die, the
    run ends and its 2 CPUs are free again. They stayed held while the step hung: a later run
    waited for them. A ``TorchTrainer`` of its own (no model): its step hangs by design."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    job, release = tmp_path / "hung" / "job", tmp_path / "release"
    job.mkdir(parents=True)

    def hung_step(cfg: dict) -> None:  # nested: Ray pickles it by value
        if ray.train.get_context().get_world_rank() == 0:
            note_placement_group(Path(cfg["job"]))  # as ray_trainer._worker does
        while not Path(cfg["release"]).exists():
            time.sleep(0.1)

    trainer = TorchTrainer(
        hung_step, train_loop_config={"job": str(job), "release": str(release)},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name="hung", storage_path=str(tmp_path / "ray"),
                             failure_config=FailureConfig(max_failures=0)))
    try:
        with pytest.raises(TrainingStopped) as stopped:  # asked once the workers are up
            fit_off_the_main_thread(trainer, RunStop(lambda: (job / PLACEMENT_FILE).exists(),
                                                     job, grace_s=1.0))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
                ray.available_resources().get("CPU", 0) < 2
                or any(t.name == "ray-train-fit" for t in threading.enumerate())):
            time.sleep(0.2)
        assert ray.available_resources().get("CPU", 0) == 2
        assert not any(t.name == "ray-train-fit" for t in threading.enumerate())
        assert str(stopped.value).endswith(
            "had not ended 1s after it was asked to and its workers were ended")
    finally:
        release.touch()  # whatever happened, the step ends (the module's Ray serves on)


def test_a_placement_group_already_removed_is_not_said_to_be_ended(ray_local, tmp_path,
                                                                    caplog) -> None:
    """The job still names the group of a worker group Ray Train replaced (a worker died and
    the new rank 0 has not named its own yet): removing it again raised nothing, so the run
    was said to have had "its workers ended" when the restarted ones were untouched."""
    from ray.util import placement_group, remove_placement_group

    group = placement_group([{"CPU": 1}])
    assert group.wait(timeout_seconds=60)
    remove_placement_group(group)
    (tmp_path / PLACEMENT_FILE).write_text(group.id.hex())
    with caplog.at_level("WARNING", logger="autospec.train.ray_trainer"):
        assert end_workers(tmp_path) is False
    assert f"placement group {group.id.hex()}" in caplog.text and "is REMOVED" in caplog.text


def test_ray_two_workers_tiny_random_init_survive_a_worker_death_deterministically(
        ray_local, db_with_traffic, tiny, tmp_path) -> None:
    """A run that loses a worker resumes from its last checkpoint and trains on; with the same
    seed it gives the same head as a clean run. (One test: the resumed run both checks are
    about costs a Ray Train run with a restart, ~1/3 of this module's time.)"""
    clean = train_candidate(_request(tmp_path / "a", seed=3), engine=db_with_traffic,
                            target=tiny)
    # 48 train sequences, 8 per step, 2 ranks: 3 steps per epoch; step 5 is in epoch 2
    resumed = train_candidate(_request(tmp_path / "b", seed=3, fail_at_step=5, max_failures=1),
                              engine=db_with_traffic, target=tiny)
    assert not any((tmp_path / "b" / "ray").iterdir())  # the run's storage is removed
    spec = load_speculator(resumed.artifact, tiny)
    assert spec.kind == "eagle3"
    m = resumed.metrics
    assert m["steps"] == 9 and m["examples_seen"] == 3 * 48 and m["workers"] == 2
    assert m["resumes"] == 1 and clean.metrics["resumes"] == 0  # from the epoch-1 checkpoint
    assert m["heldout_after"]["loss"] < m["heldout_before"]["loss"]
    with store.session_scope(db_with_traffic) as s:
        assert store.get_training_run(s, run_id=resumed.run_id).status == "succeeded"
    assert m["feature_noise"] > 0  # random draws in the loop, still repeatable
    a = load_speculator(clean.artifact, tiny).state_tensors()
    b = spec.state_tensors()
    for name, tensor in a.items():
        torch.testing.assert_close(tensor, b[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("threads", [1, None], ids=["cap-1", "no-cap"])
def test_a_ray_worker_trains_on_its_share_of_the_thread_cap_tiny_random_init(
        ray_local, db_with_traffic, tiny, tmp_path, caplog, threads) -> None:
    """The cap travels in the train loop config and the worker applies it on its node (Ray
    starts workers with OMP_NUM_THREADS=1, so the uncapped run shows the worker sets its own
    count); what rank 0 ran on is in its reports."""
    from autospec.threads import worker_threads

    if worker_threads(1, 1) == worker_threads(None, 1):
        pytest.skip("one CPU: a cap of 1 and no cap are the same here")
    caplog.set_level("INFO", logger="autospec.train.ray_trainer")
    train_candidate(TrainRequest(kind="eagle3", epochs=1, workers=1, threads=threads,
                                 window=WindowSpec(heldout_fraction=0.2),
                                 overrides={"draft_vocab_size": 40},
                                 storage_path=tmp_path / "ray"),
                    engine=db_with_traffic, target=tiny)
    expected = worker_threads(threads, 1)
    assert f"rank 0 trained on {expected} torch threads" in caplog.text
